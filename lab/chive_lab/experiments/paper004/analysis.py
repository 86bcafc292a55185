"""Analysis of the ``paper004-window`` kind: per series (one exit setting) and size, the time
to connect (``socks_connected - start``: circuit and stream set up), to the first byte and to
the last byte (``first_byte``/``last_byte - start``, as torperf measured them), and the
``transfer`` (``last_byte - socks_connected``: stream open to last byte, without the circuit
set-up a fresh-circuit fetch pays in its time to connect); kernel density
plots (the paper's Figs 1-3) and ECDFs with 95% bands, each with its CSV; two-sample K–S tests
between the windows; the issue's targets; ``comparison.md`` with the paper's findings beside
ours. Summary keys: docs/summary-schema.md, section ``paper004-window``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ... import analysis as an
from ... import stats
from ...pooling import rep_dirs
from . import KIND_NAME, Params, exit_nick, perf_stem

MEASURES = {"connect": "time to connect", "ttfb": "time to first byte", "ttlb": "time to last byte",
            "transfer": "stream open to last byte"}
PAPER = {
    "connect": "Fig 1: the window does not change the time to connect (circuit and stream setup)",
    "ttfb": "Fig 2: the first byte arrives alike with both windows",
    "ttlb": "Fig 3: 101 cells faster for 40 KiB (fits one window), no difference for 50 KiB, "
            "clearly slower for 1 MiB (more round trips)",
    "transfer": "not plotted in the paper (its Fig 3 includes the time to connect)",
}
#: Why tor (0.4.7+, fixed windows) closes a circuit whose circwindow is not a multiple of 100,
#: from its source (src/core/or/congestion_control_common.c, sendme.c, circuitlist.c).
TOR_WINDOW_NOTE = (
    "tor with cc_alg=0 and a circwindow that is not a multiple of 100 closes its circuits at the "
    "first SENDME: the exit's package window starts at circwindow (circuit_initial_package_window), "
    "and circuit_sent_cell_for_sendme() records a cell's digest for authenticated SENDMEs when "
    "(package_window - 1) % 100 == 0, i.e. at windows 101 and 1 for circwindow 101: the 1st and "
    "the 101st cell. The client's deliver window always starts at 1000 (CIRCWINDOW_START), so it "
    "sends its SENDME after the 100th cell, echoing that cell's digest; sendme_is_valid() pops the "
    "1st cell's digest, the two differ and the exit closes the circuit. A fetch that fits in the "
    "first 100 cells of a circuit (40 KiB on a fresh circuit) completes; one that needs a SENDME "
    "fails. circwindow 100 records the 100th cell and works.")
#: Default target declaration (scenario key ``targets``).
DEFAULT_TARGETS = {"small": "chive-w101", "large": "chive-w1000", "tor_small": "tor-w101",
                   "tor_large": "tor-w1000", "cc": "chive-vegas", "tor_cc": "tor-vegas",
                   "fixed": ["chive-w100", "chive-w101", "chive-w1000"], "speedup": 1.2,
                   "small_size": 40960, "large_size": 1048576, "alpha": 0.05}


def measure(rec: an.Transfer, name: str) -> float | None:
    """Seconds from the transfer's start to ``name``'s event, for ``transfer`` from the stream's
    opening (socks_connected) to the last byte (None if not reached)."""
    if name == "transfer":
        if rec.last_byte is None or rec.socks_connected is None:
            return None
        return rec.last_byte - rec.socks_connected
    end = {"connect": rec.socks_connected, "ttfb": rec.first_byte, "ttlb": rec.last_byte}[name]
    return None if end is None else end - rec.start


def variant_reps(out_dir: Path, scenario: Any) -> dict[str, list[Path]]:
    """Per variant label, its finished repetition directories under ``OUT/runs``;
    :mod:`.pooling` passes the directories of several results instead."""
    return {v.label: rep_dirs(out_dir, v.label) for v in scenario.variants}


def load_series(out_dir: Path, scenario: Any,
                reps_of: Mapping[str, list[Path]] | None = None) -> dict[str, dict[str, Any]]:
    """Per series label: its variant, impl, window and, per size, the transfers of every
    repetition (``reps``: list of lists of :class:`~chive_lab.analysis.Transfer`) that started
    in the measurement window, plus failed counts."""
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    out: dict[str, dict[str, Any]] = {}
    reps_of = variant_reps(out_dir, scenario) if reps_of is None else reps_of
    for v in scenario.variants:
        reps = reps_of.get(v.label, [])
        for label, window in v.options.exits.items():
            entry = out.setdefault(label, {"variant": v.label, "impl": v.options.impl,
                                           "window": window or v.options.params.get("circwindow", 1000),
                                           "cc_alg": v.options.params.get("cc_alg", 0),
                                           "paper": v.options.paper,
                                           "fresh_circuit": v.options.fresh_circuit, "sizes": {}})
            for size in p.sizes:
                entry["sizes"].setdefault(size, {"reps": [], "errors": 0, "error_texts": []})
            for d in reps:
                run = json.loads((d / "run.json").read_text())
                lo = float(run["t0"]) + float(run.get("warmup_s", 0.0))
                for size in p.sizes:
                    cell = entry["sizes"][size]
                    ok = []
                    for obj in an.read_jsonl(d / f"{perf_stem(label, size)}.jsonl"):
                        rec = an.parse_record(obj, label)
                        if not isinstance(rec, an.Transfer) or rec.start < lo:
                            continue
                        if rec.ok:
                            ok.append(rec)
                        elif not rec.censored:
                            cell["errors"] += 1
                            if len(cell["error_texts"]) < 3:
                                cell["error_texts"].append(str(rec.error))
                    cell["reps"].append(ok)
    return out


def onionperf_runs(out_dir: Path, scenario: Any) -> dict[str, list[an.RunData]]:
    """``chive-lab export --onionperf``: per series (one OnionPerf source), per repetition,
    every torperf fetch of every size (warm-up, failures and cut fetches included) and the
    progress samples. The window is this analysis's: a fetch counts from ``t0 + warmup_s``
    on, with no end (the loops start no fetch after the end and the one running then is
    kept), so the export's in-window successes are exactly what summary.json summarises."""
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    out: dict[str, list[an.RunData]] = {}
    for v in scenario.variants:
        for d in rep_dirs(out_dir, v.label):
            run = json.loads((d / "run.json").read_text())
            for label in v.options.exits:
                data = an.RunData(variant=label, rep=int(d.name) if d.name.isdigit() else 0,
                                  t0=float(run["t0"]), warmup=float(run.get("warmup_s", 0.0)),
                                  duration=math.inf, status=str(run.get("status", "ok")))
                for size in p.sizes:
                    stem = perf_stem(label, size)
                    for obj in an.read_jsonl(d / f"{stem}.jsonl"):
                        rec = an.parse_record(obj, f"{label}-{size}", client=stem)
                        if isinstance(rec, an.Transfer):
                            data.transfers.append(rec)
                        elif isinstance(rec, an.ProgressSample):
                            data.progress.append(rec)
                out.setdefault(label, []).append(data)
    return out


