"""Every ``SHIPYARD_*`` environment variable, with its default and meaning, in one place,
and the one module that reads them.

Each entry says what values it accepts (``kind``, ``choices``, ``minimum``); code reads a
value through a typed accessor (``number``, ``integer``, ``flag``, ``text``, the
``optional_*`` forms, ``get`` for raw text, ``take`` for a secret that children must not
inherit), so a default is written once and a bad value is refused in the same words
wherever it is used: a ``SettingError`` naming the variable, the value and what it
accepts. Nothing is read at import time. ``shipyard doctor --settings`` prints every
setting, its value and where it came from (``report()``).

Two kinds live here. ``user`` settings are knobs a user may set (in the shell, or in a
job's ``environment`` where they concern the instance). ``internal`` ones are set by
shipyard for its own processes (an agent for its runners, a runner for the user's
script); they are listed so nobody reuses a name by accident and so a reader can find
what each one carries.

Stdlib only: the agent and every runtime library import this module on start-up.
``tests/unit/house/test_settings.py`` fails when the code names a variable that is not
listed here, and when any other module reads one from ``os.environ`` (the two job-process
``sitecustomize`` hooks and an instance's init excepted: they must run before shipyard is
importable). The documentation site's settings reference is generated from ``SETTINGS``
(``docs/_hooks/reference.py``); ``python -m shipyard.settings`` prints the user settings as
a Markdown table.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shipyard.errors import SettingError

if TYPE_CHECKING:  # typing.Literal is 3.8+; job processes may run in Python 3.7
    from typing import Literal

    Audience = Literal["user", "internal"]
    Kind = Literal["text", "int", "float", "flag", "choice"]
    Source = Literal["env", "default", "unset"]

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One variable: its name, default (as the environment would hold it), meaning, and
    what values it accepts (``kind``, ``choices``, ``minimum``): everything about it in one
    entry, so a default is written once and a bad value is refused in the same words
    wherever it is read."""

    name: str
    default: str | None  # None: unset unless given
    meaning: str
    audience: Audience = "user"
    kind: Kind = "text"
    choices: tuple[str, ...] = ()
    minimum: float | None = None

    def accepts(self) -> str:
        """What a valid value looks like, for error messages and ``doctor --settings``."""
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "flag":
            return "1/true/yes/on or 0/false/no/off"
        what = {"int": "an integer", "float": "a number", "text": "any text"}[self.kind]
        if self.minimum is not None:
            bound = int(self.minimum) if self.minimum == int(self.minimum) else self.minimum
            what += f" >= {bound}"
        return what

    def parse(self, raw: str) -> int | float | bool | str:
        """``raw`` as this setting's type; SettingError naming the variable if it is not one."""
        value: int | float | bool | str
        text = raw.strip()
        try:
            if self.kind == "int":
                value = int(text)
            elif self.kind == "float":
                value = float(text)
                if not math.isfinite(value):
                    raise ValueError(text)
            elif self.kind == "flag":
                if text.lower() not in TRUE + FALSE:
                    raise ValueError(text)
                value = text.lower() in TRUE
            elif self.kind == "choice":
                folded = {c.lower(): c for c in self.choices}
                if text.lower() not in folded:
                    raise ValueError(text)
                value = folded[text.lower()]
            else:
                value = raw
        except ValueError:
            raise self._bad(raw) from None
        if self.minimum is not None and isinstance(value, (int, float)) and value < self.minimum:
            raise self._bad(raw)
        return value

    def _bad(self, raw: str) -> SettingError:
        default = f"unset it for the default {self.default!r}" if self.default else "unset it"
        return SettingError(
            f"{self.name}={raw!r} is not valid: it accepts {self.accepts()} "
            f"({self.meaning.rstrip('.')}). Fix the value or {default}."
        )


def _user(
    name: str,
    default: str | None,
    meaning: str,
    kind: Kind = "text",
    choices: tuple[str, ...] = (),
    minimum: float | None = None,
) -> Setting:
    return Setting(name, default, meaning, "user", kind, choices, minimum)


def _internal(
    name: str, meaning: str, kind: Kind = "text", minimum: float | None = None
) -> Setting:
    return Setting(name, None, meaning, "internal", kind, (), minimum)


