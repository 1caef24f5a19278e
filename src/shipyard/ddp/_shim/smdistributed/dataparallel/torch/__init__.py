"""``smdistributed.dataparallel.torch``: see torch_smddp (the backend) and distributed (the
SMDDP v1 API)."""
