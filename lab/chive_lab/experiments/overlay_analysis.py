"""The ``overlay`` kind's analysis: per class and variant, the time-to-first/
last-byte statistics, goodput, K-S tests against the first variant, relay
queue delays; ECDF/KDE/throughput/percentile figures and the tables.
Pure over :class:`chive_lab.analysis.RunData` (``analyze_runs``), plus
:func:`analyze_overlay` which loads an output directory first."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .. import stats
from ..analysis import fmt as _fmt
from ..analysis import (
    SUMMARY_SCHEMA,
    Analysis,
    Figure,
    RunData,
    Series,
    Table,
    _round,
    class_metrics,
    discover_runs,
    load_run,
    queue_delays,
    samples,
    throughput_series,
)

__all__ = ["analyze_overlay", "analyze_runs", "overlay_figures", "overlay_tables"]


def analyze_overlay(out_dir: Path, scenario: Any) -> Analysis:
    """Recompute everything from the raw records of ``out_dir`` (scenario: a
    :class:`chive_lab.scenario.Scenario`)."""
    labels = [v.label for v in scenario.variants]
    runs_by_variant: dict[str, list[RunData]] = {}
    for label, reps in discover_runs(out_dir, labels).items():
        runs_by_variant[label] = [
            load_run(path, label, rep, scenario.warmup, scenario.duration) for rep, path in reps
        ]
    return analyze_runs(scenario, runs_by_variant)


def analyze_runs(scenario: Any, runs_by_variant: Mapping[str, Sequence[RunData]]) -> Analysis:
    """The overlay analysis on loaded data (pure; used by tests directly)."""
    labels = [v.label for v in scenario.variants if v.label in runs_by_variant]
    classes = list(scenario.classes)
    for runs in runs_by_variant.values():
        for r in runs:
            for t in r.transfers:
                if t.cls not in classes:
                    classes.append(t.cls)
    first = labels[0] if labels else None
    variants: dict[str, Any] = {}
    notes: list[str] = []
    for label in labels:
        runs = runs_by_variant[label]
        entry: dict[str, Any] = {}
        for cls in classes:
            m = class_metrics(runs, cls)
            mine = [x for rep in samples(runs, cls) for x in rep]
            base = [x for rep in samples(runs_by_variant[first], cls) for x in rep] if first else []
            ks = stats.ks_test(mine, base)
            m["ks_vs_first"] = {"statistic": _round(ks["statistic"]), "pvalue": ks["pvalue"], "vs": first}
            entry[cls] = m
        bad = sum(r.bad_lines for r in runs)
        if bad:
            notes.append(f"{label}: {bad} malformed record line(s) skipped")
        failed = [r.rep for r in runs if r.status not in ("ok", "unknown")]
        if failed:
            notes.append(f"{label}: repetition(s) {failed} did not finish normally (see run.json)")
        variants[label] = entry
    queue = {label: q for label in labels if (q := queue_delays(runs_by_variant[label])) is not None}
    summary: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        "scenario": scenario.name,
        "kind": "overlay",
        "quick": bool(getattr(scenario, "quick", False)),
        "variants_order": labels,
        "classes": classes,
        "repetitions": {label: len(runs_by_variant[label]) for label in labels},
        "definitions": {
            "ttfb": "first_byte - start (s), as Tor Metrics/OnionPerf",
            "ttlb": "last_byte - start (s), as Tor Metrics/OnionPerf",
            "ttfb_req": "first_byte - request_sent (s), as tornettools",
            "ttlb_req": "last_byte - request_sent (s), as tornettools",
            "goodput_bps": "median over transfers of bytes / ttlb, in bytes per second",
            "aggregate_goodput_bps": "bytes of ok transfers started in the window / window length, bytes per second, mean over repetitions",
            "ks_vs_first": "two-sample K-S test of ttlb against the first variant (scipy.stats.ks_2samp)",
        },
        "variants": variants,
    }
    if queue:
        summary["queue_delay"] = queue
    figures = overlay_figures(scenario, labels, classes, runs_by_variant)
    tables = overlay_tables(labels, classes, variants, queue)
    return Analysis(summary=summary, figures=figures, tables=tables, notes=notes)


def _numeric_axis(scenario: Any, labels: Sequence[str]) -> tuple[str, dict[str, float]] | None:
    """If some variants vary one numeric key, map those labels to its value (for
    Fig 13-style plots); other variants become horizontal reference lines."""
    keyed: dict[str, float] = {}
    key_name = None
    for v in scenario.variants:
        if v.label not in labels:
            continue
        nums = {k: val for k, val in v.values.items()
                if isinstance(val, (int, float)) and not isinstance(val, bool)}
        if len(nums) == 1:
            ((k, val),) = nums.items()
            if key_name in (None, k):
                key_name = k
                keyed[v.label] = float(val)
    if key_name is None or len(keyed) < 2:
        return None
    return key_name, keyed


def overlay_figures(scenario: Any, labels: Sequence[str], classes: Sequence[str],
                    runs_by_variant: Mapping[str, Sequence[RunData]]) -> list[Figure]:
    """ECDFs with bands, KDEs, throughput over time, percentiles vs variant, queue delays."""
    figs: list[Figure] = []
    band_note = ("band: pointwise 95% percentile band of the per-repetition ECDFs (2+ repetitions) "
                 "or 95% DKW band (1 repetition); line: ECDF of all repetitions pooled")
    for cls in classes:
        for measure, what in (("ttlb", "time to last byte"), ("ttfb", "time to first byte")):
            fig = Figure(name=f"{measure}_cdf_{cls}", title=f"{cls}: {what} ({measure}, from start)",
                         xlabel="seconds", ylabel="fraction of transfers", note=band_note)
            for label in labels:
                band = stats.ecdf_band(samples(runs_by_variant[label], cls, measure))
                if band is None:
                    continue
                fig.series.append(Series(label=f"{label} ({band.method})", x=band.x.tolist(),
                                         y=band.center.tolist(), lo=band.lo.tolist(),
                                         hi=band.hi.tolist(), style="step"))
            if fig.series:
                figs.append(fig)
        # KDE of ttlb (Loesing-style)
        pooled = {label: [x for rep in samples(runs_by_variant[label], cls) for x in rep] for label in labels}
        allv = [x for v in pooled.values() for x in v]
        if allv:
            lo, hi = min(allv), max(allv)
            pad = (hi - lo) * 0.1 or max(hi * 0.1, 0.01)
            grid = np.linspace(max(0.0, lo - pad), hi + pad, 200)
            fig = Figure(name=f"ttlb_kde_{cls}", title=f"{cls}: density of time to last byte",
                         xlabel="seconds", ylabel="density",
                         note="Gaussian kernel density (scipy.stats.gaussian_kde, Scott's rule), repetitions pooled")
            for label in labels:
                dens = stats.kde(pooled[label], grid)
                if dens is not None:
                    fig.series.append(Series(label=label, x=grid.tolist(), y=dens.tolist()))
            if fig.series:
                figs.append(fig)
        # Throughput over time
        fig = Figure(name=f"throughput_{cls}", title=f"{cls}: goodput over time (all {cls} clients)",
                     xlabel="seconds since the clients started", ylabel="bytes/s",
                     note="1 s bins; line: mean over repetitions; band: 95% Student-t interval "
                          "(none with 1 repetition); the warm-up is included (dashed line)")
        for label in labels:
            curves = [throughput_series(r, cls) for r in runs_by_variant[label]]
            curves = [c for c in curves if c.size]
            if not curves:
                continue
            n = min(c.size for c in curves)
            mat = np.vstack([c[:n] for c in curves])
            means, los, his = [], [], []
            for k in range(n):
                m, a, b = stats.mean_ci(mat[:, k].tolist()) or (0.0, 0.0, 0.0)
                means.append(m)
                los.append(a)
                his.append(b)
            if any(means):
                fig.series.append(Series(label=label, x=[k + 0.5 for k in range(n)], y=means,
                                         lo=los if len(curves) > 1 else None,
                                         hi=his if len(curves) > 1 else None))
        if fig.series:
            if scenario.warmup > 0:
                fig.note += f"; warm-up ends at {scenario.warmup:g} s"
            figs.append(fig)
        # Percentiles vs variant (Fig 13 style)
        axis = _numeric_axis(scenario, labels)
        fig = Figure(name=f"ttlb_percentiles_{cls}", title=f"{cls}: ttlb p25 / p50 / p75 per variant",
                     xlabel="variant", ylabel="seconds")
        summaries = {label: stats.summarize(x for rep in samples(runs_by_variant[label], cls) for x in rep)
                     for label in labels}
        if axis is not None:
            key, xs = axis
            fig.xlabel = f"{key} ({'log scale' if _wide(xs.values()) else 'linear'})"
            fig.xscale = "log" if _wide(xs.values()) else "linear"
            fig.note = "variants without a value of this key are drawn as horizontal lines"
            ordered = sorted(xs.items(), key=lambda kv: kv[1])
            for p in ("p25", "p50", "p75"):
                pts = [(x, summaries[label][p]) for label, x in ordered if summaries[label][p] is not None]
                if pts:
                    fig.series.append(Series(label=p, x=[a for a, _ in pts], y=[b for _, b in pts], style="points"))
            for label in labels:
                if label in xs:
                    continue
                for p in ("p25", "p50", "p75"):
                    v = summaries[label][p]
                    if v is not None:
                        fig.series.append(Series(label=f"{label} {p}", x=[min(xs.values()), max(xs.values())],
                                                 y=[v, v], style="hline"))
        else:
            ticks = [(float(i), label) for i, label in enumerate(labels)]
            fig.xticks = ticks
            for p in ("p25", "p50", "p75"):
                pts = [(float(i), summaries[label][p]) for i, label in enumerate(labels)
                       if summaries[label][p] is not None]
                if pts:
                    fig.series.append(Series(label=p, x=[a for a, _ in pts], y=[b for _, b in pts], style="points"))
        if fig.series:
            figs.append(fig)
    # Queue delay breakdown
    qfig = Figure(name="queue_delay", title="relay cell delays: circuit queue and output buffer",
                  xlabel="seconds", ylabel="fraction of cells",
                  note="queue = dequeued - queued; outbuf = written - dequeued; all relays pooled")
    for label in labels:
        runs = runs_by_variant[label]
        for part, pick in (("queue", lambda q, d, w: None if d is None else d - q),
                           ("outbuf", lambda q, d, w: None if d is None or w is None else w - d)):
            vals = [v for r in runs for c in r.cells if (v := pick(*c)) is not None and v >= 0]
            if vals:
                xs_, ps = stats.ecdf(vals)
                if xs_.size > 2000:  # keep the CSV small: 2000 evenly spaced points of the ECDF
                    idx = np.linspace(0, xs_.size - 1, 2000).astype(int)
                    xs_, ps = xs_[idx], ps[idx]
                qfig.series.append(Series(label=f"{label} {part}", x=xs_.tolist(), y=ps.tolist(), style="step"))
    if qfig.series:
        figs.append(qfig)
    return figs


def _wide(values: Iterable[float]) -> bool:
    """Whether positive values span at least a factor of 10 (then a log axis reads better)."""
    allv = list(values)
    vals = [v for v in allv if v > 0]
    return bool(vals) and len(vals) == len(allv) and max(vals) / min(vals) >= 10


def overlay_tables(labels: Sequence[str], classes: Sequence[str], variants: Mapping[str, Any],
                   queue: Mapping[str, Any]) -> list[Table]:
    """Percentile tables per class, and the queue-delay table."""
    tables = []
    first = labels[0] if labels else None
    for cls in classes:
        rows = []
        for label in labels:
            m = variants[label].get(cls)
            if m is None:
                continue
            base = variants[first][cls]["ttlb"]["p50"] if first else None
            p50 = m["ttlb"]["p50"]
            change = "" if base in (None, 0) or p50 is None else f"{(p50 - base) / base * 100:+.1f}%"
            ks = m["ks_vs_first"]
            rows.append([
                label, m["transfers"], m["errors"], m["censored"],
                _fmt(m["ttfb"]["p25"]), _fmt(m["ttfb"]["p50"]), _fmt(m["ttfb"]["p75"]),
                _fmt(m["ttlb"]["p10"]), _fmt(m["ttlb"]["p25"]), _fmt(m["ttlb"]["p50"]),
                _fmt(m["ttlb"]["p75"]), _fmt(m["ttlb"]["p90"]), _fmt(m["ttlb"]["mean"]), change,
                _fmt(m["ttfb_req"]["p50"]), _fmt(m["ttlb_req"]["p50"]),
                _fmt(m["goodput_bps"], 0), _fmt(m["aggregate_goodput_bps"], 0),
                _fmt(ks["statistic"]), "" if ks["pvalue"] is None else f"{ks['pvalue']:.3g}",
            ])
        tables.append(Table(
            title=f"class {cls}",
            columns=["variant", "ok", "errors", "censored", "ttfb p25", "ttfb p50", "ttfb p75",
                     "ttlb p10", "ttlb p25", "ttlb p50", "ttlb p75", "ttlb p90", "ttlb mean",
                     f"ttlb p50 vs {first}", "ttfb_req p50", "ttlb_req p50", "goodput B/s",
                     "aggregate B/s", "K-S D", "K-S p"],
            rows=rows,
            note="seconds; ttfb/ttlb from start (Tor Metrics/OnionPerf), *_req from request sent "
                 "(tornettools); K-S: ttlb against the first variant",
        ))
    if queue:
        rows = []
        for label, q in queue.items():
            for part in ("queue", "outbuf"):
                s = q[part]
                rows.append([label, part, s["n"], _fmt(s["p25"], 6), _fmt(s["p50"], 6), _fmt(s["p75"], 6),
                             _fmt(s["p90"], 6), _fmt(s["mean"], 6)])
        tables.append(Table(title="relay cell delays", columns=["variant", "part", "cells", "p25", "p50",
                                                                "p75", "p90", "mean"], rows=rows,
                            note="seconds; from the relays' per-cell metrics samples"))
    return tables
