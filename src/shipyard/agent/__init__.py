"""The per-instance agent: lays out the instance's /opt/ml tree, exports the SageMaker
environment, runs the distribution's runner and reports how it ended.

Importable without TensorFlow or torch (and without pydantic): it starts once per
instance, so its import cost is part of every job's launch overhead.
"""
