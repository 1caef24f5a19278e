"""A local-mode training project run as a shipyard training job.

The SDK has already laid out what its containers would mount: each service's
``/opt/ml/input/config`` (``hyperparameters.json`` as the SDK encodes it, with
``sagemaker_program`` and ``sagemaker_submit_directory``), the channels (local directories,
S3 data already downloaded by the SDK), the code directory when it is local, and one
``/opt/ml/model`` directory it collects afterwards. This module turns that into a shipyard job
on ``len(services)`` instances, streams its logs to stdout (which the SDK prints), and leaves
the model and output files where the SDK's ``retrieve_artifacts`` looks for them.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from typing import Any

from shipyard.errors import JobFailedError, ShipyardError
from shipyard.server.compose.project import ComposeError, Project, Service
from shipyard.server.errors import ApiError

LOCAL_CODE = "/opt/ml/code"


def _read_json(path: str, what: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ComposeError(f"cannot read the {what} the SDK wrote ({path}): {exc}") from None
    if not isinstance(data, dict):
        raise ComposeError(f"the {what} at {path} is not a JSON object")
    return data


def _framework(image: str, purpose: str) -> tuple[str, str | None, str | None]:
    """(framework, framework_version, py_version) of a SageMaker image URI."""
    from shipyard.server import images

    try:
        framework, version = images.parse(image, purpose)
    except ApiError as exc:
        raise ComposeError(exc.message) from None
    tag = image.rpartition(":")[2]
    py = next((p for p in tag.split("-") if p.startswith("py")), None)
    return framework, version, py


def fetch_code(submit: str | None, service: Service, scratch: str) -> str | None:
    """The host directory holding the script: the mounted local code directory, or the
    SDK's ``sourcedir.tar.gz`` fetched from S3 and unpacked under ``scratch``."""
    if submit in (None, "", LOCAL_CODE):
        return service.host_dir(LOCAL_CODE)
    if submit.startswith("/opt/ml/"):  # e.g. the code the SDK repacked into the model
        found = service.host_path(submit)
        if found is None:
            raise ComposeError(f"{submit} is not inside any volume of service {service.name}")
        return found
    if submit.startswith("file://"):
        return submit[len("file://") :]
    if submit.startswith("s3://"):
        bundle = os.path.join(scratch, "sourcedir.tar.gz")
        if not _download(submit, bundle):
            raise ComposeError(f"sagemaker_submit_directory {submit} does not exist")
        code = os.path.join(scratch, "code")
        os.makedirs(code)
        with tarfile.open(bundle) as tar:
            tar.extractall(code, filter="data")
        return code
    raise ComposeError(f"sagemaker_submit_directory {submit!r} is neither local nor s3://")


def estimator(project: Project, scratch: str) -> tuple[Any, dict[str, str], str]:
    """The shipyard estimator, channels and job name the project describes."""
    import shipyard
    from shipyard.server.training import decode_hyperparameters, distribution_from

    first = project.first
    config = os.path.join(first.host_dir("/opt/ml/input") or "", "config")
    try:
        hps = decode_hyperparameters(
            _read_json(os.path.join(config, "hyperparameters.json"), "hyperparameters")
        )
        distribution = distribution_from(hps)
    except ApiError as exc:
        raise ComposeError(exc.message) from None
    program = hps.get("sagemaker_program")
    if not isinstance(program, str) or not program:
        raise ComposeError("hyperparameters.json names no sagemaker_program (the entry point)")
    source = fetch_code(hps.get("sagemaker_submit_directory"), first, scratch)
    framework, version, py = _framework(first.image, "training")
    env = dict(first.environment)
    job_name = env.pop("TRAINING_JOB_NAME", "") or None
    kind = shipyard.TensorFlow if framework == "tensorflow" else shipyard.PyTorch
    extra = {"model_dir": False} if framework == "tensorflow" else {}  # the SDK passed its own
    est = kind(
        entry_point=program,
        source_dir=source,
        hyperparameters={k: v for k, v in hps.items() if not k.startswith("sagemaker_")},
        instance_count=len(project.services),
        instance_type="local_gpu" if first.gpu else "local",
        distribution=distribution or None,
        environment=env,  # artifacts stay under shipyard's default output path (describe)
        framework_version=version,
        py_version=py,
        **extra,
    )
    return est, first.channels, job_name or ""


def _unpack(archive: str, into: str) -> None:
    os.makedirs(into, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")


def deliver(project: Project, job_dir: str) -> None:
    """model.tar.gz into the SDK's model directory, output.tar.gz into algo-1's
    ``output/data`` (the SDK packs both again from there); shipyard keeps its own copies,
    which ``shipyard describe`` names."""
    model_dir = project.first.host_dir("/opt/ml/model")
    out_dir = project.first.host_dir("/opt/ml/output")
    model = os.path.join(job_dir, "model.tar.gz")
    if model_dir and os.path.exists(model):
        _unpack(model, model_dir)
    output = os.path.join(job_dir, "output.tar.gz")
    if out_dir and os.path.exists(output):
        _unpack(output, os.path.join(out_dir, "data"))


def _artifacts_dir(model_data: str, scratch: str) -> str:
    """A local directory holding the job's model.tar.gz and output.tar.gz: where shipyard
    wrote them, or a copy fetched from an s3:// output path."""
    if not model_data.startswith("s3://"):
        return os.path.dirname(model_data.removeprefix("file://"))
    into = os.path.join(scratch, "artifacts")
    os.makedirs(into, exist_ok=True)
    base = model_data.rsplit("/", 1)[0]
    for name in ("model.tar.gz", "output.tar.gz"):
        _download(f"{base}/{name}", os.path.join(into, name))
    return into


def _download(uri: str, dest: str) -> bool:
    """``uri`` (s3:// or local) copied to ``dest``; False when there is no such object."""
    from shipyard.storage.listing import store_for
    from shipyard.storage.uri import parse

    where = parse(uri)
    store = store_for(where)
    if not store.exists(where):
        return False
    store.download(store.info(where), dest)
    return True


def run(project: Project, compose_file: str) -> int:
    """Train; 0 when the job completed, 1 when it failed (its reason printed last)."""
    scratch = tempfile.mkdtemp(prefix="shipyard-local-", dir=os.path.dirname(compose_file))
    try:
        est, channels, job_name = estimator(project, scratch)
        try:
            est.fit(channels or None, job_name=job_name or None, logs=True)
        except JobFailedError as exc:
            print(f"shipyard: training job failed: {exc}", flush=True)
            _mark(project, "failure", str(exc))
            return 1
        name = est.latest_training_job.name
        deliver(project, _artifacts_dir(est.model_data or "", scratch))
        _mark(project, "success", "")
        print(f"shipyard: training job {name} completed (shipyard describe {name})", flush=True)
        return 0
    except ShipyardError as exc:
        print(f"shipyard: {exc}", flush=True)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _mark(project: Project, what: str, text: str) -> None:
    out_dir = project.first.host_dir("/opt/ml/output")
    if out_dir and os.path.isdir(out_dir):
        with open(os.path.join(out_dir, what), "w", encoding="utf-8") as fh:
            fh.write(text)
