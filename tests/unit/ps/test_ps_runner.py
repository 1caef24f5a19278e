"""The native_ps runner's pure parts: options, the planned processes and environment,
when shards end (job_outcome), the job's final report, the worker wrapper."""

from __future__ import annotations

import sys
import threading

import pytest

from shipyard.agent.runners import native_ps
from shipyard.errors import DistributionError
from shipyard.jobplan.layout import paths_for
from shipyard.jobplan.runner import InstanceContext
from shipyard.ps import worker as ps_worker
from shipyard.ps.consistency import WorkerTable, job_outcome
from shipyard.ps.errors import PSError
from shipyard.ps.options import PSOptions
from shipyard.ps.stats import NEVER_USED, final_report
from shipyard.ps.worker import run_command
from tests.agent_configs import local_config

ADDRESSES = {"algo-1": "127.1.2.1", "algo-2": "127.1.2.2"}


def context(tmp_path, host, options, checkpoint_local_path=None):
    config = local_config(
        str(tmp_path / "instances"),
        ADDRESSES,
        submit_directory=str(tmp_path),
        runner="native_ps",
        runner_options=dict(options, kind="parameter_server"),
        checkpoint_local_path=checkpoint_local_path,
        job_secret="s3cret",
    )
    return InstanceContext(
        config=config,
        host=host,
        paths=paths_for(config, host),
        env={"SM_CURRENT_HOST": host},
        user_command=[sys.executable, "train.py"],
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"policy": "nearest"}, "unknown placement policy"),
        ({"consistency": "eventual"}, "unknown consistency mode"),
        ({"consistency": "bounded"}, "needs max_staleness"),
        ({"max_staleness": -1}, "max_staleness must be >= 0"),
        ({"consistency": "sync", "max_staleness": 1}, "does not apply to mode 'sync'"),
        ({"num_shards": 0}, "num_shards"),
        ({"num_shards": 33}, "num_shards"),
        ({"workers_per_host": 0}, "workers_per_host"),
        ({"workers_per_host": True}, "workers_per_host"),
        ({"workers_per_host": 2, "processes_per_host": 3}, "disagree"),
        ({"heartbeat_timeout": 0}, "heartbeat_timeout"),
        ({"mac": "md5"}, "'mac' must be one of"),
        ({"port": 80}, "'port'"),
        ({"shards": 2}, "unknown parameter_server option(s) ['shards']"),
    ],
)
def test_bad_options_raise_distribution_errors(options, message):
    with pytest.raises(DistributionError) as err:
        native_ps.NativePSRunner().validate(dict(options, enabled=True), 2, None)
    assert message in str(err.value) and "distribution['parameter_server']" in str(err.value)


def test_defaults_one_shard_per_instance_async_auto():
    opts = PSOptions.parse(
        {"enabled": True, "implementation": "shipyard", "kind": "parameter_server"}, 3
    )
    assert (opts.num_shards, opts.workers_per_host, opts.policy, opts.consistency.mode) == (
        3,
        1,
        "auto",
        "async",
    )
    assert PSOptions.parse({"max_staleness": 2}, 1).consistency.mode == "bounded"
    assert PSOptions.parse({"processes_per_host": 2}, 1).workers_per_host == 2


def test_shards_spread_over_instances_with_their_own_ports():
    opts = PSOptions.parse({"num_shards": 5}, 2)
    assert [opts.shards_on(h, 2) for h in (0, 1)] == [[0, 2, 4], [1, 3]]
    ips = list(ADDRESSES.values())
    assert [opts.shard_endpoint(i, ips) for i in range(5)] == [
        "tcp://127.1.2.1:7100",
        "tcp://127.1.2.2:7100",
        "tcp://127.1.2.1:7101",
        "tcp://127.1.2.2:7101",
        "tcp://127.1.2.1:7102",
    ]


