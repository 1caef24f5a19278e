"""The error tree of shipyard.horovod, in one module.

Names follow Horovod's (``horovod.common.exceptions``) so ``except HorovodInternalError``
in an unmodified script keeps working; the shim maps ``horovod.common.exceptions`` here.

    HorovodError (shipyard.errors.ShipyardError, RuntimeError)
    ├── HorovodInternalError               a collective failed; the job should stop (or restart)
    │   ├── TensorMismatchError            ranks disagreed on (op, name, shape, dtype, root):
    │   │                                  raised on *every* rank, before any data moved
    │   ├── JoinedRankError                an op needs a rank that already called join()
    │   └── CollectiveArgumentError (ValueError)
    │                                      some rank passed an invalid argument (bad splits,
    │                                      unsupported dtype, ...): raised on every rank
    ├── NotInitializedError (ValueError)   hvd.init() was not called (Horovod raises ValueError)
    ├── HostsUpdatedInterrupt              Horovod elastic's interrupt; never raised here
    └── UnsupportedError (NotImplementedError)
                                           a Horovod feature shipyard does not implement
                                           (process sets, elastic, Adasum with join, ...)

``MPIRunNotFoundError``
lives with the mpi runner (``shipyard.mpi.command``): it is a launcher
error, raised in the agent, never inside a rank.
"""

from __future__ import annotations

from shipyard.errors import ShipyardError


class HorovodError(ShipyardError, RuntimeError):
    """Base of every error shipyard.horovod raises on purpose (a ShipyardError, and a
    RuntimeError as Horovod's own errors are)."""


class HorovodInternalError(HorovodError):
    """A collective operation failed. As in Horovod, the job cannot continue reliably
    unless the failure was a negotiation error (see ``TensorMismatchError``)."""


class TensorMismatchError(HorovodInternalError):
    """Ranks submitted different tensors (shape, dtype, name, op or root rank) to the same
    collective. Detected by a metadata exchange *before* the data collective, so it is
    raised on every rank and nothing hangs; the engine stays usable afterwards.

    ``per_rank`` holds each rank's description of what it submitted.
    """

    def __init__(self, message: str, per_rank: list | None = None):
        super().__init__(message)
        self.per_rank = per_rank or []


class JoinedRankError(HorovodInternalError):
    """An operation needs data from a rank that already called ``join()`` (for example
    a broadcast whose root has joined, or Adasum while some rank has joined)."""


class CollectiveArgumentError(HorovodInternalError, ValueError):
    """Some rank passed an invalid argument to a collective. Because the check is part of
    the negotiation, every rank raises it (with each offending rank's reason)."""

    def __init__(self, message: str, per_rank: list | None = None):
        super().__init__(message)
        self.per_rank = per_rank or []


class NotInitializedError(HorovodError, ValueError):
    """Raised by every call that needs ``init()`` first."""

    def __init__(self, message: str = "Horovod has not been initialized; use hvd.init()."):
        super().__init__(message)


class HostsUpdatedInterrupt(HorovodError):
    """Horovod elastic's interrupt. Defined for scripts that catch it; shipyard does not
    implement elastic training, so it is never raised."""


class UnsupportedError(HorovodError, NotImplementedError):
    """A Horovod feature that shipyard.horovod does not implement; the message says what
    to use instead."""
