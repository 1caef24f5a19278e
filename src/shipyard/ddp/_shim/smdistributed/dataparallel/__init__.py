"""``smdistributed.dataparallel``: SMDDP's collectives mapped onto PyTorch DDP by shipyard."""

__version__ = "shipyard-shim"
