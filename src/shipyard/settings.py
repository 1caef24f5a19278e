"""Every ``SHIPYARD_*`` environment variable, with its default and meaning, in one place.

Two kinds live here. ``user`` settings are knobs a user may set (in the shell, or in a
job's ``environment`` where they concern the instance). ``internal`` ones are set by
shipyard for its own processes (an agent for its runners, a runner for the user's
script); they are listed so nobody reuses a name by accident and so a reader can find
what each one carries.

Stdlib only: the agent and every runtime library import this module on start-up.
``tests/unit/house/test_settings.py`` fails when the code names a variable that is not
listed here, and when the README's table differs from ``markdown_table()``
(``python -m shipyard.settings --write README.md`` regenerates it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Audience = Literal["user", "internal"]


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None  # as the environment would hold it; None: unset unless given
    meaning: str
    audience: Audience = "user"


def _user(name: str, default: str | None, meaning: str) -> Setting:
    return Setting(name, default, meaning, "user")


def _internal(name: str, meaning: str) -> Setting:
    return Setting(name, None, meaning, "internal")


SETTINGS: tuple[Setting, ...] = (
    # -- where state lives, where jobs run -------------------------------------------------
    _user("SHIPYARD_HOME", "~/.shipyard", "Job store, logs, endpoints and artifacts."),
    _user("SHIPYARD_BACKEND", "local", "Where instances run: `local` or `ray`."),
    _user("SHIPYARD_RAY_ADDRESS", None, "Ray cluster address (else RAY_ADDRESS, then `auto`)."),
    _user(
        "SHIPYARD_RAY_WORKDIR",
        None,
        "A Ray node's work directory for instance trees (default under the node's temp dir).",
    ),
    _user("SHIPYARD_RAY_PLACEMENT_TIMEOUT", "60", "Seconds to wait for Ray to place instances."),
    _user("SHIPYARD_RAY_START_TIMEOUT", "300", "Seconds to wait for instance actors to start."),
    _user("SHIPYARD_RAY_PROBE_TIMEOUT", "5", "Seconds to wait when probing a Ray address."),
    _user(
        "SHIPYARD_SANDBOX",
        "auto",
        "`off`: run instances without namespaces (no /opt/ml, listeners on the host).",
    ),
    _user(
        "SHIPYARD_STOP_GRACE",
        "5",
        "Seconds between SIGTERM and SIGKILL when a job or instance is stopped.",
    ),
    _user(
        "SHIPYARD_STACKS_ON_SILENCE",
        None,
        "Seconds without log output or metrics after which every process's Python stack "
        "is dumped into the job's log (set it in the job's `environment`; local backend).",
    ),
    _user(
        "SHIPYARD_PROGRESS",
        "auto",
        "Progress of staging, installs, uploads, endpoint start: `auto` (bars on a terminal, "
        "plain lines otherwise), `plain`, or `off` (as `--quiet`).",
    ),
    _user(
        "SHIPYARD_LOG_NOISE",
        "hide",
        "`show` to print framework noise (TF C++ INFO, cuInit, NCCL INFO) with job logs; "
        "the log files always keep it.",
    ),
    # -- data and storage ------------------------------------------------------------------
    _user("SHIPYARD_DOWNLOAD_THREADS", "8", "Parallel downloads for File-mode channels."),
    _user("SHIPYARD_FASTFILE_CHUNK", "8388608", "Bytes fetched per read in FastFile mode."),
    _user("SHIPYARD_PIPE_WAIT_SECONDS", "600", "How long a Pipe-mode reader waits for its FIFO."),
    _user(
        "SHIPYARD_CHECKPOINT_SYNC_SECONDS",
        "10",
        "Interval of checkpoint uploads to checkpoint_s3_uri while a job runs.",
    ),
    _user(
        "SHIPYARD_TENSORBOARD_SYNC_SECONDS",
        "5",
        "Interval of TensorBoard uploads (tensorboard_output_config) while a job runs.",
    ),
    _user("SHIPYARD_S3_MAX_ATTEMPTS", "3", "boto3 retry attempts for S3 calls."),
    _user("SHIPYARD_S3_CONNECT_TIMEOUT", "3", "Seconds to connect to an S3 endpoint."),
    _user(
        "SHIPYARD_S3_MULTIPART_THRESHOLD",
        str(64 << 20),
        "Bytes above which S3 uploads/downloads move in parts (also the part size, min 5 MiB).",
    ),
    _user("SHIPYARD_S3_TRANSFER_THREADS", "8", "Parts of one S3 object moved in parallel."),
    _user(
        "SHIPYARD_SERVER_ACCESS_KEY",
        None,
        "`shipyard server`: the access key clients sign with (required off loopback).",
    ),
    _user(
        "SHIPYARD_SERVER_SECRET_KEY",
        None,
        "`shipyard server`: the secret key SigV4 signatures are checked against.",
    ),
    # -- distributions ---------------------------------------------------------------------
    _user("SHIPYARD_MPIRUN", None, "The mpirun to use (a path or a name on PATH)."),
    _user("SHIPYARD_MPI_RSH_PORT", "7179", "Port of the mpi launch server on Ray nodes."),
    _user(
        "SHIPYARD_HOROVOD_INIT_TIMEOUT", "120", "Seconds hvd.init() waits for every rank to start."
    ),
    _user(
        "SHIPYARD_HOROVOD_BACKEND", "auto", "Collectives under shipyard.horovod: auto, mpi, nccl."
    ),
    _user(
        "SHIPYARD_HOROVOD_ABORT_ON_ERROR",
        "1",
        "0: a rank's uncaught exception does not MPI_Abort the others.",
    ),
    _user(
        "SHIPYARD_HOROVOD_EXIT_GRACE_SECONDS",
        "5",
        "Seconds a rank waits at exit for peers stuck in a collective.",
    ),
    _user("SHIPYARD_HOROVOD_CUDA", None, "`host`: stage CUDA tensors through host memory."),
    _user("SHIPYARD_HOROVOD_SHIM", None, "`force`: use shipyard.horovod even if Horovod exists."),
    _user("SHIPYARD_SMDDP_SHIM", None, "`off`: leave the smdistributed shim off PYTHONPATH."),
    _user("SHIPYARD_TF_INTRA_OP_THREADS", None, "Intra-op threads of shipyard's TF servers."),
    _user("SHIPYARD_TF_INTER_OP_THREADS", None, "Inter-op threads of shipyard's TF servers."),
    _user("SHIPYARD_PS_TIMEOUT", "300", "Seconds without any reply before PSTimeoutError."),
    _user("SHIPYARD_PS_HEARTBEAT", "1", "shipyard.ps heartbeat interval in seconds (0: off)."),
    _user("SHIPYARD_PS_MAC", None, "shipyard.ps message authentication (default aes-gmac)."),
    _user("SHIPYARD_PS_POLICY", None, "shipyard.ps placement policy when none is given."),
    _user("SHIPYARD_PS_MALLOPT", None, "`0`: leave glibc's malloc settings alone in shipyard.ps."),
    _user("SHIPYARD_PS_LOG_LEVEL", "INFO", "Log level of shipyard.ps shards."),
    # -- serving ---------------------------------------------------------------------------
    _user("SHIPYARD_SERVING_CONFIG", None, "JSON file with model-server settings."),
    _user("SHIPYARD_SERVING_DEVICE", None, "`cpu`: serve on CPU even where CUDA is available."),
    # -- set by shipyard for its own processes ---------------------------------------------
    _internal("SHIPYARD_ATTEMPT", "The attempt number of this run of a job (1-based)."),
    _internal("SHIPYARD_MAX_RETRY_ATTEMPTS", "The job's max_retry_attempts, for the runners."),
    _internal("SHIPYARD_HOSTS", "algo-k=address pairs of the job, for name resolution."),
    _internal("SHIPYARD_CURRENT_HOST", "This instance's host name (algo-k)."),
    _internal(
        "SHIPYARD_PYTHON_RESOLVER", "`1`: resolve algo-k in Python (instances without a sandbox)."
    ),
    _internal(
        "SHIPYARD_PROCESS_NAME", "The agent's name for a process it started (stack dump labels)."
    ),
    _internal(
        "SHIPYARD_INIT_VIEW", "The filesystem view an instance's init builds (JSON, fsview)."
    ),
    _internal("SHIPYARD_INSTANCE_DIR", "This instance's tree on the host (/opt/ml in a sandbox)."),
    _internal("SHIPYARD_JOB_SECRET", "Per-job secret of TF servers' traffic counters."),
    _internal("SHIPYARD_DDP_SECRET", "Per-job secret of the DDP port announcement."),
    _internal("SHIPYARD_PS_SECRET", "Per-job key of shipyard.ps messages."),
    _internal("SHIPYARD_PS_ENDPOINTS", "Addresses of the shipyard.ps shards."),
    _internal("SHIPYARD_PS_RANK", "This shipyard.ps worker's rank."),
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
    _internal("SHIPYARD_SERVING_FD", "The listening socket a serving worker inherits."),
    _internal("SHIPYARD_SERVING_REPORT_FD", "The pipe a serving worker reports on."),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value, else its default; a name not listed above is a KeyError,
    so a new variable cannot be read without being documented."""
    setting = BY_NAME[name]
    env = os.environ if environ is None else environ
    return env.get(name, setting.default)


def markdown_table() -> str:
    """The README's table of user settings."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for s in SETTINGS:
        if s.audience == "user":
            default = f"`{s.default}`" if s.default is not None else "unset"
            rows.append(f"| `{s.name}` | {default} | {s.meaning} |")
    return "\n".join(rows) + "\n"


BEGIN = "<!-- settings:begin (generated by python -m shipyard.settings --write README.md) -->"
END = "<!-- settings:end -->"


def with_table(text: str) -> str:
    """``text`` (a README) with the part between the markers replaced by the table."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + markdown_table() + text[end:]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--write":
        with open(argv[1], encoding="utf-8") as fh:
            text = fh.read()
        with open(argv[1], "w", encoding="utf-8") as fh:
            fh.write(with_table(text))
        return 0
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
