"""Server-side optimizers: in place, blocked steps, learning-rate changes, configs (their
numbers against torch.optim's: tests/integration/ps/test_ps_optimizers.py)."""

from __future__ import annotations

import numpy as np
import pytest

from shipyard.ps.errors import PSConfigError
from shipyard.ps.optimizers import OPTIMIZERS, SCRATCH_SLOTS, make_optimizer


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
