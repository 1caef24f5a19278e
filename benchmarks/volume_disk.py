"""The disk of VolumeSizeInGB (issue 37): what it adds to a launch and to a job's end.

    sudo python benchmarks/volume_disk.py [--runs 7] [--instances 4] [--size 30] [--keep-mb 64]

Per run: ``disk.create_all`` for N instances of ``--size`` GB in a fresh job directory
(sparse image, mkfs.ext4, loop attach, mount; the instances' disks made in parallel, as
the supervisor does before the first launch), then ``--keep-mb`` MiB written to each
instance's ``model/`` and ``disk.release_all`` (model/output/agent copied off the disk,
unmount, image deleted), as the supervisor does after the last upload. Medians; needs
root and loop devices.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
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
    args = parser.parse_args()
    why = disk.missing_reason()
    if why:
        raise SystemExit(f"no disks on this machine: {why}")
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


if __name__ == "__main__":
    main()
