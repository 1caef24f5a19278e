"""Framework environments: a job runs with the framework version it asks for.

SageMaker picks a container per ``framework_version``; shipyard picks (and, on first use,
builds with uv from the package registry) a cached environment holding that version, or the
nearest one this machine can install with the same API generation, and says which. The
installed environment stays the default when nothing is asked.

Pure parts first (:mod:`.resolver`: asked version + what the registry has -> the version to
run and why), tested as functions. See docs/decisions.md, "Framework environments".
"""
