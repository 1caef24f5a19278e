"""The data network of a network-isolated instance: the platform's, never the job's.

On SageMaker an isolated container has no network outside its job; the platform, not the
container, downloads the channels and uploads the model. Here the agent plays the
platform: with network isolation it creates, beside the instance's network namespace
(the job network only), a second one of its own, the *data network*, where pasta gives
the host's outbound network and forwards the S3 endpoint's loopback port. The agent's
S3 connections are created there (network namespaces are per thread: the connecting
thread enters the data network for ``socket()`` + ``connect()`` and goes back), and the
Pipe feeders run there entirely (they only write FIFOs on the shared filesystem).

The job's own processes cannot follow: entering a network namespace needs
``CAP_SYS_ADMIN``, which they do not hold (shipyard.sandbox.confine), and the kernel
refuses them the agent's fds (ptrace access to a process with more capabilities). So an
isolated job reaches neither the host, nor the S3 endpoint, nor ``shipyard server``'s
control API on the same port, and its channels still arrive.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from shipyard.sandbox import kernel, rtnl, tools

T = TypeVar("T")


def create(own_net: int) -> int:
    """A new network namespace with its loopback up; returns an fd to it. Called in the
    instance's own namespace (``own_net``), to which this thread returns."""
    kernel.unshare(kernel.CLONE_NEWNET)
    try:
        with rtnl.Route() as route:  # `ip link set lo up`'s request, without the process
            route.set_up("lo")
        return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        kernel.setns(own_net, kernel.CLONE_NEWNET)


def run_in(data_net: int, own_net: int, fn: Callable[[], T]) -> T:
    """``fn()`` with this thread in the data network, then back in the instance's."""
    kernel.setns(data_net, kernel.CLONE_NEWNET)
    try:
        return fn()
    finally:
        kernel.setns(own_net, kernel.CLONE_NEWNET)


def route_connections(data_net: int, own_net: int) -> None:
    """Every connection this process opens through urllib3 (boto3's S3 transfers: channel
    downloads, FastFile reads, checkpoint and model uploads) is made in the data network.
    Only the agent calls this: the job's processes are separate programs."""
    from urllib3.util import connection

    original: Any = connection.create_connection
    if getattr(original, "shipyard_data_net", False):
        return

    def create_connection(*args: Any, **kwargs: Any) -> Any:
        return run_in(data_net, own_net, lambda: original(*args, **kwargs))

    create_connection.shipyard_data_net = True  # type: ignore[attr-defined]
    connection.create_connection = create_connection


def enter_argv(data_net: int, argv: list[str]) -> list[str]:
    """``argv`` run inside the data network (a Pipe feeder: it downloads and writes FIFOs,
    it needs no job network). The agent's fd is opened through /proc by util-linux
    ``nsenter``, which holds the capabilities the agent's children keep."""
    nsenter = tools.find("nsenter")
    if nsenter is None:
        raise OSError("util-linux `nsenter` is not installed")
    return [nsenter, f"--net=/proc/{os.getpid()}/fd/{data_net}", "--", *argv]
