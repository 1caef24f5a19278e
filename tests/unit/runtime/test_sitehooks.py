"""shipyard's job-process ``sitecustomize``: what it installs, under which switch, and that
a user's own ``sitecustomize`` still runs. Real interpreters, started the way the agent
starts a job's processes (the directory on PYTHONPATH)."""

import os
import subprocess
import sys
import textwrap

from shipyard.agent.environment import process_env
from shipyard.jobplan.layout import InstancePaths
from shipyard.runtime import sitehooks
from tests.agent_configs import local_config

HOSTS = {"SHIPYARD_HOSTS": "algo-1=127.0.0.1,algo-2=127.0.0.2", "SHIPYARD_CURRENT_HOST": "algo-2"}


def run_python(code: str, env: dict[str, str], *extra_path: str) -> subprocess.CompletedProcess:
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


def test_resolver_switch_on_maps_algo_names_and_the_host_name():
    done = run_python(
        "import socket; print(socket.gethostbyname('algo-2'), socket.gethostname())",
        {**HOSTS, sitehooks.PYTHON_RESOLVER_ENV: "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["127.0.0.2", "algo-2"]


def test_resolver_switch_off_leaves_resolution_to_libc():
    """A sandbox resolves algo-k through its /etc/hosts; Python must not answer first."""
    done = run_python(
        """
        import socket
        try:
            print(socket.gethostbyname('algo-2'))
        except OSError:
            print('unresolved')
        print(socket.gethostname())
        """,
        {**HOSTS, sitehooks.PYTHON_RESOLVER_ENV: "0"},
    )
    assert done.returncode == 0, done.stderr
    name, host = done.stdout.split()
    assert name == "unresolved" and host != "algo-2"


def test_a_users_own_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins; builtins.USER_SITE = 'ran'\n")
    done = run_python("print(USER_SITE)", {}, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran"


def test_every_job_process_gets_the_site_dir_and_the_resolver_only_without_a_sandbox(tmp_path):
    from shipyard.jobplan.config_sandbox import JOB_NETWORK, SandboxPlan

    for sandbox, switch in ((SandboxPlan(), "1"), (SandboxPlan(JOB_NETWORK), "0")):
        config = local_config(str(tmp_path), {"algo-1": "127.0.0.1"}, sandbox=sandbox)
        paths = InstancePaths(str(tmp_path / "algo-1"))
        env = process_env(config, "algo-1", paths, base={sitehooks.PYTHON_RESOLVER_ENV: "1"})
        assert sitehooks.site_dir() in env["PYTHONPATH"].split(os.pathsep)
        assert env[sitehooks.PYTHON_RESOLVER_ENV] == switch
