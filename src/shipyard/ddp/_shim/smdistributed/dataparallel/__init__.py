"""``smdistributed.dataparallel``: SMDDP's collectives mapped by shipyard onto PyTorch DDP
(``.torch``) and onto shipyard.horovod's MPI engine (``.tensorflow``)."""

__version__ = "shipyard-shim"
