"""Paper 002 (Marks, Tschorsch, Scheuermann), the overlay case, with chive relays.

Hosts A, B, C on 10 Mbit/s full-duplex links to one switch (netns backend),
relay ``relayA`` on A, ``relayB`` on B, ``relayC`` on C, the authority on an
unshaped host X. Every circuit is ``relayA, relayB, relayC`` (or reversed), so
the overlay links A–B and B–C carry bulk data in BOTH directions and B's access
link carries everything in both directions — the paper's bidirectional setting
(Sec. V, Figs 6-9) with overlay connections instead of plain TCP:

* client ``clientA`` on A downloads from ``httpdC`` on C through exit relayC
  (data C→B→A) and uploads to it (A→B→C), from 0 to 250 s;
* client ``clientC`` on C does the same towards ``httpdA`` through exit relayA,
  from 50 to 300 s (times × ``scale``; ``--quick`` uses 0.2).

Clients cannot choose their path: the authority gives Guard only to relayA and
relayC (relayB advertises a lower bandwidth and ``TestingAllGuards`` is off), so
a circuit pinned to exit relayC (``host.relayC.exit``) must be relayA, relayB,
relayC; the client logs are checked for it.

Directions (each is one direction of BOTH overlay links):

* ``A->B``: A→B→C, carried by clientA's upload and clientC's download;
* ``C->B``: C→B→A, carried by clientC's upload and clientA's download.

Variants (relay config + shaping):

* ``one``            ``SplitDirection = "off"``: one TCP connection per relay pair (paper Fig 6)
* ``one-ackprio``    the same + ``chive shape`` on every host (Fig 7)
* ``split``          ``SplitDirection = "always"``: one connection per direction (extra)
* ``split-ackprio``  split + ``chive shape`` on every host (Fig 8)
* ``dynamic``, ``dynamic-ackprio``  ``SplitDirection = "dynamic"`` (beyond the paper): one
  connection until both directions of a channel carry bulk for a few seconds, then split
* ``split-ackprio-kernelbuf``  split-ackprio with the relays' ``LinkUnsentLimit = 0``
* ``one-bbr``, ``split-ackprio-bbr``  one / split-ackprio with the relays'
  ``LinkCongestionControl = "bbr"`` (the hosts keep the scenario's ``cc``)
* ``tor``, ``tor-ackprio``  the baseline: Debian's ``tor`` as authority, relays and clients
  (:class:`~chive_lab.tor_netns.TorOverlay`), without and with ``chive shape``; topology
  ``to-b`` only, clients pin the same paths in their torrc
* ``tor-ackprio-bbr``, ``one-ackprio-bbr``  BBR and ACK priority without splitting: tor with
  BBR as the hosts' default, chive's one connection with BBR links

Measurement: ``chive perf --progress 1 --verify`` per transfer loop (4 flows, `circuits` loops each);
bytes per second per loop (downloads counted at the receiving client, uploads
at the sending client, which the circuit window keeps within 1000 cells of
what the exit delivered), summed per direction. Same analysis and outputs as
:mod:`chive_lab.experiments.paper002`: ``throughput_<variant>.png/.csv``,
``variance.png/.csv`` (1 s samples of the directions towards B, 100-250 s),
``summary.json`` (schema 1), ``comparison.md``, ``manifest.json``; per run the
perf records, relay logs, ``links.json`` (which TCP connection carried how many
bytes, from ``ss``) and ``qdisc-*.txt``.

Topology ``to-b`` (scenario key ``topology``; the default above is ``through-b``): the
paper's own pattern, where the data towards B ENDS at B. A second relay ``relayB2`` and the
web servers run on B; clients pin their circuits with ``EntryNodes``/``MiddleNodes`` to
``relayA|relayC, relayB2, relayB`` (exit). clientA uploads to and downloads from ``httpdBA``
on B, clientC from ``httpdBC``: the overlay link A–B2 carries A→B and B→A, C–B2 carries C→B
and B→C, and B's access link is shared only by what B sends (as in the paper, Sec. V).
Directions: ``A->B``, ``C->B`` (towards B: the paper's Figs 6-9) and ``B->A``, ``B->C``.
Why a second topology: in ``through-b`` every byte crosses B's uplink, so each direction can
have at most half of it (minus 7.3% cell and TCP/IP overhead, and 10% more under `chive shape`,
whose data class gets 90% of the link): the issue's 45% is then out of reach by construction. In
``to-b`` the same holds for what B sends under `chive shape` (:func:`ceiling_share`: ~0.417);
only the directions towards B can reach 45% (ceiling ~0.463).

Standalone: ``python -m chive_lab.experiments.paper002_overlay --quick --out DIR``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import platform
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import netns
from ..errors import LabError
from ..kinds import ExperimentKind
from ..tor_netns import TorOverlay, check_tor_variants, standalone_variants
from . import paper002 as p2

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

VARIANTS: dict[str, dict] = {
    "one": {"split": "off", "ackprio": False, "fig": "6"},
    "one-ackprio": {"split": "off", "ackprio": True, "fig": "7"},
    "split": {"split": "always", "ackprio": False, "fig": "-"},
    "split-ackprio": {"split": "always", "ackprio": True, "fig": "8"},
    # Beyond the paper: split only while both directions carry bulk (SplitDirection "dynamic").
    "dynamic": {"split": "dynamic", "ackprio": False, "fig": "-"},
    "dynamic-ackprio": {"split": "dynamic", "ackprio": True, "fig": "-"},
    # chive's relays keep at most `LinkUnsentLimit` (64 KiB) unsent in each link socket; this
    # variant lets the kernel's autotuned buffer hold the backlog instead (as before session 6),
    # where the upload SENDMEs that B returns wait behind ~1 MB of B's downloads.
    "split-ackprio-kernelbuf": {"split": "always", "ackprio": True, "fig": "-",
                                "relay": {"LinkUnsentLimit": 0}},
    # The relays' links use BBR (`LinkCongestionControl`), the hosts keep CUBIC: relay links are
    # the only traffic between hosts, so this is what an operator can set without touching the
    # host, measured in the same batch as the CUBIC variants (the issue's BBR variant).
    "one-bbr": {"split": "off", "ackprio": False, "fig": "-",
                "relay": {"LinkCongestionControl": "bbr"}},
    "split-ackprio-bbr": {"split": "always", "ackprio": True, "fig": "-",
                          "relay": {"LinkCongestionControl": "bbr"}},
    # The baseline: Debian's tor in every role (relays, clients, authority) on the same hosts,
    # links and traffic (topology "to-b" only). Tor keeps one connection per relay pair, bounds
    # its socket writes with KIST and runs its own circuit congestion control (Vegas).
    "tor": {"impl": "tor", "split": "off", "ackprio": False, "fig": "6"},
    "tor-ackprio": {"impl": "tor", "split": "off", "ackprio": True, "fig": "7"},
    # BBR without splitting: Tor with BBR as the hosts' default (in topology to-b every
    # connection between hosts is a relay link, so this is what split-ackprio-bbr's relays
    # get per socket), and chive's one connection with BBR links, both with ACK priority.
    "tor-ackprio-bbr": {"impl": "tor", "split": "off", "ackprio": True, "fig": "-", "host_cc": "bbr"},
    "one-ackprio-bbr": {"split": "off", "ackprio": True, "fig": "-",
                        "relay": {"LinkCongestionControl": "bbr"}},
    # `chive shape --bulk-ceil 0.95`: the data class keeps its guaranteed 90% and may borrow
    # what the ACK class leaves idle up to the 95% root, so each of the two flows B sends can
    # pass 45% of the link on the wire (the paper's hard cap stops them at exactly 45%).
    "split-ackprio-borrow": {"split": "always", "ackprio": True, "fig": "-",
                             "shape": {"bulk_ceil": 0.95}},
    "split-ackprio-bbr-borrow": {"split": "always", "ackprio": True, "fig": "-",
                                 "shape": {"bulk_ceil": 0.95},
                                 "relay": {"LinkCongestionControl": "bbr"}},
    # The same shaping and BBR without splitting: does the split matter for the targets?
    "one-ackprio-bbr-borrow": {"split": "off", "ackprio": True, "fig": "-",
                               "shape": {"bulk_ceil": 0.95},
                               "relay": {"LinkCongestionControl": "bbr"}},
    "tor-ackprio-bbr-borrow": {"impl": "tor", "split": "off", "ackprio": True, "fig": "-",
                               "host_cc": "bbr", "shape": {"bulk_ceil": 0.95}},
}
#: The variants that run Debian's tor instead of chive.
TOR_VARIANTS = [v for v, d in VARIANTS.items() if d.get("impl") == "tor"]

#: Paper 002, Sec. V (bidirectional TCP connections; the paper has no overlay numbers).
PAPER = {
    "one": "towards B ~200 kB/s (1.6 Mbit/s) with high variation (Fig 6)",
    "one-ackprio": "each direction ~half of the link, but oscillations and multi-second "
                   "breakdowns in single runs (Fig 7)",
    "split": "(not measured in the paper)",
    "dynamic": "(not in the paper)",
    "dynamic-ackprio": "(not in the paper)",
    "split-ackprio": "about half each, much steadier, no multi-second breakdowns (Fig 8)",
    "split-ackprio-kernelbuf": "(not in the paper)",
    "one-bbr": "(not in the paper)",
    "split-ackprio-bbr": "(not in the paper)",
    "tor": "(Tor itself: the paper's motivation; its Fig 6 is the TCP analogue)",
    "tor-ackprio": "(Tor with the paper's ACK prioritisation; Fig 7 is the TCP analogue)",
    "tor-ackprio-bbr": "(not in the paper)",
    "one-ackprio-bbr": "(not in the paper)",
    "split-ackprio-borrow": "(not in the paper: its data class is capped at 90%)",
    "split-ackprio-bbr-borrow": "(not in the paper)",
    "one-ackprio-bbr-borrow": "(not in the paper)",
    "tor-ackprio-bbr-borrow": "(not in the paper)",
}
PAPER_VARIANCE = ("Fig 9: variance of towards-B throughput, 100-250 s: bidirectional without ACK prio "
                  "highest, with ACK prio lower, split + ACK prio lowest (no numbers in the text)")
#: Issue 6 targets for split + ACK prio.
TARGET_SHARE = 0.45
TARGET_VARIANCE_RATIO = 0.1
#: Goodput per byte on the wire: a full TCP segment carries 1448 payload bytes in 1514 (IPv4,
#: TCP with timestamps and the Ethernet header, which HTB counts), a cell 498 data bytes in 514
#: (TLS records add ~0.1%, left out).
WIRE_EFFICIENCY = (1448 / 1514) * (498 / 514)
#: `chive shape` defaults (what the lab installs): the root at 95% of the link rate, everything
#: but short ACKs in a class at 90% of it.
SHAPE_THROTTLE, SHAPE_DATA = 0.95, 0.9

RELAY_PORT, SOCKS_PORT, HTTP_PORT, DIR_PORT = 9001, 9050, 8080, 7000
#: The shaped hosts, in the order the testbed is built (then the authority's host X); the
#: testbed hands out its subnet's addresses in that order.
SHAPED_HOSTS = ("A", "B", "C")
HOST_BY_ADDR = dict(zip((str(a) for a in ipaddress.ip_network(netns.DEFAULT_SUBNET).hosts()),
                        SHAPED_HOSTS + ("X",)))
#: ``to-b``: relayB2's ORPort, and the port of httpdBC (httpdBA uses HTTP_PORT).
RELAY2_PORT, HTTP2_PORT = 9002, 8081
TOPOLOGIES = ("through-b", "to-b")
#: Params.exit_relays values.
EXIT_RELAYS = ("all", "b")
#: relayB advertises this (bytes/s, far above 10 Mbit/s so it never throttles) while
#: relayA/relayC advertise the relay's "unlimited" 100 MB/s: the median makes only A, C Guards.
B_BANDWIDTH = 50_000_000
#: Most circuits per flow (each is a perf process on the client's host).
MAX_CIRCUITS = 16


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


@dataclass
class Params:
    """Parameters of one experiment (scenario-level)."""

    rate: str = "10mbit"
    scale: float = 1.0
    cc: str = "cubic"
    queue_packets: int = 1000
    queue_at: str = "switch"
    #: The switch's port buffer towards each host (None: queue_packets), see netns.LinkSpec.
    switch_port_packets: int | None = None
    ackprio_hosts: tuple[str, ...] = ("A", "B", "C")
    delay_ms: float = 0.0
    transfer_bytes: int = 64 * 1024 * 1024
    log_level: str = "info"
    topology: str = "through-b"
    #: Transfer loops per flow, each its own perf process and SOCKS user, so its own circuit.
    #: One circuit moves at most a circuit window (1000 cells, 498 KB) per round trip; with the
    #: 1000-packet queues of the paper's era (~1.2 s at 10 Mbit/s) that caps a flow near
    #: 3.3 Mbit/s whatever TCP does. Several circuits per flow take that limit away, as several
    #: TCP connections per host did in the paper's BitTorrent motivation.
    circuits: int = 1
    #: Topology to-b, chive relays: "all" relays are exits (as before session 8), or only
    #: relayB ("b"). With "all", a client's preemptive circuits may leave at relayA or relayC
    #: through relayB2, so relayB2 opens a channel towards them while they open one to it, and
    #: a run can carry one direction on two channels (:func:`extra_channel_pairs`). Tor clients
    #: pin ExitNodes for every circuit, so this changes nothing for them.
    exit_relays: str = "all"

    def t(self, seconds: float) -> float:
        """A paper time scaled."""
        return seconds * self.scale


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


# ----------------------------------------------------------------- running
def _relay_overrides(host: str, base: dict) -> dict:
    o = dict(base)
    if host == "B":
        # Lower advertised bandwidth => no Guard flag. BandwidthRate would also switch on
        # constrained sockets and a larger OutbufCells; pin both to the unlimited relays' values.
        o.update({"BandwidthRate": B_BANDWIDTH, "BandwidthBurst": B_BANDWIDTH,
                  "ConstrainedSockets": False, "OutbufCells": 64})
    return o


def _place_nodes(ov: "netns.Overlay", p: Params, split: str,
                 relay_extra: dict | None = None, impl: str = "chive") -> dict[str, tuple[str, int]]:
    """Add relays, clients and web servers for ``p.topology``; return ``{httpd: (host, port)}``.
    ``relay_extra``: more relay options (the variant's ``relay`` table). ``impl = "tor"``:
    ``ov`` is a :class:`~chive_lab.tor_netns.TorOverlay`; relays get no chive options and
    clients pin the exit in their torrc (Tor has no ``.exit`` notation)."""
    base = {"SplitDirection": split, **(relay_extra or {})} if impl == "chive" else {}
    if p.topology == "to-b":
        for h, nick, port in (("A", "relayA", RELAY_PORT), ("B", "relayB", RELAY_PORT),
                              ("B", "relayB2", RELAY2_PORT), ("C", "relayC", RELAY_PORT)):
            no_exit = impl == "chive" and p.exit_relays == "b" and nick != "relayB"
            ov.add_relay(h, nick, port=port,
                         overrides={**base, "ExitPolicy": ["reject *:*"]} if no_exit else base)
        for h in ("A", "C"):
            pins = {"EntryNodes": [f"relay{h}"], "MiddleNodes": ["relayB2"]}
            if impl == "tor":
                pins["ExitNodes"] = ["relayB"]
            ov.add_client(h, f"client{h}", port=SOCKS_PORT, extra=pins)
        httpds = {"httpdBA": ("B", HTTP_PORT), "httpdBC": ("B", HTTP2_PORT)}
    else:
        if impl != "chive":
            raise LabError(f"{impl} nodes run only in topology to-b (through-b relies on chive's "
                           "Guard-flag settings to fix the path)")
        for h in ("A", "B", "C"):
            ov.add_relay(h, f"relay{h}", port=RELAY_PORT, overrides=_relay_overrides(h, base))
        for h in ("A", "C"):
            ov.add_client(h, f"client{h}", port=SOCKS_PORT)
        httpds = {"httpdA": ("A", HTTP_PORT), "httpdC": ("C", HTTP_PORT)}
    for name, (h, port) in httpds.items():
        ov.add_httpd(h, name, port=port)
    return httpds


def run_repetition_raw(variant: str, rep: int, out_dir: Path, p: Params, *,
                       chive_bin: Path | None = None, progress: Callable[[str], None] | None = None,
                       stop: threading.Event | None = None) -> dict[str, list[float]]:
    """Run one repetition; return ``{series: [bit/s per second]}`` (directions and loops)
    and keep the raw records, logs and link statistics in ``out_dir``."""
    v = VARIANTS[variant]
    impl = v.get("impl", "chive")
    if impl == "tor" and p.topology != "to-b":
        raise LabError(f"variant {variant} (tor) needs topology to-b")
    say = progress or (lambda _m: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    link = netns.LinkSpec(p.rate, delay_ms=p.delay_ms, queue_packets=p.queue_packets, queue_at=p.queue_at,
                          switch_port_packets=p.switch_port_packets)
    # A variant may set the hosts' congestion control itself ("host_cc"): Tor cannot choose it
    # per socket, and in topology to-b every connection between hosts is a relay link.
    host_cc = v.get("host_cc", p.cc)
    hosts = [netns.HostSpec(n, link, cc=host_cc) for n in SHAPED_HOSTS]
    hosts.append(netns.HostSpec("X", netns.LinkSpec(None), cc=host_cc))  # the authority, unshaped
    fl = flows(p)
    end = max(f.stop for f in fl)
    tb = netns.Testbed(hosts, chive_bin=chive_bin, progress=say, widen_allowed_cc=True)
    t0 = 0.0
    try:
        tb.up()
        cc = {h.name: h.cc_effective for h in tb.hosts.values()}
        shape_cmds: list[str] = []
        if v["ackprio"]:
            for h in p.ackprio_hosts:
                shape_cmds = tb.set_ack_priority(h, bulk_ceil=v.get("shape", {}).get("bulk_ceil"))
        (out_dir / "shape.txt").write_text("\n".join(shape_cmds) + "\n")
        if impl == "tor":
            ov: netns.Overlay = TorOverlay(tb, out_dir / "net", binary=chive_bin, log=p.log_level,
                                           progress=say)
        else:
            ov = netns.Overlay(tb, out_dir / "net", binary=chive_bin, log=p.log_level, progress=say)
        ov.add_authority("X", port=DIR_PORT, all_guards=False)
        httpds = _place_nodes(ov, p, v["split"], v.get("relay"), impl)
        ov.start(timeout=60)
        perf = []
        t0 = time.time() + 0.5
        samplers = []
        for name, (h, port) in httpds.items():  # uploads are counted where they arrive
            samplers.append(start_sampler(tb, h, ["ss-sample", "--port", str(port)], t0 + end + 5,
                                          out_dir / f"rx-{name}.jsonl"))
        for h in SHAPED_HOSTS:  # relay sockets' unsent bytes and RTT, once a second
            samplers.append(start_sampler(tb, h, ["link-sample", "--ports", f"{RELAY_PORT},{RELAY2_PORT}"],
                                          t0 + end + 5, out_dir / f"links-{h}.jsonl"))
        for f in fl:
            url = ov.url(f.httpd, "/upload" if f.upload else f"/bytes/{p.transfer_bytes}",
                         exit=f"relay{f.server}")
            for user in loop_stems(f, p.circuits):
                perf.append(start_perf_loop(tb, ov, f"client{f.client}", url, (t0 + f.start, t0 + f.stop),
                                            end, user, f.name, p.transfer_bytes if f.upload else None,
                                            out_dir / f"perf-{user}"))
        run_info = {"t0": t0, "variant": variant, "rep": rep, "cc": cc, "params": p.__dict__,
                    "impl": impl}
        if isinstance(ov, TorOverlay):
            run_info["tor_version"] = ov.tools.version
        (out_dir / "run.json").write_text(json.dumps(run_info, default=list))
        say(f"paper002-overlay: {variant}: {end:g} s of bulk transfers")
        wait_for_loops(perf, samplers, t0 + end, stop)
        if isinstance(ov, TorOverlay):
            (out_dir / "tor.json").write_text(json.dumps(ov.evidence(), indent=1))
        links = {h: tb.sh(h, ["ss", "-tinH"], check=False).stdout for h in ("A", "B", "C")}
        (out_dir / "ss.txt").write_text("\n".join(f"## {h}\n{t}" for h, t in links.items()))
        (out_dir / "links.json").write_text(json.dumps(link_bytes(links, tb), indent=1))
        (out_dir / "link_queues.json").write_text(json.dumps(
            link_queues(out_dir, t0, (p.t(VAR_WINDOW[0]), p.t(VAR_WINDOW[1]))), indent=1))
        for h in ("A", "B", "C"):
            (out_dir / f"qdisc-{h}.txt").write_text(tb.qdisc_stats(h) + tb.qdisc_stats("sw", f"v{h}")
                                                    + tb.qdisc_stats("sw", f"v{h}d"))
        ov.stop()
    finally:
        tb.down()
    return collect_flows(out_dir, fl, t0, math.ceil(end), directions(p), p.circuits)


def start_sampler(tb: netns.Testbed, host: str, args: list[str], stop_at: float, out: Path):
    """Start this module's ``ss-sample``/``link-sample`` (``args``) inside ``host`` until
    ``stop_at`` (UNIX s), writing ``out``."""
    return tb.popen(host, [sys.executable, "-m", "chive_lab.experiments.paper002_overlay", *args,
                           "--stop-at", f"{stop_at:.3f}", "--out", str(out)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def start_perf_loop(tb: netns.Testbed, ov: "netns.Overlay", client: str, url: str,
                    window: tuple[float, float], end: float, user: str, label: str,
                    upload_bytes: int | None, stem: Path):
    """Start a verified ``chive perf`` loop through ``client`` on its host: transfers back to
    back from ``window[0]`` to ``window[1]`` (UNIX s; the last one cut there), progress every
    second, SOCKS user ``user`` (its own circuit), uploads of ``upload_bytes`` if given.
    Records go to ``stem``.jsonl / .err."""
    now = time.time()  # perf counts --duration from its own start, delay included
    argv = [str(ov.binary), "perf", "--socks", ov.addr(client), "--url", url,
            "--count", "0", "--duration", f"{max(1.0, window[1] - now):.3f}",
            "--cut-at-deadline", "--start-delay", f"{max(0.0, window[0] - now):.3f}",
            "--progress", "1", "--verify", "--timeout", f"{end + 60:.0f}",
            "--socks-user", user, "--label", label]
    if upload_bytes is not None:
        argv += ["--method", "post", "--upload-bytes", str(upload_bytes)]
    with open(f"{stem}.jsonl", "wb") as fh, open(f"{stem}.err", "wb") as fe:
        return tb.popen(ov.nodes[client].host, argv, stdout=fh, stderr=fe)


def wait_for_loops(perf: list, samplers: list, end_at: float, stop: threading.Event | None) -> None:
    """Wait for the perf loops (LabError if ``stop`` is set or they run 60 s past ``end_at``),
    then give the samplers until 10 s past ``end_at`` before stopping them."""
    deadline = end_at + 60
    for pr in perf:
        while pr.poll() is None:
            if (stop is not None and stop.is_set()) or time.time() > deadline:
                raise LabError("run interrupted or overran its deadline")
            time.sleep(0.2)
    for sp in samplers:
        try:
            sp.wait(timeout=max(1.0, end_at + 10 - time.time()))
        except subprocess.TimeoutExpired:
            sp.terminate()


_SS_CONN = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+):(\d+)\s+(\S+):(\d+)")


def link_bytes(ss_text: dict[str, str], tb: netns.Testbed) -> list[dict]:
    """Relay-to-relay TCP connections seen from each host (``ss -tin``): who
    opened it, and bytes sent/received by this end. Split channels show up as
    two connections per pair, each carrying data one way."""
    names = {h.addr: h.name for h in tb.hosts.values()}
    rows = []
    for host, text in ss_text.items():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            m = _SS_CONN.match(line.strip())
            if not m:
                continue
            lip, lport, rip, rport = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
            if rip not in names or names[rip] == host or names[rip] == "X":
                continue
            if RELAY_PORT not in (lport, rport) and RELAY2_PORT not in (lport, rport):
                continue
            info = lines[i + 1] if i + 1 < len(lines) else ""
            sent = re.search(r"bytes_sent:(\d+)", info)
            recv = re.search(r"bytes_received:(\d+)", info)
            rows.append({"host": host, "peer": names[rip], "local": f"{lip}:{lport}",
                         "remote": f"{rip}:{rport}", "opened_by": host if rport in (RELAY_PORT, RELAY2_PORT) else names[rip],
                         "bytes_sent": int(sent.group(1)) if sent else 0,
                         "bytes_received": int(recv.group(1)) if recv else 0})
    return rows


def perf_series(path: Path, t0: float, seconds: int) -> tuple[list[float], dict]:
    """Bit/s per second since ``t0`` of one perf loop, from its progress and
    transfer records (cumulative bytes interpolated at whole seconds), and the
    transfer outcome counts."""
    samples: list[tuple[float, float]] = []
    done = 0.0
    counts = {"ok": 0, "cut": 0, "errors": 0, "bytes_ok": 0, "error_texts": []}
    try:
        text = path.read_text()
    except OSError as e:
        raise LabError(f"missing perf record {path}: {e}") from e
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if not isinstance(r, dict):
            continue
        if r.get("type") == "progress" and isinstance(r.get("t"), (int, float)):
            samples.append((float(r["t"]), done + float(r.get("bytes") or 0)))
        elif r.get("type") == "transfer":
            b = float(r.get("bytes") or 0)
            err = r.get("error")
            if err is None and r.get("status") is not None and 200 <= int(r["status"]) < 300:
                counts["ok"] += 1
                counts["bytes_ok"] += int(b)
            elif err in ("cut at deadline", "interrupted"):
                counts["cut"] += 1
            else:
                counts["errors"] += 1
                if len(counts["error_texts"]) < 5:
                    counts["error_texts"].append(str(err))
            done += b
            # A cut or failed transfer has no last_byte: its progress records already count.
            t = r.get("last_byte")
            if isinstance(t, (int, float)):
                samples.append((float(t), done))
    samples.sort()
    series = []
    prev = _cum_at(samples, t0)
    for k in range(seconds):
        cur = _cum_at(samples, t0 + k + 1)
        series.append(max(0.0, cur - prev) * 8.0)
        prev = cur
    return series, counts


def _cum_at(samples: list[tuple[float, float]], t: float) -> float:
    """Cumulative bytes at time ``t`` (linear between samples, 0 before the first)."""
    if not samples or t <= samples[0][0]:
        # Before the first record the loop had 0 bytes at most a second earlier.
        if samples and t > samples[0][0] - 1.0:
            t_first, b_first = samples[0]
            return b_first * max(0.0, 1.0 - (t_first - t))
        return 0.0
    lo, hi = 0, len(samples) - 1
    if t >= samples[hi][0]:
        return samples[hi][1]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if samples[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (ta, ba), (tb_, bb) = samples[lo], samples[hi]
    return ba if tb_ <= ta else ba + (bb - ba) * (t - ta) / (tb_ - ta)


_SS_PAIR = re.compile(r"(\d+\.\d+\.\d+\.\d+):(\d+)\s+(\d+\.\d+\.\d+\.\d+):(\d+)")
#: Upload connections receive at least this much; smaller ones are download requests.
_UPLOAD_MIN_RX = 4096


def ss_sample(port: int, stop_at: float, out: Path, interval: float = 0.25) -> None:
    """Inside a host: every ``interval`` s, ``bytes_received`` of each established
    TCP socket with local port ``port`` (the httpd's), one JSON line per sample:
    ``{"t": UNIX s, "rx": {"peer_ip:port": bytes}}``."""
    with out.open("w") as fh:
        while time.time() < stop_at:
            t = time.time()
            r = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                               capture_output=True, text=True, timeout=5, check=False)
            rx: dict[str, int] = {}
            key = None
            for line in r.stdout.splitlines():
                m = _SS_PAIR.search(line)
                if m:
                    key = f"{m.group(3)}:{m.group(4)}"
                    continue
                b = re.search(r"bytes_received:(\d+)", line)
                if key is not None and b:
                    rx[key] = int(b.group(1))
                    key = None
            fh.write(json.dumps({"t": t, "rx": rx}) + "\n")
            fh.flush()
            time.sleep(max(0.0, interval - (time.time() - t)))


_SS_INFO = {"notsent": re.compile(r"\bnotsent:(\d+)"), "rtt_ms": re.compile(r"\brtt:([\d.]+)/"),
            "cwnd": re.compile(r"\bcwnd:(\d+)"), "unacked": re.compile(r"\bunacked:(\d+)"),
            # Retransmissions included: what the socket put on the link.
            "bytes_sent": re.compile(r"\bbytes_sent:(\d+)"),
            "data_segs_out": re.compile(r"\bdata_segs_out:(\d+)")}
#: Bytes a data segment adds on the wire as HTB counts it: Ethernet 14, IPv4 20, TCP with
#: timestamps 32.
WIRE_HEADER_BYTES = 66


def parse_link_sockets(ss_text: str, ports: set[int]) -> dict[str, dict[str, float]]:
    """``ss -tinH`` output -> ``{"local_ip:port>peer_ip:port": {notsent, rtt_ms, cwnd,
    unacked}}`` for sockets between two hosts with a relay port at either end (connections
    inside one host, such as a client and its guard, are left out). ``notsent`` is what the
    application wrote and the kernel has not sent yet: the queue no scheduler can reorder."""
    out: dict[str, dict[str, float]] = {}
    key = None
    for line in ss_text.splitlines():
        m = _SS_PAIR.search(line)
        if m:
            lip, lport, rip, rport = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
            key = (f"{lip}:{lport}>{rip}:{rport}"
                   if lip != rip and (lport in ports or rport in ports) else None)
        if key is None:
            continue
        info: dict[str, float] = {}
        for name, pattern in _SS_INFO.items():
            found = pattern.search(line)
            if found:
                info[name] = float(found.group(1))
        if "rtt_ms" in info or "cwnd" in info:  # the info line (ss prints it after the pair)
            info.setdefault("notsent", 0.0)
            info.setdefault("unacked", 0.0)
            out[key] = info
            key = None
    return out


def link_sample(ports: list[int], stop_at: float, out: Path, interval: float = 1.0) -> None:
    """Inside a host: every ``interval`` s, :func:`parse_link_sockets` of the relay-to-relay
    sockets, one JSON line per sample: ``{"t": UNIX s, "socks": {key: {...}}}``."""
    filt = "( " + " or ".join(f"sport = :{p} or dport = :{p}" for p in ports) + " )"
    with out.open("w") as fh:
        while time.time() < stop_at:
            t = time.time()
            r = subprocess.run(["ss", "-tinH", "state", "established", filt],
                               capture_output=True, text=True, timeout=5, check=False)
            fh.write(json.dumps({"t": t, "socks": parse_link_sockets(r.stdout, set(ports))}) + "\n")
            fh.flush()
            time.sleep(max(0.0, interval - (time.time() - t)))


def link_queues(run_dir: Path, t0: float, window: tuple[float, float]) -> list[dict]:
    """Per relay-to-relay socket of a run (``links-<host>.jsonl``), over ``window`` seconds
    after ``t0``: mean and max unsent bytes, mean smoothed RTT, number of samples, and (when
    the samples have the counters) ``wire_bytes``: what the socket put on the link between its
    first and last sample in the window, data and headers (:data:`WIRE_HEADER_BYTES` per data
    segment, retransmissions included), over ``wire_span_s`` seconds."""
    rows = []
    for path in sorted(run_dir.glob("links-*.jsonl")):
        host = path.stem.split("-", 1)[1]
        acc: dict[str, list[tuple[float, dict]]] = {}
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
                t, socks = float(r["t"]) - t0, r["socks"]
            except (ValueError, KeyError, TypeError):
                continue
            if window[0] <= t < window[1] and isinstance(socks, dict):
                for k, v in socks.items():
                    if isinstance(v, dict):
                        acc.setdefault(k, []).append((t, v))
        for k, tvs in sorted(acc.items()):
            local, peer = k.split(">")
            vs = [v for _t, v in tvs]
            ns = [float(v.get("notsent", 0)) for v in vs]
            rtt = [float(v["rtt_ms"]) for v in vs if "rtt_ms" in v]
            row = {"host": host, "local": local, "peer": peer, "samples": len(vs),
                   "notsent_mean": sum(ns) / len(ns), "notsent_max": max(ns),
                   "rtt_ms_mean": sum(rtt) / len(rtt) if rtt else None}
            counted = [(t, float(v["bytes_sent"]) + WIRE_HEADER_BYTES * float(v["data_segs_out"]))
                       for t, v in tvs if "bytes_sent" in v and "data_segs_out" in v]
            if len(counted) >= 2:
                row["wire_bytes"] = counted[-1][1] - counted[0][1]
                row["wire_span_s"] = counted[-1][0] - counted[0][0]
            rows.append(row)
    return rows


def wire_shares(queues: list[dict], rate_bps: float) -> dict[str, float]:
    """Share of the link each host-to-host direction used on the wire in a run, from its
    :func:`link_queues` rows: the bytes every relay socket of that direction sent (headers and
    retransmissions included) over the longest sampled span among them, per link rate. This
    is the "share of the link" of the issue's target. Goodput is ~0.9 of it: cells and TCP/IP
    headers (:data:`WIRE_EFFICIENCY`, 0.93) and the SENDMEs a direction carries for the other."""
    sent: dict[str, float] = {}
    span: dict[str, float] = {}
    for q in queues:
        if "wire_bytes" not in q or not q.get("wire_span_s"):
            continue
        dst = HOST_BY_ADDR.get(q["peer"].rsplit(":", 1)[0])
        if dst is None or dst == q["host"]:
            continue
        d = f"{q['host']}->{dst}"
        sent[d] = sent.get(d, 0.0) + float(q["wire_bytes"])
        span[d] = max(span.get(d, 0.0), float(q["wire_span_s"]))
    return {d: sent[d] * 8 / span[d] / rate_bps for d in sorted(sent) if span[d] > 0}


def rx_series(path: Path, t0: float, seconds: int) -> list[float]:
    """Bit/s per second since ``t0`` received by the httpd on upload connections,
    from :func:`ss_sample` records. A connection's bytes after its last sample
    (at most one sampling interval, 0.25 s) are not counted."""
    last: dict[str, int] = {}
    samples: list[tuple[float, float]] = []
    try:
        text = path.read_text()
    except OSError as e:
        raise LabError(f"missing receiver samples {path}: {e}") from e
    for line in text.splitlines():
        try:
            r = json.loads(line)
            t, rx = float(r["t"]), r["rx"]
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(rx, dict):
            continue
        for k, v in rx.items():
            if isinstance(v, int) and v >= last.get(k, 0):
                last[k] = v
        samples.append((t, float(sum(v for v in last.values() if v >= _UPLOAD_MIN_RX))))
    out = []
    prev = _cum_at(samples, t0)
    for k in range(seconds):
        cur = _cum_at(samples, t0 + k + 1)
        out.append(max(0.0, cur - prev) * 8.0)
        prev = cur
    return out


def collect_flows(out_dir: Path, fl: list[Flow], t0: float, seconds: int,
                  dirs: tuple[str, ...] = DIRECTIONS, circuits: int = 1) -> dict[str, list[float]]:
    """Per direction (``A->B``, ``C->B`` …) and per flow (``A:down`` …, the sum of its
    ``circuits`` loops): bit/s per second."""
    out: dict[str, list[float]] = {d: [0.0] * seconds for d in dirs}
    outcomes = {}
    for f in fl:
        s, counts = [0.0] * seconds, {}
        for stem in loop_stems(f, circuits):
            ls, lc = perf_series(out_dir / f"perf-{stem}.jsonl", t0, seconds)
            s = [a + b for a, b in zip(s, ls)]
            for k, v in lc.items():
                counts[k] = counts.get(k, 0 if not isinstance(v, list) else []) + v
        if f.upload:  # perf counts what it wrote into the local SOCKS socket: use the receiver
            counts["sender_side_series_bps"] = s
            s = rx_series(out_dir / f"rx-{f.httpd}.jsonl", t0, seconds)
        out[f.name] = s
        out[f.direction] = [a + b for a, b in zip(out[f.direction], s)]
        outcomes[f.name] = counts
    (out_dir / "transfers.json").write_text(json.dumps(outcomes, indent=1))
    return out


# ---------------------------------------------------------------- analysis
def analyze_raw(results: dict[str, list[dict[str, list[float]]]], p: Params, out: Path,
                evidence: dict[str, dict] | None = None) -> dict:
    """Write figures, CSVs, summary.json and comparison.md; return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    rate = netns.parse_rate(p.rate)
    ov = (p.t(OVERLAP[0]), p.t(OVERLAP[1]))
    vw = (p.t(VAR_WINDOW[0]), p.t(VAR_WINDOW[1]))
    solo = (p.t(SOLO[0]), p.t(SOLO[1]))
    summary: dict = {"schema": 1, "kind": KIND_NAME,
                     "units": {"goodput_bps": "bit/s", "variance": "(bit/s)^2", "share_of_link": "fraction"},
                     "params": {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in p.__dict__.items()},
                                "goodput_window_s": list(ov), "variance_window_s": list(vw),
                                "solo_window_s": list(solo)},
                     "definitions": {
                         **({"A->B": "clientA's upload to httpdBA on B (ends at B)",
                             "C->B": "clientC's upload to httpdBC on B", "B->A": "clientA's download",
                             "B->C": "clientC's download"} if p.topology == "to-b" else
                            {"A->B": "data A->B->C (clientA's upload + clientC's download), one "
                                     "direction of both overlay links", "C->B": "data C->B->A"}),
                         "goodput_bps": "mean of 1 s application throughput while both clients run",
                         "variance": "sample variance of the 1 s throughput in the variance window",
                         "share_of_link": "goodput_bps / link rate",
                         "wire_share": "bytes the direction's relay sockets put on the link (data, "
                                       "headers, retransmissions) per link rate, variance window, "
                                       "mean over runs"},
                     "variants": {}, "extra": {}}
    var_rows = []
    for variant, runs in results.items():
        if not runs:
            continue
        vs: dict = {}
        extra: dict = {"runs": len(runs), "loops": {}}
        for d in directions(p):
            per_run = [p2._mean(p2._window(r[d], *ov)) for r in runs]
            samples = [x for r in runs for x in p2._window(r[d], *vw)]
            g = p2._mean(per_run)
            vs[d] = {"goodput_bps": g, "variance": p2._var(samples), "share_of_link": g / rate,
                     "solo_goodput_bps": p2._mean([p2._mean(p2._window(r[d], *solo)) for r in runs]),
                     "goodput_per_run_bps": per_run}
        # On the wire, from the relay sockets' counters (runs recorded before session 9 have none).
        wire = [wire_shares(ev.get("link_queues", []), rate)
                for ev in (evidence or {}).get(variant, {}).values()]
        for d in directions(p):
            per_run_wire = [w[d] for w in wire if d in w]
            if per_run_wire:
                vs[d]["wire_share"] = p2._mean(per_run_wire)
                vs[d]["wire_share_per_run"] = per_run_wire
        for f in sorted(k for k in runs[0] if ":" in k):
            extra["loops"][f] = {"goodput_bps": p2._mean([p2._mean(p2._window(r[f], *ov)) for r in runs])}
        pooled = [x for r in runs for d in DIRECTIONS for x in p2._window(r[d], *vw)]
        extra["towards_b_variance"] = p2._var(pooled)
        # The paper's Fig 9 samples: 10 s slot means (scaled with the timeline).
        slots = [x for r in runs for d in DIRECTIONS for x in p2._slot_means(r[d], *vw, SLOT * p.scale)]
        extra["towards_b_variance_slots"] = p2._var(slots)
        extra["towards_b_variance_slots_per_run"] = [
            p2._var([x for d in DIRECTIONS for x in p2._slot_means(r[d], *vw, SLOT * p.scale)]) for r in runs]
        extra["variance_slot_s"] = SLOT * p.scale
        if evidence and variant in evidence:
            extra["evidence"] = evidence[variant]
        var_rows.append((variant, p2._var(pooled), len(pooled),
                         p2._mean([vs[d]["goodput_bps"] for d in DIRECTIONS]), p2._var(slots)))
        summary["variants"][variant] = vs
        summary["extra"][variant] = extra
        _write_variant(out, variant, runs, SLOT * p.scale, p, directions(p))
    p2._write_variance(out, var_rows)
    summary["targets"] = _targets(summary, p)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    _write_comparison(out, summary, var_rows)
    return summary


def data_ceiling(variant: str) -> float:
    """The fraction of the link `chive shape`'s data class may use in ``variant``: the
    paper's hard 90%, or the variant's ``bulk_ceil``."""
    return VARIANTS.get(variant, {}).get("shape", {}).get("bulk_ceil", SHAPE_DATA)


def ceiling_share(p: "Params", direction: str, ackprio: bool, data: float = SHAPE_DATA) -> float:
    """The largest goodput share of the link that ``direction`` can have while both clients run,
    from the bottleneck it shares with one other flow: the switch port to B for what goes
    towards B in ``to-b``, B's uplink for what B sends (and, in ``through-b``, for everything).
    A host under `chive shape` sends data at most at ``SHAPE_DATA`` of the link, so with ACK
    priority on B the two flows B sends get 45% of the link each on the wire; times
    ``WIRE_EFFICIENCY`` that is ~0.417 of goodput, below the issue's 45% by construction.
    ``data``: the data class's ceiling (:func:`data_ceiling`; 0.95 lets B's flows reach 47.5%
    on the wire, less what B's ACKs take)."""
    def egress(host: str) -> float:
        return min(SHAPE_THROTTLE, data) if ackprio and host in p.ackprio_hosts else 1.0

    if p.topology == "to-b" and direction in ("A->B", "C->B"):
        wire = min(0.5, egress(direction[0]))
    else:
        wire = min(0.5, egress("B") / 2)
    return wire * WIRE_EFFICIENCY


def _targets(summary: dict, p: "Params") -> dict:
    """Issue 6: split + ACK prio gives each direction >= 45% of the link, and
    variance <= 1/10 of the unshaped single-connection case. Also each direction's
    ceiling (:func:`ceiling_share`) and its share relative to it."""
    dirs = directions(p)
    v = summary["variants"]
    t: dict = {"share_min": TARGET_SHARE, "variance_ratio_max": TARGET_VARIANCE_RATIO}
    if "split-ackprio" in v:
        shares = [v["split-ackprio"][d]["share_of_link"] for d in dirs]
        t["split_ackprio_min_share"] = min(shares)
        t["ceiling_share"] = {d: ceiling_share(p, d, True) for d in dirs}
        t["split_ackprio_share_of_ceiling"] = {
            d: v["split-ackprio"][d]["share_of_link"] / t["ceiling_share"][d] for d in dirs}
        t["split_ackprio_min_share_of_ceiling"] = min(t["split_ackprio_share_of_ceiling"].values())
        # The paper's Fig 8 measure alone (both flows towards B share B's downlink: <= 0.5 each,
        # ~0.463 after cell and TCP/IP overhead; what B sends is held to 90% by `chive shape`).
        t["split_ackprio_towards_b_min_share"] = min(v["split-ackprio"][d]["share_of_link"]
                                                     for d in DIRECTIONS)
        t["share_met"] = min(shares) >= TARGET_SHARE
        base = summary["extra"].get("one", {}).get("towards_b_variance")
        mine = summary["extra"]["split-ackprio"]["towards_b_variance"]
        if base and base == base and mine == mine:
            t["variance_ratio_vs_one"] = mine / base
            t["variance_met"] = mine / base <= TARGET_VARIANCE_RATIO
        base = summary["extra"].get("one", {}).get("towards_b_variance_slots")
        mine = summary["extra"]["split-ackprio"].get("towards_b_variance_slots")
        if base and base == base and mine is not None and mine == mine:
            t["variance_ratio_vs_one_slots"] = mine / base
    # Every variant's variance against `one` (the unshaped single connection) of the same batch,
    # at 1 s and over 10 s slots; then the targets for every ACK-priority variant (split or not,
    # CUBIC or BBR links, borrowing data class or not): goodput share, wire share (what the
    # issue's "of the link" can mean under `chive shape`), ceilings, and that variance ratio.
    one = summary["extra"].get("one", {})
    if one.get("towards_b_variance"):
        t["variance_ratio_vs_one_by_variant"] = {
            name: {"1s": e["towards_b_variance"] / one["towards_b_variance"],
                   "10s": (e["towards_b_variance_slots"] / one["towards_b_variance_slots"]
                           if one.get("towards_b_variance_slots") else None)}
            for name, e in summary["extra"].items() if e.get("towards_b_variance") == e.get("towards_b_variance")}
    ratios = t.get("variance_ratio_vs_one_by_variant", {})
    t["by_variant"] = {}
    for name, vs in v.items():
        if not VARIANTS.get(name, {}).get("ackprio"):
            continue
        ceil = {d: ceiling_share(p, d, True, data_ceiling(name)) for d in dirs}
        row: dict = {"split": VARIANTS[name]["split"], "data_ceiling": data_ceiling(name),
                     "min_share": min(vs[d]["share_of_link"] for d in dirs),
                     "ceiling_share": ceil,
                     "min_share_of_ceiling": min(vs[d]["share_of_link"] / ceil[d] for d in dirs)}
        row["share_met"] = row["min_share"] >= TARGET_SHARE
        if all("wire_share" in vs[d] for d in dirs):
            row["wire_share"] = {d: vs[d]["wire_share"] for d in dirs}
            row["min_wire_share"] = min(row["wire_share"].values())
            row["wire_share_met"] = row["min_wire_share"] >= TARGET_SHARE
        if name in ratios:
            row["variance_ratio_vs_one"] = ratios[name]["1s"]
            row["variance_met"] = row["variance_ratio_vs_one"] <= TARGET_VARIANCE_RATIO
            if ratios[name]["10s"] is not None:
                row["variance_ratio_vs_one_slots"] = ratios[name]["10s"]
        t["by_variant"][name] = row
    return t


def _write_variant(out: Path, variant: str, runs, slot: float, p: Params,
                   dirs: tuple[str, ...] = DIRECTIONS) -> None:
    # Per-connection series ("host:peer") go into the CSV; the figure shows the directions.
    series = list(dirs) + sorted(k for k in runs[0] if ":" in k)
    p2.write_throughput(out, variant, runs, slot, p, series, list(dirs),
                        f"overlay {variant}: mean over {len(runs)} run(s), {slot:g} s slots, 90% CI "
                        f"(cf. paper Fig {VARIANTS[variant]['fig']})",
                        hline=(netns.parse_rate(p.rate) / 2, "half the link"))


def _write_comparison(out: Path, summary: dict, var_rows) -> None:
    impls = " and ".join(sorted({VARIANTS.get(v, {}).get("impl", "chive") for v in summary["variants"]}))
    lines = [f"# Paper 002, overlay ({impls} relays on A, B, C): ours beside the paper", "",
             f"Parameters: {json.dumps(summary['params'])}", "",
             "| variant | direction | solo Mbit/s | both clients Mbit/s | share of link | paper (TCP, Sec. V) |",
             "|---|---|---|---|---|---|"]
    for v, ds in summary["variants"].items():
        for d, x in ds.items():
            lines.append(f"| {v} | {d} | {x['solo_goodput_bps'] / 1e6:.2f} | {x['goodput_bps'] / 1e6:.2f} | "
                         f"{x['share_of_link']:.2f} | {PAPER[v] if d == 'A->B' else ''} |")
    lines += [""] + p2.variance_table(var_rows, "one")
    t = summary.get("targets", {})
    lines += ["", PAPER_VARIANCE, "",
              f"Issue 6 targets (split-ackprio; share in goodput, on the wire below): each direction "
              f">= {TARGET_SHARE:.0%} of the link: "
              f"{t.get('split_ackprio_min_share', float('nan')):.3f} -> {t.get('share_met')}; "
              f"variance <= {TARGET_VARIANCE_RATIO} x one: {t.get('variance_ratio_vs_one', float('nan')):.3f}"
              f" -> {t.get('variance_met')} (1 s samples; with the paper's 10 s slot means: "
              f"{t.get('variance_ratio_vs_one_slots', float('nan')):.3f})", ""]
    if "ceiling_share" in t:
        lines += ["Ceilings (split-ackprio): the largest goodput share each direction can have, from the "
                  "bottleneck it shares with one other flow, `chive shape`'s 90% data class and "
                  f"{WIRE_EFFICIENCY:.3f} goodput per wire byte (TCP/IP, cells):", "",
                  "| direction | ceiling | share | share of ceiling |", "|---|---|---|---|"]
        for d, c in t["ceiling_share"].items():
            lines.append(f"| {d} | {c:.3f} | {summary['variants']['split-ackprio'][d]['share_of_link']:.3f} | "
                         f"{t['split_ackprio_share_of_ceiling'][d]:.2f} |")
        lines.append("")
    lines += _target_lines(t, directions_of(summary))
    lines += _link_queue_lines(summary)
    lines += _extra_channel_lines(summary)
    (out / "comparison.md").write_text("\n".join(lines))


def directions_of(summary: dict) -> list[str]:
    """The measured directions of a summary, in its order."""
    return list(next(iter(summary["variants"].values()), {}).keys())


def _target_lines(t: dict, dirs: list[str]) -> list[str]:
    """comparison.md table: the issue's targets for every ACK-priority variant."""
    rows = t.get("by_variant", {})
    if not rows:
        return []

    def f(x, fmt=".3f"):
        return "-" if x is None or x != x else format(x, fmt)

    lines = [f"Issue 6 targets by ACK-priority variant: each direction >= {TARGET_SHARE:.0%} of the link "
             f"(goodput, and on the wire: bytes the relay sockets sent incl. headers and "
             f"retransmissions), towards-B variance <= {TARGET_VARIANCE_RATIO} x one's:", "",
             "| variant | split | data class ceiling | min goodput share (of ceiling) | wire share "
             + " / ".join(dirs) + " | min wire share | variance vs one 1 s [10 s] |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        wire = " / ".join(f(r["wire_share"][d]) for d in dirs) if "wire_share" in r else "-"
        lines.append(f"| {name} | {r['split']} | {r['data_ceiling']:g} | {f(r['min_share'])} "
                     f"({f(r['min_share_of_ceiling'], '.2f')}) | {wire} | {f(r.get('min_wire_share'))} | "
                     f"{f(r.get('variance_ratio_vs_one'))} [{f(r.get('variance_ratio_vs_one_slots'))}] |")
    return lines + [""]


def _link_queue_lines(summary: dict) -> list[str]:
    """comparison.md table: per variant and relay-to-relay socket direction, what waited in
    the kernel unsent and the TCP round trip, averaged over the variance window and runs."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for v, extra in summary.get("extra", {}).items():
        for ev in extra.get("evidence", {}).values():
            for q in ev.get("link_queues", []):
                src, peer_ip = q["host"], q["peer"].rsplit(":", 1)[0]
                dst = HOST_BY_ADDR.get(peer_ip, peer_ip)
                end = "accepted" if int(q["local"].rsplit(":", 1)[1]) in (RELAY_PORT, RELAY2_PORT) else "opened"
                rows.setdefault((v, f"{src}->{dst} ({end} by {src})"), []).append(q)
    if not rows:
        return []
    lines = ["Relay sockets in the variance window (`ss` once a second inside each host; "
             "unsent = written by the relay, not yet sent by the kernel), mean over sockets and runs:", "",
             "| variant | socket | unsent mean kB | unsent max kB | TCP RTT mean ms |", "|---|---|---|---|---|"]
    for (v, sock), qs in sorted(rows.items()):
        rtts = [q["rtt_ms_mean"] for q in qs if q.get("rtt_ms_mean") is not None]
        rtt = f"{sum(rtts) / len(rtts):.0f}" if rtts else "-"
        lines.append(f"| {v} | {sock} | {sum(q['notsent_mean'] for q in qs) / len(qs) / 1e3:.0f} | "
                     f"{max(q['notsent_max'] for q in qs) / 1e3:.0f} | {rtt} |")
    return lines + [""]


#: A relay connection counts as carrying bulk above this many bytes (both directions).
BUSY_CONNECTION_BYTES = 10_000_000


def busy_connections(links: list[dict]) -> dict[str, int]:
    """Per host pair (``"A-B"``), how many of its relay connections still open at the end of
    the run carried bulk (:func:`link_bytes` rows; each connection is seen from both ends,
    counted once). With ``SplitDirection = "off"`` this should be 1; 2 means both relays opened
    a connection at once and their circuits were spread over both — part of the traffic then
    ran split. (A dynamic split's second connection may have closed after idling by then.)"""
    seen: dict[tuple[str, frozenset], int] = {}
    for row in links:
        pair = "-".join(sorted((row["host"], row["peer"])))
        conn = frozenset((row["local"], row["remote"]))
        total = int(row.get("bytes_sent", 0)) + int(row.get("bytes_received", 0))
        seen[(pair, conn)] = max(seen.get((pair, conn), 0), total)
    out: dict[str, int] = {}
    for (pair, _conn), total in seen.items():
        out.setdefault(pair, 0)
        if total >= BUSY_CONNECTION_BYTES:
            out[pair] += 1
    return out


#: Busy connections a relay pair should have by design: one channel, with one connection
#: ("off") or one per direction ("always"); "dynamic" may have either.
DESIGNED_CONNECTIONS = {"off": 1, "always": 2}


def extra_channel_pairs(variant: str, ev: dict | None) -> list[str]:
    """Relay pairs (``"B-C"``) that carried bulk on more connections than ``variant`` opens by
    design: both relays had opened a channel to each other at the same moment (in topology
    to-b when a client's preemptive circuit through relayB2 leaves at relayA or relayC while the
    other client's circuits enter there), and circuits stay on the channel they were built on,
    so the pair's traffic ran over two channels, each with its own TCP share."""
    designed = DESIGNED_CONNECTIONS.get(VARIANTS.get(variant, {}).get("split", ""))
    if designed is None or not ev:
        return []
    # Results analysed before `busy_connections` existed still have the per-connection rows.
    busy = ev.get("busy_connections") or busy_connections(ev.get("links", []))
    return sorted(p for p, n in busy.items() if n > designed)


def _extra_channel_lines(summary: dict) -> list[str]:
    """comparison.md: runs in which a relay pair carried bulk on more connections than the
    variant opens (so that run is not a clean instance of its variant)."""
    hits = []
    for v, extra in summary.get("extra", {}).items():
        for run, ev in sorted(extra.get("evidence", {}).items()):
            pairs = extra_channel_pairs(v, ev)
            if pairs:
                hits.append(f"{v} run {run} ({', '.join(pairs)})")
    if not hits:
        return []
    return ["Runs in which a relay pair carried bulk on more connections than the variant opens (two "
            "channels: both relays opened one at once, and circuits stay on the channel they were "
            "built on; the direction with two channels gets two TCP shares): "
            f"{'; '.join(hits)}. `pool --exclude-extra-channels` leaves them out.", ""]


def read_result(result_dir: Path) -> tuple[Params, dict[str, list[dict[str, list[float]]]]]:
    """A finished run's :class:`Params` and per-run series (every 1 s sample of every
    direction and loop, from ``throughput_<variant>.csv``), from a ``chive-lab run`` output
    (files in ``paper002_overlay/``) or a standalone one (files at the top)."""
    p, results, _evidence = read_result_with_evidence(result_dir)
    return p, results


def read_result_with_evidence(result_dir: Path) -> tuple[Params, dict[str, list[dict[str, list[float]]]],
                                                        dict[str, list[dict | None]]]:
    """:func:`read_result` plus each run's evidence from ``summary.json`` (in run order;
    ``None`` for every run of a variant whose evidence does not cover all its runs)."""
    result_dir = Path(result_dir)
    inner = result_dir / "paper002_overlay"
    base = inner if (inner / "summary.json").is_file() else result_dir
    try:
        summary = json.loads((base / "summary.json").read_text())
        raw = summary["params"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LabError(f"{result_dir}: not a paper002-overlay result ({e})") from e
    fields = Params.__dataclass_fields__
    p = Params(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in fields})
    results: dict[str, list[dict[str, list[float]]]] = {}
    for variant in summary.get("variants", {}):
        path = base / f"throughput_{variant}.csv"
        runs: dict[int, dict[str, dict[int, float]]] = {}
        try:
            lines = path.read_text().splitlines()
        except OSError as e:
            raise LabError(f"{result_dir}: {e}") from e
        for line in lines[1:]:
            try:
                run, second, flow, bps = line.split(",")
                runs.setdefault(int(run), {}).setdefault(flow, {})[int(second)] = float(bps)
            except ValueError as e:
                raise LabError(f"{path}: bad row {line!r}") from e
        results[variant] = [{flow: [by_s.get(t, 0.0) for t in range(max(by_s) + 1)]
                             for flow, by_s in runs[r].items()} for r in sorted(runs)]
    evidence: dict[str, list[dict | None]] = {}
    for variant, runs_of in results.items():
        ev = summary.get("extra", {}).get(variant, {}).get("evidence", {})
        # Evidence is keyed by run directory in run order (analyze_raw writes the CSV runs in
        # the same order); only a full set can be matched to the runs.
        evs = list(ev.values()) if isinstance(ev, dict) else []
        evidence[variant] = evs if len(evs) == len(runs_of) else [None] * len(runs_of)
    return p, results, evidence


#: Params that may differ between results pooled together (not the testbed or the traffic).
_POOL_MAY_DIFFER = {"log_level"}


def pool(result_dirs: list[Path], out: Path, *, exclude_extra_channels: bool = False) -> dict:
    """Analyse the runs of several finished results as one batch (same testbed and traffic,
    checked): the paper pooled 100 runs; ours accumulate across sessions. Each run's evidence
    comes along (keyed ``<result>#<n>``); ``exclude_extra_channels`` leaves out runs that
    :func:`extra_channel_pairs` flags (listed in ``pool.json``)."""
    if not result_dirs:
        raise LabError("pool: no results given")
    merged: dict[str, list] = {}
    evidence: dict[str, dict] = {}
    excluded: list[str] = []
    first: Params | None = None
    sources = []
    for d in result_dirs:
        p, results, evs = read_result_with_evidence(d)
        if first is None:
            first = p
        for k in first.__dict__:
            if k not in _POOL_MAY_DIFFER and getattr(p, k) != getattr(first, k):
                raise LabError(f"pool: {d} has {k} = {getattr(p, k)!r}, {result_dirs[0]} has "
                               f"{getattr(first, k)!r}: only runs of one setup can be pooled")
        for v, runs in results.items():
            for i, (run, ev) in enumerate(zip(runs, evs[v]), start=1):
                key = f"{Path(d).name}#{i}"
                if exclude_extra_channels and extra_channel_pairs(v, ev):
                    excluded.append(f"{v} {key}")
                    continue
                merged.setdefault(v, []).append(run)
                if ev is not None:
                    evidence.setdefault(v, {})[key] = ev
        manifest = Path(d) / "manifest.json"
        git = None
        if manifest.is_file():
            try:
                git = json.loads(manifest.read_text()).get("git")
            except ValueError:
                git = None
        sources.append({"dir": str(d), "runs": {v: len(r) for v, r in results.items()}, "git": git})
    assert first is not None
    summary = analyze_raw(merged, first, out, evidence)
    (out / "pool.json").write_text(json.dumps({"sources": sources, "git": p2.git_at_start(),
                                               "pooled_by": "paper002_overlay pool",
                                               "excluded_extra_channels": excluded}, indent=1))
    return summary


def run_evidence(run_dir: Path) -> dict:
    """What the relay logs, client logs and ``ss`` say about one run: split
    channels, the circuits' paths, bytes per relay connection, transfer outcomes."""
    net = run_dir / "net"
    ev: dict = {"went_split": {}, "split_links": {}, "paths": {}, "transfers": {}}
    try:
        tor = json.loads((run_dir / "tor.json").read_text())
    except (OSError, ValueError):
        tor = None
    if isinstance(tor, dict):  # a tor run: circuits from the clients' control ports
        ev["impl"] = "tor"
        ev["paths"] = tor.get("paths", {})
        ev["path_violations"] = tor.get("path_violations", [])
        ev["pinned_paths_ok"] = (not ev["path_violations"] and "error" not in tor
                                 and all(ps for ps in ev["paths"].values()))
        ev["tor_version"] = tor.get("version")
        _link_evidence(run_dir, ev)
        return ev
    for n in ("relayA", "relayB", "relayB2", "relayC"):
        try:
            log = (net / n / "chive.log").read_text(errors="replace")
        except OSError:
            continue
        ev["went_split"][n] = len(re.findall(r"channel went split", log))
        ev["split_links"][n] = len(re.findall(r"relay link up.*split=true", log))
    for c in ("clientA", "clientC"):
        try:
            log = (net / c / "chive.log").read_text(errors="replace")
        except OSError:
            continue
        ev["paths"][c] = sorted(set(re.findall(r"launching circuit.*path=(\S+)", log)))
    # through-b: circuits that can carry the bulk loops end at relayA or relayC, with relayB
    # in the middle. to-b: every circuit is relayA|relayC, relayB2, relayB (EntryNodes,
    # MiddleNodes, .exit).
    paths = [p.split(",") for ps in ev["paths"].values() for p in ps]
    if any("relayB2" in p for p in paths) or (net / "relayB2").is_dir():
        # (Preemptive circuits may leave through another exit; the loops pin relayB.)
        ev["pinned_paths_ok"] = (any(p[-1] == "relayB" for p in paths)
                                 and all(p[1:2] == ["relayB2"] for p in paths)
                                 and all(p[1:] == ["relayB2", "relayB"] for p in paths if p[-1] == "relayB"))
    else:
        pinned = [p for p in paths if p[-1] in ("relayA", "relayC")]
        ev["pinned_paths_ok"] = bool(pinned) and all(p[1:2] == ["relayB"] for p in pinned)
    _link_evidence(run_dir, ev)
    return ev


def _link_evidence(run_dir: Path, ev: dict) -> None:
    """Add the run's relay connections, transfer outcomes and socket queues to ``ev``."""
    try:
        ev["links"] = json.loads((run_dir / "links.json").read_text())
        ev["busy_connections"] = busy_connections(ev["links"])
        ev["transfers"] = json.loads((run_dir / "transfers.json").read_text())
    except (OSError, ValueError):
        pass
    try:
        ev["link_queues"] = json.loads((run_dir / "link_queues.json").read_text())
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------- CLI
def run_all(variants: list[str], runs: int, p: Params, out: Path, *,
            chive_bin: Path | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Run ``runs`` repetitions of each variant (one testbed at a time), then analyse."""
    say = progress or (lambda _m: None)
    git = p2.git_at_start()
    results: dict[str, list] = {v: [] for v in variants}
    evidence: dict[str, dict] = {}
    errors: list[str] = []
    for i in range(runs):
        for v in variants:
            say(f"paper002-overlay: {v} run {i + 1}/{runs}")
            rd = out / "runs" / v / str(i + 1)
            try:
                results[v].append(run_repetition_raw(v, i, rd, p, chive_bin=chive_bin, progress=say))
            except LabError as e:
                errors.append(f"{v} run {i + 1}: {e}")
                say(f"paper002-overlay: {v} run {i + 1} failed: {e}")
                if e.log_tail:
                    say(e.log_tail)
            evidence.setdefault(v, {})[str(i + 1)] = run_evidence(rd)
    manifest = {"kind": KIND_NAME, "variants": variants, "runs": runs,
                "params": {k: (list(x) if isinstance(x, tuple) else x) for k, x in p.__dict__.items()},
                "errors": errors, "host": platform.node(), "kernel": platform.release(),
                "git": git, "started_by": os.getpid(), "finished": time.time()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    summary = analyze_raw({v: r for v, r in results.items() if r}, p, out, evidence)
    if errors:
        summary["errors"] = errors
        (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m chive_lab.experiments.paper002_overlay``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ss-sample"]:  # internal: run inside a host by run_repetition_raw
        sp = argparse.ArgumentParser(prog="paper002_overlay ss-sample")
        sp.add_argument("--port", type=int, required=True)
        sp.add_argument("--stop-at", type=float, required=True)
        sp.add_argument("--out", type=Path, required=True)
        b = sp.parse_args(argv[1:])
        ss_sample(b.port, min(b.stop_at, time.time() + 4 * 3600), b.out)
        return 0
    if argv[:1] == ["link-sample"]:  # internal: run inside a host by run_repetition_raw
        sp = argparse.ArgumentParser(prog="paper002_overlay link-sample")
        sp.add_argument("--ports", required=True, help="comma-separated relay ports")
        sp.add_argument("--stop-at", type=float, required=True)
        sp.add_argument("--out", type=Path, required=True)
        b = sp.parse_args(argv[1:])
        ports = [int(x) for x in b.ports.split(",") if x]
        link_sample(ports, min(b.stop_at, time.time() + 4 * 3600), b.out)
        return 0
    if argv[:1] == ["pool"]:
        sp = argparse.ArgumentParser(prog="python -m chive_lab.experiments.paper002_overlay pool",
                                     description="Analyse the runs of several finished results (chive-lab "
                                                 "run outputs or standalone ones, same setup) as one batch.")
        sp.add_argument("--out", type=Path, required=True, help="output directory for the pooled analysis")
        sp.add_argument("--exclude-extra-channels", action="store_true",
                        help="leave out runs in which a relay pair carried bulk on more connections "
                             "than the variant opens, i.e. on two channels (listed in pool.json)")
        sp.add_argument("results", type=Path, nargs="+", help="result directories to pool")
        b = sp.parse_args(argv[1:])
        try:
            summary = pool(b.results, b.out, exclude_extra_channels=b.exclude_extra_channels)
        except LabError as e:
            print(f"paper002-overlay pool: {e}", file=sys.stderr)
            return 2
        print(json.dumps(summary["targets"], indent=1))
        return 0
    ap = argparse.ArgumentParser(prog="python -m chive_lab.experiments.paper002_overlay",
                                 description="Paper 002 overlay reproduction: chive relays on the netns "
                                             "testbed, and Debian's tor as the baseline (the tor* "
                                             "variants; topology to-b).")
    p2.add_testbed_arguments(ap, VARIANTS, default_runs=3)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per link (delay line)")
    ap.add_argument("--ackprio-hosts", default="A,B,C", help="hosts that get `chive shape` (default all)")
    ap.add_argument("--transfer-bytes", type=int, default=64 * 1024 * 1024,
                    help="size of each verified download/upload (loops run back to back)")
    ap.add_argument("--topology", choices=TOPOLOGIES, default="through-b",
                    help="through-b: every circuit relayA-relayB-relayC (B forwards everything); "
                         "to-b: the data towards B ends at B, as in the paper (see the module doc)")
    ap.add_argument("--circuits", type=int, default=1,
                    help="transfer loops per flow, each on its own circuit (default 1)")
    ap.add_argument("--exit-relays", choices=EXIT_RELAYS, default="all",
                    help="to-b with chive relays: every relay an exit (all, default) or only relayB "
                         "(b: no client circuit makes relayB2 open a channel towards A or C)")
    ap.add_argument("--chive-bin", type=Path, default=None)
    a = ap.parse_args(argv)
    why = netns.available()
    if why:
        print(f"paper002-overlay: {why}", file=sys.stderr)
        return 2
    variants, scale, runs = p2.resolve_testbed_arguments(ap, a, VARIANTS, default_runs=3)
    chosen_tor = [v for v in variants if v in TOR_VARIANTS]
    if chosen_tor and a.topology != "to-b":
        if a.variants != ",".join(VARIANTS):
            ap.error(f"variants {', '.join(chosen_tor)} (tor) need --topology to-b")
        variants = [v for v in variants if v not in TOR_VARIANTS]  # the default list
    try:
        variants = standalone_variants(KIND_NAME, variants, TOR_VARIANTS,
                                       explicit=a.variants != ",".join(VARIANTS),
                                       say=lambda m: print(m, file=sys.stderr, flush=True))
    except LabError as e:
        ap.error(str(e))
    if not 1 <= runs <= 1000:
        ap.error("--runs must be within 1..1000")
    if not 1024 <= a.transfer_bytes <= 10 * 1024**3:
        ap.error("--transfer-bytes must be within 1 KiB..10 GiB")
    if not 1 <= a.circuits <= MAX_CIRCUITS:
        ap.error(f"--circuits must be within 1..{MAX_CIRCUITS}")
    if a.exit_relays != "all" and a.topology != "to-b":
        ap.error("--exit-relays b needs --topology to-b")
    p = Params(rate=a.rate, scale=scale, cc=a.cc, queue_packets=a.queue_packets, queue_at=a.queue_at,
               switch_port_packets=a.switch_port_packets, delay_ms=a.delay_ms, transfer_bytes=a.transfer_bytes, topology=a.topology,
               circuits=a.circuits, exit_relays=a.exit_relays, ackprio_hosts=tuple(h.strip() for h in a.ackprio_hosts.split(",") if h.strip()))
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        summary = run_all(variants, runs, p, a.out, chive_bin=a.chive_bin, progress=say)
    except KeyboardInterrupt:
        say("paper002-overlay: interrupted; testbeds removed")
        return 130
    print(json.dumps({"variants": {v: {d: {k: x[k] for k in ("goodput_bps", "share_of_link", "variance")}
                                       for d, x in ds.items()} for v, ds in summary["variants"].items()},
                      "targets": summary["targets"]}, indent=1))
    return 1 if summary.get("errors") else 0


# ------------------------------------------------- `chive-lab run` adapter
# chive_lab.runner.KINDS maps kind "paper002-overlay" to this module: parse_options()
# on the scenario's own keys, run_repetition(ctx) per variant and repetition,
# analyze(out_dir, scenario) once at the end.

_OPTION_KEYS = {"rate", "scale", "cc", "queue_packets", "queue_at", "ackprio_hosts", "delay_ms",
                "transfer_bytes", "log_level", "topology", "circuits", "switch_port_packets", "exit_relays"}


def parse_options(raw: dict) -> Params:
    """The scenario's keys as :class:`Params`; LabError for unknown or bad ones."""
    unknown = sorted(set(raw) - _OPTION_KEYS)
    if unknown:
        raise LabError(f"unknown key {unknown[0]} (kind {KIND_NAME!r} takes {', '.join(sorted(_OPTION_KEYS))})")
    base = p2.parse_options({k: raw[k] for k in raw if k in p2._OPTION_KEYS})
    p = Params(rate=base.rate, scale=base.scale, cc=base.cc, queue_packets=base.queue_packets,
               queue_at=base.queue_at, switch_port_packets=base.switch_port_packets)
    if "ackprio_hosts" in raw:
        p.ackprio_hosts = base.ackprio_hosts
    if "delay_ms" in raw:
        d = raw["delay_ms"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1000:
            raise LabError(f"delay_ms must be a number within 0..1000, got {d!r}")
        p.delay_ms = float(d)
    if "transfer_bytes" in raw:
        b = raw["transfer_bytes"]
        if isinstance(b, bool) or not isinstance(b, int) or not 1024 <= b <= 10 * 1024**3:
            raise LabError(f"transfer_bytes must be an integer within 1024..10 GiB, got {b!r}")
        p.transfer_bytes = b
    if "log_level" in raw:
        if not isinstance(raw["log_level"], str) or not re.fullmatch(r"[a-z_=,:]{1,64}", raw["log_level"]):
            raise LabError("log_level must be a tracing filter such as \"info\"")
        p.log_level = raw["log_level"]
    if "circuits" in raw:
        c = raw["circuits"]
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_CIRCUITS:
            raise LabError(f"circuits must be an integer within 1..{MAX_CIRCUITS}, got {c!r}")
        p.circuits = c
    if "exit_relays" in raw:
        if raw["exit_relays"] not in EXIT_RELAYS:
            raise LabError(f"exit_relays must be one of {', '.join(EXIT_RELAYS)}, got {raw['exit_relays']!r}")
        p.exit_relays = raw["exit_relays"]
    if "topology" in raw:
        if raw["topology"] not in TOPOLOGIES:
            raise LabError(f"topology must be one of {', '.join(TOPOLOGIES)}, got {raw['topology']!r}")
        p.topology = raw["topology"]
    if p.exit_relays != "all" and p.topology != "to-b":
        raise LabError("exit_relays = \"b\" needs topology = \"to-b\" (through-b exits at relayA and relayC)")
    return p


def preflight(scenario) -> None:
    """``chive-lab run``: refuse tor variants without tor or outside topology ``to-b``."""
    chosen = [v.label for v in scenario.variants]
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    if p.topology != "to-b" and any(v in TOR_VARIANTS for v in chosen):
        raise LabError(f"{KIND_NAME}: tor variants need topology = \"to-b\" (through-b fixes paths with "
                       "chive's Guard flags)")
    check_tor_variants(KIND_NAME, chosen, TOR_VARIANTS)


def run_repetition(ctx) -> None:
    """``chive-lab run`` entry: one repetition of ``ctx.variant`` into ``ctx.run_dir``."""
    why = netns.available()
    if why:
        raise LabError(f"paper002-overlay needs the netns backend: {why}")
    p = ctx.scenario.options if isinstance(ctx.scenario.options, Params) else Params()
    name = ctx.variant.label
    if name not in VARIANTS:
        raise LabError(f"variant {name!r}: paper002-overlay variants are {', '.join(VARIANTS)}")
    ctx.status(f"{name}: {p.t(C_STOP):g} s of bulk transfers through relays A, B, C")
    run_dir = Path(ctx.run_dir)
    series = run_repetition_raw(name, ctx.rep, run_dir, p, chive_bin=ctx.binary, progress=ctx.log)
    (run_dir / "flows.json").write_text(json.dumps(series))
    (run_dir / "evidence.json").write_text(json.dumps(run_evidence(run_dir), indent=1))


def analyze(out_dir, scenario=None):
    """``chive-lab analyze`` entry: read ``runs/<variant>/<rep>/flows.json``, write
    this kind's figures and CSVs into ``out_dir/paper002_overlay`` and return an
    :class:`chive_lab.analysis.Analysis` whose summary is schema 1."""
    from .. import analysis as an

    out_dir = Path(out_dir)
    p = scenario.options if scenario is not None and isinstance(scenario.options, Params) else Params()
    dirs = p2.repetition_dirs(out_dir, VARIANTS, scenario)
    results = {v: [json.loads((d / "flows.json").read_text()) for d in reps] for v, reps in dirs.items()}
    evidence = {v: {d.name: json.loads((d / "evidence.json").read_text())
                    for d in reps if (d / "evidence.json").is_file()}
                for v, reps in dirs.items()}
    summary = analyze_raw(results, p, out_dir / "paper002_overlay", evidence)
    rows = []
    for v, ds in summary["variants"].items():
        for d, x in ds.items():
            rows.append([v, d, round(x["goodput_bps"] / 1e6, 2), round(x["share_of_link"], 3),
                         round(x["variance"] / 64e6) if x["variance"] == x["variance"] else None,
                         PAPER[v] if d == "A->B" else ""])
    table = an.Table(title="Paper 002, overlay: goodput per direction while both clients run",
                     columns=["variant", "direction", "Mbit/s", "share of link", "variance (kB/s)^2", "paper"],
                     rows=rows, note=PAPER_VARIANCE)
    notes = ["This kind's own figures: paper002_overlay/throughput_<variant>.png, "
             "paper002_overlay/variance.png, CSV beside each, and paper002_overlay/comparison.md.",
             f"Targets: {json.dumps(summary['targets'])}"]
    figures = []
    slot = SLOT * p.scale
    for v, runs in results.items():
        if not runs:
            continue
        end = len(runs[0][DIRECTIONS[0]])
        series = p2.slot_series(runs, directions(p), slot, end)
        figures.append(an.Figure(name=f"paper002_overlay_throughput_{v}",
                                 title=f"overlay {v}: throughput per direction (cf. paper Fig {VARIANTS[v]['fig']})",
                                 xlabel="time [s]", ylabel="throughput [kB/s]", series=series,
                                 note=f"mean over {len(runs)} run(s) in {slot:g} s slots; band: 90% CI"))
    var = [(v, summary["extra"][v]["towards_b_variance"]) for v in summary["variants"]]
    figures.append(an.Figure(name="paper002_overlay_variance",
                             title="variance of 1 s throughput towards B (cf. Fig 9)",
                             xlabel="variant #", ylabel="variance [(kB/s)^2]",
                             series=[an.Series(label="towards B", x=list(range(len(var))),
                                               y=[(x / 64e6) if x == x else 0.0 for _, x in var],
                                               style="points")],
                             xticks=[(float(i), v) for i, (v, _) in enumerate(var)]))
    return an.Analysis(summary=summary, figures=figures, tables=[table], notes=notes)

class _Kind(ExperimentKind):
    name = 'paper002-overlay'

    def parse_options(self, raw):
        return parse_options(raw)

    def run_repetition(self, ctx):
        run_repetition(ctx)

    def analyze(self, out_dir, scenario):
        return analyze(out_dir, scenario)

    def preflight(self, scenario):
        preflight(scenario)

    def pool(self, sources, out, **options):
        return pool(sources, out, **options)


KIND = _Kind()


if __name__ == "__main__":
    sys.exit(main())
