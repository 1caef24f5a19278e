"""The script-mode contract on 3 instances, byte for byte.

Expectations are computed here from the documented SageMaker rules
(sagemaker-training-toolkit mapping.py / environment.py), written out literally,
not taken from shipyard's own encoder.
"""

from __future__ import annotations

import json
import os
import tarfile

import pytest

import shipyard
from shipyard.sandbox import probe

SCRIPT = r"""
import json, os, socket, sys
host = os.environ["SM_CURRENT_HOST"]
cfg = os.environ["SM_INPUT_CONFIG_DIR"]
server = socket.socket()
server.bind((host, 2222))            # SageMaker's fixed port, on every instance at once
server.listen(1)
record = {
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "env": {k: v for k, v in os.environ.items()
            if k.startswith("SM_") or k in ("TRAINING_JOB_NAME", "CURRENT_HOST", "SAGEMAKER_BASE_DIR")},
    "files": {n: open(os.path.join(cfg, n)).read()
              for n in ("hyperparameters.json", "resourceconfig.json", "inputdataconfig.json")},
    "resolved": {h: socket.gethostbyname(h) for h in json.loads(os.environ["SM_HOSTS"])},
    "hostname": socket.gethostname(),
    "channel_files": sorted(os.listdir(os.environ["SM_CHANNEL_TRAINING"])),
}
with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], host + ".json"), "w") as fh:
    json.dump(record, fh)
"""

HPS = {
    "epochs": 3,
    "learning-rate": 0.01,
    "b": True,
    "layers": [64, 32],
    "opt": {"name": "sgd", "m": 0.9},
    "name": "a b",
}