def _cell_delays(path: Path, lo: float, hi: float) -> list[float]:
    """Milliseconds each sampled cell spent in a chive relay (circuit queue + output buffer:
    ``written - queued``) for cells queued in [lo, hi), from its metrics file."""
    out = []
    for obj in an.read_jsonl(path):
        if not isinstance(obj, dict) or obj.get("type") != "cell":
            continue
        q, w = obj.get("queued"), obj.get("written")
        if isinstance(q, (int, float)) and isinstance(w, (int, float)) and lo <= q < hi and w >= q:
            out.append((w - q) * 1e3)
    return out


def relay_delays(out_dir: Path, scenario: Any,
                 reps_of: Mapping[str, list[Path]] | None = None) -> dict[str, Any]:
    """Per chive series: the sojourn time (ms) of the cells its exit sampled during the
    measurement; per chive variant: those of the entry and middle relays. From the relays'
    metrics files (tor reports no per-cell times)."""
    out: dict[str, Any] = {"exit": {}, "entry_middle": {}}
    reps_of = variant_reps(out_dir, scenario) if reps_of is None else reps_of
    for v in scenario.variants:
        if v.options.impl != "chive":
            continue
        shared: list[float] = []
        per_exit: dict[str, list[float]] = {label: [] for label in v.options.exits}
        for d in reps_of.get(v.label, []):
            rj = d / "run.json"
            run = json.loads(rj.read_text())
            lo = float(run["t0"]) + float(run.get("warmup_s", 0.0))
            hi = lo + float(run.get("measure_s", 0.0))
            net = rj.parent / "net"
            for nick in ("entry", "middle"):
                shared += _cell_delays(net / nick / "metrics.jsonl", lo, hi)
            for i, label in enumerate(v.options.exits):
                per_exit[label] += _cell_delays(net / exit_nick(i) / "metrics.jsonl", lo, hi)
        out["entry_middle"][v.label] = stats.summarize(shared) | {"p95": stats.percentile(shared, 95)}
        for label, vals in per_exit.items():
            out["exit"][label] = stats.summarize(vals) | {"p95": stats.percentile(vals, 95)}
    return out


