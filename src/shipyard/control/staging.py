"""Staging: source_dir / entry_point / dependencies / git_config -> one code bundle.

Follows the SageMaker SDK: with ``source_dir`` the entry point is a path inside it
and the whole directory is shipped; without it only the entry point file is; each
``dependencies`` entry is copied next to it; ``git_config`` clones the repository
first (a real ``git clone``: local paths, file:// and https URLs) and resolves the
other paths inside the clone. The bundle is ``sourcedir.tar.gz`` written atomically
to ``<code_location or output_path>/<job>/source/``.

``requirements.txt``: installed once per content hash into a cached environment under
SHIPYARD_HOME that *sees* the current interpreter's packages (so satisfied
requirements are not reinstalled) and is put on the job's PYTHONPATH. The user's own
environment is never modified.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from shipyard.errors import StagingError, ValidationError
from shipyard.observe import progress
from shipyard.spec import CodeSpec
from shipyard.storage.uri import local_path

PACKAGE_MARKERS = ("setup.py", "pyproject.toml")


@dataclass
class StagedCode:
    bundle_path: str  # local path of sourcedir.tar.gz
    bundle_uri: str  # what sagemaker_submit_directory holds
    entry_point: str  # relative to the code root
    python_package: bool = False
    extra_python_path: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def git_clone(git_config: dict[str, str], dest: str) -> None:
    """Clone ``repo`` at ``branch``/``commit`` into ``dest``; clear errors on failure."""
    repo = git_config.get("repo")
    if not repo:
        raise ValidationError("git_config needs a 'repo' (URL or local path of a git repository)")
    unknown = set(git_config) - {
        "repo",
        "branch",
        "commit",
        "2FA_enabled",
        "username",
        "password",
        "token",
    }
    if unknown:
        raise ValidationError(f"git_config has unknown key(s) {sorted(unknown)}")
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="true")
    scheme = urlsplit(repo).scheme
    askpass_dir = None
    if scheme in ("https", "http") and (git_config.get("token") or git_config.get("username")):
        askpass_dir, askpass_env = _askpass(git_config)
        env.update(askpass_env)
    cmd = ["git", "clone", "--quiet"]
    if git_config.get("branch") and not git_config.get("commit"):
        cmd += ["--branch", git_config["branch"]]
    cmd += [repo, dest]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    except FileNotFoundError as exc:
        raise StagingError("git_config needs the `git` command, which is not on PATH") from exc
    finally:
        if askpass_dir is not None:
            shutil.rmtree(askpass_dir, ignore_errors=True)
    if result.returncode != 0:
        raise ValidationError(
            f"git_config: could not clone {repo!r}: {result.stderr.strip() or result.stdout.strip()}"
        )
    if git_config.get("branch") and git_config.get("commit"):
        _git(dest, ["checkout", "--quiet", git_config["branch"]], repo)
    if git_config.get("commit"):
        _git(dest, ["checkout", "--quiet", git_config["commit"]], repo)


_ASKPASS = """#!/bin/sh
case "$1" in
  [Uu]sername*) printf '%s\\n' "$_SY_GIT_USERNAME" ;;
  *) printf '%s\\n' "$_SY_GIT_PASSWORD" ;;
