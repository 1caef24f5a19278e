"""The PyTorch adapter trains exactly like torch.optim (one worker, in-process shards)."""

from __future__ import annotations

import pytest

from shipyard.ps.client import PSClient
from shipyard.ps.core import ServerConfig, ServerCore
from shipyard.ps.errors import PSConfigError
from shipyard.ps.transport import LocalNetwork
from tests.lazy import lazy, needs

pytestmark = needs("torch")
torch = lazy("torch")
ps_torch = lazy("shipyard.ps.torch")  # imports torch

SECRET = "torch-secret"


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))


def data(n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    y = torch.randint(0, 5, (n,), generator=g)
    return x, y


def local_client(net, rank=0):
    return PSClient(
        worker_id=rank, secret=SECRET, transport_factory=net.connect, heartbeat_interval=0
    )


def train(model, opt, steps, sched=None):
    x, y = data()
    for i in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            model(x[i * 8 : (i + 1) * 8]), y[i * 8 : (i + 1) * 8]
        )
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
    return loss.item()


def build(kind, model):
    head, body = list(model[2].parameters()), list(model[0].parameters())
    if kind == "sgd":
        return torch.optim.SGD(
            [{"params": body}, {"params": head, "lr": 0.05}],
            lr=0.1,
            momentum=0.9,
            nesterov=True,
            weight_decay=1e-3,
        )
    if kind == "adamw":
        return torch.optim.AdamW([{"params": body}, {"params": head, "lr": 3e-3}], lr=1e-2)
    return torch.optim.Adagrad(model.parameters(), lr=0.1, lr_decay=0.01)


@pytest.mark.parametrize("kind", ["sgd", "adamw", "adagrad"])
@pytest.mark.parametrize("overlap", [True, False])
def test_matches_plain_torch_training(kind, overlap):
    ref_model = make_model()
    ref_opt = build(kind, ref_model)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=3, gamma=0.5)
    ref_loss = train(ref_model, ref_opt, 8, ref_sched)

    net = LocalNetwork([ServerCore(ServerConfig(index=i, num_shards=2), SECRET) for i in range(2)])
    model = make_model()
    inner = build(kind, model)
    sched = torch.optim.lr_scheduler.StepLR(
        inner, step_size=3, gamma=0.5
    )  # on the wrapped optimizer
    opt = ps_torch.DistributedOptimizer(
        inner,
        named_parameters=model.named_parameters(),
        client=local_client(net),
        overlap=overlap,
        policy="sliced",
        chunk_bytes=1024,
    )
    loss = train(model, opt, 8, sched)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=2e-5, atol=2e-6, msg=name)
    assert loss == pytest.approx(ref_loss, rel=1e-4)
    rep = opt.stats()
    assert [e["key"] for e in rep["placement"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert opt.client.step == 8
    if kind != "adagrad":  # the scheduler's changes reached the shards
        assert all(
            s["optimizers"]["group1"]["lr"] == pytest.approx(inner.param_groups[1]["lr"])
            for s in opt.client.shard_stats()
        )


def test_other_ranks_start_from_rank0_values():
    net = LocalNetwork([ServerCore(ServerConfig(index=0, num_shards=1), SECRET)])
    m0, m1 = make_model(seed=0), make_model(seed=99)
    ps_torch.DistributedOptimizer(
        torch.optim.SGD(m0.parameters(), lr=0.1), m0.named_parameters(), client=local_client(net, 0)
    )
    ps_torch.DistributedOptimizer(
        torch.optim.SGD(m1.parameters(), lr=0.1), m1.named_parameters(), client=local_client(net, 1)
    )
    for p, q in zip(m0.parameters(), m1.parameters()):
        assert torch.equal(p, q)


def test_unsupported_optimizer_and_double_backward():
    net = LocalNetwork([ServerCore(ServerConfig(index=0, num_shards=1), SECRET)])
    m = make_model()
    with pytest.raises(PSConfigError, match="RMSprop has no server-side implementation"):
        ps_torch.DistributedOptimizer(torch.optim.RMSprop(m.parameters()), client=local_client(net))
    assert ps_torch.server_optimizer_config(
        torch.optim.Adam(m.parameters(), lr=0.5, betas=(0.8, 0.9)),
        torch.optim.Adam(m.parameters(), lr=0.5, betas=(0.8, 0.9)).param_groups[0],
    ) == {
        "name": "adam",
        "lr": 0.5,
        "betas": [0.8, 0.9],
        "eps": 1e-8,
        "weight_decay": 0,
        "amsgrad": False,
        "maximize": False,
    }
    ps_torch.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(), client=local_client(net)
    )
    x, y = data()
    torch.nn.functional.cross_entropy(m(x), y).backward()
    with pytest.raises(PSConfigError, match="overlap=False"):
        torch.nn.functional.cross_entropy(m(x), y).backward()


def test_small_gradients_wait_in_a_bucket_big_ones_go_during_backward():
    net = LocalNetwork([ServerCore(ServerConfig(index=i, num_shards=2), SECRET) for i in range(2)])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(200, 100), torch.nn.Tanh(), torch.nn.Linear(100, 3))
    opt = ps_torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        client=local_client(net),
    )
    x, y = torch.randn(8, 200), torch.randint(0, 3, (8,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    # 0.weight (80 KB) was pushed by its hook; the three small ones wait for step()
    assert sorted(r.label for r in opt.client._data.bucket) == ["0.bias", "2.bias", "2.weight"]
    assert len(opt.client._data.open) == len(opt.client.placement("0.weight").chunks)
    before = sum(s["messages_in"] for s in opt.client.shard_stats())
    opt.step()
    after = sum(s["messages_in"] for s in opt.client.shard_stats())
    assert not opt.client._data.bucket and not opt.client._data.open
    shards = {
        c.shard for n in ("0.bias", "2.bias", "2.weight") for c in opt.client.placement(n).chunks
    }
    assert after - before == len(shards) + 2  # one message per shard for the bucket, + STATS x2
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(200, 100), torch.nn.Tanh(), torch.nn.Linear(100, 3))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
