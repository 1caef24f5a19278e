"""PyTorch adapter: train any torch model asynchronously through shipyard.ps.

Why: PyTorch has no maintained parameter server. This wraps a normal torch
optimizer the way ``horovod.torch.DistributedOptimizer`` does, so a script changes
two lines::

    import shipyard.ps.torch as ps_torch
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt = ps_torch.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # each gradient is pushed as soon as it is ready
        opt.step()                        # waits for fresh parameters, writes them into the model

What it does:

* At construction every parameter is registered with the shards; the server-side
  optimizer is the wrapped one's class and hyperparameters, one optimizer group
  per param group (SGD, Adam, AdamW, Adagrad; anything else is refused). Rank 0
  (``SHIPYARD_PS_RANK``, default 0) sends its initial values; every rank then
  loads the values the shards hold (a broadcast from rank 0, or the values a
  resumed shard restored from its checkpoint).
* During ``backward()`` a post-accumulate-grad hook pushes each gradient the
  moment autograd produces it (push+pull in one message per chunk), overlapping
  communication with the rest of the backward pass. Small gradients (biases,
  norms) are copied at their hook and the client holds them back until 256 KiB
  gather or ``step()`` comes, then sends them together (one message per shard: a
  message costs the same ~90 us of CPU whatever its size). ``overlap=False`` pushes
  everything in ``step()`` instead (use it with gradient accumulation over several
  backward calls).
* ``step()`` collects the updated parameters and copies them into the model; the
  wrapped optimizer's own ``step`` is never called (the shards apply the update).
* A learning-rate change in ``param_groups`` (an LR scheduler attached to the
  wrapped optimizer) is sent to every shard at the next ``step()``.

Only this module imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from .client import GROUP_MAX_BYTES, PSClient
from .errors import PSConfigError
from .placement import DEFAULT_CHUNK_BYTES

_KEYS = {
    "sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    "adam": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    "adamw": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    "adagrad": ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "maximize"),
}


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item()
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def server_optimizer_config(optimizer: torch.optim.Optimizer, group: dict) -> dict:
    """The shipyard.ps optimizer config equivalent to ``optimizer`` for one param group."""
    if isinstance(optimizer, torch.optim.AdamW) or (
        isinstance(optimizer, torch.optim.Adam) and group.get("decoupled_weight_decay")
    ):
        name = "adamw"
    elif isinstance(optimizer, torch.optim.Adam):
        name = "adam"
    elif isinstance(optimizer, torch.optim.SGD):
        name = "sgd"
    elif isinstance(optimizer, torch.optim.Adagrad):
        name = "adagrad"
    else:
        raise PSConfigError(
            f"{type(optimizer).__name__} has no server-side implementation; use torch.optim.SGD, "
            "Adam, AdamW or Adagrad"
        )
    cfg = {"name": name}
    for k in _KEYS[name]:
        if k in group:
            cfg[k] = _plain(group[k])
    return cfg


class DistributedOptimizer:
    """Wrap ``optimizer`` so that its updates happen on the parameter server.

    ``named_parameters``: ``model.named_parameters()`` (names make the placement
    report readable and must be the same on every worker); without it parameters
    are named ``group<i>.param<j>``. ``client``: an existing PSClient (default: one
    built from the ``SHIPYARD_PS_*`` environment, with ``client_kwargs``).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
        *,
        client: PSClient | None = None,
        policy: str | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        overlap: bool = True,
        **client_kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        names_by_id: dict[int, str] = {}
        if named_parameters is not None:
            for name, p in named_parameters:
                names_by_id.setdefault(id(p), name)
        self._params: list[tuple[str, torch.nn.Parameter]] = []
        groups: dict[str, str] = {}
        configs: dict[str, dict] = {}
        seen: set[int] = set()
        for gi, group in enumerate(optimizer.param_groups):
            gname = f"group{gi}"
            configs[gname] = server_optimizer_config(optimizer, group)
            for j, p in enumerate(group["params"]):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                if named_parameters is not None and id(p) not in names_by_id:
                    raise PSConfigError(
                        "a parameter of the optimizer is missing from named_parameters"
                    )
                name = names_by_id.get(id(p), f"{gname}.param{j}")
                self._params.append((name, p))
                groups[name] = gname
        self._lrs = [_plain(g["lr"]) for g in optimizer.param_groups]
        self.client = client if client is not None else PSClient(**client_kwargs)
        self._owns_client = client is None
        values = self.client.register(
            {n: self._host(p) for n, p in self._params},
            policy=policy,
            chunk_bytes=chunk_bytes,
            optimizers=configs,
            groups=groups,
        )
        self._load(values)
        self._outs = {n: self._host(p) for n, p in self._params if self._writable_view(p)}
        self._by_id = {id(p): n for n, p in self._params}
        self._sent: set[str] = set()
        self._keep: list[np.ndarray] = []
        self._overlap = overlap
        self._hooks = []
        if overlap:
            for _, p in self._params:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    # torch.optim.Optimizer look-alike -----------------------------------------------
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def step(self, closure: Any = None) -> Any:
        """Push the gradients not pushed yet, wait for the new parameters, load them."""
        loss = closure() if closure is not None else None
        self._sync_lr()
        rest = {
            n: self._grad(p) for n, p in self._params if p.grad is not None and n not in self._sent
        }
        if rest:
            self.client.push_pull_begin(
                rest, outs={n: self._outs[n] for n in rest if n in self._outs}
            )
        values = self.client.push_pull_end()
        self._load({n: v for n, v in values.items() if n not in self._outs})
        self._sent.clear()
        self._keep.clear()
        # LR schedulers check that the optimizer stepped (they wrap its step, which the
        # shards replace): tell them it did
        self.optimizer._opt_called = True  # type: ignore[attr-defined]
        return loss

    def stats(self) -> dict:
        """The parameter-server report (placement, traffic matrix, ...)."""
        return self.client.stats()

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._owns_client:
            self.client.close()

    # internals --------------------------------------------------------------------
    def _on_grad(self, p: torch.Tensor) -> None:
        name = self._by_id[id(p)]
        if name in self._sent:
            raise PSConfigError(
                f"{name}: a second backward() before step() with overlap=True; construct the "
                "DistributedOptimizer with overlap=False to accumulate gradients over several passes"
            )
        if not self._sent:
            self._sync_lr()  # a scheduler's change applies to this step's first gradient already
        g = self._grad(p)
        if g.nbytes < GROUP_MAX_BYTES:
            # the client may hold a small one back until step(): a copy is pushed as it
            # was when its hook fired, like the big ones
            g = g.copy()
        self._keep.append(g)  # stays alive (and unchanged) until step() has the reply
        out = self._outs.get(name)
        self.client.push_pull_begin({name: g}, outs={name: out} if out is not None else None)
        self._sent.add(name)

    @staticmethod
    def _writable_view(p: torch.Tensor) -> bool:
        return p.device.type == "cpu" and p.is_contiguous() and p.dtype != torch.bfloat16

    @staticmethod
    def _host(p: torch.Tensor) -> np.ndarray:
        """A numpy view of a CPU parameter (shares memory), else a host copy."""
        t = p.detach()
        if t.device.type != "cpu" or not t.is_contiguous():
            t = t.to("cpu").contiguous()
        return t.numpy()

    @staticmethod
    def _grad(p: torch.Tensor) -> np.ndarray:
        grad = p.grad
        # callers hold a gradient: the hook fires after accumulation, step() filters on it
        assert grad is not None
        g = grad.detach()
        if g.device.type != "cpu" or not g.is_contiguous():
            g = g.to("cpu").contiguous()
        return g.numpy()

    def _load(self, values: dict[str, np.ndarray]) -> None:
        by_name = dict(self._params)
        with torch.no_grad():
            for name, v in values.items():
                p = by_name[name]
                p.copy_(torch.from_numpy(np.ascontiguousarray(v)).to(p.device))

    def _sync_lr(self) -> None:
        for gi, g in enumerate(self.optimizer.param_groups):
            lr = _plain(g["lr"])
            if lr != self._lrs[gi]:
                self.client.set_lr(float(lr), group=f"group{gi}")
                self._lrs[gi] = lr
