"""The mpi runner's pure parts: options, validation, the planned processes, the rank
wrapper's environment merge and failure excerpts, mpirun's own messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.agent_configs import local_config

from shipyard.agent.runners import mpi
from shipyard.errors import DistributionError
from shipyard.instance_types import InstanceResources
from shipyard.jobplan.layout import paths_for
from shipyard.jobplan.runner import InstanceContext
from shipyard.mpi import command as mpi_command
from shipyard.mpi import launch as mpi_launch
from shipyard.mpi import rank as mpi_rank

CPU = InstanceResources("local", num_cpus=2, num_gpus=0, nominal_cpus=2, nominal_gpus=0)
GPU4 = InstanceResources("ml.g5.12xlarge", num_cpus=48, num_gpus=4, nominal_cpus=48, nominal_gpus=4)


def test_processes_per_host_defaults_to_gpus_else_one():
    from shipyard.jobplan.runners import mpi_processes_per_host

    assert mpi_processes_per_host({}, 0) == 1
    assert mpi_processes_per_host({}, 4) == 4
    assert mpi_processes_per_host({"processes_per_host": 3}, 4) == 3


@pytest.mark.parametrize(
    "options,match",
    [
        ({"processes_per_host": 0}, "integer >= 1"),
        ({"processes_per_host": True}, "integer >= 1"),
        ({"process_per_host": 2}, "unknown option"),
    ],
)
def test_validate_refuses_bad_options(options, match):
    with pytest.raises(DistributionError, match=match):
        mpi.MpiRunner().validate(dict(options, enabled=True), 2, CPU)


def test_validate_gpus_and_cpus():
    with pytest.raises(DistributionError, match="processes_per_host <= 4"):
        mpi.MpiRunner().validate({"enabled": True, "processes_per_host": 8}, 1, GPU4)
    mpi.MpiRunner().validate({"enabled": True}, 2, GPU4)
    with pytest.warns(UserWarning, match="more than the 2 CPU"):
        mpi.MpiRunner().validate({"enabled": True, "processes_per_host": 3}, 1, CPU)


def test_validate_without_mpirun(monkeypatch, tmp_path):
    monkeypatch.setenv("SHIPYARD_MPIRUN", str(tmp_path / "nope"))
    with pytest.raises(DistributionError, match="needs mpirun"):
        mpi.MpiRunner().validate({"enabled": True}, 2, CPU)


def test_only_the_master_decides():
    assert mpi.MpiRunner().deciding_hosts({}, ["algo-1", "algo-2", "algo-3"]) == ["algo-1"]


@pytest.mark.parametrize(
    "text,level,rest",
    [
        ("", "INFO", []),
        ("--NCCL_DEBUG WARN -x FOO=1", "WARN", ["-x", "FOO=1"]),
        (
            "--mca btl_tcp_if_include lo --NCCL_DEBUG=TRACE",
            "TRACE",
            ["--mca", "btl_tcp_if_include", "lo"],
        ),
    ],
)
def test_custom_mpi_options_split_as_sagemaker_does(text, level, rest):
    assert mpi_command.parse_custom_mpi_options(text) == (level, rest)


def _ctx(tmp_path, host, options) -> InstanceContext:
    config = local_config(
        str(tmp_path / "instances"),
        {"algo-1": "127.1.2.1", "algo-2": "127.1.2.2"},
        submit_directory=str(tmp_path),
        runner="mpi",
        runner_options=dict(options, kind="mpi"),
    )
    paths = paths_for(config, host)
    return InstanceContext(
        config=config,
        host=host,
        paths=paths,
        env={"PATH": os.environ["PATH"], "SM_CURRENT_HOST": host},
        user_command=[sys.executable, "train.py", "--epochs", "2"],
    )


def test_master_plans_mpirun_and_workers_wait(tmp_path):
    options = {"processes_per_host": 3, "custom_mpi_options": "--NCCL_DEBUG WARN --mca x y"}
    [worker] = mpi.plan(_ctx(tmp_path, "algo-2", options))
    assert worker.argv[-2:] == ["shipyard.mpi.launch", "--wait"]
    assert not worker.user_facing
    [master] = mpi.plan(_ctx(tmp_path, "algo-1", options))
    argv = master.argv
    assert master.failure_file and argv[argv.index("--failure-file") + 1] == master.failure_file
    mpirun = argv[argv.index("--") + 1 :]
    assert mpirun[mpirun.index("-np") + 1] == "6"
    assert "--bind-to" in mpirun and "--oversubscribe" in mpirun
    assert ["-x", "NCCL_DEBUG=WARN"] == mpirun[mpirun.index("-x") : mpirun.index("-x") + 2]
    assert "--mca x y" in " ".join(mpirun)
    assert mpirun[-6:] == [sys.executable, "-m", "mpi4py", "train.py", "--epochs", "2"]
    plan = json.loads(Path(mpirun[mpirun.index("--plan") + 1]).read_text())
    assert plan["processes_per_host"] == 3 and plan["hosts"] == ["algo-1", "algo-2"]
    for host in ("algo-1", "algo-2"):
        env_file = tmp_path / "instances" / host / "agent" / mpi.ENV_FILE
        assert json.loads(env_file.read_text())["SM_CURRENT_HOST"] == host
        assert oct(env_file.stat().st_mode & 0o777) == "0o600"


def test_shim_goes_on_the_path_when_horovod_is_missing():
    env = mpi.rank_python_path({"PYTHONPATH": "/code"})
    first, shim = env["PYTHONPATH"].split(os.pathsep)
    assert first == "/code" and os.path.isdir(os.path.join(shim, "horovod"))


def test_smdistributed_shim_goes_on_the_path_for_smddp_only(monkeypatch):
    """Issue 28: smdistributed.dataparallel with the TensorFlow estimator runs on this
    runner; its ranks import smdistributed.dataparallel.tensorflow from the shim."""
    monkeypatch.delenv("SHIPYARD_SMDDP_SHIM", raising=False)
    paths = mpi.rank_python_path({}, "smdistributed.dataparallel")["PYTHONPATH"].split(os.pathsep)
    assert any(
        os.path.isfile(
            os.path.join(p, "smdistributed", "dataparallel", "tensorflow", "__init__.py")
        )
        for p in paths
    ), paths
    plain = mpi.rank_python_path({}, "mpi")["PYTHONPATH"].split(os.pathsep)
    assert not any(os.path.isdir(os.path.join(p, "smdistributed")) for p in plain)
    monkeypatch.setenv("SHIPYARD_SMDDP_SHIM", "off")
    off = mpi.rank_python_path({}, "smdistributed.dataparallel")["PYTHONPATH"].split(os.pathsep)
    assert not any(os.path.isdir(os.path.join(p, "smdistributed")) for p in off)


def test_rank_environment_layers():
    instance = {"SM_CURRENT_HOST": "algo-2", "PATH": "/bin", "SM_MODEL_DIR": "/j/algo-2/model"}
    master = {"SM_CURRENT_HOST": "algo-1", "PATH": "/bin", "SM_MODEL_DIR": "/j/algo-1/model"}
    current = dict(master, OMPI_COMM_WORLD_RANK="3", NCCL_DEBUG="INFO", PATH="/ompi/bin:/bin")
    env = mpi_rank.rank_environment(instance, master, current, ["algo-1", "algo-2"], 2, 3)
    assert env["SM_CURRENT_HOST"] == "algo-2" and env["SM_MODEL_DIR"] == "/j/algo-2/model"
    assert env["OMPI_COMM_WORLD_RANK"] == "3" and env["NCCL_DEBUG"] == "INFO"
    assert env["PATH"] == "/ompi/bin:/bin"
    assert (env["HOROVOD_HOSTNAME"], env["HOROVOD_LOCAL_RANK"], env["HOROVOD_CROSS_RANK"]) == (
        "algo-2",
        "1",
        "1",
    )


def test_trim_traceback_drops_what_follows_the_exception():
    lines = [
        "x",
        "Traceback (most recent call last):",
        '  File "t.py", line 1',
        "    boom()",
        "ValueError: boom",
        "shipyard.horovod: uncaught ValueError on rank 1; aborting",
        "-----",
        "MPI_ABORT was invoked on rank 1",
    ]
    assert mpi_rank.trim_traceback(lines)[-1] == "ValueError: boom"
    assert mpi_rank.trim_traceback(["a", "b"]) == ["a", "b"]


def test_first_failure_wins(tmp_path):
    path = str(tmp_path / "failure")
    assert mpi_rank.claim_failure(path, "rank 1 first")
    assert not mpi_rank.claim_failure(path, "rank 0 later")
    assert Path(path).read_text() == "rank 1 first"


def test_banner_text_is_mpiruns_message():
    lines = [
        "noise",
        "-" * 74,
        "An unrecognized option was included on the mpirun command line:",
        "",
        "  Option: --bogus",
        "-" * 74,
    ]
    assert mpi_launch.banner_text(lines) == (
        "An unrecognized option was included on the mpirun command line: Option: --bogus"
    )
    assert mpi_launch.banner_text(["a", "", "b"]) == "a b"


def test_a_rank_waits_for_the_env_of_its_own_attempt(tmp_path):
    path = tmp_path / "process-env.json"
    path.write_text(json.dumps({"SHIPYARD_ATTEMPT": "1", "A": "old"}))
    assert mpi_rank.load_env(str(path), 0.1, "2") is None
    path.write_text(json.dumps({"SHIPYARD_ATTEMPT": "2", "A": "new"}))
    assert mpi_rank.load_env(str(path), 0.1, "2")["A"] == "new"


# Issue 16 item 7: custom_mpi_options keep shipyard's defaults unless they contradict them.
@pytest.mark.parametrize(
    "custom,kept,dropped",
    [
        ("-x FOO=1 --mca btl_tcp_if_include lo", ["--oversubscribe", "--bind-to"], []),
        ("--nooversubscribe", ["--bind-to"], ["--oversubscribe"]),
        ("--map-by slot:NOOVERSUBSCRIBE", ["--bind-to"], ["--oversubscribe"]),
        ("--bind-to core", ["--oversubscribe"], ["none"]),
        ("-bind-to socket -x A=1", ["--oversubscribe"], ["none"]),
    ],
)
def test_custom_mpi_options_keep_defaults_unless_contradicted(custom, kept, dropped):
    _, extra = mpi_command.parse_custom_mpi_options(custom)
    argv = mpi_command.mpirun_command(["prog"], 64, mpirun="mpirun", extra_args=extra)
    for flag in kept:
        assert flag in argv, argv
    for flag in dropped:
        assert flag not in argv, argv
    assert " ".join(extra) in " ".join(argv)  # the user's options, verbatim and in order


def test_a_default_the_user_repeats_is_given_once():
    argv = mpi_command.mpirun_command(
        ["prog"],
        64,
        mpirun="mpirun",
        allow_run_as_root=True,
        extra_args=["--oversubscribe", "--allow-run-as-root", "--bind-to", "none"],
    )
    for flag in ("--oversubscribe", "--allow-run-as-root", "--bind-to"):
        assert argv.count(flag) == 1, argv


def _start_rank_1(tmp_path: Path, exit_code: int) -> tuple[subprocess.Popen, Path]:
    """The real rank wrapper, as mpirun starts rank 1 of a 2 x 2 job, running a command
    that exits with ``exit_code`` and prints nothing; returns it and the failure file."""
    for host in ("algo-1", "algo-2"):
        agent = tmp_path / "instances" / host / "agent"
        agent.mkdir(parents=True)
        (agent / "process-env.json").write_text(json.dumps({"SHIPYARD_ATTEMPT": ""}))
        (tmp_path / "instances" / host / "code").mkdir()
    (tmp_path / "run").mkdir()
    plan = {
        "hosts": ["algo-1", "algo-2"],
        "processes_per_host": 2,
        "instances_dir": str(tmp_path / "instances"),
        "env_file": "process-env.json",
        "env_timeout": 5,
        "master_env": str(tmp_path / "instances" / "algo-1" / "agent" / "process-env.json"),
        "run_dir": str(tmp_path / "run"),
        "failure_file": str(tmp_path / "failure"),
        "init_timeout": 0,
    }
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    rank = subprocess.Popen(
        [sys.executable, "-m", "shipyard.mpi.rank", "--plan", str(plan_file), "--"]
        + [sys.executable, "-c", f"import sys; sys.exit({exit_code})"],
        env=dict(os.environ, OMPI_COMM_WORLD_RANK="1"),
    )
    return rank, tmp_path / "failure"


def test_a_bare_exit_defers_to_the_rank_with_a_traceback(tmp_path):
    """A peer whose MPI connection broke exits 14 with nothing on stderr, sometimes before
    the raising rank's wrapper has read its traceback (seen on a loaded CI machine): the
    traceback, not the bare exit, is the job's cause."""
    bare, failure_file = _start_rank_1(tmp_path, 14)
    time.sleep(1.0)  # the bare exit happened first; the raising rank claims after it
    assert mpi_rank.claim_failure(str(failure_file), "rank 3 (algo-2): ValueError: lost")
    assert bare.wait(timeout=30) == 14
    assert failure_file.read_text() == "rank 3 (algo-2): ValueError: lost"


