"""Analysis of the ``paper003-switching`` kind: per variant the uploads (throughput, SHA-256
checked by ``chive perf --verify``), the latency probes during the uploads, the switches the
chive relays recorded (``switch`` records; cells lost and re-sent from their Prometheus
counters) and each relay's forwarding rate before and after every switch; figures with their
CSVs (Fig 4 switch-time CDF per (α, β), Fig 6 capacity change, Fig 7 throughput CDF, Fig 8
latency CDF, drop rate), Table 2 with the paper's numbers beside ours, the issue's targets and
``paper003/comparison.md``. Summary keys: docs/summary-schema.md, section ``paper003-switching``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ... import analysis as an
from ... import stats
from ...pooling import rep_dirs
from ...rundir import is_failed
from . import CLIENT_HOSTS, KIND_NAME, RELAYS, UPLOAD_USER, Params

#: A cell on the wire (the unit of the relays' cell counters).
CELL_BYTES = 514
#: The paper's numbers (Sec. 5.3, Table 2, Figs 4-5) and the issue's summary of them.
PAPER = {
    "throughput_Bps_p50": {"multiplexed": 134_000.0, "switching": 264_000.0},
    "latency_s_p50": {"multiplexed": 2.65, "switching": 1.68},
    "switch_time_s_p50": 1.0,
    "drop_rate": {"switching": 0.0009},
    "fig4_switch_time_s_p50": {(0.05, 0.1): 1.0, (0.1, 0.5): 1.0, (0.3, 0.75): 2.15, (0.5, 0.9): 3.0},
}
#: Target declaration defaults (scenario key ``targets``).
DEFAULT_TARGETS = {"switching": "connection", "baseline": "multiplexed", "conflux": "tor-conflux",
                   "bytes_lost_max": 0, "switch_time_p50_max_s": 0.05, "throughput_ratio_min": 1.9,
                   "latency_reduction_min": 0.37}


# ------------------------------------------------------------------ reading
def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text: metric name -> value summed over its label sets (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            continue
        name = parts[0].split("{", 1)[0].strip()
        try:
            value = float(parts[1])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def _records(path: Path, kind: str) -> list[dict[str, Any]]:
    return [o for o in an.read_jsonl(path) if isinstance(o, dict) and o.get("type") == kind] if path.is_file() else []


def conflux_legs(path: Path, user: str) -> list[str]:
    """From a tor client's ``GETINFO circuit-status`` text: the paths (``entry,middle,exit``) of
    every circuit in the conflux set of ``user``'s circuit (tor names the SOCKS user on one leg
    only); empty when the file is missing or the user's circuit is not a conflux leg."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] != "BUILT":
            continue
        kv = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
        hops = ",".join(h.split("~", 1)[-1] for h in parts[2].split(","))
        rows.append((hops, kv.get("CONFLUX_ID"), kv.get("SOCKS_USERNAME", "").strip('"')))
    ids = {cid for _h, cid, u in rows if u == user and cid}
    return sorted({h for h, cid, _u in rows if cid in ids})


