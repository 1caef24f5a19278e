"""shipyard's stand-in for SageMaker's ``smdistributed`` package (data parallel only).

Put on PYTHONPATH by the torch_distributed runner (PyTorch: SMDDP scripts run unmodified on
PyTorch DDP; see ``smdistributed.dataparallel.torch.torch_smddp``) and by the mpi runner for
the TensorFlow estimator (``smdistributed.dataparallel.tensorflow`` on shipyard.horovod).
"""
