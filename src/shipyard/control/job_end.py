"""What a job leaves behind beside its status: the artifacts, its warnings, the agents'
records.

The supervisor decides how a job ends; this module writes what that end leaves and
reads it back for describe. Split from the supervisor (issue 26) because the two change
for different reasons: the ending rules follow SageMaker's lifecycle, while these files
follow what describe and the dashboard show:

* the model and output artifacts (``artifacts.save``), uploaded when the job completed or
  ran out of time, with a warning when no instance saved a model; an S3 endpoint that is
  away is waited for (the job's log and StatusMessage say so) for the job's max_run, at
  most ``SHIPYARD_UPLOAD_PATIENCE``, and what still cannot be saved is one line for the
  FailureReason (issue 37);
* warnings, said where a user looks: the attached console, algo-1's log and describe
  (``warnings.json`` in the job directory);
* the distribution report (algo-1's first) copied to the job directory, and the
  non-critical processes the agents lost, read back from each instance's tree.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TextIO

from shipyard import settings
from shipyard.control import disk_full, job_disks
from shipyard.control.home import Home
from shipyard.control.lifecycle import Event, IllegalTransition
from shipyard.control.store import JobRecord, Store
from shipyard.errors import StorageError
from shipyard.jobplan.layout import InstancePaths
from shipyard.runtime import safepath
from shipyard.storage.retry import Patience

REPORT_NAME = "distribution-report.json"
RECORD_LIMIT = 1 << 20  # an agent's record in the instance's tree: lost processes, protections
REPORT_LIMIT = 64 << 20  # a distribution report (every variable's placement and traffic)
WARNINGS_NAME = "warnings.json"
EMPTY_MODEL_WARNING = (
    "No model artifact was saved under /opt/ml/model (SM_MODEL_DIR) on any instance: "
    "model.tar.gz is empty and there is nothing to deploy. Save the trained model under "
    "os.environ['SM_MODEL_DIR'] (with TensorFlow, --model_dir is the checkpoint location, "
    "not the model to deploy)."
)


def instance_paths(job_dir: str, host: str) -> InstancePaths:
    return InstancePaths(os.path.join(job_dir, "instances", host))


def lost_processes(job_dir: str, hosts: list[str]) -> list[dict]:
    """Non-critical processes that died while their instance went on (agent lost files)."""
    out = []
    for host in hosts:
        path = instance_paths(job_dir, host).lost_file
        try:  # the instance's tree is the job's: read without following its links
            text = safepath.read_text(job_dir, path, RECORD_LIMIT)
        except OSError:
            continue
        for line in text.splitlines():
            try:
                out.append(dict(json.loads(line), host=host))
            except (ValueError, TypeError):
                continue
    return out


def missing_protections(job_dir: str, hosts: list[str]) -> list[dict]:
    """The sandbox protections each instance ran without, and why (issue 31); an
    instance without a disk of VolumeSizeInGB is one (control.job_disks)."""
    disks = job_disks.read_record(job_dir)
    out = []
    for host in hosts:
        entry = (disks or {}).get(host) or {}
        if disks is None or not entry:  # no disk planned (before issue 37, never launched)
            out.append({"Host": host, "Missing": disk_full.NO_VOLUME})
        elif entry.get("Missing"):
            out.append({"Host": host, "Missing": job_disks.missing_text(str(entry["Missing"]))})
        path = instance_paths(job_dir, host).missing_protections_file
        try:
            text = safepath.read_text(job_dir, path, RECORD_LIMIT)
            out += [{"Host": host, "Missing": str(m)} for m in json.loads(text)]
        except (OSError, ValueError, TypeError):
            continue
    return out


def job_warnings(job_dir: str) -> list[str]:
    """What the job's end found worth a warning (describe's Shipyard.Warnings)."""
    try:
        with open(os.path.join(job_dir, WARNINGS_NAME), encoding="utf-8") as fh:
            return [str(w) for w in json.load(fh)]
    except (OSError, ValueError):
        return []


class JobEnd:
    """Writes what one job's end leaves. ``first_log`` names algo-1's current log (the
    attempt's own once instances run, the job's first before)."""

    def __init__(
        self,
        home: Home,
        store: Store,
        record: JobRecord,
        stream: TextIO | None,
        first_log: Callable[[], str],
    ) -> None:
        self.home = home
        self.store = store
        self.record = record
        self.stream = stream
        self.first_log = first_log

    @property
    def hosts(self) -> list[str]:
        return self.record.spec.hosts

    def say(self, line: str) -> None:
        """``line`` on the attached console and in algo-1's log (what ``shipyard logs`` and
        the SDK's ``logs()`` show)."""
        text = line if line.endswith("\n") else line + "\n"
        if self.stream is not None:
            self.stream.write(text)
        path = self.first_log()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # the job's records are out of its reach; a link at the name is refused all the same
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            with open(fd, "a", encoding="utf-8") as fh:
                fh.write(text)
        except OSError:
            pass

    def warn(self, message: str) -> None:
        """Say ``message`` in the job log, on the console, and in describe."""
        self.say(f"[shipyard] WARNING: {message}")
        path = os.path.join(self.record.job_dir, WARNINGS_NAME)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(job_warnings(self.record.job_dir) + [message], fh)
        os.replace(tmp, path)

    def collect_agent_records(self) -> None:
        """Copy the distribution report (algo-1's first) to the job dir; it and the lost
        processes recorded by the agents are what describe shows beyond SageMaker."""
        job_dir = self.record.job_dir
        for host in self.hosts:
            report = instance_paths(job_dir, host).report_file
            try:  # from the job's tree: no link followed, a regular file only
                data = safepath.read_text(job_dir, report, REPORT_LIMIT)
            except OSError:
                continue
            safepath.write_text(job_dir, os.path.join(job_dir, REPORT_NAME), data)
            break
        lost = lost_processes(job_dir, self.hosts)
        if lost and self.stream is not None:
            self.stream.write(
                "shipyard: lost during training (the job went on without "
                "them): "
                + ", ".join(f"{x['host']}/{x['process']} (status {x['exit_code']})" for x in lost)
                + "\n"
            )

    def patience(self, should_stop: Callable[[], bool]) -> Patience:
        """How long the upload waits for a store that is away: the job's max_run, at most
        SHIPYARD_UPLOAD_PATIENCE; each wait said in the log and as the StatusMessage."""
        cap = settings.number("SHIPYARD_UPLOAD_PATIENCE")
        max_run = self.record.spec.max_run
        return Patience(
            min(float(max_run), cap),
            f"the job's max_run={max_run} s, at most SHIPYARD_UPLOAD_PATIENCE={cap:g} s",
            self.waiting,
            should_stop,
        )

    def waiting(self, message: str) -> None:
        """A wait for the store, said in algo-1's log and as the job's StatusMessage."""
        self.say(f"[shipyard] {message}")
        try:
            self.store.transition(self.record.name, Event.UPLOADING, message[:1024])
        except IllegalTransition:
            pass  # ended meanwhile: the log has it

    def not_saved(self, reason: str, stopping: bool) -> JobRecord:
        """The job's end when its artifacts could not be saved (``upload``'s reason):
        Stopped when a stop ended the wait for the store, else Failed."""
        name = self.record.name
        if stopping:
            if not self.store.get(name).terminal:
                self.store.transition(name, Event.STOP_REQUESTED, "Stop requested")
            return self.store.transition(
                name, Event.STOPPED, "Training job stopped", failure_reason=reason
            )
        return self.store.transition(
            name, Event.FAILED, "Artifacts could not be saved", failure_reason=reason
        )

    def upload(self, should_stop: Callable[[], bool] = lambda: False) -> str | None:
        """Archive every instance's model and output directories and upload them; None
        when saved, else the one-line reason (a full disk, a store away past the job's
        patience, a bucket gone) for the FailureReason, never a traceback."""
        # here, not at the top: describe reads this module's records without staging's
        # and pydantic's start-up (issue 40)
        from shipyard.control import artifacts

        paths = [instance_paths(self.record.job_dir, h) for h in self.hosts]
        spec = self.record.spec
        # artifacts.save shows its own bars (bytes archived, then uploaded)
        try:
            model, output = artifacts.save(
                spec.output_path or self.home.default_output_path,
                self.record.name,
                [(h, p.model) for h, p in zip(self.hosts, paths)],
                [(h, p.output_data) for h, p in zip(self.hosts, paths)],
                scratch_root=os.path.join(self.record.job_dir, artifacts.SCRATCH_DIR),
                root=self.record.job_dir,  # below it, the instances' trees: links not followed
                patience=self.patience(should_stop),
            )
        except StorageError as exc:
            reason = (
                f"the model artifacts could not be saved: {exc} (every instance's model/ and "
                f"output/data/ are kept under {os.path.join(self.record.job_dir, 'instances')})"
            )
            self.say(f"[shipyard] ERROR: {reason}")
            return reason[:1024]
        self.store.update(self.record.name, model_artifact=model.uri, output_artifact=output.uri)
        for result in (model, output):
            for link in result.skipped:
                self.say(
                    f"[shipyard] not archived in {os.path.basename(result.path)}: a link "
                    f"out of the instance's tree ({link})"
                )
        if model.files == 0:
            self.warn(EMPTY_MODEL_WARNING)
        if self.stream is not None and model.conflicts:
            self.stream.write(
                "shipyard: several instances wrote the same model file; kept "
                "algo-1's: " + "; ".join(model.conflicts[:5]) + "\n"
            )
        return None
