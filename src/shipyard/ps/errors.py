"""The typed error tree of shipyard.ps, in one module (httpx style).

Client-side mistakes raise before anything is sent; problems a shard detects come
back as an error reply and are raised on the client as a ``RemoteError`` subclass
chosen by the reply's error code. The shard itself never raises out of its loop:
it counts the rejection by reason (see ``stats``) and keeps serving.

    PSError
    ├── PSConfigError (ValueError)        bad option: policy, consistency mode,
    │                                     max_staleness, optimizer, missing secret
    ├── ShapeMismatchError (ValueError)   a push whose shape/dtype differs from the
    │                                     registered one (raised client side too)
    ├── UnknownKeyError (KeyError)        a key that was never registered / is not held
    ├── WireError                         a frame that cannot be decoded
    │   ├── AuthenticationError           MAC mismatch (wrong SHIPYARD_PS_SECRET?)
    │   ├── MalformedFrameError           bad magic/version/header size/frame count
    │   ├── TruncatedFrameError           payload shorter than the header says
    │   ├── OversizedFrameError           payload longer than the header says / limit
    │   ├── ReplayedMessageError          authentic but not new (replay protection)
    │   └── UnknownMessageTypeError       message type code not in this protocol
    ├── RemoteError                       the shard answered with an error reply
    │   (``code``, ``shard``, ``key`` attributes; the subclasses above are *also*
    │    raised as RemoteError subclasses: RemoteShapeMismatch, RemoteUnknownKey, ...)
    ├── PSTimeoutError (TimeoutError)     no reply in time: shard down, wrong endpoint,
    │                                     or a MAC mismatch the shard silently dropped
    └── CheckpointError                   a checkpoint cannot be written / read / resumed

Error codes are short stable strings (``ErrorCode``); they are the keys of the
shard's ``rejected`` counters and of the error reply's JSON payload.
"""

from __future__ import annotations

from shipyard.errors import ShipyardError


class ErrorCode:
    """Stable reason strings: error-reply codes and ``rejected`` counter keys."""

    BAD_MAC = "bad_mac"
    MALFORMED = "malformed"
    BAD_MAGIC = "bad_magic"
    BAD_VERSION = "bad_version"
    TRUNCATED = "truncated"
    OVERSIZED = "oversized"
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_KEY = "unknown_key"
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    WRONG_SHARD = "wrong_shard"
    BAD_REQUEST = "bad_request"
    NOT_TRAINABLE = "not_trainable"
    CONFIG_MISMATCH = "config_mismatch"
    INTERNAL = "internal"
    REPLAYED = "replayed"  # an authentic message seen before (or older than the window)
    STALE_SESSION = "stale_session"  # authentic, but addressed to another session/run
    FRAME_TIMEOUT = "frame_timeout"  # a peer stopped in the middle of a message

    ALL = (
        BAD_MAC,
        MALFORMED,
        BAD_MAGIC,
        BAD_VERSION,
        TRUNCATED,
        OVERSIZED,
        UNKNOWN_TYPE,
        UNKNOWN_KEY,
        SHAPE_MISMATCH,
        DTYPE_MISMATCH,
        WRONG_SHARD,
        BAD_REQUEST,
        NOT_TRAINABLE,
        CONFIG_MISMATCH,
        INTERNAL,
        REPLAYED,
        STALE_SESSION,
        FRAME_TIMEOUT,
    )


class PSError(ShipyardError):
    """Base of every error shipyard.ps raises on purpose."""

    code: str = ErrorCode.INTERNAL


class PSConfigError(PSError, ValueError):
    """A bad option, refused before anything is started or sent."""

    code = ErrorCode.BAD_REQUEST


class ShapeMismatchError(PSError, ValueError):
    """A tensor's shape or dtype differs from what was registered for its key."""

    code = ErrorCode.SHAPE_MISMATCH


class UnknownKeyError(PSError, KeyError):
    """A key that was never registered (client) or is not held by this shard (server)."""

    code = ErrorCode.UNKNOWN_KEY

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "unknown key"


class WireError(PSError):
    """A frame sequence that cannot be decoded into a message."""

    code = ErrorCode.MALFORMED


class AuthenticationError(WireError):
    """The message's MAC does not verify: wrong secret, or the bytes were altered."""

    code = ErrorCode.BAD_MAC


class MalformedFrameError(WireError):
    """Wrong magic, protocol version, header size, or frame count."""

    code = ErrorCode.MALFORMED


class TruncatedFrameError(WireError):
    """The payload is shorter than the header announces."""

    code = ErrorCode.TRUNCATED


class OversizedFrameError(WireError):
    """The payload is longer than announced, or above the configured limit."""

    code = ErrorCode.OVERSIZED


class ReplayedMessageError(WireError):
    """An authentic message that is not new: seen before, older than the receiver's
    window, or addressed to another session (a run before a restart). Dropped, never
    answered or applied; counted under ``replayed`` or ``stale_session``."""

    code = ErrorCode.REPLAYED

    def __init__(self, message: str, code: str = ErrorCode.REPLAYED) -> None:
        super().__init__(message)
        self.code = code


class UnknownMessageTypeError(WireError):
    """A message type code this protocol version does not define."""

    code = ErrorCode.UNKNOWN_TYPE


class RemoteError(PSError):
    """A shard answered a request with an error reply.

    ``code`` is one of ``ErrorCode``; ``shard`` the shard index; ``key`` the key
    name (or id) the request was about, when there was one.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = ErrorCode.INTERNAL,
        shard: int | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.shard = shard
        self.key = key


class RemoteShapeMismatch(RemoteError, ShapeMismatchError):
    """The shard refused a tensor whose shape/dtype differs from the registered one."""


class RemoteUnknownKey(RemoteError, UnknownKeyError):
    """The shard does not hold the key the request named."""


class RemoteConfigMismatch(RemoteError, PSConfigError):
    """A registration conflicts with what the shard already holds."""


class PSTimeoutError(PSError, TimeoutError):
    """No reply within the timeout.

    Causes, most likely first: the shard is not running or not reachable at that
    endpoint; the client's secret differs from the shard's (messages with a bad
    MAC are dropped without a reply, by design); a sync/staleness wait that other
    workers never released.
    """


class CheckpointError(PSError):
    """A checkpoint could not be written, read, or does not fit this shard."""


def remote_error(
    code: str, message: str, *, shard: int | None = None, key: str | None = None
) -> RemoteError:
    """Build the most specific ``RemoteError`` subclass for an error reply's code."""
    cls: type[RemoteError]
    if code in (ErrorCode.SHAPE_MISMATCH, ErrorCode.DTYPE_MISMATCH):
        cls = RemoteShapeMismatch
    elif code == ErrorCode.UNKNOWN_KEY:
        cls = RemoteUnknownKey
    elif code == ErrorCode.CONFIG_MISMATCH:
        cls = RemoteConfigMismatch
    else:
        cls = RemoteError
    where = f"shard {shard}" if shard is not None else "shard"
    return cls(f"{where} rejected the request ({code}): {message}", code=code, shard=shard, key=key)
