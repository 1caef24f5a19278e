"""The few rtnetlink requests an instance's network needs, sent by the agent itself.

An instance's veth pair and address were set by two ``ip -batch`` runs per instance
(``instance._attach``): each a process the agent forked, exec'd and waited for, on the
critical path of every sandboxed agent's start (2-3 ms of CPU each in ``ip``, about as
much again in the agent's fork, pipes and wait, and the scheduling of a new process on
shared cores; issue 40). These are the same kernel requests ``ip`` makes, in the same
order, over a ``NETLINK_ROUTE`` socket: one opened while the thread is in a network
namespace talks to that namespace, whichever the thread enters afterwards.

Only what ``_attach`` asks for is here (create a veth pair with its peer in another
namespace, put a link on a bridge, bring a link up, add an IPv4 address); a refusal
raises ``OSError`` with the kernel's errno and what was asked.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

NETLINK_ROUTE = 0
RTM_NEWLINK, RTM_GETLINK, RTM_NEWADDR = 16, 18, 20
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFLA_IFNAME, IFLA_MASTER, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 10, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
IFF_UP = 0x1
MAX_PREFIX_LEN = 32

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefix length, flags, scope, index
_ATTR = struct.Struct("=HH")  # rtattr: length, type


def attr(kind: int, payload: bytes) -> bytes:
    """One attribute, padded to 4 bytes (the padding is not counted in its length)."""
    size = _ATTR.size + len(payload)
    return _ATTR.pack(size, kind) + payload + b"\0" * (-size % 4)


def name_attr(name: str) -> bytes:
    """An interface name (NUL-terminated, at most 15 characters, as the kernel takes)."""
    raw = os.fsencode(name)
    if not raw or len(raw) > 15 or b"\0" in raw or b"/" in raw:
        raise ValueError(f"not an interface name: {name!r}")
    return attr(IFLA_IFNAME, raw + b"\0")


def ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return _IFINFO.pack(socket.AF_UNSPEC, 0, index, flags, change)


def veth_request(name: str, peer: str, peer_netns_fd: int) -> bytes:
    """``ip link add NAME type veth peer name PEER netns /proc/self/fd/FD``'s body."""
    peer_info = ifinfo() + name_attr(peer) + attr(IFLA_NET_NS_FD, struct.pack("=I", peer_netns_fd))
    linkinfo = attr(IFLA_INFO_KIND, b"veth\0") + attr(
        IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer_info)
    )
    return ifinfo() + name_attr(name) + attr(IFLA_LINKINFO, linkinfo)


def address_request(address: str, prefix_len: int, index: int) -> bytes:
    """``ip addr add ADDRESS/PREFIX dev <index>``'s body (IPv4; local = address)."""
    if not 0 <= prefix_len <= MAX_PREFIX_LEN:
        raise ValueError(f"not an IPv4 prefix length: {prefix_len}")
    raw = socket.inet_aton(address)
    if socket.inet_ntoa(raw) != address:  # inet_aton also takes "10.1" and the like
        raise ValueError(f"not a dotted IPv4 address: {address!r}")
    head = _IFADDR.pack(socket.AF_INET, prefix_len, 0, 0, index)
    return head + attr(IFA_LOCAL, raw) + attr(IFA_ADDRESS, raw)


class Route:
    """A ``NETLINK_ROUTE`` socket of the network namespace the calling thread is in now."""

    def __init__(self) -> None:
        self._sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE
        )
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Route:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def request(self, kind: int, flags: int, body: bytes, what: str) -> bytes:
        """Send one request; the kernel's answer (the first reply that is not an
        acknowledgement, else b""). A refusal raises OSError naming ``what``."""
        self._seq += 1
        seq = self._seq
        message = _HEADER.pack(_HEADER.size + len(body), kind, flags, seq, 0) + body
        self._sock.send(message)
        answer = b""
        while True:
            data = self._sock.recv(65536)
            offset = 0
            while offset + _HEADER.size <= len(data):
                size, reply_kind, _flags, reply_seq, _port = _HEADER.unpack_from(data, offset)
                if size < _HEADER.size:
                    raise OSError(errno.EPROTO, f"{what}: a malformed netlink reply")
                payload = data[offset + _HEADER.size : offset + size]
                offset += (size + 3) & ~3
                if reply_seq != seq:
                    continue
                if reply_kind != NLMSG_ERROR:
                    answer = answer or payload
                    if not flags & NLM_F_ACK:
                        return answer
                    continue
                code = -struct.unpack_from("=i", payload)[0]
                if code:
                    raise OSError(code, f"{what}: {os.strerror(code)}")
                return answer

    def index(self, name: str) -> int:
        """The interface's index in this namespace (``ENODEV`` when there is none)."""
        answer = self.request(RTM_GETLINK, NLM_F_REQUEST, ifinfo() + name_attr(name), name)
        if len(answer) < _IFINFO.size:
            raise OSError(errno.EPROTO, f"{name}: no link in the netlink answer")
        return _IFINFO.unpack_from(answer)[2]

    def add_veth(self, name: str, peer: str, peer_netns_fd: int) -> None:
        flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        body = veth_request(name, peer, peer_netns_fd)
        self.request(RTM_NEWLINK, flags, body, f"link add {name} type veth peer name {peer}")

    def set_master(self, name: str, master: str) -> None:
        body = ifinfo() + name_attr(name) + attr(IFLA_MASTER, struct.pack("=I", self.index(master)))
        self.request(
            RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, body, f"link set {name} master {master}"
        )

    def set_up(self, name: str) -> None:
        body = ifinfo(flags=IFF_UP, change=IFF_UP) + name_attr(name)
        self.request(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, body, f"link set {name} up")

    def add_address(self, name: str, address: str, prefix_len: int) -> None:
        flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        body = address_request(address, prefix_len, self.index(name))
        self.request(RTM_NEWADDR, flags, body, f"addr add {address}/{prefix_len} dev {name}")
