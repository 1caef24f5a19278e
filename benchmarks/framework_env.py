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

from shipyard.environments import builder, job, registry, resolver


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
    ap.add_argument("--root", default=None)
    ap.add_argument("--jobs", action="store_true")
    args = ap.parse_args()
    if args.jobs:
        jobs(args.version)
        return
    root = args.root or tempfile.mkdtemp(prefix="shipyard-envs-")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    t0 = time.monotonic()
    available = registry.available("tensorflow-cpu")
    registry_s = time.monotonic() - t0
    r = resolver.resolve(
        "tensorflow", args.version, available, job.installed_version("tensorflow"), python
    )
    print(r.reason or f"{args.version}: exact", flush=True)
    if r.version is None or r.installed:
        return
    deps = builder.RUNTIME_DEPS + builder.pinned_installed(job.PINNED)
    first = builder.build(root, r.requirements, deps, r.index_url)
    again = builder.build(root, r.requirements, deps, r.index_url)
    probe = subprocess.run(
        [first.python, "-c", "import tensorflow as tf; print(tf.__version__, tf.keras.__name__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    print(
        json.dumps(
            {
                "registry_query_s": round(registry_s, 2),
                "chosen": r.version,
                "first_build_s": round(first.seconds, 1),
                "first_was_built": first.built,
                "cached_start_s": round(again.seconds, 5),
                "cached_was_built": again.built,
                "holds": probe.stdout.strip(),
            }
        )
    )


if __name__ == "__main__":
    main()