def values(series: Mapping[str, Any], size: int, name: str) -> list[list[float]]:
    """Per repetition, the ``name`` times (s) of a series' fetches of ``size``."""
    return [[m for r in rep if (m := measure(r, name)) is not None] for rep in series["sizes"][size]["reps"]]


def _pooled(series: Mapping[str, Any], size: int, name: str) -> list[float]:
    return [x for rep in values(series, size, name) for x in rep]


def ks_pairs(series: Mapping[str, Any], targets: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The pairs compared with K–S: each fixed chive window against the 1000 one, tor's two
    windows, congestion control against the fixed 1000 window and chive's against tor's."""
    t = {**DEFAULT_TARGETS, **targets}
    pairs = [(a, t["large"]) for a in t["fixed"] if a != t["large"]]
    pairs += [(t["tor_small"], t["tor_large"]), (t["cc"], t["large"]), (t["cc"], t["tor_cc"]),
              (t["tor_cc"], t["tor_large"])]
    return [(a, b) for a, b in pairs if a in series and b in series]


def summarize(series: dict[str, dict[str, Any]], p: Params,
              delays: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """summary.json's ``series``, ``ks``, ``relay_delay_ms`` and ``targets``."""
    out: dict[str, Any] = {"series": {}, "ks": [], "relay_delay_ms": dict(delays or {})}
    for label, s in series.items():
        sizes = {}
        for size in p.sizes:
            cell = s["sizes"][size]
            e: dict[str, Any] = {"n": sum(len(r) for r in cell["reps"]), "errors": cell["errors"],
                                 "error_texts": cell["error_texts"]}
            for m in MEASURES:
                vals = _pooled(s, size, m)
                e[m] = stats.summarize(vals)
                ci = stats.median_ci(vals)
                e[m]["p50_ci95"] = list(ci) if ci else None
            sizes[str(size)] = e
        keys = ("variant", "impl", "window", "cc_alg", "paper", "fresh_circuit")
        out["series"][label] = {k: s[k] for k in keys} | {"sizes": sizes}
    for a, b in ks_pairs(series, p.targets):
        for size in p.sizes:
            for m in MEASURES:
                r = stats.ks_test(_pooled(series[a], size, m), _pooled(series[b], size, m))
                out["ks"].append({"a": a, "b": b, "size": size, "measure": m, **r})
    out["targets"] = targets(out, p)
    return out


def _med(summary: Mapping[str, Any], label: str, size: int, m: str = "ttlb") -> float | None:
    try:
        return summary["series"][label]["sizes"][str(size)][m]["p50"]
    except KeyError:
        return None


def _ks(summary: Mapping[str, Any], a: str, b: str, size: int, m: str = "ttlb") -> float | None:
    for r in summary["ks"]:
        if r["a"] == a and r["b"] == b and r["size"] == size and r["measure"] == m:
            return r["pvalue"]
    return None


def targets(summary: Mapping[str, Any], p: Params) -> dict[str, Any]:
    """The issue's targets, each with the numbers it was judged on; ``met`` is None when a
    series it needs is missing."""
    t = {**DEFAULT_TARGETS, **p.targets}
    small_size, large_size, alpha = int(t["small_size"]), int(t["large_size"]), float(t["alpha"])
    out: dict[str, Any] = {}
    for impl, small, large in (("chive", t["small"], t["large"]), ("tor", t["tor_small"], t["tor_large"])):
        ms, ml = _med(summary, small, small_size), _med(summary, large, small_size)
        bs, bl = _med(summary, small, large_size), _med(summary, large, large_size)
        pv = _ks(summary, small, large, large_size)
        met = None if None in (ms, ml, bs, bl, pv) else bool(ms < ml and bs > bl and pv < alpha)
        out[f"direction_{impl}"] = {"met": met, "small": small, "large": large,
                                    "median_small_size": [ms, ml], "median_large_size": [bs, bl],
                                    "ks_p_large_size": pv}
    per_size = {}
    for size in p.sizes:
        cc = summary["series"].get(t["cc"], {}).get("sizes", {}).get(str(size), {}).get("ttlb", {})
        best = None
        for label in t["fixed"]:
            e = summary["series"].get(label, {}).get("sizes", {}).get(str(size), {}).get("ttlb", {})
            if e.get("p50") is not None and (best is None or e["p50"] < best[1]["p50"]):
                best = (label, e)
        if cc.get("p50") is None or best is None:
            per_size[str(size)] = {"met": None}
            continue
        # Within noise: cc's median CI reaches down to the best fixed window's median CI.
        cc_lo = (cc.get("p50_ci95") or [cc["p50"]])[0]
        best_hi = (best[1].get("p50_ci95") or [None, best[1]["p50"]])[1]
        per_size[str(size)] = {"met": bool(cc["p50"] <= best[1]["p50"] or cc_lo <= best_hi),
                               "cc_median": cc["p50"], "best": best[0], "best_median": best[1]["p50"]}
    flags = [v["met"] for v in per_size.values()]
    out["cc_as_fast_as_best_fixed"] = {"met": None if None in flags else all(flags), "cc": t["cc"],
                                       "by_size": per_size}
    mc, mt = _med(summary, t["cc"], large_size), _med(summary, t["tor_cc"], large_size)
    ratio = mt / mc if mc and mt else None
    out["cc_vs_tor_vegas"] = {"met": None if ratio is None else ratio >= float(t["speedup"]),
                              "ratio": ratio, "needed": float(t["speedup"]), "cc": t["cc"],
                              "tor_cc": t["tor_cc"], "size": large_size}
    ex = summary.get("relay_delay_ms", {}).get("exit", {})
    qc, ql = ex.get(t["cc"], {}).get("p95"), ex.get(t["large"], {}).get("p95")
    out["cc_queue_p95_not_above_fixed_1000"] = {
        "met": None if qc is None or ql is None else qc <= ql,
        "exit_p95_ms": [qc, ql], "series": [t["cc"], t["large"]]}
    return out


# ----------------------------------------------------------------- figures
def figures(series: Mapping[str, Any], p: Params) -> list[an.Figure]:
    """Per measure and size a KDE (the paper's Figs 1-3) and an ECDF with its 95% band."""
    figs = []
    for m, what in MEASURES.items():
        for size in p.sizes:
            data = {label: values(s, size, m) for label, s in series.items()}
            pooled = {label: [x for rep in v for x in rep] for label, v in data.items()}
            allv = [x for v in pooled.values() for x in v]
            kde = an.Figure(name=f"kde_{m}_{size}", title=f"{what}, {size // 1024} KiB: kernel density",
                            xlabel="seconds", ylabel="density",
                            note="Gaussian KDE, Scott's bandwidth (the paper's Figs 1-3)")
            cdf = an.Figure(name=f"cdf_{m}_{size}", title=f"{what}, {size // 1024} KiB: ECDF",
                            xlabel="seconds", ylabel="fraction of fetches",
                            note="band: 95% (per-repetition percentiles, or DKW with one repetition)")
            if allv:
                hi = float(np.percentile(allv, 99)) * 1.2
                grid = np.linspace(0.0, max(hi, 1e-3), 200)
                for label, v in pooled.items():
                    dens = stats.kde(v, grid)
                    if dens is not None:
                        kde.series.append(an.Series(f"{label} (n={len(v)})", [float(x) for x in grid],
                                                    [float(y) for y in dens]))
                    band = stats.ecdf_band(data[label])
                    if band is not None:
                        cdf.series.append(an.Series(label, band.x.tolist(), band.center.tolist(),
                                                    band.lo.tolist(), band.hi.tolist(), style="step"))
            figs += [kde, cdf]
    return figs


def _fmt(v: float | None, nd: int = 2) -> str:
    return "" if v is None else f"{v:.{nd}f}"


def table_rows(summary: Mapping[str, Any], p: Params) -> list[list[Any]]:
    """One row per series and size: n, errors, medians (s) of connect, ttfb, ttlb, ttlb p90."""
    rows = []
    for label, s in summary["series"].items():
        for size in p.sizes:
            e = s["sizes"][str(size)]
            ci = e["ttlb"].get("p50_ci95")
            rows.append([label, size // 1024, e["n"], e["errors"], _fmt(e["connect"]["p50"]),
                         _fmt(e["ttfb"]["p50"]), _fmt(e["ttlb"]["p50"]),
                         f"{ci[0]:.2f}-{ci[1]:.2f}" if ci else "", _fmt(e["ttlb"]["p90"]),
                         _fmt(e.get("transfer", {}).get("p50"))])  # absent in older summaries
    return rows


COLUMNS = ["series", "KiB", "n", "errors", "connect p50 s", "ttfb p50 s", "ttlb p50 s",
           "ttlb p50 95% CI", "ttlb p90 s", "transfer p50 s"]


def write_comparison(out: Path, summary: Mapping[str, Any], p: Params) -> None:
    """comparison.md: our table, the K–S tests, the targets and the paper's findings."""
    lines = ["# Paper 004: circuit window 101 vs 1000, torperf-style, with congestion control", "",
             f"Parameters: {json.dumps(summary['params'])}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in table_rows(summary, p)]
    lines += ["", "## K–S tests (two-sample, two-sided)", "", "| a | b | KiB | measure | D | p |",
              "|---|---|---|---|---|---|"]
    for r in summary["ks"]:
        lines.append(f"| {r['a']} | {r['b']} | {r['size'] // 1024} | {r['measure']} | "
                     f"{_fmt(r['statistic'], 3)} | {_fmt(r['pvalue'], 4)} |")
    lines += ["", "## Relay sojourn time of sampled cells (chive relays' metrics), ms", "",
              "| where | p50 | p95 | n |", "|---|---|---|---|"]
    for where, rows in summary.get("relay_delay_ms", {}).items():
        for label, e in rows.items():
            lines.append(f"| {where} {label} | {_fmt(e.get('p50'), 1)} | {_fmt(e.get('p95'), 1)} | {e.get('n')} |")
    lines += ["", "## Targets (issue 17)", ""]
    for k, v in summary["targets"].items():
        lines.append(f"- **{k}**: {'met' if v['met'] else 'not met' if v['met'] is False else 'n/a'} — "
                     f"`{json.dumps({x: y for x, y in v.items() if x != 'met'})}`")
    if any(x["impl"] == "tor" and not x["cc_alg"] and x["window"] % 100 for x in summary["series"].values()):
        lines += ["", "## Tor at a circuit window that is not a multiple of 100", "", TOR_WINDOW_NOTE]
    fresh = [label for label, x in summary["series"].items() if x.get("fresh_circuit")]
    if fresh:
        lines += ["", "## Fresh circuits", "",
                  "Every fetch of " + ", ".join(fresh) + " ran on a new circuit (a random SOCKS "
                  "username per fetch), so its time to connect includes building the circuit where the "
                  "client had none ready, and `transfer` (stream open to last byte) is the part the "
                  "window decides."]
    lines += ["", "## The paper's findings beside ours", ""]
    for m, text in PAPER.items():
        lines.append(f"- {MEASURES[m]}: paper — {text}.")
    lines += [f"- {label}: paper — {s['paper']}" for label, s in summary["series"].items() if s.get("paper")]
    (out / "comparison.md").write_text("\n".join(lines) + "\n")


def analyze(out_dir: Path, scenario: Any, reps_of: Mapping[str, list[Path]] | None = None) -> an.Analysis:
    """``chive-lab analyze``: summary, figures (written by the report into OUT/figures),
    table and OUT/paper004/comparison.md + summary.json. ``reps_of`` (variant label -> its
    repetition directories) defaults to ``OUT/runs``; pooling passes several results' runs."""
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    reps_of = variant_reps(out_dir, scenario) if reps_of is None else reps_of
    series = load_series(out_dir, scenario, reps_of)
    summary: dict[str, Any] = {"schema": 1, "kind": KIND_NAME, "units": {"time": "s", "relay_delay_ms": "ms"},
                               "params": {**p.__dict__, "duration": scenario.duration,
                                          "warmup": scenario.warmup},
                               "variants": {v.label: {"impl": v.options.impl, "consensus": dict(v.options.params),
                                                      "series": list(v.options.exits)}
                                            for v in scenario.variants},
                               **summarize(series, p, relay_delays(out_dir, scenario, reps_of))}
    own = out_dir / "paper004"
    own.mkdir(parents=True, exist_ok=True)
    (own / "summary.json").write_text(json.dumps(summary, indent=2, default=list))
    write_comparison(own, summary, p)
    table = an.Table(title="torperf-style fetches per exit setting", columns=COLUMNS,
                     rows=table_rows(summary, p))
    return an.Analysis(summary=summary, figures=figures(series, p), tables=[table],
                       notes=["This kind's own files: paper004/comparison.md (paper's findings "
                              "beside ours, K–S tests, targets) and paper004/summary.json."])
