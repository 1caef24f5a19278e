"""Where the sandbox's external tools are (iproute2's ``ip``, passt's ``pasta``).

Looked up in the sbin directories too: a user's PATH often lacks them.
"""

from __future__ import annotations

import os
import shutil

_SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


def find(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for directory in _SBIN:
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK):
            return path
    return None
