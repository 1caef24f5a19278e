"""Artifacts: every instance's model/ -> model.tar.gz, output/data/ -> output.tar.gz.

Like SageMaker, all instances' directories end up in one archive under
``<output_path>/<job>/output/``. Where two instances wrote the same file, algo-1's copy
wins (SageMaker's result would depend on upload order) and the conflict is reported.
Archives are written to a temporary name and renamed, so a reader never sees half a file;
an s3:// output_path gets them uploaded whole. Temporary names all start with
``PARTIAL_PREFIX`` and s3 scratch lives under the job's directory, so when the supervisor
dies mid-upload :func:`discard_partial` (run by the reconcile that marks the job) finds
and removes every piece.
"""

from __future__ import annotations

import glob
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from shipyard.control import staging
from shipyard.control.staging import local_path
from shipyard.observe import progress

PARTIAL_PREFIX = ".shipyard-partial-"
SCRATCH_DIR = "upload-scratch"


@dataclass
class ArchiveResult:
    path: str
    uri: str
    files: int
    conflicts: list[str] = field(default_factory=list)


def _walk(root: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if not os.listdir(full):
                out.append(os.path.relpath(full, root) + os.sep)
    return out


def tree_bytes(sources: list[tuple[str, str]]) -> int:
    """Bytes of the regular files under the source dirs (the archiving bar's total)."""
    return sum(staging.tree_bytes(directory) for _, directory in sources)


def archive_dirs(
    sources: list[tuple[str, str]],
    dest_path: str,
    on_file: Callable[[int], None] | None = None,
) -> ArchiveResult:
    """Merge ``[(host, dir), ...]`` (first wins) into a gzip tar at ``dest_path``;
    ``on_file(nbytes)`` after each file (progress)."""
    os.makedirs(os.path.dirname(dest_path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=os.path.dirname(dest_path),
        prefix=PARTIAL_PREFIX + os.path.basename(dest_path) + ".",
        suffix=".tmp",
    )
    os.close(fd)
    seen: dict[str, str] = {}
    conflicts: list[str] = []
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
            for host, directory in sources:
                if not os.path.isdir(directory):
                    continue
                for rel in _walk(directory):
                    if rel in seen:
                        conflicts.append(f"{rel} (kept {seen[rel]}'s, ignored {host}'s)")
                        continue
                    seen[rel] = host
                    tar.add(
                        os.path.join(directory, rel.rstrip(os.sep)),
                        arcname=rel.rstrip(os.sep),
                        recursive=False,
                    )
                    if on_file is not None:
                        on_file(_size(os.path.join(directory, rel.rstrip(os.sep))))
        os.replace(tmp, dest_path)
    except BaseException:
        os.unlink(tmp)
        raise
    return ArchiveResult(dest_path, "file://" + dest_path, len(seen), conflicts)


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
) -> tuple[ArchiveResult, ArchiveResult]:
    """Both archives under one bar: bytes of the instances' files archived of all."""
    total = tree_bytes(model_dirs) + tree_bytes(output_dirs)
    with progress.transfer(description, total) as advance:
        model = archive_dirs(model_dirs, model_dest, advance)
        output = archive_dirs(output_dirs, output_dest, advance)
    return model, output


def output_prefix(output_path: str, job_name: str) -> str:
    return os.path.join(local_path(output_path), job_name, "output")


def save(
    output_path: str,
    job_name: str,
    model_dirs: list[tuple[str, str]],
    output_dirs: list[tuple[str, str]],
    scratch_root: str | None = None,
) -> tuple[ArchiveResult, ArchiveResult]:
    """Write model.tar.gz and output.tar.gz under ``<output_path>/<job>/output/``.

    For an s3:// output_path the archives are built in a scratch directory (under
    ``scratch_root``, the job's directory, when given) and uploaded; an object appears
    only when its upload completes, so the bucket never holds half of one.
    """
    if not output_path.startswith("s3://"):
        prefix = output_prefix(output_path, job_name)
        return _archive_both(
            model_dirs,
            output_dirs,
            os.path.join(prefix, "model.tar.gz"),
            os.path.join(prefix, "output.tar.gz"),
            f"Writing model.tar.gz and output.tar.gz to {prefix}",
        )
    from shipyard import storage

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
        )
        for result in archives:
            target = base.child(os.path.basename(result.path))
            size = os.path.getsize(result.path)
            with progress.transfer(f"Uploading {target.uri}", size) as advance:
                store.upload(result.path, target, callback=advance)
            results.append(ArchiveResult(target.uri, target.uri, result.files, result.conflicts))
    return results[0], results[1]


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
        from shipyard.errors import StorageError
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
