"""``shipyard server``'s S3 against a public S3 conformance suite (issue 27).

The suite is ceph/s3-tests; its code is not part of shipyard and is never committed here:
point ``--suite`` at a checkout of it (the directory that holds ``s3tests/functional/``, or
``s3tests_boto3/functional/`` in checkouts before 2024) and run it with a Python that has
what the suite imports (its requirements.txt: boto3, munch, gevent, isodate, requests, pytz,
httplib2, lxml, PyYAML, pytest; pytest-timeout if present bounds each test), e.g. a
throw-away venv. This script only needs the standard library.

What it does: starts ``shipyard server`` on a fresh temporary ``SHIPYARD_HOME`` and a free
loopback port, writes the suite's ``s3tests.conf`` (host, port, the key ``shipyard server
env`` prints, a bucket prefix, and every section the current ``s3tests.conf.SAMPLE`` asks
for: ``[s3 tenant]`` with its ``tenant``, ``[iam]``, ``[iam root]``, ``[iam alt root]``),
runs pytest over the whole suite with a junit report, and groups the results by feature
from the file and test names (names are what every version of the suite has in common).
The server has one identity: the suite's "alt", "tenant" and IAM users get the same key, so
tests that expect another user to be refused fail (ACLs are out of scope). IAM, STS, SNS and
S3 Select are other services shipyard does not serve: their files are run and counted in
groups of their own, outside the SageMaker-relevant groups.

    /tmp/s3-venv/bin/python benchmarks/s3_conformance.py --suite /tmp/s3-tests
    ... --src /tmp/before/src      # another tree's server (a before/after comparison)
    ... -k multipart               # a part of the suite

Ends with ``RESULT s3_conformance passed=... total=... sagemaker_groups=passed/total
groups=name:passed/total,...``; the SageMaker-relevant groups are those served (not
``OUT_OF_SCOPE``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _result import result  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (group, pattern on the test name): the first that matches names the group. Groups the
# server answers NotImplemented by design come first, so "copy of a versioned object" is
# counted under versioning, not copy.
GROUPS: tuple[tuple[str, str], ...] = (
    ("iam-sts-sns", r"^(iam|sts|sns)::"),
    ("s3select", r"^s3select::"),
    ("sigv2", r"_aws2$"),
    ("bucket-logging", r"logging"),
    # tests whose setup enables versioning ("current" versions, delete markers)
    ("versioning", r"version|(^|_)current(_|$)|delete_marker"),
    (
        "acl",
        r"acl|anon|not_owned|grant|ownership|owner_(enforced|preferred)|object_writer|access_bucket|nonowner",
    ),
    ("tagging", r"tagging|_tags?(_|$)"),
    ("lifecycle", r"lifecycle"),
    ("storage-class", r"storage_class|restore|read_through|torrent"),
    ("policy", r"policy"),
    ("cors", r"cors"),
    ("encryption", r"sse|encrypt|kms|(^|_)enc($|_)"),
    ("object-lock", r"lock|retention|legal_hold"),
    ("post-object", r"post_object"),
    ("rgw-usage", r"usage"),
    ("presign-auth", r"presign|x_amz_expires|signature|_expired|authorization|amz_date"),
    ("checksums", r"checksum|md5|etag"),
    ("multipart", r"multipart"),
    ("copy", r"copy"),
    ("ranged", r"range"),
    ("conditional", r"if_?match|if_?none|ifmatch|ifnonmatch|modified|precondition"),
    ("listing", r"list|delimiter|prefix|marker|maxkeys|continuation|startafter|key_count"),
    ("batch-delete", r"multi_object|delete_objects"),
    ("metadata", r"metadata|cache_control|expires|content_type|contenttype"),
    ("bucket", r"bucket"),
    ("object", r"object|atomic|100_continue"),
)
# Groups outside what SageMaker workflows use, each answered NotImplemented (or, for SigV2,
# refused with S3's InvalidRequest) by design; the rest are the "SageMaker groups".
OUT_OF_SCOPE = (
    "iam-sts-sns",
    "s3select",
    "sigv2",
    "bucket-logging",
    "versioning",
    "acl",
    "tagging",
    "lifecycle",
    "storage-class",
    "policy",
    "cors",
    "encryption",
    "object-lock",
    "post-object",
    "rgw-usage",
)

# the suite's files of other services (their tests never reach S3's API)
OTHER_SERVICES = {
    "test_iam": "iam",
    "test_sts": "sts",
    "test_sns": "sns",
    "test_s3select": "s3select",
}


def group_of(name: str, module: str = "") -> str:
    """The feature group of a suite test, from its file (``module``) and name."""
    bare = name.split("[")[0].removeprefix("test_")
    service = OTHER_SERVICES.get(module.rsplit(".", 1)[-1])
    if service:
        bare = f"{service}::{bare}"
    for group, pattern in GROUPS:
        if re.search(pattern, bare):
            return group
    return "other"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(src: str, home: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, SHIPYARD_HOME=home, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1")


def start_server(python: str, src: str, home: str, port: int, log: str) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [python, "-m", "shipyard.cli", "server", "--port", str(port)],
            env=_env(src, home),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_shipyard/health", timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"shipyard server did not start within 60 s (its log: {log})")


def credentials(python: str, src: str, home: str, port: int) -> tuple[str, str]:
    out = subprocess.run(
        [python, "-m", "shipyard.cli", "server", "env", "--port", str(port)],
        env=_env(src, home),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    values = {}
    for line in out.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export ") :].partition("=")
            values[name.strip()] = value.strip().strip("'\"")
    return values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"]


def write_conf(path: str, port: int, key: str, secret: str) -> None:
    """The suite's config: every section its ``configure()`` reads, all with the one key."""
    sections = ("s3 main", "s3 alt", "s3 tenant", "iam", "iam root", "iam alt root")
    users = "".join(
        f"[{who}]\ndisplay_name = shipyard\nuser_id = shipyard\n"
        f"email = {who.replace(' ', '-')}@shipyard.local\n"
        f"access_key = {key}\nsecret_key = {secret}\n"
        + ("tenant = shipyard\n" if who == "s3 tenant" else "")
        + "\n"
        for who in sections
    )
    with open(path, "w") as fh:
        fh.write(
            f"[DEFAULT]\nhost = 127.0.0.1\nport = {port}\nis_secure = False\n"
            "ssl_verify = False\n\n[fixtures]\nbucket prefix = conf-{random}-\n"
            "iam name prefix = s3-tests-\niam path prefix = /s3-tests/\n\n" + users
        )


