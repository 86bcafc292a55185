"""Tor's side of a run in the summary and report: the relay options and
consensus parameters of tor variants that have no Tor equivalent, and Tor's
own metrics (circuit build times, circuits, bytes per relay) as collected by
:func:`chive_lab.rundir.collect_tor_step`. Added by the runner to every
kind's summary when a variant ran on tor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .analysis import Table, discover_runs
from .analysis import fmt as _fmt

__all__ = ["tor_metrics_rows", "tor_section", "tor_unmapped"]



def _variant_impl(scenario: Any, variant: Any) -> str:
    return getattr(variant, "impl", None) or getattr(scenario, "impl", "chive")


def _base_network(scenario: Any) -> Any:
    """The scenario's [network] (a non-overlay kind may keep its own in ``options.network``)."""
    opts = getattr(scenario, "options", None)
    net = getattr(opts, "network", None)
    return net if net is not None else getattr(scenario, "network", None)


def tor_unmapped(scenario: Any) -> list[dict[str, Any]]:
    """Every relay option / consensus parameter of a tor variant that Tor lacks:
    ``{"key", "value", "kind", "reason", "variants": [labels]}`` (one entry per
    key, kind and value; tor.unmapped_options gives the reason)."""
    from .tor import unmapped_options

    net = _base_network(scenario)
    found: dict[tuple[str, str, str], dict[str, Any]] = {}
    for v in getattr(scenario, "variants", ()):
        if _variant_impl(scenario, v) != "tor":
            continue
        relay = dict(getattr(net, "relay", {}) or {})
        relay.update(v.relay)
        params = dict(getattr(net, "params", {}) or {})
        params.update(v.params)
        try:
            items = unmapped_options(relay, params, client_overrides=getattr(net, "client", {}) or {})
        except Exception as e:  # a bad option: the run itself reports it; say so here too
            items = [{"key": "?", "value": None, "kind": "error", "reason": f"cannot map: {e}"}]
        for u in items:
            key = (str(u.get("key")), str(u.get("kind")), json.dumps(u.get("value"), default=str))
            entry = found.setdefault(key, {**u, "variants": []})
            entry["variants"].append(v.label)
    return list(found.values())


def _load_json(path: Path, limit: int = 16 << 20) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(limit))
    except (OSError, ValueError):
        return None


def tor_metrics_rows(snapshot: Any) -> dict[str, Any]:
    """The numbers the report shows from one ``{before_stop, after_stop}`` pair of
    ``collect_tor_metrics`` results: circuit-build-time histogram (complete
    after the stop), the client's circuits, and bytes written per relay (the
    live values of the last collection while it ran)."""
    out: dict[str, Any] = {"cbt_count": None, "cbt_median_ms": None, "cbt_mean_ms": None,
                           "cbt_abandoned": None, "client_circuits": None, "relay_written_bytes": {},
                           "relay_read_bytes": {}, "errors": []}
    if not isinstance(snapshot, dict):
        return out
    for when in ("before_stop", "after_stop"):
        snap = snapshot.get(when)
        if not isinstance(snap, dict):
            continue
        if "error" in snap:
            out["errors"].append(f"{when}: {snap['error']}")
            continue
        cbt = snap.get("circuit_build_times")
        if isinstance(cbt, dict) and cbt.get("count") is not None:
            out["cbt_count"] = cbt.get("count")
            out["cbt_median_ms"] = cbt.get("median_ms")
            out["cbt_mean_ms"] = cbt.get("mean_ms")
            out["cbt_abandoned"] = cbt.get("abandoned")
        nodes = snap.get("nodes")
        if not isinstance(nodes, dict):
            continue
        for name, node in nodes.items():
            if not isinstance(node, dict):
                continue
            live = node.get("live") if isinstance(node.get("live"), dict) else {}
            if node.get("role") == "relay":
                if isinstance(live.get("traffic_written_bytes"), int):
                    out["relay_written_bytes"][name] = live["traffic_written_bytes"]
                if isinstance(live.get("traffic_read_bytes"), int):
                    out["relay_read_bytes"][name] = live["traffic_read_bytes"]
            elif node.get("role") == "client" and isinstance(live.get("circuits"), list):
                out["client_circuits"] = len(live["circuits"])
    return out


def tor_section(out_dir: Path, scenario: Any) -> tuple[dict[str, Any] | None, list[Table]]:
    """The ``tor`` part of summary.json and its report tables, or (None, [])
    when no variant ran on tor. Reads ``runs/<variant>/<rep>/tor-metrics.json``
    (written by :func:`chive_lab.rundir.collect_tor_step`, one entry per network
    phase)."""
    tor_variants = [v for v in getattr(scenario, "variants", ()) if _variant_impl(scenario, v) == "tor"]
    if not tor_variants:
        return None, []
    unmapped = tor_unmapped(scenario)
    metrics: dict[str, list[dict[str, Any]]] = {}
    rows = []
    for v in tor_variants:
        for rep, path in discover_runs(Path(out_dir), [v.label]).get(v.label, []):
            doc = _load_json(path / "tor-metrics.json")
            if not isinstance(doc, dict):
                continue
            for phase, snapshot in doc.items():
                m = tor_metrics_rows(snapshot)
                m.update(rep=rep, phase=str(phase))
                metrics.setdefault(v.label, []).append(m)
                written = m["relay_written_bytes"]
                rows.append([v.label, rep, phase, _fmt(m["cbt_count"]), _fmt(m["cbt_median_ms"]),
                             _fmt(m["cbt_mean_ms"], 1), _fmt(m["cbt_abandoned"]), _fmt(m["client_circuits"]),
                             len(written), f"{sum(written.values()) / 1e6:.1f}" if written else "-",
                             "; ".join(m["errors"]) or ""])
    part = {"unmapped": unmapped, "metrics": metrics}
    tables = [Table(
        title="Relay options and parameters with no Tor equivalent",
        columns=["key", "value", "kind", "variants", "Tor"],
        rows=[[u.get("key"), json.dumps(u.get("value"), default=str), u.get("kind"),
               ", ".join(u.get("variants", [])), f"no Tor equivalent: {u.get('reason')}"] for u in unmapped]
        or [["-", "", "", "", "every option of the scenario has a Tor equivalent"]],
        note="From chive_lab.tor.unmapped_options: these options were applied to the chive relays only.",
    ), Table(
        title="Tor's own view (control port, MetricsPort, client state file)",
        columns=["variant", "rep", "network", "circuits built (CBT)", "CBT median ms", "CBT mean ms",
                 "abandoned", "client circuits", "relays", "relay MB written", "collection errors"],
        rows=rows or [["-", "", "", "", "", "", "", "", "", "", "no tor-metrics.json found"]],
        note="Circuit build times: the client's CircuitBuildTimeBin histogram (10 ms bins) written when it "
             "stopped; relay MB written: traffic/written of every relay's control port at the last collection "
             "before the stop (raw: runs/<variant>/<rep>/tor-metrics.json and net*/<node>/tor-metrics.json).",
    )]
    return part, tables
