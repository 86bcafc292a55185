"""What a ``paper002-overlay`` run's logs and sockets say about it: whether the
channels split, which paths the circuits took, how many relay connections
carried bulk (a run with a second channel per relay pair is not a clean
instance of its variant), and the comparison.md tables made from that."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

from .options import VariantOptions
from .targets import declared_variants
from .testbed import HOST_BY_ADDR, RELAY2_PORT, RELAY_PORT


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


def extra_channel_pairs(variant: str, ev: dict | None,
                        variants: Mapping[str, VariantOptions] | None = None) -> list[str]:
    """Relay pairs (``"B-C"``) that carried bulk on more connections than ``variant`` opens by
    design: both relays had opened a channel to each other at the same moment (in topology
    to-b when a client's preemptive circuit through relayB2 leaves at relayA or relayC while the
    other client's circuits enter there), and circuits stay on the channel they were built on,
    so the pair's traffic ran over two channels, each with its own TCP share. ``variants``:
    the declarations (default: the shipped scenarios')."""
    declared = (variants if variants is not None else declared_variants()).get(variant)
    designed = DESIGNED_CONNECTIONS.get(declared.split if declared is not None else "")
    if designed is None or not ev:
        return []
    # Results analysed before `busy_connections` existed still have the per-connection rows.
    busy = ev.get("busy_connections") or busy_connections(ev.get("links", []))
    return sorted(p for p, n in busy.items() if n > designed)


def extra_channel_lines(summary: dict, variants: Mapping[str, VariantOptions]) -> list[str]:
    """comparison.md: runs in which a relay pair carried bulk on more connections than the
    variant opens (so that run is not a clean instance of its variant)."""
    hits = []
    for v, extra in summary.get("extra", {}).items():
        for run, ev in sorted(extra.get("evidence", {}).items()):
            pairs = extra_channel_pairs(v, ev, variants)
            if pairs:
                hits.append(f"{v} run {run} ({', '.join(pairs)})")
    if not hits:
        return []
    return ["Runs in which a relay pair carried bulk on more connections than the variant opens (two "
            "channels: both relays opened one at once, and circuits stay on the channel they were "
            "built on; the direction with two channels gets two TCP shares): "
            f"{'; '.join(hits)}. `pool --exclude-extra-channels` leaves them out.", ""]


def link_queue_lines(summary: dict) -> list[str]:
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
