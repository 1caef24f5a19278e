"""``estimator.training_job_analytics``: SageMaker's TrainingJobAnalytics over shipyard's
metric history (every metric_definitions match, kept with its time and host).

``dataframe()`` has SageMaker's columns ``timestamp`` (seconds since the job's training
started), ``metric_name`` and ``value``, plus ``host``; a pandas DataFrame when pandas
is installed, else a list of row dicts with the same keys.
"""

from __future__ import annotations

import csv
from typing import Any

from shipyard.control.client import ControlPlane


class TrainingJobAnalytics:
    """Metric history of one training job (``sagemaker.analytics.TrainingJobAnalytics``):
    every value the job's ``metric_definitions`` matched, with its time and host."""

    def __init__(
        self,
        training_job_name: str,
        metric_names: list[str] | None = None,
        sagemaker_session: Any = None,
        start_time: Any = None,
        end_time: Any = None,
        period: int | None = None,
        control: ControlPlane | None = None,
    ) -> None:
        """Read a job's metrics (lazily, on the first ``dataframe`` or ``rows``).

        Args:
            training_job_name: The job's name.
            metric_names: Only these metrics; default all.
            sagemaker_session: The shipyard.Session whose home holds the job.
            start_time: CloudWatch's window on SageMaker; accepted and ignored.
            end_time: CloudWatch's window on SageMaker; accepted and ignored.
            period: CloudWatch's aggregation period on SageMaker; accepted and ignored.
            control: The control plane to read from (shipyard's own; default the
                session's).
        """
        if control is None:
            control = sagemaker_session.control if sagemaker_session is not None else None
        self.control = control or ControlPlane()
        self.name = training_job_name
        self.metric_names = list(metric_names) if metric_names else None
        self._rows: list[dict[str, Any]] | None = None

    def rows(self, force_refresh: bool = False) -> list[dict[str, Any]]:
        """The metric values as dicts (``timestamp``, ``metric_name``, ``value``, ``host``).

        Args:
            force_refresh: Read the store again (a running job has new values).
        """
        if self._rows is None or force_refresh:
            record = self.control.get(self.name)
            start = record.start_time or record.created_at
            self._rows = [
                {
                    "timestamp": round(p["at"] - start, 3),
                    "metric_name": p["name"],
                    "value": p["value"],
                    "host": p["host"],
                }
                for p in self.control.store.metrics(self.name)
                if self.metric_names is None or p["name"] in self.metric_names
            ]
        return self._rows

    def dataframe(self, force_refresh: bool = False) -> Any:
        """The metric values as a pandas DataFrame (a list of row dicts without pandas).

        Args:
            force_refresh: Read the store again (a running job has new values).
        """
        rows = self.rows(force_refresh)
        try:
            import pandas as pd
        except ImportError:
            return rows
        return pd.DataFrame(rows, columns=["timestamp", "metric_name", "value", "host"])

    def export_csv(self, filename: str) -> None:
        """Write the metric values to a CSV file with a header row.

        Args:
            filename: The file to write.
        """
        with open(filename, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, ["timestamp", "metric_name", "value", "host"])
            writer.writeheader()
            writer.writerows(self.rows())

    def __repr__(self) -> str:
        return f"<TrainingJobAnalytics for {self.name}>"
