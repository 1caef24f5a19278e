"""An instance type's network on the job network: traffic control on each instance's link.

Why: every local instance talks over an unlimited in-memory network, so what a user sees
here says nothing about a cluster. Opt in per job with the training job tag
``shipyard:network``: ``instance-type`` (the type's sustained bandwidth from
:func:`shipyard.instance_types.network`), or a rate such as ``50mbit``, optionally with a
one-way latency, ``50mbit/2ms``. The tag travels the same way from shipyard's SDK
(``tags=``), the CLI and the real SDK through ``shipyard server``.

Each instance's link is shaped in both directions, as AWS rates a NIC per direction: a
``tbf`` on the instance's ``eth0`` (what it sends) and one on its veth peer ``v<host>`` on
the job's bridge (what it receives); ``netem`` adds the latency in front where the kernel
has it, and the job says once when it does not. Both qdiscs belong to the veth pair,
which lives in the job's namespaces: they go with the job, nothing is left on the host.
Where ``tc`` or ``tbf`` is missing the job runs unshaped and says so.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shipyard.errors import ValidationError
from shipyard.sandbox import tools

TAG = "shipyard:network"
INSTANCE_TYPE = "instance-type"
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_DELAYS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")
_HELP = (
    f"tag {TAG!r} takes 'instance-type' (the instance type's bandwidth) or a rate in bits "
    "per second such as '50mbit', '1gbit' (units bit, kbit, mbit, gbit), optionally with a "
    "one-way latency: '50mbit/2ms'"
)
# tbf: a bucket of 1 ms of traffic (at least 16 KiB, ten full frames; tbf cuts a larger
# GSO packet into frames) and up to 100 ms of queue before it drops. The bucket is what a
# link lets through at once after idling, which a real NIC does not: with 10 ms of it, a
# 5 MB message that followed 60 ms of compute crossed 1 Gbit/s in 32 ms instead of the
# 41.8 ms the rate implies (measured; 41.1 ms with 1 ms), and the model, which has no
# bucket, under-predicted such jobs by up to half
BURST_S = 0.001
MIN_BURST = 16 * 1024
QUEUE_LATENCY = "100ms"


@dataclass(frozen=True)
class Shape:
    """The link every instance of a job gets: a rate each direction and a one-way delay."""

    rate_bits_per_s: float
    delay_s: float = 0.0
    source: str = ""  # what asked for it: "50mbit/2ms" or the instance type

    @property
    def rate_bytes_per_s(self) -> float:
        return self.rate_bits_per_s / 8

    def describe(self) -> str:
        text = _human_rate(self.rate_bits_per_s)
        if self.delay_s:
            text += f", {self.delay_s * 1e3:g} ms one way"
        return text + (f" ({self.source})" if self.source else "")

    def to_json(self) -> dict:
        return {
            "rate_bits_per_s": self.rate_bits_per_s,
            "delay_s": self.delay_s,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> Shape:
        return cls(
            float(data["rate_bits_per_s"]),
            float(data.get("delay_s") or 0),
            str(data.get("source") or ""),
        )


def _human_rate(bits: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g} {unit}"
    return f"{bits:g} bit/s"


def parse_rate(text: str) -> float:
    """``50mbit`` -> 5e7 bits per second (tc's units; ``mbps`` is refused: tc reads it as
    megabytes, AWS writes it for megabits)."""
    match = _RATE.match(text.lower())
    if match is None or match.group(2) not in _UNITS:
        raise ValidationError(f"bandwidth {text!r} does not parse: {_HELP}")
    value = float(match.group(1)) * _UNITS[match.group(2)]
    if value < 8000:
        raise ValidationError(f"bandwidth {text!r} is below 8 kbit/s: nothing would train; {_HELP}")
    return value


def parse_delay(text: str) -> float:
    match = _RATE.match(text.lower())
    if match is None or match.group(2) not in _DELAYS:
        raise ValidationError(f"latency {text!r} does not parse (e.g. 2ms, 500us): {_HELP}")
    value = float(match.group(1)) * _DELAYS[match.group(2)]
    if value > 10:
        raise ValidationError(f"latency {text!r} is over 10 s; {_HELP}")
    return value


def parse(value: str, instance_type: str) -> Shape:
    """The Shape a ``shipyard:network`` tag value asks for on ``instance_type``."""
    text = value.strip()
    if text.lower() == INSTANCE_TYPE:
        from shipyard import instance_types

        try:
            net = instance_types.network(instance_type)
        except ValidationError as exc:
            raise ValidationError(
                f"tag {TAG}={value!r}: {exc}; or give the rate itself, e.g. '10gbit'"
            ) from None
        return Shape(net.sustained_gbps * 1e9, 0.0, f"{instance_type}: {net.describe()}")
    rate, _, delay = text.partition("/")
    return Shape(parse_rate(rate), parse_delay(delay) if delay else 0.0, text)


def from_tags(tags: Iterable[Mapping[str, str]], instance_type: str) -> Shape | None:
    """The job's Shape from its tags (SageMaker's ``[{'Key':..., 'Value':...}]``), None
    when it did not ask; raises ValidationError on a value that does not parse."""
    for tag in tags:
        if tag.get("Key") == TAG:
            return parse(str(tag.get("Value") or ""), instance_type)
    return None


def tbf_args(dev: str, shape: Shape, parent: str = "root") -> list[str]:
    rate = int(shape.rate_bits_per_s)
    burst = max(MIN_BURST, int(shape.rate_bytes_per_s * BURST_S))
    where = ["root"] if parent == "root" else ["parent", parent]
    return [
        "qdisc", "add", "dev", dev, *where, "tbf",
        "rate", f"{rate}bit", "burst", str(burst), "latency", QUEUE_LATENCY,
    ]  # fmt: skip


def netem_args(dev: str, shape: Shape) -> list[str]:
    return [
        "qdisc",
        "add",
        "dev",
        dev,
        "root",
        "handle",
        "1:",
        "netem",
        "delay",
        f"{shape.delay_s * 1e6:.0f}us",
    ]


def apply(dev: str, shape: Shape) -> list[str]:
    """Shape what ``dev`` sends (in the current network namespace). Returns notes for the
    job's log: what could not be done and what the job runs with instead."""
    tc = tools.find("tc")
    if tc is None:
        return [f"{TAG}: iproute2's `tc` is not installed: the job runs unshaped"]
    notes = []
    parent = "root"
    if shape.delay_s:
        done = _tc(tc, netem_args(dev, shape))
        if done is None:
            parent = "1:1"
        else:
            notes.append(
                f"{TAG}: netem is not in this kernel ({done}): the {shape.delay_s * 1e3:g} ms "
                "latency is not emulated, only the bandwidth"
            )
    error = _tc(tc, tbf_args(dev, shape, parent))
    if error is not None:
        return [f"{TAG}: traffic control unavailable ({error}): the job runs unshaped"]
    return notes