def load_run(run_dir: Path) -> dict[str, Any]:
    """One repetition's measurements: uploads (per client: ok, bytes, seconds, throughput,
    error), latency samples (s) during the uploads, switch records (relays' and, for path
    switching, clients'), per relay the per-second
    forwarding rate and the switching counters."""
    info = json.loads((run_dir / "run.json").read_text())
    t0 = float(info["t0"])
    end = float(info.get("uploads_done") or math.inf)
    uploads: dict[str, dict[str, Any]] = {}
    last: list[float] = []
    for h in CLIENT_HOSTS:
        recs = [r for o in an.read_jsonl(run_dir / f"upload-{h}.jsonl")
                if isinstance(r := an.parse_record(o, "upload", h), an.Transfer)]
        if not recs:
            err = (run_dir / f"upload-{h}.err")
            text = err.read_text(errors="replace").strip()[-300:] if err.is_file() else ""
            uploads[h] = {"ok": False, "bytes": 0, "seconds": None, "throughput_Bps": None,
                          "error": f"no transfer record ({text or 'no output'})"}
            continue
        r = recs[-1]
        secs = r.metric("ttlb")
        uploads[h] = {"ok": r.ok, "bytes": r.bytes, "seconds": secs,
                      "throughput_Bps": r.goodput, "error": r.error}
        if r.last_byte is not None:
            last.append(r.last_byte)
    if not math.isfinite(end) and last:  # run.json without uploads_done: the last upload's end
        end = max(last)
    latency: list[float] = []
    for h in CLIENT_HOSTS:
        for o in an.read_jsonl(run_dir / f"latency-{h}.jsonl"):
            r = an.parse_record(o, "latency", h)
            if isinstance(r, an.Transfer) and r.ok and t0 <= r.start < end:
                v = r.metric("ttfb_req")
                if v is not None and v >= 0:
                    latency.append(v)
    switches: list[dict[str, Any]] = []
    for h in CLIENT_HOSTS:  # path switching: the client starts the switch and records it
        for sw in _records(run_dir / "net" / f"client{h}" / "metrics.jsonl", "switch"):
            switches.append({**sw, "relay": f"client{h}"})
    relays: dict[str, dict[str, Any]] = {}
    for nick in RELAYS:
        d = run_dir / "net" / nick
        for s in _records(d / "metrics.jsonl", "switch"):
            switches.append({**s, "relay": nick})
        rate = [(float(r["t"]), float(r.get("bytes_out_per_s") or 0.0))
                for r in _records(d / "metrics.jsonl", "relay") if isinstance(r.get("t"), (int, float))]
        cells_out = sum(int(r.get("cells_out") or 0) for r in _records(d / "metrics.jsonl", "relay"))
        prom = parse_prometheus((d / "metrics.prom").read_text()) if (d / "metrics.prom").is_file() else {}
        relays[nick] = {"rate": rate, "cells_out": cells_out, "prom": prom}
    upload_paths: dict[str, list[str]] = {}
    if (run_dir / "tor.json").is_file():  # tor: the circuits each client's upload used
        ev = json.loads((run_dir / "tor.json").read_text())
        for c, users in (ev.get("stream_circuits") or {}).items():
            upload_paths[c.removeprefix("client")] = sorted(set(users.get(UPLOAD_USER, [])))
        for h in CLIENT_HOSTS:  # conflux: every leg of the upload's set (only one names the user)
            legs = conflux_legs(run_dir / "net" / f"client{h}" / "circuit-status.txt", UPLOAD_USER)
            if legs:
                upload_paths[h] = legs
    return {"info": info, "t0": t0, "end": end, "uploads": uploads, "latency": latency,
            "switches": switches, "relays": relays, "upload_paths": upload_paths}


def variant_reps(out_dir: Path, scenario: Any) -> dict[str, list[Path]]:
    """Per variant label, all its repetition directories under ``OUT/runs`` (skipped and failed
    ones too: :func:`variant_runs` sorts them); pooling passes several results' instead."""
    return {v.label: rep_dirs(out_dir, v.label, finished=False) for v in scenario.variants}


def variant_runs(dirs: Iterable[Path]) -> tuple[list[dict[str, Any]], str | None]:
    """Of a variant's repetition directories, the finished ones' runs (failed ones left out) and,
    if it was skipped, why."""
    runs, skipped = [], None
    for d in dirs:
        if (d / "skipped.json").is_file():
            skipped = json.loads((d / "skipped.json").read_text()).get("reason", "skipped")
            continue
        if (d / "run.json").is_file() and not is_failed(d):
            info = json.loads((d / "run.json").read_text())
            if "t0" in info:
                runs.append(load_run(d))
    return runs, skipped