def read_junit(path: str) -> dict[tuple[str, str], str]:
    """(module, test name) -> passed | failed | skipped (a test failing its teardown failed)."""
    outcome: dict[tuple[str, str], str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        if "skipped" in tags:
            state = "skipped"
        elif tags & {"failure", "error"}:
            state = "failed"
        else:
            state = "passed"
        test = (case.get("classname", ""), case.get("name", "?"))
        if outcome.get(test) != "failed":  # a teardown error is a second entry
            outcome[test] = state
    return outcome


def suite_dir(suite: str) -> str:
    """The suite's tests: ``s3tests/functional`` today, ``s3tests_boto3/functional`` before."""
    for layout in ("s3tests", "s3tests_boto3"):
        tests = os.path.join(suite, layout, "functional")
        if os.path.isdir(tests):
            return tests
    raise SystemExit(
        f"--suite {suite}: neither s3tests/functional/ nor s3tests_boto3/functional/ is "
        "there; point --suite at the root of a ceph/s3-tests checkout"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default=None, help="root of a ceph/s3-tests checkout")
    parser.add_argument("--report", default=None, help="group a kept junit report, run nothing")
    parser.add_argument("--src", default=os.path.join(ROOT, "src"), help="shipyard's src/")
    parser.add_argument("--server-python", default=None, help="Python that runs the server")
    parser.add_argument("-k", default=None, help="pytest -k expression (a part of the suite)")
    parser.add_argument("--junit", default=None, help="keep the junit report here")
    parser.add_argument("--show-failed", action="store_true", help="list every failed test")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test (hang guard)")
    args = parser.parse_args()
    if args.report:
        summarize(read_junit(args.report), args.show_failed)
        return
    if not args.suite:
        raise SystemExit("give --suite (a ceph/s3-tests checkout) or --report (a junit report)")
    tests = suite_dir(args.suite)
    server_python = args.server_python or os.path.join(ROOT, ".venv", "bin", "python")
    if not os.path.exists(server_python):
        server_python = sys.executable

    work = tempfile.mkdtemp(prefix="s3conf-")
    home, port = os.path.join(work, "home"), free_port()
    proc = start_server(server_python, args.src, home, port, os.path.join(work, "server.log"))
    try:
        key, secret = credentials(server_python, args.src, home, port)
        conf = os.path.join(work, "s3tests.conf")
        write_conf(conf, port, key, secret)
        junit = args.junit or os.path.join(work, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests]
        cmd += ["--junitxml", junit, "-o", "junit_family=xunit2"]
        if args.k:
            cmd += ["-k", args.k]
        has_timeout = subprocess.run(
            [sys.executable, "-c", "import pytest_timeout"], capture_output=True, check=False
        )
        if has_timeout.returncode == 0:
            cmd += ["--timeout", str(args.timeout)]
        env = dict(os.environ, S3TEST_CONF=conf, AWS_DEFAULT_REGION="us-east-1")
        env.pop("AWS_ACCESS_KEY_ID", None)
        env.pop("AWS_SECRET_ACCESS_KEY", None)
        log = os.path.join(work, "pytest.log")
        try:
            with open(log, "wb") as out:
                subprocess.run(cmd, cwd=args.suite, env=env, stdout=out, stderr=out, check=False)
        except KeyboardInterrupt:
            pass
        if not os.path.exists(junit):
            with open(log, errors="replace") as fh:
                tail = fh.read()[-3000:]
            raise SystemExit(f"pytest wrote no report (is the suite's Python complete?):\n{tail}")
        outcome = read_junit(junit)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)  # the server's home; the report was read
    summarize(outcome, args.show_failed)