def _tc(tc: str, args: list[str]) -> str | None:
    """Run tc; None when it worked, else its error."""
    try:
        done = subprocess.run([tc, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


@dataclass(frozen=True)
class Support:
    """What this machine can emulate (``shipyard doctor``): tbf for the bandwidth, netem
    for the latency; ``detail`` says why not."""

    tbf: bool
    netem: bool
    detail: str


def support() -> Support:
    """Try both qdiscs on the loopback of a throw-away network namespace (a user namespace
    too when not root), exactly as a job's instances would add them."""
    tc, unshare = tools.find("tc"), tools.find("unshare")
    if tc is None or unshare is None:
        return Support(False, False, "iproute2's `tc` or util-linux `unshare` is missing")
    ns = [unshare, "--net"] + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"])
    probe = (
        f"{tc} qdisc add dev lo root tbf rate 1mbit burst 65536 latency 100ms && echo tbf; "
        f"{tc} qdisc del dev lo root; "
        f"{tc} qdisc add dev lo root netem delay 1ms && echo netem"
    )
    try:
        done = subprocess.run([*ns, "sh", "-c", probe], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return Support(False, False, str(exc))
    words = done.stdout.split()
    tbf, netem = "tbf" in words, "netem" in words
    if not tbf:
        return Support(False, False, done.stderr.strip() or "tbf could not be added")
    return Support(tbf, netem, "" if netem else "netem is not in this kernel")
