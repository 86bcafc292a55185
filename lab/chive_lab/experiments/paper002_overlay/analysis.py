"""The ``paper002-overlay`` analysis: per direction the goodput while both
clients run, its share of the link (goodput and on the wire), the variance
of the directions towards B (Fig 9), the targets, and the files: throughput
and variance figures with their CSVs, ``summary.json`` and ``comparison.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ... import analysis as an
from ... import netns, stats
from .. import bulk
from .evidence import extra_channel_lines, link_queue_lines
from .options import (
    DIRECTIONS,
    KIND_NAME,
    OVERLAP,
    SLOT,
    SOLO,
    VAR_WINDOW,
    Params,
    Targets,
    VariantOptions,
    directions,
    params_dict,
)
from .targets import WIRE_EFFICIENCY, compute_targets, declared_targets, declared_variants, target_lines, wire_shares

PAPER_VARIANCE = ("Fig 9: variance of towards-B throughput, 100-250 s: bidirectional without ACK prio "
                  "highest, with ACK prio lower, split + ACK prio lowest (no numbers in the text)")


def analyze_raw(results: dict[str, list[dict[str, list[float]]]], p: Params, out: Path,
                evidence: dict[str, dict] | None = None,
                variants: Mapping[str, VariantOptions] | None = None) -> dict:
    """Write figures, CSVs, summary.json and comparison.md; return the summary. ``variants``:
    each variant's declaration, ``p.targets`` the targets (defaults: the shipped scenarios')."""
    out.mkdir(parents=True, exist_ok=True)
    variants = variants if variants is not None else declared_variants()
    targets = p.targets if p.targets is not None else declared_targets()
    rate = netns.parse_rate(p.rate)
    ov = (p.t(OVERLAP[0]), p.t(OVERLAP[1]))
    vw = (p.t(VAR_WINDOW[0]), p.t(VAR_WINDOW[1]))
    solo = (p.t(SOLO[0]), p.t(SOLO[1]))
    summary: dict = {"schema": 1, "kind": KIND_NAME,
                     "units": {"goodput_bps": "bit/s", "variance": "(bit/s)^2", "share_of_link": "fraction"},
                     "params": {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in params_dict(p).items()},
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
            per_run = [stats.mean(stats.window(r[d], *ov)) for r in runs]
            samples = [x for r in runs for x in stats.window(r[d], *vw)]
            g = stats.mean(per_run)
            vs[d] = {"goodput_bps": g, "variance": stats.variance(samples), "share_of_link": g / rate,
                     "solo_goodput_bps": stats.mean([stats.mean(stats.window(r[d], *solo)) for r in runs]),
                     "goodput_per_run_bps": per_run}
        # On the wire, from the relay sockets' counters (runs recorded before session 9 have none).
        wire = [wire_shares(ev.get("link_queues", []), rate)
                for ev in (evidence or {}).get(variant, {}).values()]
        for d in directions(p):
            per_run_wire = [w[d] for w in wire if d in w]
            if per_run_wire:
                vs[d]["wire_share"] = stats.mean(per_run_wire)
                vs[d]["wire_share_per_run"] = per_run_wire
        for f in sorted(k for k in runs[0] if ":" in k):
            extra["loops"][f] = {"goodput_bps": stats.mean([stats.mean(stats.window(r[f], *ov)) for r in runs])}
        pooled = [x for r in runs for d in DIRECTIONS for x in stats.window(r[d], *vw)]
        extra["towards_b_variance"] = stats.variance(pooled)
        # The paper's Fig 9 samples: 10 s slot means (scaled with the timeline).
        slots = [x for r in runs for d in DIRECTIONS for x in stats.slot_means(r[d], *vw, SLOT * p.scale)]
        extra["towards_b_variance_slots"] = stats.variance(slots)
        extra["towards_b_variance_slots_per_run"] = [
            stats.variance([x for d in DIRECTIONS for x in stats.slot_means(r[d], *vw, SLOT * p.scale)]) for r in runs]
        extra["variance_slot_s"] = SLOT * p.scale
        if evidence and variant in evidence:
            extra["evidence"] = evidence[variant]
        var_rows.append((variant, stats.variance(pooled), len(pooled),
                         stats.mean([vs[d]["goodput_bps"] for d in DIRECTIONS]), stats.variance(slots)))
        summary["variants"][variant] = vs
        summary["extra"][variant] = extra
        # Per-connection series ("host:peer") go into the CSV; the figure shows the directions.
        dirs = directions(p)
        bulk.write_throughput(out, variant, runs, SLOT * p.scale, list(dirs) + sorted(k for k in runs[0] if ":" in k),
                              list(dirs), f"overlay {variant}: mean over {len(runs)} run(s), {SLOT * p.scale:g} s "
                              f"slots, 90% CI (cf. paper Fig {variants[variant].fig})", rep_window=ov,
                              hline=(netns.parse_rate(p.rate) / 2, "half the link"))
    bulk.write_variance(out, var_rows)
    if targets is not None:
        summary["targets"] = compute_targets(summary, p, targets, variants)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    _write_comparison(out, summary, var_rows, variants, targets)
    return summary


def _write_comparison(out: Path, summary: dict, var_rows, variants: Mapping[str, VariantOptions],
                      targets: Targets | None) -> None:
    impls = " and ".join(sorted({variants[v].impl if v in variants else "chive" for v in summary["variants"]}))
    lines = [f"# Paper 002, overlay ({impls} relays on A, B, C): ours beside the paper", "",
             f"Parameters: {json.dumps(summary['params'])}", "",
             "| variant | direction | solo Mbit/s | both clients Mbit/s | share of link | paper (TCP, Sec. V) |",
             "|---|---|---|---|---|---|"]
    for v, ds in summary["variants"].items():
        for d, x in ds.items():
            lines.append(f"| {v} | {d} | {x['solo_goodput_bps'] / 1e6:.2f} | {x['goodput_bps'] / 1e6:.2f} | "
                         f"{x['share_of_link']:.2f} | {variants[v].paper if d == 'A->B' else ''} |")
    baseline = targets.baseline if targets is not None else "one"
    lines += [""] + bulk.variance_table(var_rows, baseline)
    t = summary.get("targets", {})
    lines += ["", PAPER_VARIANCE, ""]
    if targets is not None:
        lines += [f"Issue 6 targets ({targets.variant}; share in goodput, on the wire below): each direction "
                  f">= {targets.share_min:.0%} of the link: "
                  f"{t.get('split_ackprio_min_share', float('nan')):.3f} -> {t.get('share_met')}; "
                  f"variance <= {targets.variance_ratio_max} x {baseline}: "
                  f"{t.get('variance_ratio_vs_one', float('nan')):.3f}"
                  f" -> {t.get('variance_met')} (1 s samples; with the paper's 10 s slot means: "
                  f"{t.get('variance_ratio_vs_one_slots', float('nan')):.3f})", ""]
    if "ceiling_share" in t:
        assert targets is not None
        lines += [f"Ceilings ({targets.variant}): the largest goodput share each direction can have, from the "
                  "bottleneck it shares with one other flow, `chive shape`'s 90% data class and "
                  f"{WIRE_EFFICIENCY:.3f} goodput per wire byte (TCP/IP, cells):", "",
                  "| direction | ceiling | share | share of ceiling |", "|---|---|---|---|"]
        for d, c in t["ceiling_share"].items():
            lines.append(f"| {d} | {c:.3f} | {summary['variants'][targets.variant][d]['share_of_link']:.3f} | "
                         f"{t['split_ackprio_share_of_ceiling'][d]:.2f} |")
        lines.append("")
    lines += target_lines(t, directions_of(summary))
    lines += link_queue_lines(summary)
    lines += extra_channel_lines(summary, variants)
    (out / "comparison.md").write_text("\n".join(lines))


def directions_of(summary: dict) -> list[str]:
    """The measured directions of a summary, in its order."""
    return list(next(iter(summary["variants"].values()), {}).keys())


def analyze(out_dir: Path, scenario: Any) -> an.Analysis:
    """``chive-lab analyze``: read ``runs/<variant>/<rep>/flows.json``, write this kind's
    figures and CSVs into ``out_dir/paper002_overlay`` and return the analysis (summary
    schema 1)."""
    out_dir = Path(out_dir)
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    # The scenario's declarations (a label-only variant of an old result was resolved from the
    # shipped scenarios when the scenario was read).
    variants = {v.label: v.options for v in scenario.variants if v.options is not None}
    dirs = bulk.repetition_dirs(out_dir, [v.label for v in scenario.variants])
    results = bulk.read_flows(dirs)
    evidence = {v: {d.name: json.loads((d / "evidence.json").read_text())
                    for d in reps if (d / "evidence.json").is_file()}
                for v, reps in dirs.items()}
    summary = analyze_raw(results, p, out_dir / "paper002_overlay", evidence, variants)
    table = bulk.goodput_table("Paper 002, overlay: goodput per direction while both clients run", "direction",
                               "share of link", summary, lambda x: round(x["share_of_link"], 3), variants,
                               PAPER_VARIANCE)
    notes = ["This kind's own figures: paper002_overlay/throughput_<variant>.png, "
             "paper002_overlay/variance.png, CSV beside each, and paper002_overlay/comparison.md.",
             f"Targets: {json.dumps(summary['targets'])}"]
    slot = SLOT * p.scale
    figures = [bulk.throughput_figure(f"paper002_overlay_throughput_{v}",
                                      f"overlay {v}: throughput per direction (cf. paper Fig {variants[v].fig})",
                                      runs, list(directions(p)), slot)
               for v, runs in results.items() if runs]
    figures.append(bulk.variance_figure("paper002_overlay_variance",
                                        "variance of 1 s throughput towards B (cf. Fig 9)", summary))
    return an.Analysis(summary=summary, figures=figures, tables=[table], notes=notes)
