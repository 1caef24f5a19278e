"""Server-side optimizers: numpy re-implementations of torch.optim's update rules.

Why on the server: in an asynchronous parameter server the shard applies each
gradient the moment it arrives, so the optimizer state (momentum, Adam moments)
must live next to the parameters, on the shard. The formulas follow PyTorch's
single-tensor implementations (torch/optim/sgd.py, adam.py, adagrad.py; AdamW is
Adam with decoupled weight decay) operation for operation, so a model trained
through shipyard.ps with one worker matches ``torch.optim`` to float32 rounding.

Every update works in place on the parameter array and uses caller-provided
scratch arrays, so applying a 100 MB gradient allocates nothing.

Optimizer configs are JSON-able dicts (``{"name": "adam", "lr": 1e-3, ...}``); a
worker sends one with its registration, ``set_lr`` changes ``lr`` on every shard.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .errors import PSConfigError

if TYPE_CHECKING:  # aliases are strings: job processes may run in Python 3.7/3.8
    from typing import TypeAlias

State: TypeAlias = "dict[str, Any]"  # arrays (checkpointed as arrays) and the int "step"
# scratch(i) -> an array shaped like the parameter
Scratch: TypeAlias = "Callable[[int], np.ndarray]"


class Optimizer(ABC):
    """An update rule plus its hyperparameters; per-parameter state is kept by the caller."""

    name: ClassVar[str]
    defaults: ClassVar[dict[str, Any]]

    def __init__(self, **hparams: Any) -> None:
        unknown = sorted(set(hparams) - set(self.defaults))
        if unknown:
            raise PSConfigError(
                f"{self.name}: unknown option(s) {unknown}; accepted: {sorted(self.defaults)}"
            )
        self.hparams: dict[str, Any] = {**self.defaults, **hparams}
        self._validate()

    @property
    def lr(self) -> float:
        return float(self.hparams["lr"])

    @lr.setter
    def lr(self, value: float) -> None:
        _nonneg(self.name, "lr", value)
        self.hparams["lr"] = float(value)

    def config(self) -> dict[str, Any]:
        """JSON-able config; ``make_optimizer(opt.config())`` rebuilds it."""
        out: dict[str, Any] = {"name": self.name}
        for k, v in self.hparams.items():
            out[k] = list(v) if isinstance(v, tuple) else v
        return out

    def init_state(self, param: np.ndarray) -> State:
        """Fresh per-parameter state."""
        return {"step": 0}

    @abstractmethod
    def update(self, param: np.ndarray, grad: np.ndarray, state: State, scratch: Scratch) -> None:
        """Apply one gradient to ``param`` in place (``grad`` is read-only)."""

    def _validate(self) -> None:
        _nonneg(self.name, "lr", self.hparams["lr"])
        if "weight_decay" in self.hparams:
            _nonneg(self.name, "weight_decay", self.hparams["weight_decay"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config()})"


def _nonneg(name: str, key: str, value: Any) -> None:
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < 0
    ):
        raise PSConfigError(f"{name}: {key} must be a finite number >= 0, got {value!r}")


def _effective_grad(
    grad: np.ndarray,
    param: np.ndarray,
    maximize: bool,
    weight_decay: float,
    scratch: Scratch,
    slot: int,
) -> np.ndarray:
    """torch: ``g = -grad if maximize else grad; if wd: g = g + wd * param``."""
    if not maximize and not weight_decay:
        return grad
    out = scratch(slot)
    if maximize:
        np.negative(grad, out=out)
    else:
        np.copyto(out, grad)
    if weight_decay:
        tmp = scratch(slot + 1)
        np.multiply(param, weight_decay, out=tmp)
        out += tmp
    return out


class SGD(Optimizer):
    """torch.optim.SGD: momentum, dampening, nesterov, weight_decay, maximize."""

    name = "sgd"
    defaults = {
        "lr": 1e-3,
        "momentum": 0.0,
        "dampening": 0.0,
        "weight_decay": 0.0,
        "nesterov": False,
        "maximize": False,
    }

    def _validate(self) -> None:
        super()._validate()
        _nonneg(self.name, "momentum", self.hparams["momentum"])
        if not isinstance(self.hparams["dampening"], (int, float)):
            raise PSConfigError(
                f"sgd: dampening must be a number, got {self.hparams['dampening']!r}"
            )
        if self.hparams["nesterov"] and (
            self.hparams["momentum"] <= 0 or self.hparams["dampening"] != 0
        ):
            raise PSConfigError("sgd: Nesterov momentum requires a momentum and zero dampening")

    def update(self, param: np.ndarray, grad: np.ndarray, state: State, scratch: Scratch) -> None:
        h = self.hparams
        lr, momentum = float(h["lr"]), float(h["momentum"])
        d = _effective_grad(grad, param, h["maximize"], float(h["weight_decay"]), scratch, 0)
        if momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = np.array(d, copy=True)
                state["momentum_buffer"] = buf
            else:
                buf *= momentum
                alpha = 1.0 - float(h["dampening"])
                if alpha == 1.0:
                    buf += d
                else:
                    tmp = scratch(2)
                    np.multiply(d, alpha, out=tmp)
                    buf += tmp
            if h["nesterov"]:
                tmp = scratch(2)
                np.multiply(buf, momentum, out=tmp)
                tmp += d
                d = tmp
            else:
                d = buf
        state["step"] = int(state.get("step", 0)) + 1
        add_scaled(param, d, -lr, scratch(3))


#: elements per block of ``add_scaled``: a block of the gradient, the parameter and the
#: product (3 x 1 MiB of float32) stays in this machine's cache between the two passes
BLOCK = 256 * 1024
#: below this many bytes the whole arrays stay in the last-level cache anyway and blocks
#: only add calls (measured with benchmarks/ps_mac_cost.py: whole arrays are as fast
#: up to 4 MiB, blocks 1.2-1.4x faster from 8 MiB; sliced placement's 2 MiB chunks
#: take the whole-array path)
BLOCKED_MIN_BYTES = 4 << 20


def add_scaled(param: np.ndarray, d: np.ndarray, alpha: float, tmp: np.ndarray) -> None:
    """``param += alpha * d`` as torch's ``param.add_(d, alpha=alpha)`` rounds it here
    (the product, then the sum: the same two numpy operations, so the same bits), block
    by block: the product of a block is still in cache when it is added, where whole
    arrays would write it to memory and read it back (1.2-1.5x less CPU from 8 MiB up:
    benchmarks/ps_mac_cost.py)."""
    n = param.size
    if param.nbytes <= BLOCKED_MIN_BYTES or not (param.flags.c_contiguous and d.flags.c_contiguous):
        np.multiply(d, alpha, out=tmp)
        param += tmp
        return
    p, g, t = param.reshape(-1), d.reshape(-1), tmp.reshape(-1)
    for i in range(0, n, BLOCK):
        j = min(i + BLOCK, n)
        tt = t[: j - i]
        np.multiply(g[i:j], alpha, out=tt)
        pp = p[i:j]
        np.add(pp, tt, out=pp)


class Adam(Optimizer):
    """torch.optim.Adam (L2 weight decay added to the gradient), amsgrad, maximize."""

    name = "adam"
    decoupled = False
    defaults = {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.0,
        "amsgrad": False,
        "maximize": False,
    }

    def _validate(self) -> None:
        super()._validate()
        betas = self.hparams["betas"]
        if (
            not isinstance(betas, (list, tuple))
            or len(betas) != 2
            or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas)
        ):
            raise PSConfigError(f"{self.name}: betas must be two numbers in [0, 1), got {betas!r}")
        self.hparams["betas"] = (float(betas[0]), float(betas[1]))
        _nonneg(self.name, "eps", self.hparams["eps"])

    def init_state(self, param: np.ndarray) -> State:
        st: State = {"step": 0, "exp_avg": np.zeros_like(param), "exp_avg_sq": np.zeros_like(param)}
        if self.hparams["amsgrad"]:
            st["max_exp_avg_sq"] = np.zeros_like(param)
        return st

    def update(self, param: np.ndarray, grad: np.ndarray, state: State, scratch: Scratch) -> None:
        h = self.hparams
        lr, wd, eps = float(h["lr"]), float(h["weight_decay"]), float(h["eps"])
        beta1, beta2 = h["betas"]
        if self.decoupled:
            g = _effective_grad(grad, param, h["maximize"], 0.0, scratch, 0)
            if wd:
                param *= 1.0 - lr * wd
        else:
            g = _effective_grad(grad, param, h["maximize"], wd, scratch, 0)
        state["step"] = step = int(state["step"]) + 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        tmp = scratch(2)
        # exp_avg.lerp_(g, 1 - beta1) with torch's two-sided lerp formula
        weight = 1.0 - beta1
        np.subtract(g, m, out=tmp)
        if weight < 0.5:
            tmp *= weight
            m += tmp
        else:
            tmp *= 1.0 - weight
            np.subtract(g, tmp, out=m)
        # exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        v *= beta2
        np.multiply(g, 1.0 - beta2, out=tmp)
        tmp *= g
        v += tmp
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        if h["amsgrad"]:
            mv = state["max_exp_avg_sq"]
            np.maximum(mv, v, out=mv)
            np.sqrt(mv, out=tmp)
        else:
            np.sqrt(v, out=tmp)
        tmp /= bias_correction2_sqrt
        tmp += eps
        # param.addcdiv_(exp_avg, denom, value=-step_size)
        np.divide(m, tmp, out=tmp)
        tmp *= -step_size
        param += tmp


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay (default 1e-2)."""

    name = "adamw"
    decoupled = True
    defaults = {**Adam.defaults, "weight_decay": 1e-2}


