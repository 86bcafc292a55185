"""Tor's own view of a lab network, and the parsers for what Tor says: the MetricsPort
page (Prometheus text), ``GETINFO circuit-status``, the circuit-build-time histogram in a
client's ``state`` file, and which relays a consensus lists as usable at every hop.

:func:`collect_tor_metrics` reads it all for a loopback network (``DIR/state.json``); the
netns overlay (:mod:`chive_lab.tor_netns`) uses the parsers from inside its hosts.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from ..errors import LabError
from ..process import is_running
from ..state import load_state
from .control import control_for
from .node import METRICS_FILE

__all__ = ["collect_tor_metrics", "consensus_relays", "fetch_metrics", "parse_cbt_state",
           "parse_circuit_status", "parse_prometheus"]

# Bounds on what the lab reads from Tor (metrics pages, a client's state file).
MAX_METRICS_BYTES = 8 << 20
MAX_STATE_FILE = 4 << 20


def parse_prometheus(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def fetch_metrics(port: int) -> str:
    """The MetricsPort page (Prometheus text). Tor answers HTTP/1.0 with a
    Content-Length but may keep the connection open, so read by length."""
    from ..socks import http_get

    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as sock:
        resp = http_get(sock, "127.0.0.1", port, "/metrics", max_body=MAX_METRICS_BYTES)
    if resp.status != 200:
        raise LabError(f"MetricsPort {port} answered HTTP {resp.status} {resp.reason}")
    return resp.body.decode("utf-8", "replace")


# The MetricsPort samples kept in tor-metrics.json (the full page is in metrics.prom).
_METRIC_KEEP = ("traffic", "circuits_total", "congestion_control", "flow_control", "cell_total", "oom")


def parse_cbt_state(text: str) -> dict[str, Any]:
    """The circuit-build-time histogram Tor keeps in its ``state`` file
    (``CircuitBuildTimeBin MS COUNT`` lines; 10 ms bins) with its count,
    median and mean (from bin midpoints)."""
    bins: dict[int, int] = {}
    abandoned = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "CircuitBuildTimeBin":
            try:
                ms, n = int(parts[1]), int(parts[2])
            except ValueError:
                continue
            if ms >= 0 and n > 0:
                bins[ms] = bins.get(ms, 0) + n
        elif len(parts) == 2 and parts[0] == "CircuitBuildAbandonedCount":
            try:
                abandoned = int(parts[1])
            except ValueError:
                pass
    count = sum(bins.values())
    result: dict[str, Any] = {"bins_ms": {str(k): bins[k] for k in sorted(bins)}, "count": count,
                              "abandoned": abandoned, "median_ms": None, "mean_ms": None}
    if count:
        result["mean_ms"] = sum(k * n for k, n in bins.items()) / count
        half, seen = (count + 1) / 2, 0
        for k in sorted(bins):
            seen += bins[k]
            if seen >= half:
                result["median_ms"] = k
                break
    return result


def parse_circuit_status(text: str) -> list[dict[str, Any]]:
    """The circuits of a ``GETINFO circuit-status`` reply: ``id``, ``status``, ``path`` (relay
    nicknames) and every ``KEY=value`` field, lower-cased (``purpose``, ``socks_username`` …)."""
    circs = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        circ: dict[str, Any] = {"id": int(parts[0]), "status": parts[1], "path": []}
        for p in parts[2:]:
            if "=" in p:
                k, _, v = p.partition("=")
                circ[k.lower()] = v
            elif p.startswith("$"):
                circ["path"] = [hop.split("~")[-1] for hop in p.split(",")]
        circs.append(circ)
    return circs


def collect_tor_metrics(dir: Path | str) -> dict[str, Any]:
    """Tor's own view of a tor network, written to ``DIR/<node>/tor-metrics.json``
    and returned as ``{"impl": "tor", "version", "nodes": {name: {...}},
    "circuit_build_times": {...}}``.

    While a node runs: the control port's ``traffic/read`` / ``traffic/written``
    (bytes since start) and ``uptime``; for relays the MetricsPort page (kept
    raw in ``DIR/<node>/metrics.prom``, plus its traffic counters); for the
    client ``circuit-status`` (each circuit's state, purpose, path). Always:
    the client's circuit-build-time histogram from its ``state`` file, which
    Tor writes when it exits, so call this once more after ``down`` for the
    complete histogram. Live values of a node that has stopped are kept from
    the previous call. A directory without a tor network raises LabError.
    """
    dir = Path(dir)
    state = load_state(dir)
    tor_info = state.endpoints.get("tor")
    if not isinstance(tor_info, dict) or not isinstance(tor_info.get("nodes"), list):
        raise LabError(f"{dir} holds no tor network (state.json has no tor nodes)")
    running = {rec.name: rec for rec in state.nodes if is_running(rec.pid)}
    result: dict[str, Any] = {"impl": "tor", "version": tor_info.get("version"), "nodes": {},
                              "circuit_build_times": None, "collected_at": time.time()}
    for node in tor_info["nodes"]:
        if not isinstance(node, dict) or "name" not in node or "dir" not in node:
            continue
        name = str(node["name"])
        node_dir = Path(str(node["dir"]))
        out_path = node_dir / METRICS_FILE
        previous: dict[str, Any] = {}
        try:
            with open(out_path, "rb") as f:
                loaded = json.loads(f.read(MAX_METRICS_BYTES))
            if isinstance(loaded, dict):
                previous = loaded
        except (OSError, ValueError):
            pass
        entry: dict[str, Any] = {"role": node.get("role"), "running": name in running}
        live: dict[str, Any] = {}
        if name in running:
            try:
                with control_for(node) as ctl:
                    info = ctl.getinfo("traffic/read", "traffic/written", "uptime")
                    live["traffic_read_bytes"] = int(info.get("traffic/read", "0"))
                    live["traffic_written_bytes"] = int(info.get("traffic/written", "0"))
                    live["uptime_s"] = int(info.get("uptime", "0"))
                    if node.get("role") == "client":
                        status = ctl.getinfo("circuit-status").get("circuit-status", "")
                        live["circuits"] = parse_circuit_status(status)
                        (node_dir / "circuit-status.txt").write_text(status + "\n", encoding="utf-8")
            except (OSError, LabError, ValueError) as e:
                live["control_error"] = str(e)
            if node.get("metrics_port"):
                try:
                    page = fetch_metrics(int(node["metrics_port"]))
                    (node_dir / "metrics.prom").write_text(page, encoding="utf-8")
                    samples = parse_prometheus(page)
                    live["metrics"] = {k: v for k, v in samples.items() if any(w in k for w in _METRIC_KEEP)}
                except (OSError, LabError) as e:
                    live["metrics_error"] = str(e)
            live["live_at"] = time.time()
        else:
            live = previous.get("live") or {}
        entry["live"] = live
        if node.get("role") == "client":
            try:
                with open(node_dir / "state", "rb") as f:
                    cbt = parse_cbt_state(f.read(MAX_STATE_FILE).decode("utf-8", "replace"))
                entry["circuit_build_times"] = cbt
                result["circuit_build_times"] = cbt
            except OSError:
                entry["circuit_build_times"] = None
        result["nodes"][name] = entry
        try:
            out_path.write_text(json.dumps(entry, indent=2) + "\n", encoding="utf-8")
        except OSError:
            pass
    return result


#: Flags a relay needs to take any position of a pinned path: Exit for the last hop, and for
#: the first what tor's ``node_is_possible_guard`` asks of a guard (EntryNodes are guards).
PATH_FLAGS = frozenset({"Running", "Valid", "Exit", "Guard", "Stable", "Fast", "V2Dir"})


def consensus_relays(text: str) -> set[str]:
    """Nicknames of the ``r`` lines of a network-status document whose ``s`` line (the
    next one) carries every flag of :data:`PATH_FLAGS`: relays a client can use at any hop."""
    running = set()
    current = None
    for line in text.splitlines():
        if line.startswith("r "):
            parts = line.split()
            current = parts[1] if len(parts) > 1 else None
        elif line.startswith("s ") and current is not None:
            if PATH_FLAGS <= set(line.split()):
                running.add(current)
            current = None
    return running
