"""The ``paper002-overlay`` kind's scenario keys, variants and targets, and the
transfer loops (flows) of a run; see the package documentation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import LabError
from ...options import option
from .. import bulk

KIND_NAME = "paper002-overlay"

#: Timeline of the two clients (paper seconds, × scale).
A_START, A_STOP, C_START, C_STOP = 0.0, 250.0, 50.0, 300.0
OVERLAP = (50.0, 250.0)  # both clients active: mean goodput
SOLO = (10.0, 50.0)  # clientA alone (after its start-up)
VAR_WINDOW = (100.0, 250.0)  # Fig 9
SLOT = 10.0
DIRECTIONS = ("A->B", "C->B")  # towards B, as the paper plots them
#: ``to-b`` also measures what B sends back on each overlay link.
DIRECTIONS_TO_B = DIRECTIONS + ("B->A", "B->C")


def directions(p: "Params") -> tuple[str, ...]:
    """The directions measured for ``p``'s topology (the first two: towards B)."""
    return DIRECTIONS_TO_B if p.topology == "to-b" else DIRECTIONS

TOPOLOGIES = ("through-b", "to-b")
#: Params.exit_relays values.
EXIT_RELAYS = ("all", "b")
#: Most circuits per flow (each is a perf process on the client's host).
MAX_CIRCUITS = 16
SPLITS = ("off", "always", "dynamic")


@dataclass(frozen=True)
class Targets:
    """The scenario's ``[targets]`` (issue 6): ``variant`` (split + ACK priority) gives each
    direction at least ``share_min`` of the link, with at most ``variance_ratio_max`` times
    the towards-B variance of ``baseline`` (one connection, no shaping)."""

    share_min: float = option(lo=0.0, hi=1.0)
    variance_ratio_max: float = option(lo=0.0)
    variant: str = option("split-ackprio")
    baseline: str = option("one")


@dataclass(frozen=True)
class Params(bulk.TestbedParams):
    """The scenario's keys of this kind (``scenario.options``): the testbed's, then these."""

    ackprio_hosts: tuple[str, ...] = option(("A", "B", "C"), choices=bulk.HOSTS)
    delay_ms: float = option(0.0, lo=0.0, hi=1000.0)
    transfer_bytes: int = option(64 * 1024 * 1024, lo=1024, hi=10 * 1024**3)
    log_level: str = option("info", check=bulk.check_log_level)
    topology: str = option("through-b", choices=TOPOLOGIES)
    #: Transfer loops per flow, each its own perf process and SOCKS user, so its own circuit.
    #: One circuit moves at most a circuit window (1000 cells, 498 KB) per round trip; with the
    #: 1000-packet queues of the paper's era (~1.2 s at 10 Mbit/s) that caps a flow near
    #: 3.3 Mbit/s whatever TCP does. Several circuits per flow take that limit away, as several
    #: TCP connections per host did in the paper's BitTorrent motivation.
    circuits: int = option(1, lo=1, hi=MAX_CIRCUITS)
    #: Topology to-b, chive relays: "all" relays are exits (as before session 8), or only
    #: relayB ("b"). With "all", a client's preemptive circuits may leave at relayA or relayC
    #: through relayB2, so relayB2 opens a channel towards them while they open one to it, and
    #: a run can carry one direction on two channels (:func:`extra_channel_pairs`). Tor clients
    #: pin ExitNodes for every circuit, so this changes nothing for them.
    exit_relays: str = option("all", choices=EXIT_RELAYS)
    #: The scenario's ``[targets]`` (None: the shipped scenarios'); not a testbed parameter,
    #: so left out of :func:`params_dict`.
    targets: Targets | None = None

    def __post_init__(self) -> None:
        if self.exit_relays != "all" and self.topology != "to-b":
            raise LabError("exit_relays = \"b\" needs topology = \"to-b\" (through-b exits at relayA and relayC)")


def params_dict(p: Params) -> dict[str, Any]:
    """The testbed and traffic parameters of ``p`` (what ``summary.json`` records as
    ``params`` and what pooled results must share), in declaration order."""
    return {k: v for k, v in p.__dict__.items() if k != "targets"}


@dataclass(frozen=True)
class VariantOptions:
    """What a ``[[variant]]`` of this kind declares."""

    split: str = option(choices=SPLITS, doc="the relays' SplitDirection")
    ackprio: bool = option(False, doc="`chive shape` ACK priority on ackprio_hosts")
    impl: str = option("chive", choices=("chive", "tor"), doc="tor: Debian's tor in every role (to-b only)")
    fig: str = option("-", doc="the paper figure it is compared with")
    paper: str = option("", doc="what the paper reports for it")
    relay: dict[str, Any] = option(default_factory=dict, doc="more relay options (chive)")
    shape: bulk.ShapeOptions = field(default_factory=bulk.ShapeOptions)
    host_cc: str | None = option(None, doc="the hosts' congestion control instead of the scenario's cc")


@dataclass(frozen=True)
class Flow:
    """One perf loop: ``client`` on its host, towards the httpd on ``server`` via exit ``server``."""

    name: str
    client: str
    server: str
    upload: bool
    start: float
    stop: float
    #: Which measured direction carries the data (``A->B`` …).
    direction: str = ""
    #: The httpd node serving this loop.
    httpd: str = ""


def loop_stems(f: Flow, circuits: int) -> list[str]:
    """The perf loops of flow ``f`` as file stems and SOCKS users: one per circuit (the first
    keeps the flow's own name, so single-circuit runs look as before)."""
    base = f.name.replace(":", "-")
    return [base if i == 0 else f"{base}-{i}" for i in range(circuits)]


def flows(p: Params) -> list[Flow]:
    """The four transfer loops of a run."""
    a = (p.t(A_START), p.t(A_STOP))
    c = (p.t(C_START), p.t(C_STOP))
    if p.topology == "to-b":
        return [Flow("A:down", "A", "B", False, *a, "B->A", "httpdBA"),
                Flow("A:up", "A", "B", True, *a, "A->B", "httpdBA"),
                Flow("C:down", "C", "B", False, *c, "B->C", "httpdBC"),
                Flow("C:up", "C", "B", True, *c, "C->B", "httpdBC")]
    # through-b: the direction is named by the sender's end towards B (A->B = A->B->C).
    return [Flow("A:down", "A", "C", False, *a, "C->B", "httpdC"),
            Flow("A:up", "A", "C", True, *a, "A->B", "httpdC"),
            Flow("C:down", "C", "A", False, *c, "A->B", "httpdA"),
            Flow("C:up", "C", "A", True, *c, "C->B", "httpdA")]
