"""Launch overhead: a 4-instance job of a no-op script vs `python noop.py`, per backend.

    python benchmarks/launch_overhead.py [--runs 15] [--instances 4] [--backends local,ray]
    python benchmarks/launch_overhead.py --backends local,local-nosandbox   # issue 15
    python benchmarks/launch_overhead.py --backends local,local-nosandbox \
        --trees before=/tmp/a/src,after=/tmp/b/src                         # issue 40

``local`` runs instances in sandboxes where this machine supports them (shipyard.sandbox);
``local-nosandbox`` is the same backend with SHIPYARD_SANDBOX=off (plain processes), so
the sandbox's own cost is the difference of those two, measured interleaved.

``--trees LABEL=SRC,...`` runs every backend once per source tree (``PYTHONPATH=SRC``,
e.g. two ``git archive`` exports: before and after a change), so an A/B of two versions
is measured in one sitting, interleaved; each tree's container share (sandboxed minus
unsandboxed) is printed.

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
import resource
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


CPU: dict[str, list[float]] = {}  # per label: CPU seconds (user+sys) of each run's tree


def timed(cmd: list[str], env: dict[str, str], label: str = "") -> float:
    """The wall time of ``cmd``; its whole process tree's CPU time goes to CPU[label]
    (orphans included: this process is their subreaper and reaps them here)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    _reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    CPU.setdefault(label, []).append(cpu)
    return wall


def _become_subreaper() -> None:
    """Orphaned descendants (an instance's init or pasta outliving its agent) come to
    this process, so their CPU time is counted (Linux; elsewhere they are not)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _reap_orphans(limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


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
    parser.add_argument(
        "--trees",
        default="",
        help="LABEL=SRC,...: each backend run with PYTHONPATH=SRC per tree (an A/B of two "
        "source trees in one sitting)",
    )
    args = parser.parse_args()
    kinds = [b.strip() for b in args.backends.split(",") if b.strip()]
    trees = dict(t.split("=", 1) for t in args.trees.split(",") if t.strip())
    backends = [f"{b}@{label}" for label in trees for b in kinds] if trees else kinds
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
                kind, _, label = backend.partition("@")
                extra = f", backend='ray', address={cluster.address!r}" if kind == "ray" else ""
                home = os.path.join(tmp, "home-" + backend)
                jobs[backend] = [
                    sys.executable,
                    "-c",
                    JOB.format(src=src, n=args.instances, home=home, extra=extra),
                ]
                envs[backend] = dict(env)
                if label:
                    envs[backend]["PYTHONPATH"] = trees[label]
                if kind == "local-nosandbox":
                    envs[backend]["SHIPYARD_SANDBOX"] = "off"
                if kind == "local-nocgroups":  # the cgroups' own cost (issue 31)
                    envs[backend]["SHIPYARD_CGROUPS"] = "off"
            plain = [sys.executable, noop]
            _become_subreaper()
            for backend, cmd in jobs.items():
                timed(cmd, envs[backend])  # warm the page cache (and Ray's worker pool)
            timed(plain, env)
            CPU.clear()
            times: dict[str, list[float]] = {b: [] for b in [*backends, "plain"]}
            for _ in range(args.runs):
                for backend, cmd in jobs.items():
                    times[backend].append(timed(cmd, envs[backend], backend))
                times["plain"].append(timed(plain, env, "plain"))
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
        print(f"  CPU time (user+sys, whole tree): median {statistics.median(CPU[backend]):.3f} s")
    shares, cpu_shares = {}, {}
    for label in trees or {"": ""}:
        at = f"@{label}" if label else ""
        if f"local{at}" in medians and f"local-nosandbox{at}" in medians:
            shares[label] = medians[f"local{at}"] - medians[f"local-nosandbox{at}"]
            cpu_shares[label] = statistics.median(CPU[f"local{at}"]) - statistics.median(
                CPU[f"local-nosandbox{at}"]
            )
            print(
                f"the container's share{' (' + label + ')' if label else ''} (sandboxed minus "
                f"unsandboxed, medians): {shares[label]:.3f} s  (goal <= 0.2 s); "
                f"CPU time {cpu_shares[label]:.3f} s"
            )
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
        **{f"{_key(b)}_overhead_s": medians[b] - base for b in backends},
        **{f"share{'_' + _key(label) if label else ''}_s": v for label, v in shares.items()},
        **{f"cpu_share{'_' + _key(lb) if lb else ''}_s": v for lb, v in cpu_shares.items()},
    )


def _key(name: str) -> str:
    return name.replace("-", "_").replace("@", "_")


if __name__ == "__main__":
    main()
