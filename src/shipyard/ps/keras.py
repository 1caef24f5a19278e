"""Keras 3 adapter: ``model.fit`` trains through shipyard.ps (TensorFlow backend).

Why: Keras 3 dropped ParameterServerStrategy, so the tutorials' asynchronous
parameter-server training has no Keras 3 path. One line brings it back::

    import shipyard.ps.keras as ps_keras
    model.compile(optimizer=ps_keras.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, ...)          # every step: gradients to the shards, fresh weights back

What it does: the optimizer keeps its class and hyperparameters, which become the
shards' server-side optimizer (SGD with momentum/nesterov, Adam, AdamW, Adagrad;
anything else is refused). On the first step (while ``model.fit`` traces its train
function) the trainable variables are registered with the shards: rank 0 sends
its initial values and every rank loads what the shards hold (rank 0's values, or
what a resumed shard restored). Each step then runs one ``tf.numpy_function``
that pushes every gradient and pulls the updated values in one round trip per
chunk, and assigns them to the variables; the optimizer's own update never runs
(its ``iterations`` still counts steps, for callbacks). A change of the learning
rate (``optimizer.learning_rate.assign``, a LearningRateScheduler callback)
reaches the shards at the next step. The connection leaves the shards at exit.

Only this module imports TensorFlow/Keras.
"""

from __future__ import annotations

import atexit
from typing import Any

import numpy as np
import tensorflow as tf

from .client import PSClient
from .errors import PSConfigError
from .placement import DEFAULT_CHUNK_BYTES


def server_optimizer_config(optimizer: Any) -> dict[str, Any]:
    """The shipyard.ps optimizer config equivalent to a Keras 3 optimizer."""
    import keras

    lr = optimizer.learning_rate
    if not isinstance(lr, (int, float)):
        try:
            lr = float(np.asarray(lr))
        except (TypeError, ValueError):
            raise PSConfigError(
                "a LearningRateSchedule object is not supported as learning_rate; "
                "use a float and a LearningRateScheduler callback"
            ) from None
    wd = float(optimizer.weight_decay or 0.0)
    kind = type(optimizer)
    if kind is keras.optimizers.AdamW:
        return {
            "name": "adamw",
            "lr": lr,
            "betas": [optimizer.beta_1, optimizer.beta_2],
            "eps": optimizer.epsilon,
            "weight_decay": wd,
            "amsgrad": optimizer.amsgrad,
        }
    if kind is keras.optimizers.Adam:
        cfg = {
            "name": "adamw" if wd else "adam",
            "lr": lr,
            "betas": [optimizer.beta_1, optimizer.beta_2],
            "eps": optimizer.epsilon,
            "amsgrad": optimizer.amsgrad,
        }
        return dict(cfg, weight_decay=wd) if wd else cfg
    if kind is keras.optimizers.SGD:
        return {
            "name": "sgd",
            "lr": lr,
            "momentum": float(optimizer.momentum),
            "nesterov": bool(optimizer.nesterov),
            "weight_decay": wd,
        }
    if kind is keras.optimizers.Adagrad:
        return {
            "name": "adagrad",
            "lr": lr,
            "eps": optimizer.epsilon,
            "weight_decay": wd,
            "initial_accumulator_value": float(optimizer.initial_accumulator_value),
        }
    raise PSConfigError(
        f"{kind.__name__} has no server-side implementation; use keras.optimizers.SGD, "
        "Adam, AdamW or Adagrad"
    )


class _ParameterServerStep:
    """The replacement for ``optimizer.apply_gradients`` (one per wrapped optimizer)."""

    def __init__(
        self,
        optimizer: Any,
        client: PSClient | None,
        policy: str | None,
        chunk_bytes: int,
        client_kwargs: dict[str, Any],
    ) -> None:
        self.optimizer = optimizer
        self.config = server_optimizer_config(optimizer)  # refuse what the shards cannot run, now
        self._client = client
        self._client_kwargs = client_kwargs
        self._policy = policy
        self._chunk_bytes = chunk_bytes
        self._names: list[str] = []
        self._lr = self.config["lr"]

    @property
    def client(self) -> PSClient:
        if self._client is None:
            self._client = PSClient(**self._client_kwargs)
            atexit.register(self._client.close)
        return self._client

    def register(self, variables: list[Any]) -> None:
        """Declare the variables (eagerly, even while fit traces) and load the shards' values."""
        with tf.init_scope():
            names = [getattr(v, "path", None) or f"{i}.{v.name}" for i, v in enumerate(variables)]
            if len(set(names)) != len(names):
                names = [f"{i}.{n}" for i, n in enumerate(names)]
            values = self.client.register(
                {n: np.asarray(v.numpy()) for n, v in zip(names, variables)},
                self.config,
                policy=self._policy,
                chunk_bytes=self._chunk_bytes,
            )
            for n, v in zip(names, variables):
                v.assign(values[n])
        self._names = names

    def apply_gradients(self, grads_and_vars: Any) -> Any:
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        variables = [v for _, v in pairs]
        if not self._names:
            self.register(variables)
        if len(variables) != len(self._names):
            raise PSConfigError(
                "the set of trainable variables changed after the first step; "
                "shipyard.ps registers them once"
            )
        grads = [tf.convert_to_tensor(g) for g, _ in pairs]
        lr = tf.cast(self.optimizer.learning_rate, tf.float64)
        new = tf.numpy_function(
            self._push_pull,
            [lr, *grads],
            [v.dtype for v in variables],
            stateful=True,
            name="shipyard_ps_push_pull",
        )
        for v, value in zip(variables, new):
            v.assign(tf.reshape(value, v.shape))
        return self.optimizer.iterations.assign_add(1)

    def _push_pull(self, lr: np.ndarray, *grads: np.ndarray) -> list[np.ndarray]:
        if float(lr) != self._lr:
            self._lr = float(lr)
            self.client.set_lr(self._lr)
        values = self.client.push_pull(dict(zip(self._names, grads)))
        return [values[n] for n in self._names]


def DistributedOptimizer(
    optimizer: Any,
    *,
    client: PSClient | None = None,
    policy: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    **client_kwargs: Any,
) -> Any:
    """Make a Keras 3 optimizer train through the parameter server; returns it.

    ``client``: an existing PSClient (default: one from the ``SHIPYARD_PS_*``
    environment, built at the first step, with ``client_kwargs``). ``policy``:
    placement (default ``$SHIPYARD_PS_POLICY`` or auto). Named like Horovod's wrapper.
    """
    step = _ParameterServerStep(optimizer, client, policy, chunk_bytes, client_kwargs)
    # An instance attribute shadows the class's method: model.fit's train step calls it.
    object.__setattr__(optimizer, "apply_gradients", step.apply_gradients)
    object.__setattr__(optimizer, "shipyard_ps", step)
    return optimizer