SETTINGS: tuple[Setting, ...] = (
    # -- where state lives, where jobs run -------------------------------------------------
    _user("SHIPYARD_HOME", "~/.shipyard", "Job store, logs, endpoints and artifacts."),
    _user(
        "SHIPYARD_BACKEND",
        "local",
        "Where instances run: `local` or `ray`.",  # or ray@<address>: backends.get checks it
    ),
    _user("SHIPYARD_RAY_ADDRESS", None, "Ray cluster address (else RAY_ADDRESS, then `auto`)."),
    _user(
        "SHIPYARD_RAY_WORKDIR",
        None,
        "A Ray node's work directory for instance trees (default under the node's temp dir).",
    ),
    _user(
        "SHIPYARD_RAY_PLACEMENT_TIMEOUT",
        "60",
        "Seconds to wait for Ray to place instances.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_RAY_START_TIMEOUT",
        "300",
        "Seconds to wait for instance actors to start.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_RAY_PROBE_TIMEOUT",
        "5",
        "Seconds to wait when probing a Ray address.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_SANDBOX",
        "auto",
        "`off`: run instances without namespaces (no /opt/ml, listeners on the host).",
        kind="choice",
        choices=("auto", "on", "1", "true", "yes", "off", "0", "false", "no"),
    ),
    _user(
        "SHIPYARD_STOP_GRACE",
        "5",
        "Seconds between SIGTERM and SIGKILL when a job or instance is stopped.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_STACKS_ON_SILENCE",
        None,
        "Seconds without log output or metrics after which every process's Python stack "
        "is dumped into the job's log (set it in the job's `environment`; local backend).",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_PROGRESS",
        "auto",
        "Progress of staging, installs, uploads, endpoint start: `auto` (bars on a terminal, "
        "plain lines otherwise), `plain`, or `off` (as `--quiet`).",
        kind="choice",
        choices=("auto", "plain", "off"),
    ),
    _user(
        "SHIPYARD_CUSTOM_INSTANCE_FAMILIES",
        "",
        "Instance families beyond SageMaker's to accept (comma-separated, e.g. `q9,z2`); "
        "sized as an ml.m family. Others (`ml.q9.xlarge`) are refused at submission.",
    ),
    _user(
        "SHIPYARD_LOG_NOISE",
        "hide",
        "`show` to print framework noise (TF C++ INFO, cuInit, NCCL INFO) with job logs; "
        "the log files always keep it.",
        kind="choice",
        choices=("hide", "show", "all", "1", "yes", "0", "no"),
    ),
    # -- data and storage ------------------------------------------------------------------
    _user(
        "SHIPYARD_DOWNLOAD_THREADS",
        "8",
        "Parallel downloads for File-mode channels.",
        kind="int",
        minimum=1,
    ),
    _user(
        "SHIPYARD_FASTFILE_CHUNK",
        "8388608",
        "Bytes fetched per read in FastFile mode.",
        kind="int",
        minimum=1,
    ),
    _user(
        "SHIPYARD_PIPE_WAIT_SECONDS",
        "600",
        "How long a Pipe-mode reader waits for its FIFO.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_CHECKPOINT_SYNC_SECONDS",
        "10",
        "Interval of checkpoint uploads to checkpoint_s3_uri while a job runs.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_TENSORBOARD_SYNC_SECONDS",
        "5",
        "Interval of TensorBoard uploads (tensorboard_output_config) while a job runs.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_S3_MAX_ATTEMPTS", "3", "boto3 retry attempts for S3 calls.", kind="int", minimum=1
    ),
    _user(
        "SHIPYARD_S3_CONNECT_TIMEOUT",
        "3",
        "Seconds to connect to an S3 endpoint.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_UPLOAD_PATIENCE",
        "3600",
        "Seconds a finished job's artifact upload keeps retrying an S3 endpoint that does not "
        "answer (a restarted `shipyard server`), at most the job's max_run.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_S3_MULTIPART_THRESHOLD",
        str(64 << 20),
        "Bytes above which S3 uploads/downloads move in parts (also the part size, min 5 MiB).",
        kind="int",
        minimum=5 << 20,
    ),
    _user(
        "SHIPYARD_S3_TRANSFER_THREADS",
        "8",
        "Parts of one S3 object moved in parallel.",
        kind="int",
        minimum=1,
    ),
    _user(
        "SHIPYARD_SERVER_ACCESS_KEY",
        None,
        "`shipyard server`: the access key clients sign with (required off loopback).",
    ),
    _user(
        "SHIPYARD_SERVER_SECRET_KEY",
        None,
        "`shipyard server`: the secret key SigV4 signatures are checked against "
        "(unset: one made per SHIPYARD_HOME, printed by `shipyard server env`).",
    ),
    _user(
        "SHIPYARD_SERVER_HOSTNAMES",
        None,
        "`shipyard server`: more names clients may call it by (comma-separated), "
        "beyond loopback names and its bound address.",
    ),
    # -- distributions ---------------------------------------------------------------------
    _user("SHIPYARD_MPIRUN", None, "The mpirun to use (a path or a name on PATH)."),
    _user(
        "SHIPYARD_MPI_RSH_PORT",
        "7179",
        "Port of the mpi launch server on Ray nodes.",
        kind="int",
        minimum=1,
    ),
    _user(
        "SHIPYARD_HOROVOD_INIT_TIMEOUT",
        "120",
        "Seconds hvd.init() waits for every rank to start.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_HOROVOD_BACKEND",
        "auto",
        "Collectives under shipyard.horovod: auto, mpi, nccl.",
        kind="choice",
        choices=("auto", "self", "mpi", "nccl"),
    ),
    _user(
        "SHIPYARD_HOROVOD_ABORT_ON_ERROR",
        "1",
        "0: a rank's uncaught exception does not MPI_Abort the others.",
        kind="flag",
    ),
    _user(
        "SHIPYARD_HOROVOD_EXIT_GRACE_SECONDS",
        "5",
        "Seconds a rank waits at exit for peers stuck in a collective.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_HOROVOD_CUDA",
        None,
        "`host`: stage CUDA tensors through host memory.",
        kind="choice",
        choices=("host",),
    ),
    _user(
        "SHIPYARD_HOROVOD_SHIM",
        None,
        "`force`: use shipyard.horovod even if Horovod exists.",
        kind="choice",
        choices=("force",),
    ),
    _user(
        "SHIPYARD_SMDDP_SHIM",
        None,
        "`off`: leave the smdistributed shim off PYTHONPATH.",
        kind="choice",
        choices=("off", "on"),
    ),
    _user(
        "SHIPYARD_TF_INTRA_OP_THREADS",
        None,
        "Intra-op threads of shipyard's TF servers.",
        kind="int",
        minimum=0,
    ),
    _user(
        "SHIPYARD_TF_INTER_OP_THREADS",
        None,
        "Inter-op threads of shipyard's TF servers.",
        kind="int",
        minimum=0,
    ),
    _user(
        "SHIPYARD_PS_TIMEOUT",
        "300",
        "Seconds without any reply before PSTimeoutError.",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_PS_HEARTBEAT",
        "1",
        "shipyard.ps heartbeat interval in seconds (0: off).",
        kind="float",
        minimum=0,
    ),
    _user(
        "SHIPYARD_CGROUPS",
        "auto",
        "`off`: instances get no cgroup (no CPU, memory or process limits by instance type).",
        kind="choice",
        choices=("auto", "on", "off", "0", "false", "no"),
    ),
    _user(
        "SHIPYARD_PIDS_MAX",
        "4096",
        "Processes (and threads) one instance may hold at once; a fork bomb fails its own job.",
        kind="int",
        minimum=1,
    ),
    _user(
        "SHIPYARD_GPUS",
        None,
        "The GPUs to divide between instances (`0,1,2,3` or `none`) instead of nvidia-smi's.",
    ),
    _user(
        "SHIPYARD_GPU_SHARING",
        "wait",
        "A GPU another running job holds: `wait` for it, or `share` it (your consent).",
        kind="choice",
        choices=("wait", "share"),
    ),
    _user(
        "SHIPYARD_GPU_LEASES",
        None,
        "Directory of the machine-wide GPU leases (default: <tmp>/shipyard-gpu-leases).",
    ),
    _user(
        "SHIPYARD_UTILIZATION_INTERVAL",
        "5",
        "Seconds between samples of each instance's CPU, memory, disk, network and GPU use.",
        kind="float",
        minimum=0.1,
    ),
    _user(
        "SHIPYARD_FRAMEWORK_ENVS",
        "auto",
        "`auto` (or `on`): a job asking for a framework_version other than the installed one "
        "runs in an environment of it (or the nearest with the same API), built by uv as the "
        "job's first phase on first use and cached; `off`: every job runs on the installed "
        "framework.",
        kind="choice",
        choices=("auto", "off", "on"),
    ),
    _user(
        "SHIPYARD_ENVIRONMENTS_DIR",
        None,
        "Where framework environments are built and cached (default: "
        "<SHIPYARD_HOME>/environments); homes, and Ray nodes, pointing at one directory share "
        "one build.",
    ),
    _user(
        "SHIPYARD_FRAMEWORK_EXACT",
        "0",
        "`1`: a job runs the framework_version it asks for or fails naming why; never the "
        "nearest release of the same API nor the installed one in its place (the default says "
        "which ran in the log, describe and the FailureReason).",
        kind="flag",
    ),
    _user(
        "SHIPYARD_PYTORCH_INDEX_URL",
        "https://download.pytorch.org/whl/cpu",
        "The package index PyTorch framework environments install from (its CPU builds: "
        "PyPI's Linux torch pulls several GB of CUDA packages); a mirror of it where that "
        "index cannot be reached.",
    ),
    _user("SHIPYARD_PS_MAC", None, "shipyard.ps message authentication (default aes-gmac)."),
    _user("SHIPYARD_PS_POLICY", None, "shipyard.ps placement policy when none is given."),
    _user(
        "SHIPYARD_PS_MALLOPT",
        None,
        "`0`: leave glibc's malloc settings alone in shipyard.ps.",
        kind="flag",
    ),
    _user(
        "SHIPYARD_PS_LOG_LEVEL",
        "INFO",
        "Log level of shipyard.ps shards.",
        kind="choice",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    ),
    # -- serving ---------------------------------------------------------------------------
    _user("SHIPYARD_SERVING_CONFIG", None, "JSON file with model-server settings."),
    _user(
        "SHIPYARD_SERVING_DEVICE",
        None,
        "`cpu`: serve on CPU even where CUDA is available.",
        kind="choice",
        choices=("cpu", "auto"),
    ),
    # -- set by shipyard for its own processes ---------------------------------------------
    _internal(
        "SHIPYARD_ATTEMPT",
        "The attempt number of this run of a job (1-based).",
        kind="int",
        minimum=1,
    ),
    _internal(
        "SHIPYARD_MAX_RETRY_ATTEMPTS",
        "The job's max_retry_attempts, for the runners.",
        kind="int",
        minimum=0,
    ),
    _internal("SHIPYARD_HOSTS", "algo-k=address pairs of the job, for name resolution."),
    _internal("SHIPYARD_CURRENT_HOST", "This instance's host name (algo-k)."),
    _internal(
        "SHIPYARD_PYTHON_RESOLVER", "`1`: resolve algo-k in Python (instances without a sandbox)."
    ),
    _internal(
        "SHIPYARD_PROCESS_NAME", "The agent's name for a process it started (stack dump labels)."
    ),
    _internal(
        "SHIPYARD_INSTANCE_GPUS", "How many GPUs this instance got (backends.resources).", "int", 0
    ),
    _internal(
        "SHIPYARD_INIT_VIEW", "The filesystem view an instance's init builds (JSON, fsview)."
    ),
    _internal("SHIPYARD_LAUNCH", "How the launcher starts a job's process (sandbox/launch.py)."),
    _internal(
        "SHIPYARD_JOB_ENV",
        "Prefix (``SHIPYARD_JOB_ENV:NAME``) of a job's variables on their way through the "
        "launcher, applied only at the job's own exec (sandbox/launch.py).",
    ),
    _internal("SHIPYARD_INSTANCE_DIR", "This instance's tree on the host (/opt/ml in a sandbox)."),
    _internal("SHIPYARD_JOB_SECRET", "Per-job secret of TF servers' traffic counters."),
    _internal("SHIPYARD_DDP_SECRET", "Per-job secret of the DDP port announcement."),
    _internal("SHIPYARD_PS_SECRET", "Per-job key of shipyard.ps messages."),
    _internal("SHIPYARD_PS_ENDPOINTS", "Addresses of the shipyard.ps shards."),
    _internal("SHIPYARD_PS_RANK", "This shipyard.ps worker's rank.", kind="int", minimum=0),
    _internal("SHIPYARD_PS_LOCAL_RANK", "This shipyard.ps worker's rank on its instance."),
    _internal("SHIPYARD_PS_NUM_WORKERS", "How many shipyard.ps workers the job has."),
    _internal("SHIPYARD_PS_REPORT", "Where rank 0 writes the shipyard.ps report on close."),
    _internal("SHIPYARD_REPORT_PATH", "Where a distribution writes its placement report."),
    _internal("SHIPYARD_PEER_LABEL", "The label of a process in the traffic matrix."),
    _internal("SHIPYARD_TF_PLACEMENT_FILE", "Where the TF chief records variable placement."),
    _internal("SHIPYARD_KERAS_MWMS_COMPAT", "Turns on Keras 3 compatibility under MWMS."),
    _internal(
        "SHIPYARD_BIND_ADDRESS",
        "Ray: the node's cluster address, which the bind shim puts wildcard TCP binds on.",
    ),
    _internal("SHIPYARD_MPI_LAUNCH", "`rsh`: mpirun reaches other nodes via the launch server."),
    _internal("SHIPYARD_MPI_PLAN", "The mpi launch plan file of a rank."),
    _internal("SHIPYARD_MPI_RUN_DIR", "Directory where mpi ranks record that they started."),
    _internal("SHIPYARD_ENDPOINT", "The endpoint a model-server process serves."),
    _internal(
        "SHIPYARD_SERVING_FD",
        "The listening socket a serving worker inherits.",
        kind="int",
        minimum=0,
    ),
    _internal(
        "SHIPYARD_SERVING_REPORT_FD", "The pipe a serving worker reports on.", kind="int", minimum=0
    ),
    _internal(
        "SHIPYARD_SERVING_LOAD_FIRST",
        "A replacement serving worker loads its model before it takes connections.",
        kind="flag",
    ),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def _raw(name: str, environ: Mapping[str, str] | None) -> tuple[Setting, str | None, Source]:
    """The entry, the text in force and where it came from. An empty value counts as
    unset (``VAR= cmd`` is how a shell clears one); a name not listed above is a KeyError,
    so a new variable cannot be read without being documented."""
    setting = BY_NAME[name]
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is not None and raw != "":
        return setting, raw, "env"
    if setting.default is not None:
        return setting, setting.default, "default"
    return setting, None, "unset"


def _typed(
    name: str, environ: Mapping[str, str] | None, kind: Kind
) -> int | float | bool | str | None:
    setting, raw, _ = _raw(name, environ)
    if setting.kind != kind:
        raise TypeError(f"{name} is a {setting.kind} setting, not {kind}")
    return None if raw is None else setting.parse(raw)


def _required(name: str, value: object) -> object:
    if value is None:
        setting = BY_NAME[name]
        who = "shipyard sets it for its own processes" if setting.audience == "internal" else ""
        raise SettingError(
            f"{name} is not set ({setting.meaning.rstrip('.')}); "
            + (who or f"set it to {setting.accepts()}")
        )
    return value


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's text, else its default, else None (no parsing: text settings and
    callers that pass a value through untouched)."""
    return _raw(name, environ)[1]


def optional_text(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """A text or choice setting, checked (a choice comes back as spelled in its entry);
    None when it is unset and has no default."""
    setting, raw, _ = _raw(name, environ)
    if setting.kind not in ("text", "choice"):
        raise TypeError(f"{name} is a {setting.kind} setting, not text")
    return None if raw is None else str(setting.parse(raw))


def text(name: str, environ: Mapping[str, str] | None = None) -> str:
    """A text or choice setting that has a default or must be set (SettingError if not)."""
    return str(_required(name, optional_text(name, environ)))


def integer(name: str, environ: Mapping[str, str] | None = None) -> int:
    """An ``int`` setting's value; SettingError if it is malformed or unset without default."""
    value = _required(name, _typed(name, environ, "int"))
    assert isinstance(value, int)
    return value