esac
"""


def _askpass(git_config: dict[str, str]) -> tuple[str, dict[str, str]]:
    """A GIT_ASKPASS helper that answers from the clone's environment, never argv: a token
    or password in the URL is visible to every user of the machine (ps, /proc/*/cmdline)
    and ends up in git's error messages. Returns (its private dir, the env to add)."""
    import stat

    directory = tempfile.mkdtemp(prefix="shipyard-askpass-")
    helper = os.path.join(directory, "askpass")
    with open(os.open(helper, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700), "w") as fh:
        fh.write(_ASKPASS)
    os.chmod(helper, stat.S_IRWXU)
    if git_config.get("token"):
        # what SageMaker's https://<token>@host does: the token is the user name
        user, password = git_config["token"], ""
    else:
        user, password = git_config["username"], git_config.get("password", "")
    return directory, {
        "GIT_ASKPASS": helper,
        "_SY_GIT_USERNAME": user,
        "_SY_GIT_PASSWORD": password,
        # a stored credential helper must not answer (or record) in our place
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "credential.helper",
        "GIT_CONFIG_VALUE_0": "",
    }


def _git(repo_dir: str, args: list[str], repo: str) -> None:
    result = subprocess.run(["git", "-C", repo_dir, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ValidationError(
            f"git_config: `git {' '.join(args)}` failed in {repo!r}: {result.stderr.strip()}"
        )


def _inside(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


def _ignore_for(source_dir: str, exclude: tuple[str, ...]):
    """copytree's ``ignore``: VCS/bytecode noise, and any directory of ``exclude`` (shipyard's
    home, output paths, checkpoint directories) that lies inside ``source_dir``; those
    hold other jobs' trees and secrets and would grow every bundle."""
    skip = {os.path.realpath(p) for p in exclude if p and _inside(p, source_dir)}
    noise = shutil.ignore_patterns(".git", "__pycache__", "*.pyc")

    def ignore(directory: str, names: list[str]) -> set[str]:
        out = set(noise(directory, names))
        if skip:
            real = os.path.realpath(directory)
            out.update(n for n in names if os.path.join(real, n) in skip)
        return out

    return ignore


def _copy_source(source_dir: str, root: str, exclude: tuple[str, ...], what: str) -> None:
    """Copy the user's directory; a file that vanishes or cannot be read meanwhile (another
    process writing into source_dir) is a clear StagingError, not a copy traceback."""
    try:
        shutil.copytree(source_dir, root, symlinks=False, ignore=_ignore_for(source_dir, exclude))
    except shutil.Error as exc:
        problems = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
        first = problems[0] if problems else (source_dir, "", str(exc))
        raise StagingError(
            f"{what} {source_dir!r} changed while it was being staged: {first[0]!r} could not be "
            f"copied ({first[2]}); {len(problems) or 1} file(s) affected. Something is writing "
            "into it (another job's output or checkpoints?): keep such directories outside "
            "source_dir, or retry"
        ) from None
    except OSError as exc:
        raise StagingError(
            f"{what} {source_dir!r} could not be staged: {exc}; something may be changing it "
            "while the job is submitted, retry"
        ) from None


def resolve_code(
    code: CodeSpec, workdir: str, exclude: tuple[str, ...] = ()
) -> tuple[str, str, list[str]]:
    """Check the code inputs and gather them in ``workdir/code``.

    Returns (code root, entry point relative to it, notes). Raises ValidationError
    before anything outside ``workdir`` is written. Directories in ``exclude`` are left
    out of the copy wherever they lie inside the source directory.
    """
    base = None
    if code.git_config:
        base = os.path.join(workdir, "git")
        git_clone(code.git_config, base)
    source_dir = code.source_dir
    if source_dir is not None:
        source_dir = local_path(source_dir) if base is None else os.path.join(base, source_dir)
        if not os.path.isdir(source_dir):
            raise ValidationError(
                f"source_dir {code.source_dir!r} does not exist or is not a directory"
            )
        entry = os.path.join(source_dir, code.entry_point)
        if not _inside(entry, source_dir):
            raise ValidationError(
                f"entry_point {code.entry_point!r} is outside source_dir {code.source_dir!r}: "
                "give its path relative to source_dir"
            )
    else:
        root = base if base is not None else os.getcwd()
        entry = (
            code.entry_point
            if os.path.isabs(code.entry_point)
            else os.path.join(root, code.entry_point)
        )
        if base is not None and not _inside(entry, base):
            raise ValidationError(f"entry_point {code.entry_point!r} is outside the git repository")
    if not os.path.isfile(entry):
        where = f" in source_dir {code.source_dir!r}" if code.source_dir else ""
        raise ValidationError(f"entry_point {code.entry_point!r} not found{where}")

    root = os.path.join(workdir, "code")
    if source_dir is not None:
        _copy_source(source_dir, root, exclude, "source_dir")
        rel_entry = os.path.relpath(os.path.realpath(entry), os.path.realpath(source_dir))
    else:
        os.makedirs(root)
        shutil.copy2(entry, os.path.join(root, os.path.basename(entry)))
        rel_entry = os.path.basename(entry)
    for dep in code.dependencies:
        dep_path = local_path(dep) if base is None else os.path.join(base, dep)
        if not os.path.exists(dep_path):
            raise ValidationError(f"dependency {dep!r} does not exist")
        target = os.path.join(root, os.path.basename(os.path.normpath(dep_path)))
        if os.path.isdir(dep_path):
            _copy_into(dep_path, target, exclude)
        else:
            shutil.copy2(dep_path, target)
    return root, rel_entry, []


def _copy_into(dep_path: str, target: str, exclude: tuple[str, ...]) -> None:
    try:
        shutil.copytree(dep_path, target, dirs_exist_ok=True, ignore=_ignore_for(dep_path, exclude))
    except (shutil.Error, OSError) as exc:
        raise StagingError(
            f"dependency {dep_path!r} changed while it was being staged ({exc}); retry"
        ) from None


def tree_bytes(root: str) -> int:
    """Bytes of the regular files under ``root`` (the bundling bar's total)."""
    total = 0
    for dirpath, _dirs, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def make_bundle(
    code_root: str, dest_path: str, on_file: Callable[[int], None] | None = None
) -> None:
    """Write sourcedir.tar.gz atomically (a reader never sees a partial bundle);
    ``on_file(nbytes)`` as each file goes in (progress)."""

    def counted(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if on_file is not None and info.isfile():
            on_file(info.size)
        return info

    os.makedirs(os.path.dirname(dest_path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest_path), suffix=".tmp")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
            for name in sorted(os.listdir(code_root)):
                tar.add(os.path.join(code_root, name), arcname=name, filter=counted)
        os.replace(tmp, dest_path)
    except BaseException:
        os.unlink(tmp)
        raise


def _site_packages(env_dir: str) -> str:
    return sysconfig.get_path("purelib", vars={"base": env_dir, "platbase": env_dir})


def cached_environment(
    cache_root: str, key: str, install_args: list[str], cwd: str, label: str
) -> str:
    """A cached environment with ``pip install <install_args>`` done; returns its site dir.

    The environment sees the current interpreter's packages through a .pth file, so pip
    only installs what is missing. Built in a temporary directory and renamed into
    place, under a lock, so concurrent jobs share one install and a failed install
    leaves nothing behind.
    """
    os.makedirs(cache_root, exist_ok=True)
    final = os.path.join(cache_root, key)
    lock_path = os.path.join(cache_root, key + ".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isdir(final):
            return _site_packages(final)
        tmp = tempfile.mkdtemp(dir=cache_root, prefix=key + ".")
        try:
            subprocess.run(
                [sys.executable, "-m", "venv", "--without-pip", tmp],
                check=True,
                capture_output=True,
            )
            site_dir = _site_packages(tmp)
            os.makedirs(site_dir, exist_ok=True)
            parents = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
            with open(os.path.join(site_dir, "_shipyard_parent.pth"), "w") as fh:
                fh.write("\n".join(parents) + "\n")
            python = os.path.join(tmp, "bin", "python")
            with progress.step(f"Installing {label} (pip, cached for the next jobs)"):
                result = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "--python",
                        python,
                        "install",
                        "--disable-pip-version-check",
                        "--no-input",
                        *install_args,
                    ],
                    cwd=cwd,
                    capture_output=True,
                    text=True,
                    timeout=3600,
                )
            if result.returncode != 0:
                raise StagingError(
                    f"installing {label} failed:\n" + (result.stderr or result.stdout)[-2000:]
                )
            # Site dir paths are relative to the env root: rename keeps them valid.
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return _site_packages(final)


def install_requirements(
    code_root: str, cache_root: str, requirements: bool = True
) -> tuple[list[str], list[str]]:
    """requirements.txt and package installs for the code; returns (python paths, notes).
    ``requirements`` False: the job runs in a framework environment, whose build installs
    requirements.txt in the framework's own resolve (shipyard.environments), not here."""
    paths: list[str] = []
    notes: list[str] = []
    interp = f"{sys.executable}|{sys.version}"
    req = os.path.join(code_root, "requirements.txt")
    if os.path.isfile(req) and requirements:
        with open(req, "rb") as fh:
            digest = hashlib.sha256(fh.read() + interp.encode()).hexdigest()[:24]
        site = cached_environment(
            cache_root, "req-" + digest, ["-r", "requirements.txt"], code_root, "requirements.txt"
        )
        paths.append(site)
        notes.append(f"requirements.txt installed in cached environment {site}")
    if any(os.path.isfile(os.path.join(code_root, m)) for m in PACKAGE_MARKERS):
        digest = hashlib.sha256(interp.encode() + _tree_digest(code_root)).hexdigest()[:24]
        site = cached_environment(cache_root, "pkg-" + digest, ["."], code_root, "the code package")
        paths.append(site)
        notes.append(f"code package installed in cached environment {site}")
    return paths, notes


def _tree_digest(root: str) -> bytes:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode())
            with open(path, "rb") as fh:
                h.update(fh.read())
    return h.digest()


def stage(
    code: CodeSpec,
    job_name: str,
    code_location: str,
    cache_root: str,
    local_dir: str | None = None,
    exclude: tuple[str, ...] = (),
    requirements: bool = True,
) -> StagedCode:
    """Resolve, bundle and install the job's code. Nothing is left behind on failure.

    ``exclude``: local directories never bundled even when they lie inside source_dir
    (shipyard's home with every job's tree and secret, output and checkpoint paths).
    ``requirements`` False: requirements.txt is left to the job's framework environment.

    An s3:// ``code_location`` gets the bundle uploaded to
    ``<code_location>/<job>/source/sourcedir.tar.gz`` (what sagemaker_submit_directory
    names); the agents on this machine read the local copy written to ``local_dir``.
    """
    remote = code_location.startswith("s3://")
    if remote:
        if local_dir is None:
            raise ValidationError("an s3:// code_location needs a local staging directory")
        bundle = os.path.join(local_dir, "sourcedir.tar.gz")
    else:
        bundle = os.path.join(local_path(code_location), job_name, "source", "sourcedir.tar.gz")
    with tempfile.TemporaryDirectory(prefix="shipyard-stage-") as workdir:
        root, entry, notes = resolve_code(code, workdir, exclude)
        is_package = any(os.path.isfile(os.path.join(root, m)) for m in PACKAGE_MARKERS)
        extra, install_notes = install_requirements(root, cache_root, requirements)
        with progress.transfer(f"Bundling the code of {job_name}", tree_bytes(root)) as add:
            make_bundle(root, bundle, add)
    uri = "file://" + bundle
    if remote:
        from shipyard import storage

        target = storage.parse(code_location).child(f"{job_name}/source/sourcedir.tar.gz")
        try:
            with progress.transfer(f"Uploading {target.uri}", os.path.getsize(bundle)) as add:
                storage.store_for(target).upload(bundle, target, callback=add)
        except BaseException:
            os.unlink(bundle)
            raise
        uri = target.uri
        notes = notes + [f"code bundle uploaded to {uri}"]
    return StagedCode(
        bundle_path=bundle,
        bundle_uri=uri,
        entry_point=entry,
        python_package=is_package,
        extra_python_path=extra,
        notes=notes + install_notes,
    )


def discard(staged: StagedCode) -> None:
    """Undo stage() after a later refusal: the local bundle dir and any uploaded copy."""
    if staged.bundle_uri.startswith("s3://"):
        from shipyard import storage

        try:
            target = storage.parse(staged.bundle_uri)
            storage.store_for(target).delete(target)
        except Exception:  # noqa: BLE001 - the refusal being raised matters more
            pass
        shutil.rmtree(os.path.dirname(staged.bundle_path), ignore_errors=True)
    else:
        shutil.rmtree(os.path.dirname(os.path.dirname(staged.bundle_path)), ignore_errors=True)