# ------------------------------------------------------------------ computing
def _mean(pts: Iterable[tuple[float, float]]) -> float | None:
    vals = [v for _t, v in pts]
    return sum(vals) / len(vals) if vals else None


def capacity_changes(run: Mapping[str, Any], events: Sequence[float], window: float) -> dict[str, list[float]]:
    """Per relay, C_after − C_before (bytes/s) around each event time (UNIX s): the mean of its
    per-second forwarding rate in [t − window, t) and in (t, t + window]."""
    out: dict[str, list[float]] = {}
    for nick, r in run["relays"].items():
        diffs = []
        for t in events:
            before = _mean((x, v) for x, v in r["rate"] if t - window <= x < t)
            after = _mean((x, v) for x, v in r["rate"] if t < x <= t + window)
            if before is not None and after is not None:
                diffs.append(after - before)
        if diffs:
            out[nick] = diffs
    return out


def switch_events(run: Mapping[str, Any]) -> list[float]:
    """When the run's switches took effect (UNIX s)."""
    return [float(s["t"]) for s in run["switches"] if s.get("outcome") == "switched" and isinstance(s.get("t"), (int, float))]


def summarize_variant(v: Any, runs: list[dict[str, Any]], skipped: str | None, window: float,
                      reference: Mapping[int, list[float]]) -> dict[str, Any]:
    """summary.json's entry of one variant (``reference``: per repetition index, the offsets from
    t0 of the switching variants' switches, used as event times where a variant has none)."""
    o = v.options
    e: dict[str, Any] = {"impl": o.impl, "switching": o.switching if o.impl == "chive" else None,
                         "alpha": o.alpha if o.impl == "chive" and o.switching != "off" else None,
                         "beta": o.beta if o.impl == "chive" and o.switching != "off" else None,
                         "conflux": o.conflux if o.impl == "tor" else None, "spare_path": o.spare_path,
                         "paper": o.paper, "repetitions": len(runs), "skipped": skipped}
    ups = [u for r in runs for u in r["uploads"].values()]
    errors = [f"rep {i + 1} {h}: {u['error']}" for i, r in enumerate(runs) for h, u in r["uploads"].items() if not u["ok"]]
    tput = [u["throughput_Bps"] for u in ups if u["ok"] and u["throughput_Bps"] is not None]
    e["upload"] = {"n": len(ups), "ok": sum(1 for u in ups if u["ok"]), "failed": len(errors), "errors": errors[:10],
                   "throughput_Bps": stats.summarize(tput),
                   "per_client_Bps": {h: [r["uploads"][h]["throughput_Bps"] for r in runs] for h in CLIENT_HOSTS}}
    e["latency_s"] = stats.summarize([x for r in runs for x in r["latency"]])
    if o.impl != "chive":
        # Circuits (entry,middle,exit) carrying each upload at the end, from tor's control port:
        # two with conflux when both legs were linked.
        e["upload_circuits"] = [r.get("upload_paths", {}) for r in runs]
        e["switching"] = None
        e["drop_rate"] = None
        e["capacity_change_Bps"] = {}
        return e
    sw = [s for r in runs for s in r["switches"]]
    outcomes: dict[str, int] = {}
    for s in sw:
        outcomes[str(s.get("outcome"))] = outcomes.get(str(s.get("outcome")), 0) + 1
    times = [float(s["switch_time_s"]) for s in sw
             if s.get("outcome") == "switched" and isinstance(s.get("switch_time_s"), (int, float))]
    # The paper's definition (last cell on the old connection or leg -> first on the new one);
    # records of binaries before it carry no gap_s.
    gaps = [float(s["gap_s"]) for s in sw
            if s.get("outcome") == "switched" and isinstance(s.get("gap_s"), (int, float))]
    # Path switches: what held the first cell after CONGESTED (records since session 16).
    held_by: dict[str, int] = {}
    for s in sw:
        if s.get("outcome") == "switched" and "held_by" in s:
            k = str(s["held_by"]) if s["held_by"] is not None else "none"
            held_by[k] = held_by.get(k, 0) + 1
    prom = [rel["prom"] for r in runs for rel in r["relays"].values()]
    have_prom = any(prom)
    lost = sum(p.get("chive_switch_cells_lost_total", 0.0) for p in prom)
    resent = sum(p.get("chive_switch_cells_resent_total", 0.0) for p in prom)
    held = sum(p.get("chive_switch_cells_held_total", 0.0) for p in prom)
    entry_cells = sum(r["relays"][n]["cells_out"] for r in runs for n in ("entry1", "entry2") if n in r["relays"])
    e["switching"] = {"switches": outcomes.get("switched", 0), "outcomes": outcomes,
                      "switch_time_s": stats.summarize(times),
                      "gap_s": stats.summarize(gaps),
                      "held_by": held_by,
                      "cells_lost": int(lost) if have_prom else None,
                      "bytes_lost": int(lost) * CELL_BYTES if have_prom else None,
                      "cells_resent": int(resent) if have_prom else None,
                      "cells_held": int(held) if have_prom else None,
                      "entry_cells_out": entry_cells}
    e["drop_rate"] = (lost / entry_cells) if have_prom and entry_cells else None
    changes: dict[str, list[float]] = {}
    for i, r in enumerate(runs):
        events = switch_events(r) or [r["t0"] + off for off in reference.get(i, [])]
        for nick, diffs in capacity_changes(r, events, window).items():
            changes.setdefault(nick, []).extend(diffs)
    e["capacity_change_Bps"] = {nick: stats.summarize(d) for nick, d in changes.items()}
    e["_capacity_raw"] = changes
    return e


