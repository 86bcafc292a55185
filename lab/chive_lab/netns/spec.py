"""What a testbed is made of: hosts, each with its access link to the switch and its TCP
congestion control, validated when made. Pure data; nothing here touches the system."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import LabError

__all__ = ["DEFAULT_SUBNET", "Host", "HostSpec", "LinkSpec", "parse_rate"]

#: Addresses of the hosts; only ever used inside our namespaces.
DEFAULT_SUBNET = "10.77.0.0/24"
#: Host names become interface and namespace name parts: keep them short.
_HOST_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,7}$")


def parse_rate(text: str | int | float) -> int:
    """A rate in bit/s from ``10mbit``, ``10M``, ``500kbit`` or a number."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmg]?)(?:bit)?\s*", text.lower())
        if not m:
            raise LabError(f"invalid rate {text!r}: expected e.g. 10mbit")
        value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    if not 8_000 <= value <= 1e12:
        raise LabError(f"rate {text!r} out of range (8 kbit/s .. 1 Tbit/s)")
    return int(round(value))


@dataclass
class LinkSpec:
    """The access link between a host and the switch (both directions alike)."""

    rate_bps: int | None = None  # None: unshaped
    delay_ms: float = 0.0  # one-way, each direction
    jitter_ms: float = 0.0
    loss: float = 0.0  # probability per frame, each direction
    queue_packets: int = 1000
    #: Where the host→switch queue lives: "host" = HTB on the host's own eth0
    #: (a modern Linux host with its NIC: TCP Small Queues keep that queue
    #: about 1 ms long and the backlog stays in the socket), or "switch" = HTB
    #: on the switch side of the link, invisible to the host's TCP (a deep NIC
    #: queue of a pre-TSQ kernel such as the paper's 2.6.26, or a DSL modem).
    queue_at: str = "host"
    #: The switch's output-port buffer towards the host (switch → host), in packets; ``None``
    #: = ``queue_packets``. A 10/100 switch holds far less per port than a host's 1000-packet
    #: txqueue, and this is the queue that flows from several hosts towards one share.
    switch_port_packets: int | None = None

    def __post_init__(self) -> None:
        if self.queue_at not in ("host", "switch"):
            raise LabError(f"queue_at must be 'host' or 'switch', got {self.queue_at!r}")
        if self.rate_bps is not None:
            self.rate_bps = parse_rate(self.rate_bps)
        for name in ("delay_ms", "jitter_ms"):
            v = getattr(self, name)
            if not 0 <= v <= 60_000:
                raise LabError(f"{name} must be within 0..60000, got {v}")
        if not 0 <= self.loss <= 1:
            raise LabError(f"loss must be within 0..1, got {self.loss}")
        if not 1 <= self.queue_packets <= 1_000_000:
            raise LabError(f"queue_packets must be within 1..1000000, got {self.queue_packets}")
        if self.switch_port_packets is not None and not 1 <= self.switch_port_packets <= 1_000_000:
            raise LabError(f"switch_port_packets must be within 1..1000000, got {self.switch_port_packets}")

    @property
    def port_queue(self) -> int:
        """Packets the switch's port towards the host holds."""
        return self.queue_packets if self.switch_port_packets is None else self.switch_port_packets

    @property
    def needs_delay_line(self) -> bool:
        """Whether the link needs the user-space delay line."""
        return self.delay_ms > 0 or self.jitter_ms > 0 or self.loss > 0


@dataclass
class HostSpec:
    """One host: a name (letters/digits, ≤ 8), its link and its TCP congestion control."""

    name: str
    link: LinkSpec = field(default_factory=LinkSpec)
    cc: str = "cubic"

    def __post_init__(self) -> None:
        if not _HOST_RE.match(self.name) or self.name == "sw":
            raise LabError(f"invalid host name {self.name!r}: 1-8 letters/digits, not 'sw'")
        if not re.fullmatch(r"[a-z0-9_]{1,16}", self.cc):
            raise LabError(f"invalid congestion control {self.cc!r}")


@dataclass
class Host:
    """A running host: its namespace, address and effective congestion control."""

    spec: HostSpec
    ns: str
    addr: str
    cc_effective: str = ""
    ack_priority: bool = False

    @property
    def name(self) -> str:
        """The host's name."""
        return self.spec.name