def test_plan_shards_and_workers_of_one_instance(tmp_path):
    options = {
        "enabled": True,
        "consistency": "sync",
        "policy": "sliced",
        "num_shards": 2,
        "workers_per_host": 2,
        "checkpoint_interval": 5,
    }
    ctx = context(tmp_path, "algo-2", options)
    specs = native_ps.plan(ctx)
    assert [s.name for s in specs] == ["ps-shard-1", "ps-worker-2", "ps-worker-3"]
    shard, *workers = specs
    assert shard.critical and not shard.user_facing and shard.role == "main"
    argv = shard.argv
    assert argv[argv.index("--bind") + 1] == "tcp://127.1.2.2:7100"
    assert argv[argv.index("--num-workers") + 1] == "4" and "--exit-when-done" in argv
    assert argv[argv.index("--checkpoint-dir") + 1] == ctx.paths.checkpoints
    assert argv[argv.index("--consistency") + 1] == "sync"
    assert shard.failure_file and shard.env["SHIPYARD_PS_SECRET"] == "s3cret"
    for local, w in enumerate(workers):
        assert not w.critical and w.argv[1:4] == ["-m", "shipyard.ps.worker", "--"]
        assert w.argv[4:] == ctx.user_command
        assert w.env["SHIPYARD_PS_RANK"] == str(2 + local) and w.env[
            "SHIPYARD_PS_LOCAL_RANK"
        ] == str(local)
        assert w.env["SHIPYARD_PS_ENDPOINTS"] == "tcp://127.1.2.1:7100,tcp://127.1.2.2:7100"
        assert w.env["SHIPYARD_PS_NUM_WORKERS"] == "4" and w.env["SHIPYARD_PS_POLICY"] == "sliced"
        assert w.env["SHIPYARD_PS_SECRET"] == "s3cret"
        assert w.env["SHIPYARD_PS_REPORT"] == ctx.paths.report_file


def test_checkpoint_local_path_is_where_shards_checkpoint(tmp_path):
    ctx = context(tmp_path, "algo-1", {"enabled": True}, checkpoint_local_path=str(tmp_path / "ck"))
    argv = native_ps.plan(ctx)[0].argv
    assert argv[argv.index("--checkpoint-dir") + 1] == str(tmp_path / "ck")


def test_job_outcome_waits_for_every_rank():
    table = WorkerTable(heartbeat_timeout=10)
    table.seen(0, 0.0)
    table.seen(1, 0.0)
    # rank 1 still heartbeating, rank 0 done: not over
    assert job_outcome(2, {0: 0}, table, {0, 1}, 5.0, 0.0, 60) is None
    table.expire(8.0)  # silent, but not for longer than the heartbeat timeout yet
    assert job_outcome(2, {0: 0}, table, {0, 1}, 8.0, 0.0, 60) is None
    table.expire(11.0)
    out = job_outcome(2, {0: 0}, table, {0, 1}, 11.0, 0.0, 60)
    assert out[0] == {"exit_code": 0} and "heartbeat timeout" in out[1]["lost"]


def test_job_outcome_a_rank_that_never_joins_is_lost_after_the_join_timeout():
    table = WorkerTable(heartbeat_timeout=10)
    table.restore({1: 40})  # known from a checkpoint, not heard from by this shard
    assert job_outcome(2, {0: 1}, table, {0}, 30.0, 0.0, 60) is None
    assert job_outcome(2, {0: 1}, table, {0}, 61.0, 0.0, 60)[1] == {
        "lost": "never connected within 60s"
    }


def test_final_report_merges_shards_and_warns_when_nobody_pushed():
    stats = {"shard": 0, "pushes": 0, "workers": {"0": {"bytes_in": 10, "bytes_out": 20}}}
    answers = [
        {
            "finished": {"1": {"lost": "x"}, "0": {"exit_code": 0}},
            "stats": stats,
            "placement": None,
        },
        None,
    ]
    report = final_report(answers, ["tcp://a:1"])
    assert report["schema"] == "shipyard.ps.report/v1"
    assert list(report["workers_final"]) == ["0", "1"] and report["warnings"] == [NEVER_USED]
    assert report["traffic"]["bytes_to_shard"] == [[10]]
    assert final_report([{"finished": {}, "stats": dict(stats, pushes=3)}])["warnings"] == []