def summarize(outcome: dict[tuple[str, str], str], show_failed: bool) -> None:
    """The table by group, the failed tests if asked, and the RESULT line."""
    table: dict[str, list[int]] = {}
    for (module, name), state in outcome.items():
        row = table.setdefault(group_of(name, module), [0, 0])
        if state != "skipped":
            row[1] += 1
            row[0] += state == "passed"
    print(f"{'group':<14} {'passed':>6} {'total':>6}  scope")
    for group in sorted(table, key=lambda g: (g in OUT_OF_SCOPE, g)):
        passed, total = table[group]
        scope = "NotImplemented by design" if group in OUT_OF_SCOPE else "served"
        print(f"{group:<14} {passed:>6} {total:>6}  {scope}")
    if show_failed:
        for module, name in sorted(t for t, s in outcome.items() if s == "failed"):
            print(f"FAILED {group_of(name, module):<14} {module.rsplit('.', 1)[-1]}::{name}")
    passed = sum(row[0] for row in table.values())
    total = sum(row[1] for row in table.values())
    served = [row for group, row in table.items() if group not in OUT_OF_SCOPE]
    sagemaker = f"{sum(r[0] for r in served)}/{sum(r[1] for r in served)}"
    groups = ",".join(f"{g}:{p}/{t}" for g, (p, t) in sorted(table.items()))
    result("s3_conformance", passed=passed, total=total, sagemaker_groups=sagemaker, groups=groups)


if __name__ == "__main__":
    main()
