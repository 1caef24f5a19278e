"""Batch transform: ``records`` (pure: split, group, filter, join) and ``engine``
(mini-batched requests to a running model server, outputs written atomically)."""
