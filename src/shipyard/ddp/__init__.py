"""PyTorch DDP for shipyard: torchrun's process model without torchrun.

The ``torch_distributed`` runner (agent/runners/torch_distributed.py) serves the three
SageMaker forms ``torch_distributed``, ``pytorchddp`` and ``smdistributed.dataparallel``.
Per instance it starts ``processes_per_host`` ranks, each under a small wrapper
(:mod:`shipyard.ddp.rank`), and on algo-1 one rendezvous service
(:mod:`shipyard.ddp.rendezvous`) that hosts the job's TCPStore, as torchrun's agent does
(``TORCHELASTIC_USE_AGENT_STORE=True``), so ``dist.init_process_group()`` with no
arguments works in every rank.

Why a service of our own instead of rank 0's store: it can pick another MASTER_PORT
when the usual one is taken and tell every instance which (over a small authenticated
announce protocol, :mod:`shipyard.ddp.announce`, that works across machines), it sees
which ranks joined the rendezvous (so a rank that never joins fails the job naming it),
and it outlives the ranks of its own instance until every rank has finished (torchrun's
exit barrier).

Pure parts (the per-rank environment, port candidates, join keys) live in
:mod:`shipyard.ddp.contract` and are tested as functions. The ``smdistributed`` shim for
unmodified SMDDP scripts is in ``_shim`` (see :func:`shim_path`).
"""

from __future__ import annotations

import os


def shim_path() -> str:
    """Directory to put on PYTHONPATH so ``import smdistributed.dataparallel...`` resolves
    to shipyard's shim (smddp mapped onto nccl or gloo)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim")


def timing_hook_path() -> str:
    """Directory whose ``sitecustomize`` times torch DDP's steps (shipyard/ddp/steptiming.py);
    the agent puts it on every job process's PYTHONPATH."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_hook")
