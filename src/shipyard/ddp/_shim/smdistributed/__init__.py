"""shipyard's stand-in for SageMaker's ``smdistributed`` package (data parallel only).

Put on PYTHONPATH by the torch_distributed runner so SMDDP scripts run unmodified on
PyTorch DDP; see ``smdistributed.dataparallel.torch.torch_smddp``.
"""
