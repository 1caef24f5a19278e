"""shipyard.horovod.torch in one process (size 1): the optimizer's bucket mechanics, and the
size-1 engine's answers that ask torch (nccl_built, cuda_built). Real torch, so not in the
unit tier (tests/unit/horovod holds the engine's other single-rank tests)."""

from __future__ import annotations

import pytest
from tests.lazy import lazy, needs

import shipyard.horovod as hvd_engine

pytestmark = needs("torch")
torch = lazy("torch")
hvd = lazy("shipyard.horovod.torch")  # imports torch


@pytest.fixture
def single(single_rank):
    return hvd


def test_basics_single_rank(single_rank):
    """From tests/unit/horovod/test_hvd_single.py: nccl_built and cuda_built import torch."""
    hvd = hvd_engine
    assert (
        hvd.size(),
        hvd.rank(),
        hvd.local_rank(),
        hvd.local_size(),
        hvd.cross_rank(),
        hvd.cross_size(),
    ) == (1, 0, 0, 1, 0, 1)
    assert hvd.is_initialized() and hvd.is_homogeneous()
    assert hvd.mpi_enabled() is False and hvd.gloo_enabled() is False
    assert isinstance(hvd.nccl_built(), bool) and isinstance(hvd.cuda_built(), bool)


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _train(model, opt, steps=3, accumulate=1):
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(accumulate):
            x = torch.randn(6, 4, generator=g)
            model(x).pow(2).mean().backward()
        opt.step()


def test_optimizer_matches_plain_optimizer_and_keeps_its_class(single):
    m1, m2 = _model(), _model()
    plain = torch.optim.Adam(m1.parameters(), lr=0.01)
    dist = hvd.DistributedOptimizer(
        torch.optim.Adam(m2.parameters(), lr=0.01), named_parameters=m2.named_parameters()
    )
    assert isinstance(dist, torch.optim.Adam)
    _train(m1, plain)
    _train(m2, dist)
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b)


def test_grads_live_in_bucket_buffers(single):
    m = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))
    buckets = opt._hvd_buckets
    ptrs = {b.buffer.data_ptr() for b in buckets}
    _train(m, opt, steps=1)
    for b in buckets:
        for p, v in zip(b.params, b.views):
            assert p.grad is v and p.grad.data_ptr() >= b.buffer.data_ptr()
    m.zero_grad(set_to_none=True)  # user replaces grads: the hook copies back into the bucket
    _train(m, opt, steps=1)
    assert {b.buffer.data_ptr() for b in buckets} == ptrs
    assert all(p.grad is v for b in buckets for p, v in zip(b.params, b.views))


def test_backward_passes_per_step(single):
    m1, m2 = _model(), _model()
    _train(m1, torch.optim.SGD(m1.parameters(), lr=0.1), accumulate=2)
    _train(
        m2,
        hvd.DistributedOptimizer(
            torch.optim.SGD(m2.parameters(), lr=0.1), backward_passes_per_step=2
        ),
        accumulate=2,
    )
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b)
    m3 = _model()
    _opt = hvd.DistributedOptimizer(torch.optim.SGD(m3.parameters(), lr=0.1))
    x = torch.randn(2, 4)
    m3(x).sum().backward()
    with pytest.raises((AssertionError, RuntimeError), match="backward_passes_per_step"):
        m3(x).sum().backward()


def test_synchronize_skip_and_zero_grad_guard(single):
    m = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1))
    m(torch.randn(3, 4)).sum().backward()
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.01)
    with opt.skip_synchronize():
        opt.step()
    m(torch.randn(3, 4)).sum().backward()
    # the last layer's bucket has been launched: zeroing now would race with the reduction
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    opt.zero_grad()
    assert all(float(p.grad.abs().sum()) == 0 for p in m.parameters())


def test_unused_parameters_get_zero_gradients(single):
    m = _model()
    extra = torch.nn.Parameter(torch.ones(3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(list(m.parameters()) + [extra], lr=0.1))
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    assert extra.grad is not None and float(extra.grad.abs().sum()) == 0


def test_tensor_ops_and_compression(single):
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert torch.equal(hvd.allreduce(t), t)
    assert torch.equal(hvd.allreduce(t, compression=hvd.Compression.fp16), t)
    assert hvd.allreduce(t, compression=hvd.Compression.fp16).dtype == torch.float32
    bf = t.to(torch.bfloat16)
    assert torch.equal(hvd.allreduce(bf, op=hvd.Sum), bf)
    assert torch.equal(hvd.allgather(t), t)
    assert torch.equal(hvd.broadcast(t, 0), t)
    out, recv = hvd.alltoall(t, splits=torch.tensor([2]))
    assert torch.equal(out, t) and recv.tolist() == [2]
    h = hvd.allreduce_async(t, op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h), t)
    outs = hvd.grouped_allreduce([t, t.double(), torch.tensor(3)])
    assert [o.dtype for o in outs] == [torch.float32, torch.float64, torch.int64] and outs[
        2
    ].shape == ()
    x = t.clone().requires_grad_()
    hvd.allreduce(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(t))


def test_broadcast_parameters_and_optimizer_state_roundtrip(single):
    m = _model()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    _train(m, opt, steps=1)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k])
    assert hvd.broadcast_object([1, "a"]) == [1, "a"]
