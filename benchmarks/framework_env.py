"""Framework environments: first-use build and cached start (issue 28).

Resolves ``framework_version`` (default the workshop's 2.4.1) against the registry, builds
its environment with uv into a fresh root (the first build), asks again (the cached start:
what every later job pays), and checks which TensorFlow and Keras the environment holds.
uv's own wheel cache is whatever this machine has: run with ``UV_CACHE_DIR`` set to an
empty directory for a cold-registry figure.

    .venv/bin/python benchmarks/framework_env.py [--version 2.4.1] [--root DIR]

``--jobs``: the same through whole jobs (the job's first phase, issue 28): how long
submission takes (it returns before the build), the phase on first use and cached (from
the job's SecondaryStatusTransitions: the environment's Downloading message to Training),
and a job whose requirements.txt adds a package (one more environment, keyed by the
requirements' hash, built from uv's warm cache).

    .venv/bin/python benchmarks/framework_env.py --jobs [--version 2.4.1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from shipyard.environments import builder, job


def _phase_seconds(desc: dict) -> float:
    """From the first transition naming the environment to Training."""
    ts = desc["SecondaryStatusTransitions"]
    start = next(
        (t for t in ts if "framework environment" in t["StatusMessage"]),
        next(t for t in ts if t["Status"] == "Downloading"),  # no environment: the baseline
    )
    train = next(t for t in ts if t["Status"] == "Training")
    return (train["StartTime"] - start["StartTime"]).total_seconds()


def jobs(version: str) -> None:
    """Whole jobs through the control plane, on a fresh home and environments root."""
    import os

    home = tempfile.mkdtemp(prefix="shipyard-bench-home-")
    os.environ["SHIPYARD_HOME"] = home
    os.environ["SHIPYARD_ENVIRONMENTS_DIR"] = os.path.join(home, "envs")
    import shipyard

    src = os.path.join(home, "src")
    os.makedirs(src)
    with open(os.path.join(src, "train.py"), "w") as fh:
        fh.write("import sys\nprint(sys.prefix)\n")
    session = shipyard.Session(home=home)
    out: dict[str, float] = {}

    def run(name: str, asked: str | None = version) -> dict:
        est = shipyard.TensorFlow(
            entry_point="train.py",
            source_dir=src,
            instance_count=1,
            instance_type="local",
            framework_version=asked,
            session=session,
        )
        spec = est._job_spec(None, name)
        t0 = time.monotonic()
        session.control.submit(spec)
        out[f"{name}_submit_s"] = round(time.monotonic() - t0, 2)
        record = session.control.run(name)
        assert record.status == "Completed", record.failure_reason
        desc = session.control.describe(name)
        out[f"{name}_phase_s"] = round(_phase_seconds(desc), 2)
        return desc

    run("installed", None)  # the baseline: Downloading to Training with nothing to build
    run("first")
    run("cached")
    with open(os.path.join(src, "requirements.txt"), "w") as fh:
        fh.write("idna==3.4\n")
    run("with-requirements")
    run("with-requirements-cached")
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", default="2.4.1")
    ap.add_argument("--py-version", default=None, help="SageMaker's py_version, e.g. py37")
    ap.add_argument("--runner", default="plain", help="the job's runner (mpi: mpi4py too)")
    ap.add_argument("--root", default=None)
    ap.add_argument("--jobs", action="store_true")
    args = ap.parse_args()
    if args.jobs:
        jobs(args.version)
        return
    root = args.root or tempfile.mkdtemp(prefix="shipyard-envs-")
    t0 = time.monotonic()
    # the job's own resolution: the exact release in the Python it was built for first
    found = job.resolution(
        job.Request("tensorflow", args.version, args.py_version, job.min_python(args.runner))
    )
    registry_s = time.monotonic() - t0
    print(found.reason or f"{args.version}: exact", flush=True)
    if found.installed:
        return
    requirements, deps, index = job.build_args(found)
    first = builder.build(root, requirements, deps, index, python=found.python)
    again = builder.build(root, requirements, deps, index, python=found.python)
    probe = subprocess.run(
        [
            first.python,
            "-c",
            "import sys, tensorflow as tf; print(tf.__version__, sys.version.split()[0])",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    result = {
        "registry_query_s": round(registry_s, 2),
        "chosen": found.version,
        "python": found.python or f"{sys.version_info.major}.{sys.version_info.minor}",
        "first_build_s": round(first.seconds, 1),
        "first_was_built": first.built,
        "cached_start_s": round(again.seconds, 5),
        "cached_was_built": again.built,
        "holds": probe.stdout.strip().splitlines()[-1:] or probe.stderr[-300:],
    }
    print(json.dumps(result))
    print(
        f"RESULT framework_env version={found.version} python={result['python']} "
        f"first_build_s={result['first_build_s']} cached_start_s={result['cached_start_s']}"
    )


if __name__ == "__main__":
    main()