def test_a_bare_exit_alone_is_still_the_cause(tmp_path):
    bare, failure_file = _start_rank_1(tmp_path, 3)
    assert bare.wait(timeout=30) == 3
    assert failure_file.read_text().startswith("rank 1 (algo-1): ")


def test_ray_open_mpi_gets_one_network_holding_every_node():
    """The same if_include on every node (prterun copies its value to remote prteds): the
    smallest network holding all instances' addresses, never a /32 (Open MPI 5.0.11
    matches a /32 against every interface, and prterun segfaults on one)."""
    cluster_mca, cluster_network = mpi.cluster_mca, mpi.cluster_network
    assert cluster_network(["10.1.2.12", "10.1.2.13", "10.1.2.14"]) == "10.1.2.12/30"
    assert cluster_network(["10.1.2.12"]) == "10.1.2.12/31"
    assert cluster_network(["10.0.0.1", "172.16.0.1"]) is None  # nothing short of /8
    assert cluster_network(["fe80::1"]) is None
    mca = cluster_mca({"algo-1": "10.1.2.14", "algo-2": "10.1.2.12"})
    assert mca["OMPI_MCA_btl_tcp_if_include"] == "10.1.2.12/30"
    assert mca["PRTE_MCA_oob_tcp_if_include"] == mca["OMPI_MCA_oob_tcp_if_include"]
    assert mca["PRTE_MCA_oob_tcp_if_include"] == "10.1.2.12/30"
    assert mca["OMPI_MCA_btl_tcp_disable_family"] == "6"
    # loopback nodes (one machine): no interface owns 127.0.0.12, Open MPI chooses
    assert cluster_mca({"algo-1": "127.0.0.12", "algo-2": "127.0.0.13"}) == {}
