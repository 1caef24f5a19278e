"""The DDP runner's pure parts and its small wire pieces: the torchrun environment per
rank (expected values written out from torchrun's rules), the plan, validation, join
keys, the announce protocol over real sockets (the smdistributed shim in a real process with
torch: tests/integration/ddp/test_ddp_contract.py)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

import pytest

from shipyard.agent.runners import torch_distributed as runner
from shipyard.ddp import announce, contract, shim_path
from shipyard.errors import DistributionError
from shipyard.instance_types import InstanceResources
from shipyard.jobplan.layout import InstancePaths
from shipyard.jobplan.runner import InstanceContext
from tests.agent_configs import local_config


def test_rank_env_is_torchruns_for_rank_3_of_2x2():
    [_, rank] = contract.ranks_of(1, 2, 2)
    env = contract.rank_env(
        rank,
        master_addr="10.0.0.1",
        master_port=7777,
        restart_count=1,
        max_restarts=2,
        run_id="job-a",
        inherited={},
        error_file="/x/rank-3.error.json",
    )
    assert env == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "7777",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "2",
        "TORCHELASTIC_RUN_ID": "job-a",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
        "TORCHELASTIC_ERROR_FILE": "/x/rank-3.error.json",
    }


def test_rank_env_keeps_the_users_threads_and_devices_and_one_process_gets_no_omp():
    [rank] = contract.ranks_of(0, 1, 3)
    inherited = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "CUDA_VISIBLE_DEVICES": "2,3"}
    env = contract.rank_env(
        rank,
        master_addr="a",
        master_port=1,
        restart_count=0,
        max_restarts=0,
        run_id="j",
        inherited=inherited,
    )
    assert "OMP_NUM_THREADS" not in env and "TORCHELASTIC_ERROR_FILE" not in env
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    env = contract.rank_env(
        contract.ranks_of(0, 4, 1)[0],
        master_addr="a",
        master_port=1,
        restart_count=0,
        max_restarts=0,
        run_id="j",
        inherited={"OMP_NUM_THREADS": "3"},
    )
    assert env["OMP_NUM_THREADS"] == "3"


def _context(tmp_path, host: str, **options) -> InstanceContext:
    config = local_config(
        str(tmp_path),
        {"algo-1": "127.9.9.1", "algo-2": "127.9.9.2"},
        job_name="job-a",
        runner="torch_distributed",
        runner_options=dict(options, kind="pytorchddp"),
        job_secret="s3cret",
    )
    env = {"PYTHONPATH": "/code", "SHIPYARD_ATTEMPT": "2", "SHIPYARD_MAX_RETRY_ATTEMPTS": "3"}
    return InstanceContext(
        config=config,
        host=host,
        paths=InstancePaths(str(tmp_path / host)),
        env=env,
        user_command=[sys.executable, "train.py", "--lr", "1"],
    )


def test_plan_algo1_runs_the_rendezvous_and_its_ranks(tmp_path):
    ctx = _context(tmp_path, "algo-1", processes_per_host=2)
    service, *ranks = runner.plan(ctx)
    assert (service.name, service.role, service.user_facing) == ("rendezvous", "service", False)
    assert [s.name for s in ranks] == ["rank-0", "rank-1"]
    assert all(s.role == "main" and s.critical for s in ranks)
    for spec in ranks:
        assert spec.argv[-3:] == ["train.py", "--lr", "1"]
        assert spec.env["SHIPYARD_DDP_SECRET"] == "s3cret"  # by env, never argv
        assert "s3cret" not in " ".join(spec.argv + service.argv)
        assert spec.env["PYTHONPATH"].split(os.pathsep) == ["/code", shim_path()]
        assert spec.env["TORCHELASTIC_RESTART_COUNT"] == "1"  # attempt 2
        assert spec.env["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert spec.failure_file.endswith(os.path.join("agent", "ddp", "attempt-2", "failure"))
    assert "--announce-ports" in service.argv
    ports = service.argv[service.argv.index("--announce-ports") + 1]
    assert ports == ",".join(map(str, contract.announce_ports("s3cret", "job-a")))


def test_plan_other_hosts_run_only_ranks_default_one_per_instance_without_gpus(tmp_path):
    specs = runner.plan(_context(tmp_path, "algo-2"))
    assert [(s.name, s.env["RANK"], s.env["GROUP_RANK"]) for s in specs] == [("rank-1", "1", "1")]
    assert specs[0].env["MASTER_ADDR"] == "127.9.9.1"


def _resources(cpus: int, gpus: int) -> InstanceResources:
    return InstanceResources("ml.x", cpus, gpus, cpus, gpus)


def test_validate_refuses_more_ranks_than_gpus_and_warns_beyond_cpus(caplog):
    with pytest.raises(DistributionError, match="NCCL needs one GPU per rank"):
        runner.TorchDistributedRunner().validate(
            {"processes_per_host": 5, "kind": "torch_distributed"}, 1, _resources(8, 4)
        )
    with caplog.at_level(logging.WARNING, logger="shipyard"):
        runner.TorchDistributedRunner().validate(
            {"processes_per_host": 3, "kind": "pytorchddp"}, 2, _resources(2, 0)
        )
    assert "exceeds the 2 CPU(s)" in caplog.text
    runner.TorchDistributedRunner().validate({"processes_per_host": 4}, 1, _resources(8, 4))  # fine


@pytest.mark.parametrize(
    "options,match",
    [
        ({"master_port": 80}, "master_port"),
        ({"master_port": "7777"}, "master_port"),
        ({"rendezvous_timeout": 0}, "rendezvous_timeout"),
    ],
)
def test_validate_refuses_bad_options(options, match):
    with pytest.raises(DistributionError, match=match):
        runner.TorchDistributedRunner().validate(options, 1, _resources(2, 0))


def test_ports_are_the_same_everywhere_and_join_keys_name_ranks():
    assert contract.master_ports(7777)[:2] == [7777, 7778]
    assert contract.announce_ports("k", "j") == contract.announce_ports("k", "j")
    assert contract.announce_ports("k", "j") != contract.announce_ports("other", "j")
    keys = [
        "default_pg/0//cpu//0/0",
        "default_pg/0//cpu//0/3",
        "default_pg/0//cuda//0",
        "user/key/1",
    ]
    assert contract.joined_ranks(keys) == {0, 3}
    text = contract.missing_ranks_message([1, 2], 2, ["algo-1", "algo-2"], 2, 5)
    assert "2 of 4 ranks never joined" in text
    assert "rank 1 (algo-1, local rank 1), rank 2 (algo-2, local rank 0)" in text


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_announce_skips_a_stranger_on_the_first_port_and_checks_the_secret():
    """A program that accepts and says nothing holds the first candidate: the server
    binds the next one, the client gets past the stranger; a wrong secret gets nothing."""
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen(4)
    ports = [stranger.getsockname()[1], *_free_ports(2)]
    events = []
    server = announce.AnnounceServer(
        "127.0.0.1", ports, "key", 7781, lambda *e: events.append(e)
    ).start()
    try:
        assert server.port == ports[1]
        assert announce.request("127.0.0.1", ports[0], "key", "hello", 0, timeout=0.3) is None
        assert announce.request("127.0.0.1", server.port, "key", "exit", 2, 9) == 7781
        assert announce.request("127.0.0.1", server.port, "wrong", "hello", 1, timeout=0.5) is None
        assert events == [("exit", 2, 9)]
    finally:
        server.close()
        stranger.close()


def test_rank_wrapper_names_the_failing_rank_and_the_first_failure_wins(tmp_path):
    """The wrapper against a real announce server: it learns the port, runs the command
    with it, and writes the rank-named failure text once per instance."""
    from shipyard.ddp import rank as wrapper

    ports = _free_ports(1)
    exits = []
    server = announce.AnnounceServer(
        "127.0.0.1", ports, "key", 7790, lambda *e: exits.append(e)
    ).start()
    failure = tmp_path / "failure"
    base = [
        sys.executable,
        "-m",
        "shipyard.ddp.rank",
        "--announce-addr",
        "127.0.0.1",
        "--announce-ports",
        str(ports[0]),
        "--hosts",
        "algo-1,algo-2",
        "--failure-file",
        str(failure),
        "--timeout",
        "10",
        "--",
    ]
    code = (
        "import os; print('port', os.environ['MASTER_PORT'], 'secret' , "
        "os.environ.get('SHIPYARD_DDP_SECRET')); raise ValueError('rank %s broke' % "
        "os.environ['RANK'])"
    )
    try:
        results = []
        for rank in ("3", "2"):
            env = dict(os.environ, SHIPYARD_DDP_SECRET="key", RANK=rank, LOCAL_WORLD_SIZE="2")
            results.append(
                subprocess.run(
                    base + [sys.executable, "-c", code],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
            )
    finally:
        server.close()
    assert [r.returncode for r in results] == [1, 1]
    assert "port 7790 secret None" in results[0].stdout
    text = failure.read_text()
    assert text.startswith(
        "rank 3 (algo-2, local rank 1) failed: AlgorithmError: ExecuteUserScriptError:"
    )
    assert "ValueError: rank 3 broke" in text
    assert sorted(exits) == [("exit", 2, 1), ("exit", 3, 1), ("hello", 2, 0), ("hello", 3, 0)]
    assert wrapper.exit_status(-9) == 137
