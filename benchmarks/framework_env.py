"""Framework environments: first-use build and cached start (issue 28).

Resolves ``framework_version`` (default the workshop's 2.4.1) against the registry, builds
its environment with uv into a fresh root (the first build), asks again (the cached start:
what every later job pays), and checks which TensorFlow and Keras the environment holds.
uv's own wheel cache is whatever this machine has: run with ``UV_CACHE_DIR`` set to an
empty directory for a cold-registry figure.

    .venv/bin/python benchmarks/framework_env.py [--version 2.4.1] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from shipyard.environments import builder, job, registry, resolver


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", default="2.4.1")
    ap.add_argument("--root", default=None)
    args = ap.parse_args()
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
