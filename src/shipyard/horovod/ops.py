"""Reduction-op constants, with Horovod's numeric values (``ReduceOp`` in horovod/common)."""

from __future__ import annotations

from .errors import UnsupportedError

Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_NAMES = {
    Average: "Average",
    Sum: "Sum",
    Adasum: "Adasum",
    Min: "Min",
    Max: "Max",
    Product: "Product",
}


def op_name(op: int) -> str:
    return _NAMES.get(op, f"op{op}")


def resolve_op(op: int | None, average: bool | None = None) -> int:
    """Horovod's old ``average=`` argument and the newer ``op=`` (one of them at most)."""
    if op is not None and average is not None:
        raise ValueError("pass op= or the deprecated average=, not both")
    if average is not None:
        return Average if average else Sum
    if op is None:
        return Average
    if op not in _NAMES:
        raise ValueError(
            f"unknown reduction op {op!r}; use Average, Sum, Min, Max, Product or Adasum"
        )
    return int(op)


def check_process_set(process_set) -> None:
    """Only the global process set exists here."""
    if process_set is None:
        return
    if getattr(process_set, "process_set_id", 0) not in (0, None):
        raise UnsupportedError(
            "process sets other than the global one are not supported by shipyard.horovod; "
            "split the job into separate jobs or use torch.distributed groups"
        )


class ProcessSet:
    """The global process set (``hvd.global_process_set``); the only one supported."""

    process_set_id = 0

    def __init__(self, ranks=None):
        if ranks is not None:
            raise UnsupportedError(
                "process sets other than the global one are not supported by shipyard.horovod"
            )

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = ProcessSet()
