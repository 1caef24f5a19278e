"""Per-job credentials: what a training job signs its calls to ``shipyard server`` with.

A job never holds the server's own key (that key can create jobs, and a job could then
create one that reads what it may not). At ``CreateTrainingJob`` the server mints the job
a key of its own (``mint``): an access key id, a secret and a session token, kept 0600 in
``$SHIPYARD_HOME/server/job-keys/<job>.json`` (a 0700 directory) so they survive a server
restart. With it go the S3 prefixes the job may touch (``JobGrant.read``/``write``, what a
SageMaker training job's execution role is usually scoped to); ``job_policy`` enforces
them. The key is revoked when the job ends in any terminal state: ``ended`` asks the job
store at every request, so no event can be missed (a server restarted while the job ended
revokes it at the next call). A revoked key still verifies its signature, so the caller
gets AccessDenied saying why, not a confusing "unknown key".

The table is also the ``Mapping`` of access key -> secret that SigV4 verification reads:
the server's own key(s) and every job's.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace

JOB_KEY_PREFIX = "SYJOB"  # access key ids of job keys (AWS's own start AKIA/ASIA)


@dataclass(frozen=True)
class JobGrant:
    """One job's credential and what it may reach (``bucket/key-prefix`` strings)."""

    job: str
    access_key: str
    secret_key: str
    session_token: str
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    revoked: str | None = None  # why, once revoked

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> JobGrant:
        data = json.loads(text)
        data["read"] = tuple(data.get("read") or ())
        data["write"] = tuple(data.get("write") or ())
        return cls(**data)


class KeyTable(Mapping[str, str]):
    """access key -> secret for the server's keys and every job's, with job grants.

    ``ended(job)`` returns the job's terminal status (Completed, Failed, Stopped) or
    None while it runs (or is not yet recorded: a key is minted just before its job)."""

    def __init__(
        self,
        root: str,
        master: Mapping[str, str],
        ended: Callable[[str], str | None] = lambda job: None,
    ) -> None:
        self.root = root
        self.master = dict(master)
        self.ended = ended
        self._lock = threading.Lock()
        self._by_key: dict[str, JobGrant] = {}
        if os.path.isdir(root):
            for name in sorted(os.listdir(root)):
                if name.endswith(".json"):
                    try:
                        with open(os.path.join(root, name), encoding="utf-8") as fh:
                            grant = JobGrant.from_json(fh.read())
                    except (OSError, ValueError, TypeError):
                        continue  # a torn or foreign file is no key
                    self._by_key[grant.access_key] = grant

    # -- Mapping: what SigV4 verification reads --------------------------------------------
    def __getitem__(self, access_key: str) -> str:
        if access_key in self.master:
            return self.master[access_key]
        grant = self._by_key.get(access_key)
        if grant is None:
            raise KeyError(access_key)
        return grant.secret_key

    def __iter__(self) -> Iterator[str]:
        return iter([*self.master, *self._by_key])

    def __len__(self) -> int:
        return len(self.master) + len(self._by_key)

    # -- job keys ---------------------------------------------------------------------------
    def mint(self, job: str, read: tuple[str, ...], write: tuple[str, ...]) -> JobGrant:
        """A fresh credential for ``job`` (replacing any older one of that name), stored
        0600 before it is handed out."""
        grant = JobGrant(
            job=job,
            access_key=JOB_KEY_PREFIX + secrets.token_hex(8).upper(),
            secret_key=secrets.token_urlsafe(30),
            session_token=secrets.token_urlsafe(32),
            read=tuple(sorted(set(read))),
            write=tuple(sorted(set(write))),
        )
        with self._lock:
            for old in [g for g in self._by_key.values() if g.job == job]:
                del self._by_key[old.access_key]
            self._write(grant)
            self._by_key[grant.access_key] = grant
        return grant

    def discard(self, job: str) -> None:
        """Forget ``job``'s key entirely (its creation was refused: nothing is left)."""
        with self._lock:
            for old in [g for g in self._by_key.values() if g.job == job]:
                del self._by_key[old.access_key]
            try:
                os.unlink(self._path(job))
            except FileNotFoundError:
                pass

    def grant(self, access_key: str) -> JobGrant | None:
        """The job grant behind ``access_key`` (None for the server's own key), revoked
        first when its job has ended."""
        grant = self._by_key.get(access_key)
        if grant is None or grant.revoked:
            return grant
        status = self.ended(grant.job)
        if status is None:
            return grant
        return self._revoke(grant, f"the job ended ({status})")

    def by_token(self, token: str) -> JobGrant | None:
        """The live grant whose container-credentials token is ``token``."""
        for grant in list(self._by_key.values()):
            if secrets.compare_digest(grant.session_token, token):
                return self.grant(grant.access_key)
        return None

    def _revoke(self, grant: JobGrant, why: str) -> JobGrant:
        revoked = replace(grant, revoked=why)
        with self._lock:
            if self._by_key.get(grant.access_key) is grant:
                self._write(revoked)
                self._by_key[grant.access_key] = revoked
        return self._by_key.get(grant.access_key, revoked)

    def _path(self, job: str) -> str:
        return os.path.join(self.root, f"{job}.json")

    def _write(self, grant: JobGrant) -> None:
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        path = self._path(grant.job)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(grant.to_json())
        os.replace(tmp, path)
