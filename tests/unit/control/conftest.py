"""A job recorded in a real store, run by the real supervisor on the in-process backend
(shipyard.backends.inprocess): the controller's rules in milliseconds, no process started.

The policies are the real ones with short windows (a 0.1 s settle, a 0.05 s grace, a
10 ms stop check), so a rule is exercised, not waited out."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import pytest

from shipyard.backends.inprocess import InProcessBackend
from shipyard.control.home import Home
from shipyard.control.policies import (
    FailurePolicy,
    MaxRunPolicy,
    Policies,
    RetryPolicy,
    StopPolicy,
)
from shipyard.control.store import Store
from shipyard.control.supervisor import JobSupervisor
from shipyard.jobplan.config import AgentConfig
from shipyard.spec import validated


@dataclass
class Job:
    home: Home
    store: Store
    name: str
    output_dir: str

    def supervisor(
        self,
        backend: InProcessBackend,
        retries: int = 0,
        max_run: float = 60.0,
        settle: float = 0.1,
        grace: float = 0.05,
        **kwargs: Any,
    ) -> JobSupervisor:
        policies = Policies(
            RetryPolicy(retries),
            FailurePolicy(settle),
            StopPolicy(grace=grace, check_seconds=0.01),
            MaxRunPolicy(max_run),
        )
        return JobSupervisor(
            self.home, self.store, self.name, backend=backend, policies=policies, **kwargs
        )

    def instances(self, attempt: int | None = None) -> dict[str, Any]:
        """host -> (status, exit code) of one attempt (the last when None)."""
        recs = self.store.instances(self.name, attempt)
        last = max(r.attempt for r in recs) if attempt is None else attempt
        return {r.host: (str(r.status), r.exit_code) for r in recs if r.attempt == last}

    def secondary(self) -> list[str]:
        return [str(t["secondary_status"]) for t in self.store.transitions(self.name)]


@pytest.fixture(autouse=True)
def no_process_started():
    """The point of this tier: the controller's rules run without starting a process."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not started, f"a controller unit test started processes: {started}"


@pytest.fixture
def make_job(tmp_path) -> Callable[..., Job]:
    def make(hosts: int = 2, runner: str = "plain", **fields: Any) -> Job:
        home = Home(str(tmp_path / "home"))
        os.makedirs(home.root, exist_ok=True)
        store = Store(home.db_path)
        out = str(tmp_path / "out")
        spec = validated(
            job_name="ctrl-job",
            code={"entry_point": "train.py", "source_dir": str(tmp_path)},
            instance_count=hosts,
            output_path="file://" + out,
            **fields,
        )
        job_dir = home.job_dir(spec.job_name)
        os.makedirs(job_dir)
        config = AgentConfig(
            job_name=spec.job_name,
            hosts=spec.hosts,
            addresses={},
            instance_type=spec.instance_type,
            num_cpus=1,
            num_gpus=0,
            hyperparameters={},
            input_data_config={},
            channel_sources={},
            submit_directory=str(tmp_path),
            entry_point="train.py",
            instances_dir=os.path.join(job_dir, "instances"),
            runner=runner,
        )
        with open(os.path.join(job_dir, "agent.json"), "w", encoding="utf-8") as fh:
            fh.write(config.to_json())
        store.create_job(spec, {}, job_dir, "inprocess", None)
        return Job(home, store, spec.job_name, out)

    return make
