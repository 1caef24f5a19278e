"""The disk of VolumeSizeInGB (issue 37): what it adds to a launch and to a job's end.

    sudo python benchmarks/volume_disk.py [--runs 7] [--instances 4] [--size 30] [--keep-mb 64]
    sudo python benchmarks/volume_disk.py --trees before=/tmp/a/src,after=/tmp/b/src   # issue 40

Per run: ``disk.create_all`` for N instances of ``--size`` GB in a fresh job directory
(sparse image, mkfs.ext4, loop attach, mount; the instances' disks made in parallel, as
the supervisor does before the first launch), then ``--keep-mb`` MiB written to each
instance's ``model/`` and ``disk.release_all`` (model/output/agent copied off the disk,
unmount, image deleted), as the supervisor does after the last upload. Medians; needs
root and loop devices.

``--trees LABEL=SRC,...``: each run is made once per source tree (a process per tree and
run, ``shipyard`` imported from SRC, e.g. two ``git archive`` exports), interleaved, so
an A/B of two versions is one sitting; the medians are printed per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

if "--src" not in sys.argv:  # --src (a child of --trees): that tree's shipyard instead
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
else:
    sys.path.insert(0, sys.argv[sys.argv.index("--src") + 1])
sys.path.insert(0, os.path.dirname(__file__))

from _result import result  # noqa: E402
from shipyard.sandbox import disk  # noqa: E402


def one(base: str, instances: int, size: int, keep_mb: int) -> tuple[float, float, int]:
    job_dir = tempfile.mkdtemp(dir=base)
    hosts = [f"algo-{i}" for i in range(1, instances + 1)]
    started = time.perf_counter()
    made = disk.create_all(job_dir, hosts, size)
    create = time.perf_counter() - started
    disks = [d for d in made.values() if isinstance(d, disk.Disk)]
    if len(disks) != instances:
        raise SystemExit(f"no disks: {made}")
    upfront = sum(os.stat(d.image).st_blocks * 512 for d in disks) // instances
    for d in disks:
        os.makedirs(os.path.join(d.tree, "model"))
        with open(os.path.join(d.tree, "model", "weights.bin"), "wb") as fh:
            fh.write(os.urandom(1 << 20) * keep_mb)
    started = time.perf_counter()
    notes = [n for n in disk.release_all(disks, job_dir).values() if n]
    if notes:
        raise SystemExit(notes[0])
    return create, time.perf_counter() - started, upfront


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--size", type=int, default=30)
    parser.add_argument("--keep-mb", type=int, default=64)
    parser.add_argument("--trees", default="", help="LABEL=SRC,...: an A/B of source trees")
    parser.add_argument("--src", help=argparse.SUPPRESS)  # one run of --trees, in that tree
    args = parser.parse_args()
    why = disk.missing_reason()
    if why:
        raise SystemExit(f"no disks on this machine: {why}")
    if args.src:
        with tempfile.TemporaryDirectory() as base:
            print(json.dumps(one(base, args.instances, args.size, args.keep_mb)))
        return
    if args.trees:
        compare(args)
        return
    with tempfile.TemporaryDirectory() as base:
        runs = [one(base, args.instances, args.size, args.keep_mb) for _ in range(args.runs)]
    create = statistics.median(r[0] for r in runs)
    release = statistics.median(r[1] for r in runs)
    upfront = statistics.median(r[2] for r in runs)
    print(f"create {args.instances} x {args.size} GB in parallel: median {create:.3f} s")
    print(f"release (keep {args.keep_mb} MiB each): median {release:.3f} s")
    print(f"host space taken up front per disk: {upfront / (1 << 20):.1f} MiB")
    result(
        "volume_disk",
        instances=args.instances,
        size_gb=args.size,
        create_s=create,
        release_s=release,
        upfront_mib=upfront / (1 << 20),
    )


def compare(args: argparse.Namespace) -> None:
    """Each tree's runs, interleaved run by run, in a process per tree and run."""
    trees = dict(t.split("=", 1) for t in args.trees.split(",") if t.strip())
    runs: dict[str, list[list[float]]] = {label: [] for label in trees}
    for _ in range(args.runs):
        for label, src in trees.items():
            cmd = [sys.executable, __file__, "--src", src, "--instances", str(args.instances)]
            cmd += ["--size", str(args.size), "--keep-mb", str(args.keep_mb)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[label].append(json.loads(out.splitlines()[-1]))
    figures: dict[str, float] = {}
    for label, got in runs.items():
        create = statistics.median(r[0] for r in got)
        release = statistics.median(r[1] for r in got)
        print(
            f"{label}: create {args.instances} x {args.size} GB median {create:.4f} s, "
            f"release (keep {args.keep_mb} MiB each) median {release:.4f} s"
        )
        figures[f"create_s_{label}"] = create
        figures[f"release_s_{label}"] = release
    result("volume_disk", instances=args.instances, size_gb=args.size, **figures)


if __name__ == "__main__":
    main()