def optional_integer(name: str, environ: Mapping[str, str] | None = None) -> int | None:
    value = _typed(name, environ, "int")
    assert value is None or isinstance(value, int)
    return value


def number(name: str, environ: Mapping[str, str] | None = None) -> float:
    """A ``float`` setting's value; SettingError if it is malformed or unset without default."""
    value = _required(name, _typed(name, environ, "float"))
    assert isinstance(value, float)
    return value


def optional_number(name: str, environ: Mapping[str, str] | None = None) -> float | None:
    value = _typed(name, environ, "float")
    assert value is None or isinstance(value, float)
    return value


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool | None:
    """A yes/no setting; None when it is unset and has no default."""
    value = _typed(name, environ, "flag")
    assert value is None or isinstance(value, bool)
    return value


def take(name: str) -> str | None:
    """Read a secret and remove it from this process's environment, so that nothing this
    process starts inherits it (the job secrets of the DDP rendezvous and ranks)."""
    value = get(name)
    os.environ.pop(name, None)
    return value


def report(
    environ: Mapping[str, str] | None = None,
) -> list[tuple[Setting, str | None, Source, str]]:
    """Every setting, the text in force, where it came from, and ``ok`` or the problem
    with its value (what ``shipyard doctor --settings`` prints)."""
    rows: list[tuple[Setting, str | None, Source, str]] = []
    for setting in SETTINGS:
        _, raw, source = _raw(setting.name, environ)
        problem = "ok"
        if raw is not None:
            try:
                setting.parse(raw)
            except SettingError as err:
                problem = str(err)
        rows.append((setting, raw, source, problem))
    return rows


def markdown_table() -> str:
    """The user settings as a Markdown table (``python -m shipyard.settings``)."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for s in SETTINGS:
        if s.audience == "user":
            default = f"`{s.default}`" if s.default is not None else "unset"
            rows.append(f"| `{s.name}` | {default} | {s.meaning} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
