"""Launch overhead: a 4-instance job of a no-op script vs `python noop.py`, per backend.

    python benchmarks/launch_overhead.py [--runs 15] [--instances 4] [--backends local,ray]
    python benchmarks/launch_overhead.py --backends local,local-nosandbox   # issue 15

``local`` runs instances in sandboxes where this machine supports them (shipyard.sandbox);
``local-nosandbox`` is the same backend with SHIPYARD_SANDBOX=off (plain processes), so
the sandbox's own cost is the difference of those two, measured interleaved.

All are measured side by side in one run, interleaved, as wall time of a fresh
`python -c` process (so interpreter start-up and `import shipyard` are counted on our
side). Prints the medians and the difference; the goal is a difference under 1.0 s on
the local backend.

With ``ray`` in --backends, a Ray cluster of --instances worker nodes (1 CPU each, own
loopback IPs 127.0.0.31.., a head without CPUs) is started once on this machine before
timing; each timed Ray job is a fresh process that joins it (ray.init is part of the
cost, as for a user's script), places one actor per node and runs the agents there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

JOB = """
import shipyard
est = shipyard.Estimator(entry_point="noop.py", source_dir={src!r}, instance_count={n},
                         instance_type="local", session=shipyard.Session(home={home!r}{extra}))
est.fit(logs=False)
"""


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def start_ray_cluster(nodes: int):
    """A multi-node Ray cluster on this machine: each node on its own loopback IP."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.30", "include_dashboard": False},
    )
    for i in range(nodes):
        cluster.add_node(num_cpus=1, node_ip_address=f"127.0.0.{31 + i}")
    cluster.wait_for_nodes()
    return cluster


def report(label: str, times: list[float]) -> float:
    median = statistics.median(times)
    print(f"{label:<34} median {median:.3f} s (min {min(times):.3f}, max {max(times):.3f})")
    return median


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument(
        "--backends",
        default="local",
        help="comma-separated: local, local-nosandbox, local-nocgroups, ray (ray starts a "
        "local cluster)",
    )
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    cluster = start_ray_cluster(args.instances) if "ray" in backends else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "src")
            os.makedirs(src)
            noop = os.path.join(src, "noop.py")
            with open(noop, "w") as fh:
                fh.write("pass\n")
            env = dict(os.environ)
            jobs = {}
            envs = {}
            for backend in backends:
                extra = f", backend='ray', address={cluster.address!r}" if backend == "ray" else ""
                home = os.path.join(tmp, "home-" + backend)
                jobs[backend] = [
                    sys.executable,
                    "-c",
                    JOB.format(src=src, n=args.instances, home=home, extra=extra),
                ]
                envs[backend] = dict(env)
                if backend == "local-nosandbox":
                    envs[backend]["SHIPYARD_SANDBOX"] = "off"
                if backend == "local-nocgroups":  # the cgroups' own cost (issue 31)
                    envs[backend]["SHIPYARD_CGROUPS"] = "off"
            plain = [sys.executable, noop]
            for backend, cmd in jobs.items():
                timed(cmd, envs[backend])  # warm the page cache (and Ray's worker pool)
            timed(plain, env)
            times: dict[str, list[float]] = {b: [] for b in [*backends, "plain"]}
            for _ in range(args.runs):
                for backend, cmd in jobs.items():
                    times[backend].append(timed(cmd, envs[backend]))
                times["plain"].append(timed(plain, env))
    finally:
        if cluster is not None:
            cluster.shutdown()
    base = report("python noop.py:", times["plain"])
    medians = {}
    for backend in backends:
        medians[backend] = report(
            f"{args.instances}-instance no-op job ({backend}):", times[backend]
        )
        print(
            f"  launch overhead ({backend}, difference of medians): "
            f"{medians[backend] - base:.3f} s" + ("  (goal < 1.0 s)" if backend == "local" else "")
        )
        print(f"  ratio job/noop ({backend}): {medians[backend] / base:.1f}x")
    if "local" in medians and "ray" in medians:
        print(
            f"ray/local (medians): {medians['ray'] / medians['local']:.2f}x over "
            f"{args.runs} runs, {args.runs} interleaved pairs"
        )
    from _result import result

    result(
        "launch_overhead",
        instances=args.instances,
        noop_s=base,
        **{f"{b.replace('-', '_')}_overhead_s": medians[b] - base for b in backends},
    )


if __name__ == "__main__":
    main()