def test_wrapper_keeps_the_error_tail_and_reports_signals(capfd):
    status, tail, stopped = run_command(
        [sys.executable, "-c", "import sys; sys.exit('boom at the end')"]
    )
    assert (status, stopped) == (1, False) and "boom at the end" in tail
    assert "boom at the end" in capfd.readouterr().err  # passed through as it came
    status, tail, _ = run_command(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    )
    assert status == 137 and tail == ""
    assert run_command([sys.executable, "-c", "print('ok')"])[:2] == (0, "")


def test_job_outcome_gives_a_rank_that_left_time_to_report_its_end():
    table = WorkerTable(heartbeat_timeout=10)
    table.seen(0, 0.0)
    table.leave(0)  # closed its client, still saving its model
    assert job_outcome(1, {}, table, {0}, 30.0, 0.0, 60) is None
    assert "never reported its end" in job_outcome(1, {}, table, {0}, 61.0, 0.0, 60)[0]["lost"]


class _Clock:
    """The worker wrapper's clock, virtual: sleeps move it, nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _GoneShards:
    """A PSClient whose shards are gone: every DONE is refused, and counted."""

    sent = 0

    def __init__(self, **_kw) -> None:
        pass

    def finish(self, *_a, **_kw):
        type(self).sent += 1
        raise PSError("connection refused by shard 1")

    def close(self, leave: bool = True) -> None:
        pass


@pytest.mark.parametrize("stopped", [True, False])
def test_wrapper_resends_done_to_gone_shards_only_while_its_job_may_still_want_it(
    monkeypatch, capsys, stopped
):
    """A stopped worker (its job is being torn down) gives up on DONE within its own
    short wait; before, it resent for RETRY_DONE_S (15 s) and every stopped ps job waited
    for the agent's SIGKILL at the end of the stop grace. A worker whose command simply
    ended resends for RETRY_DONE_S of refusals in a row (a loaded machine may refuse for a
    moment), then gives up: before, it resent every 0.5 s for its whole 30-day wait."""
    clock = _Clock()
    monkeypatch.setattr(ps_worker, "time", clock)
    monkeypatch.setattr(ps_worker, "PSClient", _GoneShards)
    monkeypatch.setattr(ps_worker, "run_command", lambda cmd: (143, "", stopped))
    _GoneShards.sent = 0
    assert ps_worker.main(["--", "python", "train.py"]) == 143
    assert "could not report the end of this worker" in capsys.readouterr().err
    if stopped:
        assert clock.now <= ps_worker.WAIT_WHEN_STOPPED_S + 0.5, clock.now
        assert 1 <= _GoneShards.sent <= 5
    else:
        assert ps_worker.RETRY_DONE_S <= clock.now <= ps_worker.RETRY_DONE_S + 1, clock.now


@pytest.mark.timeout(60)  # a hang guard: before the fix main() never returned here
def test_a_stopped_wrapper_does_not_wait_on_a_shard_that_never_answers(monkeypatch, capsys):
    """The shard's instance is gone: a connect to it is not refused, it hangs (for the
    transport's 5 s connect timeout, longer than the agent's stop grace), so the stopped
    wrapper lived until its agent SIGKILLed it. It now gives its report
    WAIT_WHEN_STOPPED_S in all and exits with its command's status."""
    released = threading.Event()

    class _SilentShards(_GoneShards):
        def finish(self, *_a, **_kw):
            released.wait()  # a connect that never completes
            raise PSError("released at the end of the test")

    monkeypatch.setattr(ps_worker, "WAIT_WHEN_STOPPED_S", 0.2)
    monkeypatch.setattr(ps_worker, "PSClient", _SilentShards)
    monkeypatch.setattr(ps_worker, "run_command", lambda cmd: (143, "", True))
    try:
        assert ps_worker.main(["--", "python", "train.py"]) == 143
        assert "no answer within" in capsys.readouterr().err
    finally:
        released.set()
