"""_TrainingJob: the handle ``estimator.latest_training_job`` returns (SageMaker's _TrainingJob)."""

from __future__ import annotations

import sys
from typing import Any

from shipyard.control.client import ControlPlane
from shipyard.control.lifecycle import JobStatus
from shipyard.errors import JobFailedError


class TrainingJob:
    def __init__(self, control: ControlPlane, job_name: str) -> None:
        self.control = control
        self.job_name = job_name
        self.name = job_name

    def describe(self) -> dict[str, Any]:
        return self.control.describe(self.job_name)

    def wait(self, logs: Any = True) -> dict[str, Any]:
        record = self.control.wait(self.job_name, logs=_logs_on(logs), stream=sys.stdout)
        if record.status is JobStatus.FAILED:
            raise JobFailedError(record.name, record.status, record.failure_reason)
        return self.describe()

    def stop(self) -> None:
        self.control.stop(self.job_name)

    def logs(self) -> None:
        self.control.wait(self.job_name, logs=True, stream=sys.stdout)

    def __repr__(self) -> str:
        return f"TrainingJob({self.job_name!r})"


def _logs_on(logs: Any) -> bool:
    if isinstance(logs, str):
        return logs.lower() not in ("none", "false", "")
    return bool(logs)
