"""``BroadcastGlobalVariablesHook``: Horovod's TF1 ``SessionRunHook`` for ``tf.estimator`` and
``MonitoredTrainingSession`` scripts.

Graph-mode scripts never call ``broadcast_variables`` themselves: they hand this hook to the
session, which runs one broadcast of every global variable from ``root_rank`` right after the
session is created (after initialisation or a checkpoint restore), so every rank starts from
the same weights. The op is built in ``begin``, when the graph is final except for what the
session adds, and rebuilt if the estimator starts a new graph (it does for each ``train``
call), as Horovod's hook does.
"""

from __future__ import annotations

import tensorflow as tf


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcast all global variables from ``root_rank`` once the session exists."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device  # accepted for Horovod's signature; the engine runs on the CPU
        self.bcast_op = None
        self._graph = None

    def begin(self) -> None:
        from shipyard.horovod.tensorflow import broadcast_global_variables

        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self._graph is not graph:
            self._graph = graph
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord) -> None:
        if self.bcast_op is not None:
            session.run(self.bcast_op)
