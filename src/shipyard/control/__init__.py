"""The control plane: job store, lifecycle, staging, artifacts and supervision."""
