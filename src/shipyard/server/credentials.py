"""The key pair clients sign with: configured, or made once per ``$SHIPYARD_HOME``.

Every request to ``shipyard server`` is SigV4-signed, loopback included: any local user
(and, through DNS rebinding, any web page) can open a connection to 127.0.0.1, so a
well-known default secret would sign nothing. Without ``SHIPYARD_SERVER_ACCESS_KEY`` /
``SHIPYARD_SERVER_SECRET_KEY`` the server makes a random secret on first use and keeps it
in ``$SHIPYARD_HOME/server/credentials.json`` (0600 in the 0700 home); ``shipyard server
env`` prints it, so ``eval "$(shipyard server env)"`` is all a notebook needs.
"""

from __future__ import annotations

import json
import os
import secrets

from shipyard import settings
from shipyard.control.home import Home

DEFAULT_ACCESS_KEY = "shipyard"


ACCESS_ENV, SECRET_ENV = "SHIPYARD_SERVER_ACCESS_KEY", "SHIPYARD_SERVER_SECRET_KEY"


def path(home: str) -> str:
    return os.path.join(home, "server", "credentials.json")


def configured() -> bool:
    """Whether the key pair comes from the environment (required off loopback, where the
    clients are on other machines and must be given the key on purpose)."""
    return bool(settings.get(ACCESS_ENV) and settings.get(SECRET_ENV))


def load(home: str) -> tuple[str, str]:
    """(access key, secret key): the configured pair, else this home's own (made once)."""
    if configured():
        return settings.text(ACCESS_ENV), settings.text(SECRET_ENV)
    Home(home).ensure_private()
    file = path(home)
    try:
        return _read(file)
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(file), mode=0o700, exist_ok=True)
    pair = {"access_key": DEFAULT_ACCESS_KEY, "secret_key": secrets.token_urlsafe(30)}
    tmp = f"{file}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(pair, fh)
    try:
        os.link(tmp, file)  # exclusive: of two first starts racing, one secret wins
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return _read(file)


def _read(file: str) -> tuple[str, str]:
    with open(file, encoding="utf-8") as fh:
        data = json.load(fh)
    try:
        return str(data["access_key"]), str(data["secret_key"])
    except (KeyError, TypeError):
        raise ValueError(
            f"{file} is not a shipyard server key file; delete it to make a new key"
        ) from None
