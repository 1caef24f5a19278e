"""Holds the ``smdistributed`` shim package; see ``shipyard.ddp.shim_path()``. Not imported
as ``shipyard.ddp._shim``: its directory goes on PYTHONPATH (here for packaging only)."""
