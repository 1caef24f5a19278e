"""The performance model against cases computed by hand (issue 29)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shipyard import instance_types
from shipyard.errors import ValidationError
from shipyard.planner import model
from shipyard.planner.model import Link, Profile

MB = 1e6


def test_ring_allreduce_moves_2_n_minus_1_over_n():
    assert model.ring_bytes(100, 1) == 0
    assert model.ring_bytes(100, 2) == 100
    assert model.ring_bytes(100, 4) == 150
    assert model.ring_bytes(100, 64) == pytest.approx(2 * 63 / 64 * 100)


def test_horovod_row_is_compute_plus_ring_time():
    # S = 60 MB in one fused buffer, 4 instances at 1.25e9 B/s, no latency:
    # each NIC moves 2*3/4*60 MB = 90 MB -> 0.072 s; step 0.1 + 0.072
    prof = Profile("horovod", compute_s=0.1, variables=(60 * MB,))
    row = model.predict(prof, Link("ml.p3.8xlarge", 1.25e9, 0.0), 4)
    assert row.comm_s == pytest.approx(0.072)
    assert row.step_s == pytest.approx(0.172)
    assert row.steps_per_s == pytest.approx(4 / 0.172)
    assert row.efficiency == pytest.approx(0.1 / 0.172)
    assert row.bottleneck == "compute"  # 0.072 < 0.1


def test_latency_counts_every_hop_of_every_fused_buffer():
    # 100 MB over Horovod's 64 MiB fusion = 2 buffers; 4 ranks -> 2*3 hops each
    prof = Profile("horovod", compute_s=0.01, variables=(100 * MB,))
    row = model.predict(prof, Link("x", 1e9, 1e-3), 4)
    assert row.comm_s == pytest.approx(150 * MB / 1e9 + 12 * 1e-3)
    assert row.bottleneck == "nic"
    # SageMaker's library: the same bytes per node, but two phases per buffer
    smddp = model.predict(Profile("smdistributed", 0.01, (100 * MB,)), Link("x", 1e9, 1e-3), 4)
    assert smddp.comm_s == pytest.approx(150 * MB / 1e9 + 4 * 1e-3)


def test_reduce_then_broadcast_goes_through_rank_0():
    # Open MPI's default for few ranks: rank 0 receives 3 x 10 MB, then its binomial
    # broadcast sends 10 MB in each of ceil(log2 4) = 2 rounds: 5 x 10 MB at 1e8 B/s
    prof = Profile("horovod", 0.1, (10 * MB,), allreduce="reduce_bcast")
    row = model.predict(prof, Link("x", 1e8, 0.0), 4)
    assert row.comm_s == pytest.approx(0.5)
    assert row.busiest_bytes == pytest.approx(30 * MB)  # what rank 0 receives
    # 2 and 3 instances: 1 + 1 and 2 + 2 gradients (as the linear count said)
    assert model.predict(prof, Link("x", 1e8, 0.0), 2).comm_s == pytest.approx(0.2)
    assert model.predict(prof, Link("x", 1e8, 0.0), 3).comm_s == pytest.approx(0.4)
    assert model.predict(prof, Link("x", 1e8, 0.0), 1).comm_s == 0.0
    with pytest.raises(ValueError, match="reduce_bcast"):
        model.predict(Profile("horovod", 0.1, (1,), allreduce="tree"), Link("x", 1e8), 2)


def test_processes_per_host_share_one_nic():
    # 2 instances x 4 ranks: R = 8, one ring edge leaves each instance: 2*7/8*S
    prof = Profile("horovod", 0.1, (80 * MB,), processes_per_host=4)
    row = model.predict(prof, Link("x", 1e9, 0.0), 2)
    assert row.busiest_bytes == pytest.approx(140 * MB)
    assert row.steps_per_s == pytest.approx(8 / (0.1 + 0.14))


def test_one_instance_and_no_distribution_have_no_network():
    prof = Profile("horovod", 0.2, (500 * MB,))
    one = model.predict(prof, Link("x", 1e6), 1)
    assert (one.comm_s, one.efficiency, one.bottleneck) == (0.0, 1.0, "compute")
    plain = model.predict(Profile("none", 0.2, (500 * MB,)), Link("x", 1e6), 8)
    assert plain.steps_per_s == pytest.approx(40.0)


def test_placement_policies():
    assert model.place([5, 1, 1, 1], 2, "round_robin") == [6, 2]
    assert model.place([5, 1, 1, 1], 2, "greedy_bytes") == [5, 3]
    assert model.place([5, 1, 1, 1], 2, "sliced", chunk_bytes=2) == [4, 4]
    assert model.place([5, 1, 1, 1], 2, "sliced") == [5, 3]  # 5 < 2 MiB: not cut
    assert model.place([5, 1, 1, 1], 2, "auto", chunk_bytes=2) == [4, 4]
    assert model.place([1, 1, 1, 1], 2, "auto") == [2, 2]
    with pytest.raises(ValueError, match="round_robin"):
        model.place([1], 2, "random")


def test_hot_parameter_server_is_named_with_its_remedy():
    # ps:0 holds 99 MB, ps:1 1 MB; the worker on algo-2 pulls and pushes 99 MB across
    # its NIC one after the other: 198 MB / 1e8 B/s = 1.98 s per step
    prof = Profile("tf_parameter_server", 1.0, (99 * MB, 1 * MB), chunk_bytes=MB)
    link = Link("x", 1e8, 0.0)
    row = model.predict(prof, link, 2)
    assert row.comm_s == pytest.approx(1.98)
    assert row.steps_per_s == pytest.approx(2 / 2.98)
    assert row.bottleneck == "hot ps:0"
    assert "ps:0 holds 99% of the bytes" in row.advice
    assert "MinSizePartitioner" in row.advice
    # sliced: 50 MB each way per worker, 100 MB -> 1.0 s; step 2.0
    assert row.speedup == pytest.approx(2.98 / 2.0)
    assert f"x{2.98 / 2.0:.2f}" in row.advice
    native = model.predict(Profile("shipyard_ps", 1.0, (99 * MB, 1 * MB), chunk_bytes=MB), link, 2)
    assert "'sliced'" in native.advice


def test_balanced_parameter_servers_are_nic_bound_and_offered_allreduce():
    # two 50 MB variables on 2 ps: each worker moves 50 up + 50 down remotely
    prof = Profile("tf_parameter_server", 0.5, (50 * MB, 50 * MB), chunk_bytes=MB)
    link = Link("x", 1e8, 0.0)
    (row,) = model.plan(prof, [link], [2])
    assert row.comm_s == pytest.approx(1.0)
    assert row.bottleneck == "nic"
    # ring over 2: 100 MB per NIC -> 1.0 s as well: no gain, no advice to switch
    assert "allreduce" not in row.advice
    (row4,) = model.plan(prof, [link], [4])
    # 4 ps but only 2 variables: ps:2 and ps:3 hold nothing, and the worker on algo-3
    # moves both variables both ways remotely: 200 MB -> 2.0 s; sliced, every worker
    # moves 3/4 of 100 MB each way: 1.5 s
    assert row4.comm_s == pytest.approx(2.0)
    assert row4.bottleneck == "hot ps:0"
    assert row4.speedup == pytest.approx(2.5 / 2.0)


def test_wire_overhead_scales_the_bytes():
    prof = Profile("shipyard_ps", 1.0, (50 * MB, 50 * MB), push_overhead=1.1, pull_overhead=1.0)
    row = model.predict(prof, Link("x", 1e8, 0.0), 2)
    assert row.comm_s == pytest.approx((55 + 50) * MB / 1e8)


def test_faster_network_advice_and_unsupported_smddp():
    prof = Profile("horovod", 0.01, (100 * MB,))
    slow = Link("ml.p2.xlarge", 1.25e9 / 8 * 1.25, 0.0)
    fast = Link("ml.p3dn.24xlarge", 100e9 / 8, 0.0)
    rows = model.plan(prof, [slow, fast], [8])
    assert "ml.p3dn.24xlarge's network" in rows[0].advice or "fp16" in rows[0].advice
    assert rows[0].speedup and rows[0].speedup > 1
    row = model.predict(Profile("smdistributed", 0.1, (MB,)), slow, 2)
    assert row.bottleneck == "unsupported" and "ml.p3.16xlarge" in row.advice


def test_bad_inputs():
    with pytest.raises(ValueError, match="distribution 'pytorchddpx'"):
        model.predict(Profile("pytorchddpx", 0.1, (1,)), Link("x", 1.0), 2)
    with pytest.raises(ValueError, match="at least 1"):
        model.predict(Profile("horovod", 0.1, (1,)), Link("x", 1.0), 0)


def test_instance_network_table():
    p3 = instance_types.network("ml.p3.2xlarge")
    assert (p3.peak_gbps, p3.baseline_gbps, p3.sustained_gbps) == (10.0, 2.5, 2.5)
    assert "up to 10" in p3.describe()
    assert instance_types.network("ml.p3.16xlarge").sustained_gbps == 25.0
    assert instance_types.network("ml.p3dn.24xlarge").sustained_gbps == 100.0
    assert instance_types.network("ml.p2.8xlarge").sustained_gbps == 10.0
    assert instance_types.network("ml.p2.16xlarge").bytes_per_s == 25e9 / 8
    assert instance_types.network("ml.m5.large").baseline_gbps == 0.75
    assert instance_types.network("ml.c5.18xlarge").sustained_gbps == 25.0
    assert instance_types.network("ml.m5.8xlarge").sustained_gbps == 10.0
    # the 6th/7th generations are rated "up to 12.5" with their own baselines and sizes
    # (EC2's DescribeInstanceTypes: m6i.large 781 Mbit/s, c6i.8xlarge 12.5 Gbit/s)
    m6i = instance_types.network("ml.m6i.large")
    assert (m6i.peak_gbps, m6i.baseline_gbps) == (12.5, 0.781)
    assert instance_types.network("ml.c6i.8xlarge").sustained_gbps == 12.5
    assert instance_types.network("ml.r7i.24xlarge").sustained_gbps == 37.5
    assert instance_types.network("ml.m4.xlarge").sustained_gbps == 1.25  # "High"
    with pytest.raises(ValidationError, match="not known"):
        instance_types.network("ml.zz.xlarge")
    with pytest.raises(ValidationError, match="network bandwidth is not known"):
        instance_types.network("local")
    # every GPU type shipyard knows has a network
    for name in instance_types._GPU_TYPES:
        assert instance_types.network(name).peak_gbps > 0


def test_a_variable_below_the_chunk_size_is_advised_smaller_chunks():
    # auto cannot balance a 1 MB variable (below 2 MiB, never cut) and a 10 kB one:
    # slicing at 1 MB / (4 x 2) = 125 kB chunks would
    prof = Profile("shipyard_ps", 0.1, (1 * MB, 0.01 * MB), placement="auto")
    row = model.predict(prof, Link("x", 1e6, 0.0), 2)
    assert row.bottleneck == "hot ps:0"
    assert "DistributedOptimizer(chunk_bytes=126250)" in row.advice
    assert row.speedup and row.speedup > 1.5


def test_a_compute_bound_row_with_a_large_network_share_says_so():
    # compute 0.1 s, ring over 2 moves 60 MB at 1e9 B/s: 0.06 s = 37% of the step
    prof = Profile("horovod", 0.1, (60 * MB,))
    slow, fast = Link("ml.p3.8xlarge", 1e9, 0.0), Link("ml.p3dn.24xlarge", 12.5e9, 0.0)
    row = model.plan(prof, [slow, fast], [2])[0]
    assert row.bottleneck == "compute"
    assert row.advice.startswith("compute leads, the network takes 38% of a step")
    assert "ml.p3dn.24xlarge's network" in row.advice or "fp16" in row.advice


def test_a_shared_host_s_cores_pace_more_workers_than_it_has():
    # compute 0.2 s, S = 10 MB, 1e9 B/s, no latency, every instance on one 2-core machine.
    # n=2: 2 workers, 2 cores: compute + ring time 2*1/2*10 MB / 1e9 = 0.2 + 0.01
    prof = Profile("horovod", 0.2, (10 * MB,), host_cores=2)
    link = Link("1gbit", 1e9, 0.0)
    two = model.predict(prof, link, 2)
    assert two.step_s == pytest.approx(0.21)
    assert two.bottleneck == "compute"
    # n=4: the ring alone would be 0.2 + 2*3/4*10 MB / 1e9 = 0.215 s, but 4 workers x 0.2 s
    # of CPU on 2 cores stretch the compute phase to 0.4 s; an allreduce waits for every
    # rank, so its 0.015 s follow: 0.415 s, and the host's CPU paces it
    four = model.predict(prof, link, 4)
    assert four.step_s == pytest.approx(0.415)
    assert four.steps_per_s == pytest.approx(4 / 0.415)
    assert four.comm_s == pytest.approx(0.015)
    assert four.efficiency == pytest.approx(0.2 / 0.415)
    assert four.bottleneck == "host CPU"
    assert model.predict(replace(prof, host_cores=None), link, 4).step_s == pytest.approx(0.215)
    # processes per host count as workers: 2 instances x 2 ranks on 2 cores
    pph = model.predict(replace(prof, processes_per_host=2), link, 2)
    assert pph.step_s == pytest.approx(0.415) and pph.bottleneck == "host CPU"
    # a slow network still paces: 3 workers stretch the compute to 0.3 s, then the ring
    # moves 2*2/3*10 MB at 1e7 B/s = 1.333 s
    slow = model.predict(prof, Link("80mbit", 1e7, 0.0), 3)
    assert slow.step_s == pytest.approx(0.3 + 4 / 3)
    assert slow.bottleneck == "nic"
    # parameter servers are a pipeline: a worker waiting on the network leaves its core
    # to the others, so the busiest resource paces: max(0.2 + comm, 4 x 0.2 / 2)
    ps = model.predict(Profile("shipyard_ps", 0.2, (10 * MB,), host_cores=2), link, 4)
    assert ps.step_s == pytest.approx(0.4) and ps.bottleneck == "host CPU"
    # the advice says why and that real instances would not share the cores
    row = model.plan(prof, [link], [4])[0]
    assert "4 workers share this machine's 2 cores" in row.advice


def test_shared_host_step_and_its_inverse():
    assert model.shared_host_step(0.2, 2, None) == 0.0
    assert model.shared_host_step(0.2, 2, 2) == 0.0
    assert model.shared_host_step(0.2, 3, 2) == pytest.approx(0.3)
    # measured 0.4 s with 0.015 s of communication, 4 workers on 2 cores: the CPU bound
    # explains it with 0.2 s of compute (compute + comm would need 0.385 s)
    assert model.compute_of(0.4, 0.015, 4, 2) == pytest.approx(0.2)
    assert model.compute_of(0.4, 0.015, 4, None) == pytest.approx(0.385)
    assert model.compute_of(0.4, 0.015, 2, 2) == pytest.approx(0.385)
    # a communication-bound step keeps what it measured: 873 ms less 837 ms of
    # communication is 36 ms of compute (a floor of a tenth made it 87 ms)
    assert model.compute_of(0.873, 0.837, 2, None) == pytest.approx(0.036)
    assert model.compute_of(0.4, 0.41, 2, None) == pytest.approx(0.008)  # floor: 2%
    # a collective's inverse: 0.415 s = max(c, 4c/2) + 0.015 s, so c = 0.2 s
    assert model.compute_of(0.415, 0.015, 4, 2, collective=True) == pytest.approx(0.2)
    assert model.compute_of(0.4, 0.015, 2, 2, collective=True) == pytest.approx(0.385)
    # round trips: the compute found predicts the measured step again
    prof = Profile("horovod", model.compute_of(0.4, 0.015, 4, 2, True), (10 * MB,), host_cores=2)
    assert model.predict(prof, Link("1gbit", 1e9, 0.0), 4).step_s == pytest.approx(0.4)
    ps = Profile("shipyard_ps", model.compute_of(0.4, 0.001, 4, 2), (10 * MB,), host_cores=2)
    assert model.predict(ps, Link("1gbit", 1e9, 0.0), 4).step_s == pytest.approx(0.4)


def test_tcp_framing_counts_the_headers_a_nic_carries():
    # 1448 bytes of payload per 1514-byte frame (Ethernet 14 + IPv4 20 + TCP 20 + 12)
    assert model.TCP_FRAMING == pytest.approx(1514 / 1448)
    link = Link("x", 1e6, 0.0, framing=model.TCP_FRAMING)
    assert link.seconds(1448 * 1000) == pytest.approx(1514 * 1000 / 1e6)
    assert Link("x", 1e6, 0.0).seconds(1e6) == 1.0  # payload-only arithmetic