def compact(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def test_three_instance_contract_in_sandboxes(session, write_script, tmp_path):
    """Each instance in its own namespaces: SM_* are SageMaker's /opt/ml paths, byte for
    byte, the interface is eth0, and algo-k resolve on the job's private network."""
    if not probe.support().ok:
        pytest.skip(f"no instance sandbox on this machine: {probe.support().reason}")
    table = run_contract_job(
        session,
        write_script,
        tmp_path,
        base_of=lambda host: "/opt/ml",
        cpus=str(len(os.sched_getaffinity(0))),
        interface="eth0",
    )
    assert all(a.startswith("10.") for a in table.values())
    assert len(set(table.values())) == 3
    assert len({a.rsplit(".", 1)[0] for a in table.values()}) == 1


def test_three_instance_contract_without_sandbox(session, write_script, tmp_path, monkeypatch):
    """The fallback (namespaces unavailable, here forced off): trees in the job directory,
    per-instance loopback addresses."""
    monkeypatch.setenv("SHIPYARD_SANDBOX", "off")
    job_dir = os.path.join(session.home, "jobs", "contract-job")
    table = run_contract_job(
        session,
        write_script,
        tmp_path,
        base_of=lambda host: os.path.join(job_dir, "instances", host),
        cpus=str(len(os.sched_getaffinity(0))),
    )
    # Every instance resolves the same table: three distinct addresses in one /24.
    assert all(a.startswith("127.") for a in table.values())
    assert len(set(table.values())) == 3
    assert len({a.rsplit(".", 1)[0] for a in table.values()}) == 1
    log = open(os.path.join(job_dir, "logs", "algo-1.log")).read()
    assert log.count("instance sandbox off (SHIPYARD_SANDBOX=off): /opt/ml is not mapped") == 1


def run_contract_job(
    session,
    write_script,
    tmp_path,
    base_of,
    cpus: str,
    job_name: str = "contract-job",
    interface: str = "lo",
) -> dict[str, str]:
    """Run the 3-instance contract job and check every instance byte for byte; returns
    the host -> address table all instances resolved (the caller checks the addresses:
    they depend on the backend). ``base_of(host)`` is the instance's tree where it ran."""
    src = write_script("train.py", SCRIPT)
    train = tmp_path / "train"
    train.mkdir()
    (train / "part-0.csv").write_text("1,2\n")
    evald = tmp_path / "eval"
    evald.mkdir()
    est = shipyard.Estimator(
        entry_point="train.py",
        source_dir=src,
        instance_count=3,
        instance_type="local",
        hyperparameters=HPS,
        session=session,
    )
    est.fit(
        {
            "training": str(train),
            "eval": shipyard.TrainingInput("file://" + str(evald), content_type="text/csv"),
        },
        job_name=job_name,
    )
    desc = est.latest_training_job.describe()
    assert desc["TrainingJobStatus"] == "Completed"

    output = desc["Shipyard"]["OutputArtifacts"].removeprefix("file://")
    with tarfile.open(output) as tar:
        records = {m.name[:-5]: json.load(tar.extractfile(m)) for m in tar.getmembers()}
    assert sorted(records) == ["algo-1", "algo-2", "algo-3"]

    home = session.home
    submit = "file://" + os.path.join(home, "output", job_name, "source", "sourcedir.tar.gz")
    hosts = ["algo-1", "algo-2", "algo-3"]

    expected_hps_file = {
        "b": "true",
        "epochs": "3",
        "layers": "[64, 32]",
        "learning-rate": "0.01",
        "name": '"a b"',
        "opt": '{"name": "sgd", "m": 0.9}',
        "sagemaker_container_log_level": "20",
        "sagemaker_job_name": json.dumps(job_name),
        "sagemaker_program": '"train.py"',
        "sagemaker_region": '"us-east-1"',
        "sagemaker_submit_directory": json.dumps(submit),
    }
    expected_argv = [
        "-b",
        "True",
        "--epochs",
        "3",
        "--layers",
        "[64, 32]",
        "--learning-rate",
        "0.01",
        "--name",
        "a b",
        "--opt",
        "m=0.9,name=sgd",
    ]
    expected_idc = {
        "eval": {
            "ContentType": "text/csv",
            "TrainingInputMode": "File",
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": "None",
        },
        "training": {
            "TrainingInputMode": "File",
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": "None",
        },
    }
    group = {"instance_group_name": "homogeneousCluster", "instance_type": "local", "hosts": hosts}
    user_hps = {
        "b": True,
        "epochs": 3,
        "layers": [64, 32],
        "learning-rate": 0.01,
        "name": "a b",
        "opt": {"m": 0.9, "name": "sgd"},
    }
    addresses = set()
    for host in hosts:
        rec = records[host]
        base = base_of(host)
        rc = {
            "current_host": host,
            "current_instance_type": "local",
            "current_group_name": "homogeneousCluster",
            "hosts": hosts,
            "instance_groups": [group],
            "network_interface_name": interface,
        }
        assert rec["argv"] == expected_argv
        assert rec["cwd"] == os.path.join(base, "code")
        assert json.loads(rec["files"]["hyperparameters.json"]) == expected_hps_file
        assert json.loads(rec["files"]["resourceconfig.json"]) == rc
        assert json.loads(rec["files"]["inputdataconfig.json"]) == expected_idc
        assert rec["channel_files"] == ["part-0.csv"]
        p = lambda *parts, base=base: os.path.join(base, *parts)  # noqa: E731
        training_env = {
            "additional_framework_parameters": {},
            "channel_input_dirs": {
                "eval": p("input", "data", "eval"),
                "training": p("input", "data", "training"),
            },
            "current_host": host,
            "current_instance_group": "homogeneousCluster",
            "current_instance_group_hosts": hosts,
            "current_instance_type": "local",
            "distribution_hosts": [],
            "distribution_instance_groups": [],
            "framework_module": None,
            "hosts": hosts,
            "hyperparameters": user_hps,
            "input_config_dir": p("input", "config"),
            "input_data_config": expected_idc,
            "input_dir": p("input"),
            "instance_groups": ["homogeneousCluster"],
            "instance_groups_dict": {"homogeneousCluster": group},
            "is_hetero": False,
            "is_master": host == "algo-1",
            "is_modelparallel_enabled": None,
            "is_smddpmprun_installed": False,
            "job_name": job_name,
            "log_level": 20,
            "master_hostname": "algo-1",
            "model_dir": p("model"),
            "module_dir": submit,
            "module_name": "train",
            "network_interface_name": interface,
            "num_cpus": int(cpus),
            "num_gpus": 0,
            "num_neurons": 0,
            "output_data_dir": p("output", "data"),
            "output_dir": p("output"),
            "output_intermediate_dir": p("output", "intermediate"),
            "resource_config": rc,
            "user_entry_point": "train.py",
        }
        expected_env = {
            "SM_HOSTS": '["algo-1","algo-2","algo-3"]',
            "SM_NETWORK_INTERFACE_NAME": interface,
            "SM_HPS": compact(user_hps),
            "SM_USER_ENTRY_POINT": "train.py",
            "SM_FRAMEWORK_PARAMS": "{}",
            "SM_RESOURCE_CONFIG": compact(rc),
            "SM_INPUT_DATA_CONFIG": compact(expected_idc),
            "SM_OUTPUT_DATA_DIR": p("output", "data"),
            "SM_CHANNELS": '["eval","training"]',
            "SM_CURRENT_HOST": host,
            "SM_CURRENT_INSTANCE_TYPE": "local",
            "SM_CURRENT_INSTANCE_GROUP": "homogeneousCluster",
            "SM_CURRENT_INSTANCE_GROUP_HOSTS": compact(hosts),
            "SM_INSTANCE_GROUPS": '["homogeneousCluster"]',
            "SM_INSTANCE_GROUPS_DICT": compact({"homogeneousCluster": group}),
            "SM_DISTRIBUTION_INSTANCE_GROUPS": "[]",
            "SM_IS_HETERO": "false",
            "SM_MODULE_NAME": "train",
            "SM_LOG_LEVEL": "20",
            "SM_FRAMEWORK_MODULE": "",
            "SM_INPUT_DIR": p("input"),
            "SM_INPUT_CONFIG_DIR": p("input", "config"),
            "SM_OUTPUT_DIR": p("output"),
            "SM_NUM_CPUS": cpus,
            "SM_NUM_GPUS": "0",
            "SM_NUM_NEURONS": "0",
            "SM_MODEL_DIR": p("model"),
            "SM_MODULE_DIR": submit,
            "SM_TRAINING_ENV": compact(training_env),
            "SM_USER_ARGS": compact(expected_argv),
            "SM_OUTPUT_INTERMEDIATE_DIR": p("output", "intermediate"),
            "SM_CHANNEL_TRAINING": p("input", "data", "training"),
            "SM_CHANNEL_EVAL": p("input", "data", "eval"),
            "SM_HP_EPOCHS": "3",
            "SM_HP_LEARNING-RATE": "0.01",
            "SM_HP_B": "true",
            "SM_HP_LAYERS": "[64,32]",
            "SM_HP_OPT": '{"m":0.9,"name":"sgd"}',
            "SM_HP_NAME": "a b",
            "TRAINING_JOB_NAME": job_name,
            "CURRENT_HOST": host,
            "SAGEMAKER_BASE_DIR": base,
        }
        assert rec["env"] == expected_env
        assert rec["hostname"] == host
        addresses.add(tuple(sorted(rec["resolved"].items())))
    assert len(addresses) == 1  # every instance resolves the same table
    return dict(next(iter(addresses)))
