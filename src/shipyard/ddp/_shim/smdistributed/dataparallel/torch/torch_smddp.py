"""``import smdistributed.dataparallel.torch.torch_smddp`` makes ``backend="smddp"`` valid.

SMDDP 1.4+ scripts do::

    import smdistributed.dataparallel.torch.torch_smddp
    import torch.distributed as dist
    dist.init_process_group(backend="smddp")

shipyard maps ``smddp`` onto ``nccl`` when CUDA is available and onto ``gloo`` otherwise,
and says so in one log line. It is a translation of the backend name in
``init_process_group``/``new_group`` rather than a registered backend object, so
everything torch and DDP do with the group (``get_backend``, DDP's reducer, NCCL
streams) is exactly what they do for nccl/gloo.
"""

from __future__ import annotations

import functools
import os
import sys

import torch
import torch.distributed as dist

SMDDP = "smddp"
_PATCHED = "_shipyard_smddp_patched"


def backend_for_this_machine() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _translate(backend):
    if isinstance(backend, str) and backend.lower() == SMDDP:
        chosen = backend_for_this_machine()
        if not getattr(_translate, "logged", False):
            _translate.logged = True
            if os.environ.get("RANK", "0") == "0":
                sys.stderr.write(
                    f"[shipyard] backend 'smddp' runs as '{chosen}' on PyTorch "
                    "DDP (smdistributed shim)\n"
                )
                sys.stderr.flush()
        return chosen
    return backend


def _wrap(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if args:
            args = (_translate(args[0]), *args[1:])
        if "backend" in kwargs:
            kwargs["backend"] = _translate(kwargs["backend"])
        return function(*args, **kwargs)

    return wrapper


def _patch() -> None:
    if getattr(dist, _PATCHED, False):
        return
    dist.init_process_group = _wrap(dist.init_process_group)
    c10d = dist.distributed_c10d
    c10d.init_process_group = dist.init_process_group
    original_new_group = dist.new_group

    @functools.wraps(original_new_group)
    def new_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _translate(kwargs["backend"])
        if len(args) >= 3:
            args = (*args[:2], _translate(args[2]), *args[3:])
        return original_new_group(*args, **kwargs)

    dist.new_group = new_group
    c10d.new_group = new_group
    setattr(dist, _PATCHED, True)


_patch()
