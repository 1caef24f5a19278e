"""TensorFlow's own distributions, run the SageMaker way: parameter servers and
multi-worker mirrored strategy.

Import-light on purpose (no TensorFlow at import time): the agent plans with
:mod:`shipyard.tf.cluster`; only the processes it starts (``shipyard.tf.server``,
the user's script) import TensorFlow.
"""
