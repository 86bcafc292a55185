"""The ``paper002-overlay`` testbed: hosts A, B, C (shaped) and X (the
authority), where each topology places its relays, clients and web servers,
one repetition run end to end, and the per-second series collected from its
perf loops and ``ss`` samples."""

from __future__ import annotations

import ipaddress
import json
import math
import re
import time
from pathlib import Path
from typing import Callable

from ... import netns
from ...errors import LabError
from .. import netns_overlay as no
from .options import (
    DIRECTIONS,
    VAR_WINDOW,
    Flow,
    Params,
    VariantOptions,
    directions,
    flows,
    loop_stems,
    params_dict,
)

RELAY_PORT, SOCKS_PORT, HTTP_PORT, DIR_PORT = 9001, 9050, 8080, 7000
#: The shaped hosts, in the order the testbed is built (then the authority's host X); the
#: testbed hands out its subnet's addresses in that order.
SHAPED_HOSTS = ("A", "B", "C")
HOST_BY_ADDR = dict(zip((str(a) for a in ipaddress.ip_network(netns.DEFAULT_SUBNET).hosts()),
                        SHAPED_HOSTS + ("X",)))
#: ``to-b``: relayB2's ORPort, and the port of httpdBC (httpdBA uses HTTP_PORT).
RELAY2_PORT, HTTP2_PORT = 9002, 8081
#: relayB advertises this (bytes/s, far above 10 Mbit/s so it never throttles) while
#: relayA/relayC advertise the relay's "unlimited" 100 MB/s: the median makes only A, C Guards.
B_BANDWIDTH = 50_000_000


def _relay_overrides(host: str, base: dict) -> dict:
    o = dict(base)
    if host == "B":
        # Lower advertised bandwidth => no Guard flag. BandwidthRate also sets a larger
        # OutbufCells (and, in binaries before session 15, constrained sockets); pin both to the
        # unlimited relays' values. Its rate's LinkUnsentLimit default is the cap, 64 KiB, as theirs.
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