def reference_offsets(per_variant: Mapping[str, list[dict[str, Any]]]) -> dict[int, list[float]]:
    """Per repetition index, the switches' offsets from t0 of every variant that switched (the
    event times Fig 6 uses for variants without switches of their own)."""
    out: dict[int, list[float]] = {}
    for runs in per_variant.values():
        for i, r in enumerate(runs):
            out.setdefault(i, []).extend(t - r["t0"] for t in switch_events(r))
    return out


def _p50(e: Mapping[str, Any] | None, *path: str) -> float | None:
    cur: Any = e
    for k in path:
        if not isinstance(cur, Mapping) or k not in cur:
            return None
        cur = cur[k]
    return cur.get("p50") if isinstance(cur, Mapping) else None


def targets(variants: Mapping[str, Mapping[str, Any]], declared: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with the numbers it was judged on (``met`` None: a variant it
    needs did not run)."""
    t = {**DEFAULT_TARGETS, **declared}
    ran = {k: e for k, e in variants.items() if not e.get("skipped") and e.get("repetitions")}
    out: dict[str, Any] = {}
    failed = {k: e["upload"]["failed"] for k, e in ran.items()}
    lost = {k: e["switching"]["bytes_lost"] for k, e in ran.items() if e.get("switching")}
    lossless = None
    if ran:
        lossless = all(n == 0 for n in failed.values()) and all(
            b is not None and b <= float(t["bytes_lost_max"]) for b in lost.values())
    out["lossless"] = {"met": lossless, "failed_uploads": failed, "bytes_lost": lost,
                       "bytes_lost_max": t["bytes_lost_max"]}
    sw, base, cfx = ran.get(t["switching"]), ran.get(t["baseline"]), ran.get(t["conflux"])
    st = _p50(sw, "switching", "switch_time_s") if sw and sw.get("switching") else None
    out["switch_time_p50"] = {"met": None if st is None else st <= float(t["switch_time_p50_max_s"]),
                              "variant": t["switching"], "p50_s": st, "max_s": t["switch_time_p50_max_s"],
                              "paper_s": PAPER["switch_time_s_p50"]}
    ts, tb, tc = (_p50(x, "upload", "throughput_Bps") for x in (sw, base, cfx))
    ratio = ts / tb if ts and tb else None
    out["throughput_ratio"] = {"met": None if ratio is None else ratio >= float(t["throughput_ratio_min"]),
                               "ratio": ratio, "min": t["throughput_ratio_min"], "p50_Bps": [ts, tb],
                               "variants": [t["switching"], t["baseline"]],
                               "paper_ratio": PAPER["throughput_Bps_p50"]["switching"] / PAPER["throughput_Bps_p50"]["multiplexed"]}
    out["not_below_conflux"] = {"met": None if ts is None or tc is None else ts >= tc, "p50_Bps": [ts, tc],
                                "variants": [t["switching"], t["conflux"]]}
    ls, lb = _p50(sw, "latency_s"), _p50(base, "latency_s")
    red = 1.0 - ls / lb if ls is not None and lb else None
    out["latency_reduction"] = {"met": None if red is None else red >= float(t["latency_reduction_min"]),
                                "reduction": red, "min": t["latency_reduction_min"], "p50_s": [ls, lb],
                                "paper_reduction": 1.0 - PAPER["latency_s_p50"]["switching"] / PAPER["latency_s_p50"]["multiplexed"]}
    return out


# ------------------------------------------------------------------ figures
def _cdf(label: str, values: Sequence[float], scale: float = 1.0) -> an.Series | None:
    if not values:
        return None
    x, y = stats.ecdf([v * scale for v in values])
    return an.Series(f"{label} (n={len(values)})", [float(a) for a in x], [float(b) for b in y], style="step")


def figures(variants: Mapping[str, Mapping[str, Any]], raw: Mapping[str, list[dict[str, Any]]]) -> list[an.Figure]:
    """Figs 4, 6 (one per chive variant), 7, 8 and the drop rate, each written with its CSV."""
    figs = []
    f4 = an.Figure("fig4_switch_time_cdf", "Fig 4: switch time (congestion report to first cell on the new connection)",
                   "seconds", "fraction of switches", note="chive relays' switch records; the paper: medians "
                   "< 1 s at (0.05, 0.1) and (0.1, 0.5), 2.15 s at (0.3, 0.75), 3 s at (0.5, 0.9)")
    for label, e in variants.items():
        if e.get("switching") and e["switching"] is not None and e.get("alpha") is not None:
            times = [float(s["switch_time_s"]) for r in raw.get(label, []) for s in r["switches"]
                     if s.get("outcome") == "switched" and isinstance(s.get("switch_time_s"), (int, float))]
            s = _cdf(f"{label} α={e['alpha']:g} β={e['beta']:g}", times)
            if s:
                f4.series.append(s)
    figs.append(f4)
    for label, e in variants.items():
        ch = e.get("_capacity_raw") or {}
        if not ch:
            continue
        f6 = an.Figure(f"fig6_capacity_change_{label}", f"Fig 6: relay capacity after − before a switch, {label}",
                       "C_after − C_before (Mbit/s)", "fraction of switches",
                       note="per relay, mean forwarding rate over the window after minus before each switch "
                            "(variants without switches: at the switching variants' switch times)")
        for nick, d in ch.items():
            s = _cdf(nick, d, 8e-6)
            if s:
                f6.series.append(s)
        figs.append(f6)
    f7 = an.Figure("fig7_throughput_cdf", "Fig 7 / Table 2: end-to-end upload throughput", "KB/s",
                   "fraction of uploads", note="bytes / (last byte − start) of each verified upload; the paper's "
                   "medians 134 (multiplexed) and 264 KB/s (switching)")
    f8 = an.Figure("fig8_latency_cdf", "Fig 8: latency of one cell through the 3 hops, during the uploads", "seconds",
                   "fraction of probes", note="request sent to first byte of a small GET on a circuit of its own "
                   "(one cell out, one back); the paper's medians 2.65 s (multiplexed), 1.68 s (switching)")
    for label, e in variants.items():
        runs = raw.get(label, [])
        s7 = _cdf(label, [u["throughput_Bps"] for r in runs for u in r["uploads"].values()
                          if u["ok"] and u["throughput_Bps"] is not None], 1e-3)
        if s7:
            f7.series.append(s7)
        s8 = _cdf(label, [x for r in runs for x in r["latency"]])
        if s8:
            f8.series.append(s8)
    figs += [f7, f8]
    chive = [(label, e) for label, e in variants.items() if e.get("drop_rate") is not None]
    fd = an.Figure("drop_rate", "Cells lost by switching / cells the entries sent", "variant", "drop rate (%)",
                   note="chive_switch_cells_lost_total over the entries' cells out; the paper lost 0.09%",
                   xticks=[(float(i), label) for i, (label, _e) in enumerate(chive)])
    if chive:
        fd.series.append(an.Series("chive", [float(i) for i in range(len(chive))],
                                   [100.0 * e["drop_rate"] for _l, e in chive], style="points"))
        fd.series.append(an.Series("paper (0.09%)", [0.0], [100.0 * PAPER["drop_rate"]["switching"]], style="hline"))
    figs.append(fd)
    return figs


# ------------------------------------------------------------------ tables
def _f(v: float | None, scale: float = 1.0, nd: int = 2) -> str:
    return "" if v is None else f"{v * scale:.{nd}f}"


COLUMNS = ["variant", "uploads ok/n", "throughput p50 KB/s", "p25-p75 KB/s", "latency p50 s", "switches",
           "switch time p50 s", "cells lost", "drop rate %", "paper"]


def table_rows(variants: Mapping[str, Mapping[str, Any]]) -> list[list[Any]]:
    """Table 2 with the switching columns: one row per variant."""
    rows = []
    for label, e in variants.items():
        if e.get("skipped"):
            rows.append([label, "skipped", "", "", "", "", "", "", "", e["skipped"][:80]])
            continue
        t = e["upload"]["throughput_Bps"]
        sw = e.get("switching") or {}
        rows.append([label, f"{e['upload']['ok']}/{e['upload']['n']}", _f(t["p50"], 1e-3, 1),
                     f"{_f(t['p25'], 1e-3, 1)}-{_f(t['p75'], 1e-3, 1)}" if t["p25"] is not None else "",
                     _f(e["latency_s"]["p50"], 1.0, 3), sw.get("switches", ""),
                     _f(_p50(sw, "switch_time_s"), 1.0, 3) if sw else "",
                     "" if sw.get("cells_lost") is None else sw["cells_lost"],
                     _f(e.get("drop_rate"), 100.0, 3), e.get("paper", "")])
    return rows


def write_comparison(out: Path, summary: Mapping[str, Any]) -> None:
    """comparison.md: Table 2 with ours, the paper's numbers beside them, the targets."""
    lines = ["# Paper 003: circuit switching at entry relays, beside tor's conflux", "",
             f"Parameters: {json.dumps(summary['params'])}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in table_rows(summary["variants"])]
    lines += ["", "## The paper's numbers beside ours", "",
              "| measure | paper multiplexed | paper switching | ours multiplexed | ours switching | ours tor-conflux |",
              "|---|---|---|---|---|---|"]
    t = {**DEFAULT_TARGETS, **summary["params"].get("targets", {})}
    v = summary["variants"]
    b, s, c = v.get(t["baseline"]), v.get(t["switching"]), v.get(t["conflux"])
    lines.append(f"| throughput p50 KB/s | 134 | 264 | {_f(_p50(b, 'upload', 'throughput_Bps'), 1e-3, 1)} | "
                 f"{_f(_p50(s, 'upload', 'throughput_Bps'), 1e-3, 1)} | {_f(_p50(c, 'upload', 'throughput_Bps'), 1e-3, 1)} |")
    lines.append(f"| latency p50 s | 2.65 | 1.68 | {_f(_p50(b, 'latency_s'), 1.0, 3)} | {_f(_p50(s, 'latency_s'), 1.0, 3)} | "
                 f"{_f(_p50(c, 'latency_s'), 1.0, 3)} |")
    lines.append(f"| switch time p50 s | | ~1 | | {_f(_p50((s or {}).get('switching'), 'switch_time_s'), 1.0, 3)} | |")
    lines.append(f"| cells lost | | 0.09% | | {_f((s or {}).get('drop_rate'), 100.0, 3)}% | |")
    lines += ["", "Fig 4 (switch time p50 per (α, β)): paper " + ", ".join(
        f"({a:g}, {bb:g}) {x:g} s" for (a, bb), x in PAPER["fig4_switch_time_s_p50"].items()) + "; ours "
        + ", ".join(f"{label} ({e['alpha']:g}, {e['beta']:g}) {_f(_p50(e.get('switching'), 'switch_time_s'), 1.0, 3)} s"
                    for label, e in v.items() if e.get("alpha") is not None and not e.get("skipped")) + ".",
              "", "## Targets (issue 16)", ""]
    for k, x in summary["targets"].items():
        lines.append(f"- **{k}**: {'met' if x['met'] else 'missed' if x['met'] is False else 'n/a'} — "
                     f"`{json.dumps({a: y for a, y in x.items() if a != 'met'})}`")
    (out / "comparison.md").write_text("\n".join(lines) + "\n")


def analyze(out_dir: Path, scenario: Any, reps_of: Mapping[str, list[Path]] | None = None) -> an.Analysis:
    """``chive-lab analyze``: summary, figures, Table 2, OUT/paper003/comparison.md + summary.json.
    ``reps_of`` (variant label -> its repetition directories) defaults to ``OUT/runs``; pooling
    passes several results' runs."""
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    reps_of = variant_reps(out_dir, scenario) if reps_of is None else reps_of
    raw: dict[str, list[dict[str, Any]]] = {}
    skipped: dict[str, str | None] = {}
    for v in scenario.variants:
        raw[v.label], skipped[v.label] = variant_runs(reps_of.get(v.label, []))
    ref = reference_offsets({k: r for k, r in raw.items()})
    variants = {v.label: summarize_variant(v, raw[v.label], skipped[v.label], p.capacity_window_s, ref)
                for v in scenario.variants}
    figs = figures(variants, raw)
    for e in variants.values():
        e.pop("_capacity_raw", None)
    params = {**{k: (list(x) if isinstance(x, tuple) else x) for k, x in p.__dict__.items()},
              "relay_rate_Bps": p.relay_rate_bytes}
    summary: dict[str, Any] = {"schema": 1, "kind": KIND_NAME,
                               "units": {"throughput": "bytes/s", "time": "s", "capacity": "bytes/s"},
                               "params": params, "variants": variants,
                               "paper": {k: ({f"{a:g},{b:g}": x for (a, b), x in val.items()} if k.startswith("fig4") else val)
                                         for k, val in PAPER.items()}}
    summary["targets"] = targets(variants, p.targets)
    own = out_dir / "paper003"
    own.mkdir(parents=True, exist_ok=True)
    (own / "summary.json").write_text(json.dumps(summary, indent=2))
    write_comparison(own, summary)
    notes = ["This kind's own files: paper003/comparison.md (Table 2, the paper's numbers beside ours, "
             "targets) and paper003/summary.json."]
    notes += [f"{label}: skipped: {why}" for label, why in skipped.items() if why]
    return an.Analysis(summary=summary, figures=figs,
                       tables=[an.Table("Table 2: uploads, latency and switching per variant", COLUMNS, table_rows(variants))],
                       notes=notes)
