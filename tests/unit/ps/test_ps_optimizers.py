"""Server-side optimizers against torch.optim's reference numbers."""

from __future__ import annotations

import numpy as np
import pytest

from shipyard.ps.errors import PSConfigError
from shipyard.ps.optimizers import OPTIMIZERS, SCRATCH_SLOTS, make_optimizer

torch = pytest.importorskip("torch")

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
    opt = cls([p], **kwargs)
    for g in grads:
        opt.zero_grad()
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    return p.detach().numpy(), opt.state[p]


CASES = [
    ("sgd", torch.optim.SGD, {"lr": 0.1}),
    ("sgd", torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    ("sgd", torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 1e-2}),
    ("sgd", torch.optim.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 5e-3}),
    ("sgd", torch.optim.SGD, {"lr": 0.05, "momentum": 0.5, "maximize": True}),
    ("adam", torch.optim.Adam, {"lr": 1e-2}),
    (
        "adam",
        torch.optim.Adam,
        {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
    ),
    ("adam", torch.optim.Adam, {"lr": 1e-2, "amsgrad": True}),
    ("adam", torch.optim.Adam, {"lr": 1e-2, "betas": (0.3, 0.9)}),  # lerp's other branch
    ("adamw", torch.optim.AdamW, {"lr": 1e-2}),
    ("adamw", torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.3, "amsgrad": True}),
    ("adagrad", torch.optim.Adagrad, {"lr": 0.1}),
    (
        "adagrad",
        torch.optim.Adagrad,
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


def test_update_is_in_place_and_leaves_grad_untouched():
    p = np.ones(4, np.float32)
    g = np.full(4, 2.0, np.float32)
    g.setflags(write=False)  # received gradients are read-only views of socket buffers
    opt = make_optimizer({"name": "adam", "lr": 0.1, "weight_decay": 0.1})
    st = opt.init_state(p)
    scratch = [np.empty_like(p) for _ in range(SCRATCH_SLOTS)]
    before = id(p)
    opt.update(p, g, st, lambda i: scratch[i])
    assert id(p) == before and np.all(p < 1) and np.all(g == 2)


def test_blocked_sgd_step_gives_the_same_bits_as_whole_arrays():
    """add_scaled works block by block (cache-sized) on large parameters: the product
    and the sum per element are the same two roundings, so the bits must not change."""
    from shipyard.ps.optimizers import BLOCK, BLOCKED_MIN_BYTES, add_scaled

    rng = np.random.default_rng(3)
    n = BLOCKED_MIN_BYTES // 4 + BLOCK + 123  # past the threshold, with a ragged end
    p = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    g.setflags(write=False)
    want = p + np.multiply(g, np.float32(-0.037))
    add_scaled(p, g, -0.037, np.empty_like(p))
    assert np.array_equal(p, want)


def test_lr_change_takes_effect():
    opt = make_optimizer({"name": "sgd", "lr": 1.0})
    p = np.zeros(2, np.float32)
    st = opt.init_state(p)
    scratch = [np.empty_like(p) for _ in range(SCRATCH_SLOTS)]
    opt.update(p, np.ones(2, np.float32), st, lambda i: scratch[i])
    opt.lr = 0.25
    opt.update(p, np.ones(2, np.float32), st, lambda i: scratch[i])
    assert np.allclose(p, -1.25)
    assert opt.config()["lr"] == 0.25


def test_config_round_trip():
    for name in OPTIMIZERS:
        opt = make_optimizer(name)
        again = make_optimizer(opt.config())
        assert again.config() == opt.config()
    assert make_optimizer({"name": "AdamW"}).hparams["weight_decay"] == 1e-2  # torch's default


@pytest.mark.parametrize(
    "config,match",
    [
        ({"name": "rmsprop"}, "unknown optimizer 'rmsprop'"),
        ({"name": "sgd", "lr": -1}, "lr must be"),
        ({"name": "sgd", "lr": float("nan")}, "lr must be"),
        ({"name": "sgd", "nesterov": True}, "Nesterov momentum requires"),
        ({"name": "sgd", "momentum": 0.9, "nesterov": True, "dampening": 0.1}, "Nesterov"),
        ({"name": "adam", "betas": (0.9, 1.0)}, "betas"),
        ({"name": "adam", "betas": 0.9}, "betas"),
        ({"name": "adam", "lr": 1e-3, "momentum": 0.9}, "unknown option"),
        ({"name": "adagrad", "eps": -1}, "eps must be"),
        (42, "must be a name or a dict"),
    ],
)
def test_bad_optimizer_configs(config, match):
    with pytest.raises(PSConfigError, match=match):
        make_optimizer(config)
    with pytest.raises(ValueError):
        make_optimizer(config)
