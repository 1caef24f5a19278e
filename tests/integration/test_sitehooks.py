"""shipyard's job-process ``sitecustomize`` with real torch: the exit guard sees gloo's
worker threads (a real interpreter with a gloo group; tests/unit/runtime/test_sitehooks.py holds
the hooks' other rules)."""

import os
import subprocess
import sys
import textwrap

from shipyard.runtime import sitehooks
from tests.lazy import needs

pytestmark = needs("torch")


def run_python(code: str, env: dict[str, str], *extra_path: str) -> subprocess.CompletedProcess:
    """As tests/unit/runtime/test_sitehooks.py's: the way the agent starts a job's processes."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SHIPYARD_")}
    base.update(env)
    base["PYTHONPATH"] = os.pathsep.join([sitehooks.site_dir(), *extra_path])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=base,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_gloo_workers_are_seen_by_the_exit_guard_and_the_rank_exits_cleanly(tmp_path):
    """The guard keys on torch's gloo worker threads: a process with a gloo group has them
    (so the guard waits for them at exit), one without torch has none (no wait)."""
    done = run_python(
        f"""
        import sys
        import torch
        import torch.distributed as dist
        dist.init_process_group(
            "gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1
        )
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        model(torch.ones(2, 4)).sum().backward()
        dist.barrier()
        dist.destroy_process_group()
        print(sys.modules["sitecustomize"]._gloo_workers())
        """,
        {},
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) >= 1
    plain = run_python("import sys; print(sys.modules['sitecustomize']._gloo_workers())", {})
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "0"