class Adagrad(Optimizer):
    """torch.optim.Adagrad: lr_decay, weight_decay, initial_accumulator_value, eps."""

    name = "adagrad"
    defaults = {
        "lr": 1e-2,
        "lr_decay": 0.0,
        "weight_decay": 0.0,
        "initial_accumulator_value": 0.0,
        "eps": 1e-10,
        "maximize": False,
    }

    def _validate(self) -> None:
        super()._validate()
        for key in ("lr_decay", "initial_accumulator_value", "eps"):
            _nonneg(self.name, key, self.hparams[key])

    def init_state(self, param: np.ndarray) -> State:
        return {"step": 0, "sum": np.full_like(param, self.hparams["initial_accumulator_value"])}

    def update(self, param: np.ndarray, grad: np.ndarray, state: State, scratch: Scratch) -> None:
        h = self.hparams
        state["step"] = step = int(state["step"]) + 1
        g = _effective_grad(grad, param, h["maximize"], float(h["weight_decay"]), scratch, 0)
        clr = float(h["lr"]) / (1 + (step - 1) * float(h["lr_decay"]))
        s = state["sum"]
        tmp = scratch(2)
        np.multiply(g, g, out=tmp)
        s += tmp
        np.sqrt(s, out=tmp)
        tmp += float(h["eps"])
        np.divide(g, tmp, out=tmp)
        tmp *= -clr
        param += tmp


