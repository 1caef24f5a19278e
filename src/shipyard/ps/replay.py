"""The replay guard: a receiver accepts each authenticated message once.

Why its own module: a MAC says who sent a message, not that it is new; a captured
message re-sent would otherwise be applied again (a gradient pushed twice). The
guard is the receiver's memory of what it accepted, checked after the MAC
(integrity.py) by ``wire.decode``; shards and clients each keep one.
"""

from __future__ import annotations

import threading

from .errors import ErrorCode, ReplayedMessageError
from .header import Header, MsgType


class ReplayGuard:
    """A receiver's memory of what it accepted: every authenticated message must be new.

    Each message carries the sender's random ``session``, its counter ``seq`` in that
    session and ``peer``, the receiver's own session as the sender learned it (a shard's
    in the HELLO reply; a client's is echoed in every reply), all inside the MAC. A
    message is accepted once: ``peer`` must be this receiver's session (0 only for a
    HELLO, which changes nothing but liveness), and ``seq`` must not have been seen in its
    session: an anti-replay window as in IPsec (RFC 4303 3.4.3) of ``WINDOW`` numbers
    below the highest seen, older ones refused. A captured message re-sent, to this
    process or to one started later (a new session), is dropped and counted.
    """

    WINDOW = 1024
    MAX_SESSIONS = 16384

    def __init__(self, session: int) -> None:
        self.session = session
        self._windows: dict[int, list[int]] = {}  # sender session -> [highest seq, bitmap]
        self._lock = threading.Lock()

    def check(self, h: Header) -> None:
        """Raise ReplayedMessageError unless ``h`` is fresh; record it when it is."""
        if h.peer != self.session and not (h.peer == 0 and h.msg_type == MsgType.HELLO):
            raise ReplayedMessageError(
                f"message for session {h.peer:#x}, this receiver is {self.session:#x} "
                "(replayed from another run, or sent before a restart)",
                code=ErrorCode.STALE_SESSION,
            )
        if h.seq < 1:
            raise ReplayedMessageError("message without a sequence number")
        with self._lock:
            win = self._windows.get(h.session)
            if win is None:
                if len(self._windows) >= self.MAX_SESSIONS:
                    self._windows.pop(next(iter(self._windows)))
                self._windows[h.session] = [h.seq, 1]
                return
            top, bits = win
            if h.seq > top:
                win[0] = h.seq
                win[1] = ((bits << (h.seq - top)) | 1) & ((1 << self.WINDOW) - 1)
                return
            age = top - h.seq
            if age >= self.WINDOW or bits >> age & 1:
                raise ReplayedMessageError(
                    f"message {h.seq} of session {h.session:#x} was already received"
                    if age < self.WINDOW
                    else f"message {h.seq} of session {h.session:#x} is older than the window"
                )
            win[1] = bits | 1 << age