def run_repetition_raw(variant: str, v: VariantOptions, rep: int, out_dir: Path, p: Params, *,
                       chive_bin: Path | None = None,
                       progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Run one repetition of ``variant`` (declared as ``v``); return ``{series: [bit/s per
    second]}`` (directions and loops) and keep the raw records, logs and link statistics in
    ``out_dir``."""
    impl = v.impl
    if impl == "tor" and p.topology != "to-b":
        raise LabError(f"variant {variant} (tor) needs topology to-b")
    say = progress or (lambda _m: None)
    link = netns.LinkSpec(p.rate, delay_ms=p.delay_ms, queue_packets=p.queue_packets, queue_at=p.queue_at,
                          switch_port_packets=p.switch_port_packets)
    # A variant may set the hosts' congestion control itself ("host_cc"): Tor cannot choose it
    # per socket, and in topology to-b every connection between hosts is a relay link.
    host_cc = v.host_cc if v.host_cc is not None else p.cc
    hosts = [netns.HostSpec(n, link, cc=host_cc) for n in SHAPED_HOSTS]
    hosts.append(netns.HostSpec("X", netns.LinkSpec(None), cc=host_cc))  # the authority, unshaped
    fl = flows(p)
    end = max(f.stop for f in fl)
    tb = netns.Testbed(hosts, chive_bin=chive_bin, progress=say, widen_allowed_cc=True)
    t0 = 0.0
    with no.netns_repetition(out_dir, tb, impl, chive_bin=chive_bin, log_level=p.log_level,
                             progress=say) as run:
        cc = {h.name: h.cc_effective for h in tb.hosts.values()}
        shape_cmds: list[str] = []
        if v.ackprio:
            for h in p.ackprio_hosts:
                shape_cmds = tb.set_ack_priority(h, bulk_ceil=v.shape.bulk_ceil)
        (out_dir / "shape.txt").write_text("\n".join(shape_cmds) + "\n")
        ov = run.ov
        ov.add_authority("X", port=DIR_PORT, all_guards=False)
        httpds = _place_nodes(ov, p, v.split, dict(v.relay), impl)
        ov.start(timeout=60)
        perf = []
        t0 = time.time() + 0.5
        samplers = []
        for name, (h, port) in httpds.items():  # uploads are counted where they arrive
            samplers.append(no.start_sampler(tb, h, ["ss-sample", "--port", str(port)], t0 + end + 5,
                                             out_dir / f"rx-{name}.jsonl"))
        for h in SHAPED_HOSTS:  # relay sockets' unsent bytes and RTT, once a second
            samplers.append(no.start_sampler(tb, h, ["link-sample", "--ports", f"{RELAY_PORT},{RELAY2_PORT}"],
                                             t0 + end + 5, out_dir / f"links-{h}.jsonl"))
        for f in fl:
            url = ov.url(f.httpd, "/upload" if f.upload else f"/bytes/{p.transfer_bytes}",
                         exit=f"relay{f.server}")
            for user in loop_stems(f, p.circuits):
                perf.append(no.start_perf_loop(tb, ov, f"client{f.client}", url, (t0 + f.start, t0 + f.stop),
                                               end, user, f.name, p.transfer_bytes if f.upload else None,
                                               out_dir / f"perf-{user}"))
        run.write_run({"t0": t0, "variant": variant, "rep": rep, "cc": cc, "params": params_dict(p),
                       "impl": impl})
        say(f"paper002-overlay: {variant}: {end:g} s of bulk transfers")
        no.wait_for_loops(perf, samplers, t0 + end)
        links = {h: tb.sh(h, ["ss", "-tinH"], check=False).stdout for h in ("A", "B", "C")}
        (out_dir / "ss.txt").write_text("\n".join(f"## {h}\n{t}" for h, t in links.items()))
        (out_dir / "links.json").write_text(json.dumps(link_bytes(links, tb), indent=1))
        (out_dir / "link_queues.json").write_text(json.dumps(
            no.link_queues(out_dir, t0, (p.t(VAR_WINDOW[0]), p.t(VAR_WINDOW[1]))), indent=1))
        for h in ("A", "B", "C"):
            (out_dir / f"qdisc-{h}.txt").write_text(tb.qdisc_stats(h) + tb.qdisc_stats("sw", f"v{h}")
                                                    + tb.qdisc_stats("sw", f"v{h}d"))
    return collect_flows(out_dir, fl, t0, math.ceil(end), directions(p), p.circuits)


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


def collect_flows(out_dir: Path, fl: list[Flow], t0: float, seconds: int,
                  dirs: tuple[str, ...] = DIRECTIONS, circuits: int = 1) -> dict[str, list[float]]:
    """Per direction (``A->B``, ``C->B`` …) and per flow (``A:down`` …, the sum of its
    ``circuits`` loops): bit/s per second."""
    out: dict[str, list[float]] = {d: [0.0] * seconds for d in dirs}
    outcomes = {}
    for f in fl:
        s, counts = [0.0] * seconds, {}
        for stem in loop_stems(f, circuits):
            ls, lc = no.perf_series(out_dir / f"perf-{stem}.jsonl", t0, seconds)
            s = [a + b for a, b in zip(s, ls)]
            for k, v in lc.items():
                counts[k] = counts.get(k, 0 if not isinstance(v, list) else []) + v
        if f.upload:  # perf counts what it wrote into the local SOCKS socket: use the receiver
            counts["sender_side_series_bps"] = s
            s = no.rx_series(out_dir / f"rx-{f.httpd}.jsonl", t0, seconds)
        out[f.name] = s
        out[f.direction] = [a + b for a, b in zip(out[f.direction], s)]
        outcomes[f.name] = counts
    (out_dir / "transfers.json").write_text(json.dumps(outcomes, indent=1))
    return out
