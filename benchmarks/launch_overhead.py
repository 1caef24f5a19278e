"""Launch overhead: a 4-instance job of a no-op script vs `python noop.py`.

    python benchmarks/launch_overhead.py [--runs 15] [--instances 4]

Both are measured side by side in one run, interleaved, as wall time of a fresh
`python -c` process (so interpreter start-up and `import shipyard` are counted on our
side). Prints the medians and the difference; the goal is a difference under 1.0 s.
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
                         instance_type="local", session=shipyard.Session(home={home!r}))
est.fit(logs=False)
"""


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--instances", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        noop = os.path.join(src, "noop.py")
        open(noop, "w").write("pass\n")
        home = os.path.join(tmp, "home")
        env = dict(os.environ)
        job = [sys.executable, "-c", JOB.format(src=src, n=args.instances, home=home)]
        plain = [sys.executable, noop]
        timed(job, env), timed(plain, env)  # warm the page cache
        ours, base = [], []
        for _ in range(args.runs):
            ours.append(timed(job, env))
            base.append(timed(plain, env))
    m_ours, m_base = statistics.median(ours), statistics.median(base)
    print(f"{args.instances}-instance no-op job: median {m_ours:.3f} s "
          f"(min {min(ours):.3f}, max {max(ours):.3f}) over {args.runs} runs")
    print(f"python noop.py:           median {m_base:.3f} s "
          f"(min {min(base):.3f}, max {max(base):.3f})")
    print(f"launch overhead (difference of medians): {m_ours - m_base:.3f} s  (goal < 1.0 s)")
    print(f"ratio job/noop: {m_ours / m_base:.1f}x")


if __name__ == "__main__":
    main()
