"""Server-side optimizers against torch.optim's reference numbers (real torch, so not in
the unit tier: tests/unit/ps/test_ps_optimizers.py holds the optimizers' other rules)."""

from __future__ import annotations

import numpy as np
import pytest

from shipyard.ps.optimizers import SCRATCH_SLOTS, make_optimizer
from tests.lazy import lazy, needs

pytestmark = needs("torch")
torch = lazy("torch")

STEPS = 6


def run_numpy(config, p0, grads):
    opt = make_optimizer(config)
    param = p0.copy()
    state = opt.init_state(param)
    scratch = [np.empty_like(param) for _ in range(SCRATCH_SLOTS)]
    for g in grads:
        opt.update(param, g, state, lambda i: scratch[i])
    return param, state


def run_torch(cls, kwargs, p0, grads):
    p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = getattr(torch.optim, cls)([p], **kwargs)
    for g in grads:
        opt.zero_grad()
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    return p.detach().numpy(), opt.state[p]


CASES = [
    ("sgd", "SGD", {"lr": 0.1}),
    ("sgd", "SGD", {"lr": 0.05, "momentum": 0.9}),
    ("sgd", "SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 1e-2}),
    ("sgd", "SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 5e-3}),
    ("sgd", "SGD", {"lr": 0.05, "momentum": 0.5, "maximize": True}),
    ("adam", "Adam", {"lr": 1e-2}),
    (
        "adam",
        "Adam",
        {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
    ),
    ("adam", "Adam", {"lr": 1e-2, "amsgrad": True}),
    ("adam", "Adam", {"lr": 1e-2, "betas": (0.3, 0.9)}),  # lerp's other branch
    ("adamw", "AdamW", {"lr": 1e-2}),
    ("adamw", "AdamW", {"lr": 1e-2, "weight_decay": 0.3, "amsgrad": True}),
    ("adagrad", "Adagrad", {"lr": 0.1}),
    (
        "adagrad",
        "Adagrad",
        {
            "lr": 0.1,
            "lr_decay": 0.05,
            "weight_decay": 0.01,
            "initial_accumulator_value": 0.2,
            "eps": 1e-8,
        },
    ),
]


@pytest.mark.parametrize("name,cls,kwargs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_torch_optim(name, cls, kwargs):
    rng = np.random.default_rng(42)
    p0 = rng.standard_normal((7, 5)).astype(np.float32)
    grads = [rng.standard_normal((7, 5)).astype(np.float32) for _ in range(STEPS)]
    ours, state = run_numpy({"name": name, **kwargs}, p0, grads)
    ref, ref_state = run_torch(cls, kwargs, p0, grads)
    assert not np.allclose(ours, p0)  # the optimizer did something
    np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=2e-7)
    if "exp_avg" in state:
        np.testing.assert_allclose(
            state["exp_avg"], ref_state["exp_avg"].numpy(), rtol=2e-6, atol=1e-8
        )
        np.testing.assert_allclose(
            state["exp_avg_sq"], ref_state["exp_avg_sq"].numpy(), rtol=2e-6, atol=1e-10
        )
    if "momentum_buffer" in state:
        np.testing.assert_allclose(
            state["momentum_buffer"], ref_state["momentum_buffer"].numpy(), rtol=2e-6, atol=1e-7
        )
    assert state["step"] == STEPS