OPTIMIZERS: dict[str, type[Optimizer]] = {c.name: c for c in (SGD, Adam, AdamW, Adagrad)}
SCRATCH_SLOTS = 4  # the most scratch(i) indices an update uses


def make_optimizer(config: str | Mapping[str, Any] | Optimizer | None) -> Optimizer:
    """An Optimizer from a name, a config dict (``{"name": ..., **hparams}``) or an instance.

    ``None`` gives torch's SGD defaults (lr 1e-3, no momentum).
    """
    if isinstance(config, Optimizer):
        return config
    if config is None:
        return SGD()
    if isinstance(config, str):
        config = {"name": config}
    if not isinstance(config, Mapping):
        raise PSConfigError(
            f"optimizer config must be a name or a dict, got {type(config).__name__}"
        )
    cfg = dict(config)
    name = str(cfg.pop("name", "")).lower()
    cls = OPTIMIZERS.get(name)
    if cls is None:
        raise PSConfigError(
            f"unknown optimizer {name!r}; use one of: " + ", ".join(sorted(OPTIMIZERS))
        )
    return cls(**cfg)


def state_arrays(state: State) -> dict[str, np.ndarray]:
    """The array part of a state (what a checkpoint stores as arrays)."""
    return {k: v for k, v in state.items() if isinstance(v, np.ndarray)}


def state_scalars(state: State) -> dict[str, Any]:
    """The scalar part of a state (what a checkpoint stores in its JSON manifest)."""
    return {k: v for k, v in state.items() if not isinstance(v, np.ndarray)}
