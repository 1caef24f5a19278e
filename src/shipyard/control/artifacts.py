"""Artifacts: every instance's model/ -> model.tar.gz, output/data/ -> output.tar.gz.

Like SageMaker, all instances' directories end up in one archive under
``<output_path>/<job>/output/``. Where two instances wrote the same file, algo-1's copy
wins (SageMaker's result would depend on upload order) and the conflict is reported.
Archives are written to a temporary name and renamed, so a reader never sees half a file;
an s3:// output_path gets them uploaded whole. Temporary names all start with
``PARTIAL_PREFIX`` and s3 scratch lives under the job's directory, so when the supervisor
dies mid-upload :func:`discard_partial` (run by the reconcile that marks the job) finds
and removes every piece.

Two faults end in one line, never a traceback (issue 37): a disk that fills while an
archive is written is a ``NoSpaceError`` naming the path, the bytes written and the space
left (the partial archive removed); an S3 endpoint that is away (a restarted ``shipyard
server``) is waited for with backoff as long as the caller's ``Patience`` allows
(``storage.retry``), since the archives are built and only the store is missing.
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shipyard.control import staging
from shipyard.control.staging import local_path
from shipyard.errors import NoSpaceError, StorageError
from shipyard.observe import progress
from shipyard.runtime import safepath
from shipyard.storage.retry import Patience, patiently

if TYPE_CHECKING:
    from shipyard.storage.s3 import S3Store
    from shipyard.storage.uri import Location

PARTIAL_PREFIX = ".shipyard-partial-"
SCRATCH_DIR = "upload-scratch"


@dataclass
class ArchiveResult:
    path: str
    uri: str
    files: int
    conflicts: list[str] = field(default_factory=list)
    # links the job left that point out of its tree: not archived (what they name is the
    # host's, read as root), each "host: path -> target"
    skipped: list[str] = field(default_factory=list)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _add(tar: tarfile.TarFile, root: str, directory: str, entry: safepath.Entry) -> int:
    """One entry of an instance's tree into the archive, read through an fd opened without
    following links (the tree is the job's): what is archived is what was checked. Returns
    the bytes archived."""
    info = tarfile.TarInfo(entry.rel)
    info.mtime = entry.mtime_ns // 1_000_000_000
    info.mode = entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        return 0
    if entry.kind == "link":
        info.type = tarfile.SYMTYPE
        info.linkname = entry.target
        tar.addfile(info)
        return 0
    fd = safepath.open_file(root, os.path.join(directory, entry.rel))
    with os.fdopen(fd, "rb") as fh:
        info.size = os.fstat(fh.fileno()).st_size
        tar.addfile(info, fh)
    return info.size


def tree_bytes(sources: list[tuple[str, str]]) -> int:
    """Bytes of the regular files under the source dirs (the archiving bar's total)."""
    return sum(staging.tree_bytes(directory) for _, directory in sources)


def archive_dirs(
    sources: list[tuple[str, str]],
    dest_path: str,
    on_file: Callable[[int], None] | None = None,
    root: str | None = None,
) -> ArchiveResult:
    """Merge ``[(host, dir), ...]`` (first wins) into a gzip tar at ``dest_path``;
    ``on_file(nbytes)`` after each file (progress). A full disk is a NoSpaceError and
    leaves nothing behind."""
    try:
        os.makedirs(os.path.dirname(dest_path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=os.path.dirname(dest_path),
            prefix=PARTIAL_PREFIX + os.path.basename(dest_path) + ".",
            suffix=".tmp",
        )
        os.close(fd)
    except OSError as exc:
        if _full(exc):
            raise _no_space(exc, dest_path, sources, 0) from None
        raise
    seen: dict[str, str] = {}
    conflicts: list[str] = []
    skipped: list[str] = []
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            for host, directory in sources:
                # ``root``: the trusted directory above the instances' trees (the job's);
                # below it nothing is followed, the tree's own top included
                top = root or directory
                found = safepath.lstat(top, directory) if root else _lstat(directory)
                if found is None or not stat.S_ISDIR(found.st_mode):
                    if found is not None and stat.S_ISLNK(found.st_mode):
                        skipped.append(f"{host}: {directory} is a link (not followed)")
                    continue
                for entry in safepath.walk(top, directory):
                    if entry.kind == "link" and safepath.link_leaves(entry.rel, entry.target):
                        skipped.append(f"{host}: {entry.rel} -> {entry.target}")
                        continue
                    if entry.rel in seen:
                        conflicts.append(
                            f"{entry.rel} (kept {seen[entry.rel]}'s, ignored {host}'s)"
                        )
                        continue
                    seen[entry.rel] = host
                    size = _add(tar, top, directory, entry)
                    if on_file is not None:
                        on_file(size)
        os.replace(tmp, dest_path)
    except BaseException as exc:
        written = _size(tmp)
        os.unlink(tmp)
        if isinstance(exc, OSError) and _full(exc):
            raise _no_space(exc, dest_path, sources, written) from None
        raise
    return ArchiveResult(dest_path, "file://" + dest_path, len(seen), conflicts, skipped)


def _full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _no_space(
    exc: OSError, dest_path: str, sources: list[tuple[str, str]], written: int
) -> NoSpaceError:
    """One line for a disk that filled while writing ``dest_path``: the path, what was
    written of what there was to write, and the space left where it was going."""
    why = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
    try:
        stat = os.statvfs(os.path.dirname(dest_path))
        free = f"{_mb(stat.f_bavail * stat.f_frsize)} free of {_mb(stat.f_blocks * stat.f_frsize)}"
    except OSError:
        free = "free space unknown"
    return NoSpaceError(
        f"{why} writing {dest_path}: {_mb(written)} of the archive written, from "
        f"{_mb(tree_bytes(sources))} of the instances' files; {free} there. Free space "
        "there (or choose another output_path) and run the job again; the partial archive "
        "was removed"
    )


def _mb(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size if os.path.isfile(path) else 0
    except OSError:
        return 0


def _archive_both(
    model_dirs: list[tuple[str, str]],
    output_dirs: list[tuple[str, str]],
    model_dest: str,
    output_dest: str,
    description: str,
    root: str | None = None,
) -> tuple[ArchiveResult, ArchiveResult]:
    """Both archives under one bar: bytes of the instances' files archived of all."""
    total = tree_bytes(model_dirs) + tree_bytes(output_dirs)
    with progress.transfer(description, total) as advance:
        model = archive_dirs(model_dirs, model_dest, advance, root)
        output = archive_dirs(output_dirs, output_dest, advance, root)
    return model, output


def output_prefix(output_path: str, job_name: str) -> str:
    return os.path.join(local_path(output_path), job_name, "output")


def save(
    output_path: str,
    job_name: str,
    model_dirs: list[tuple[str, str]],
    output_dirs: list[tuple[str, str]],
    scratch_root: str | None = None,
    patience: Patience | None = None,
    root: str | None = None,
) -> tuple[ArchiveResult, ArchiveResult]:
    """Write model.tar.gz and output.tar.gz under ``<output_path>/<job>/output/``.

    For an s3:// output_path the archives are built in a scratch directory (under
    ``scratch_root``, the job's directory, when given) and uploaded; an object appears
    only when its upload completes, so the bucket never holds half of one. An endpoint
    that is away is retried as ``patience`` allows (none: botocore's retries only).
    """
    if not output_path.startswith("s3://"):
        prefix = output_prefix(output_path, job_name)
        return _archive_both(
            model_dirs,
            output_dirs,
            os.path.join(prefix, "model.tar.gz"),
            os.path.join(prefix, "output.tar.gz"),
            f"Writing model.tar.gz and output.tar.gz to {prefix}",
            root,
        )
    from shipyard import storage
    from shipyard.storage.s3 import S3Store

    base = storage.parse(output_path).child(f"{job_name}/output")
    store = storage.store_for(base)
    results = []
    if scratch_root is not None:
        os.makedirs(scratch_root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shipyard-artifacts-", dir=scratch_root) as scratch:
        archives = _archive_both(
            model_dirs,
            output_dirs,
            os.path.join(scratch, "model.tar.gz"),
            os.path.join(scratch, "output.tar.gz"),
            "Archiving model.tar.gz and output.tar.gz",
            root,
        )
        for result in archives:
            target = base.child(os.path.basename(result.path))
            size = os.path.getsize(result.path)

            def upload(
                path: str = result.path, target: Location = target, size: int = size
            ) -> None:
                # a bar per try: a retried upload starts again from its first byte
                with progress.transfer(f"Uploading {target.uri}", size) as advance:
                    store.upload(path, target, callback=advance)

            patiently(f"uploading {target.uri}", upload, patience or Patience(0))
            results.append(
                ArchiveResult(
                    target.uri, target.uri, result.files, result.conflicts, result.skipped
                )
            )
    if patience is not None and isinstance(store, S3Store):
        _abort_leftover_parts(store, base)
    return results[0], results[1]


def _abort_leftover_parts(store: S3Store, base: Location) -> None:
    """A try cut off by the endpoint going away may leave a multipart upload it could not
    abort; once every archive is in, nothing under the job's prefix is still uploading."""
    try:
        store.abort_incomplete_uploads(base.child(""))
    except StorageError:
        pass  # best effort: the archives are in; discard_partial tries again if needed


def discard_partial(output_path: str, job_name: str, job_dir: str) -> list[str]:
    """Remove what an interrupted save() left: partial archives beside the final ones and
    the s3 scratch directory. Returns the paths removed."""
    removed = []
    if not output_path.startswith("s3://"):
        prefix = output_prefix(output_path, job_name)
        for path in glob.glob(os.path.join(glob.escape(prefix), PARTIAL_PREFIX + "*")):
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
    else:
        from shipyard import storage
        from shipyard.storage.s3 import S3Store

        base = storage.parse(output_path).child(f"{job_name}/output/")
        store = storage.store_for(base)
        try:
            if isinstance(store, S3Store):
                aborted = store.abort_incomplete_uploads(base)
                removed += [f"{base.uri} (incomplete multipart upload)"] * aborted
        except StorageError:
            pass  # the endpoint is unreachable now; the reason still says what happened
    scratch = os.path.join(job_dir, SCRATCH_DIR)
    if os.path.isdir(scratch):
        shutil.rmtree(scratch, ignore_errors=True)
        removed.append(scratch)
    return removed
