"""Holds the ``horovod`` shim package; see ``shipyard.horovod.shim_path()``."""
