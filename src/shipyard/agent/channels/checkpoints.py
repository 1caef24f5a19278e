"""checkpoint_s3_uri <-> the instance's checkpoint directory, as SageMaker syncs them.

At start every object under the URI is copied in (a restarted job resumes); while the
script runs, new or changed files are uploaded every SHIPYARD_CHECKPOINT_SYNC_SECONDS
(default 10) by a background thread; when the script has ended a last pass uploads
what is left. Files are uploaded whole; a file still being written is uploaded again
on the next pass once its size or mtime changes. Local deletions are not propagated.
The last pass waits for a store that is away (a restarted ``shipyard server``) as the
job's artifact upload does (shipyard.storage.retry, ``SHIPYARD_UPLOAD_PATIENCE``; the
supervisor's max_run ends the wait at the latest), said in the instance's log (issue 37).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from shipyard import settings, storage
from shipyard.agent.channels.file import download_objects
from shipyard.errors import StorageError
from shipyard.runtime import safepath
from shipyard.storage.retry import Patience, patiently


class CheckpointSync:
    """Also syncs TensorBoard output (``what="tensorboard"``), which SageMaker uploads
    the same way: new or changed files, during the job and once more at its end."""

    def __init__(
        self,
        uri: str,
        local_dir: str,
        endpoint: str | None,
        log: Callable[[str], None],
        what: str = "checkpoints",
        interval: float | None = None,
    ) -> None:
        self.base = storage.parse(uri)
        self.local_dir = local_dir
        self.store = storage.store_for(self.base, endpoint)
        self.log = log
        self.what = what
        self.interval = (
            interval
            if interval is not None
            else settings.number("SHIPYARD_CHECKPOINT_SYNC_SECONDS")
        )
        self.uploaded: dict[str, tuple[int, int]] = {}
        self.refused: set[str] = set()  # links said once each
        self.sent = 0  # files uploaded, every pass together
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def restore(self) -> int:
        """Copy existing checkpoints in; returns how many objects there were."""
        os.makedirs(self.local_dir, exist_ok=True)
        try:
            objects = self.store.list(self.base)
        except StorageError as exc:
            if "does not exist" in str(exc) and self.base.scheme == "file":
                return 0
            raise
        base_key = self.base.key if self.base.scheme == "s3" else ""
        if base_key and not base_key.endswith("/"):
            # keep paths relative to the URI itself, not to its parent "directory"
            objects = [
                storage.ObjectInfo(o.location, o.size, o.location.key[len(base_key) :].lstrip("/"))
                for o in objects
                if o.location.key.startswith(base_key + "/")
            ]
        if objects:
            download_objects(
                self.store, objects, self.local_dir, f"checkpoints from {self.base.uri}", self.log
            )
            for obj in objects:
                path = os.path.join(self.local_dir, obj.relative)
                st = os.stat(path)
                self.uploaded[obj.relative] = (st.st_size, st.st_mtime_ns)
        return len(objects)

    def sync_once(self) -> int:
        """Upload new or changed files; returns how many were uploaded.

        The directory is the job's: it is walked without following links (its own top
        included, checked from the directory above it), a link is never uploaded (one out
        of the tree is said once), and each file is uploaded from the descriptor that was
        checked (``/proc/self/fd/N``), not reopened by name."""
        count = 0
        top = os.path.dirname(os.path.abspath(self.local_dir))
        with self._lock:
            for entry in safepath.walk(top, self.local_dir):
                name = entry.rel.rsplit("/", 1)[-1]
                if name.startswith(".shipyard-") or entry.kind == "dir":
                    continue
                if entry.kind == "link":
                    if entry.rel not in self.refused:
                        self.refused.add(entry.rel)
                        self.log(
                            f"{self.what}: not uploading {entry.rel}: a link "
                            f"({entry.target}), not a file of the instance"
                        )
                    continue
                stamp = (entry.size, entry.mtime_ns)
                if self.uploaded.get(entry.rel) == stamp:
                    continue
                try:
                    fd = safepath.open_file(top, os.path.join(self.local_dir, entry.rel))
                except OSError:  # gone or replaced meanwhile: the next pass sees it
                    continue
                try:
                    self.store.upload(f"/proc/self/fd/{fd}", self.base.child(entry.rel))
                finally:
                    os.close(fd)
                self.uploaded[entry.rel] = stamp
                self.sent += 1
                count += 1
        return count

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                try:
                    self.sync_once()
                except Exception as exc:  # noqa: BLE001 - retried; the final pass raises
                    self.log(f"{self.what} upload to {self.base.uri} failed, will retry: {exc}")

        self._thread = threading.Thread(target=loop, name=f"{self.what}-sync", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        before = self.sent
        cap = settings.number("SHIPYARD_UPLOAD_PATIENCE")
        patience = Patience(
            cap,
            f"at most SHIPYARD_UPLOAD_PATIENCE={cap:g} s, within the job's max_run",
            say=lambda message: self.log(f"{self.what}: {message}"),
        )
        # a pass cut short is taken up again: what it uploaded is not sent twice
        patiently(f"uploading {self.what} to {self.base.uri}", self.sync_once, patience)
        count = self.sent - before
        self.log(f"{self.what}: {count} file(s) uploaded to {self.base.uri} at the end")
