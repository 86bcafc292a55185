"""Analysis of the ``paper001-onion`` kind: per variant, the connection set-up of each group's
first fetch (``socks_connected - start``: the SOCKS request until the onion stream is open;
introduction and rendezvous), of the later fetches (circuit reused), and the page fetch time
(``last_byte - socks_connected``); the ECDF of first-fetch set-up (the paper's Fig 14) and of
the fetch time, each with its CSV; the issue's targets from the scenario's ``targets``; and
``paper001/comparison.md`` with the paper's numbers (``paper_numbers``) beside ours; for the
chive variants, where the first fetches' set-up went step by step (:mod:`.phases`, from the
onion client's log). Summary keys: docs/summary-schema.md, section ``paper001-onion``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ... import analysis as an
from ... import stats
from ...pooling import rep_dirs
from . import KIND_NAME, Params, onion_stem
from . import phases as ph

#: Measures per fetch: name -> (which fetches, what), see :func:`measure`.
MEASURES = {
    "setup_first": "connection set-up, first fetch of a group (circuits built)",
    "setup_later": "connection set-up, later fetches (circuit reused)",
    "fetch": "page fetch after set-up, every fetch",
}
#: Target keys the scenario's ``targets`` table must give (labels and thresholds).
TARGET_KEYS = ("rr", "ewma", "tor", "statistic", "ewma_below_rr", "tor_fraction")
STATISTICS = ("mean", "p50")


def measure(rec: an.Transfer, name: str) -> float | None:
    """Seconds of ``name`` for one successful fetch (None if it does not apply or was not
    reached): ``setup_*`` from start to the SOCKS reply (first fetch: ``seq`` 0), ``fetch`` from
    the SOCKS reply to the last byte."""
    if name == "fetch":
        if rec.socks_connected is None or rec.last_byte is None:
            return None
        return rec.last_byte - rec.socks_connected
    first = rec.seq == 0
    if (name == "setup_first") != first or rec.socks_connected is None:
        return None
    return rec.socks_connected - rec.start


def load_variants(out_dir: Path, scenario: Any) -> dict[str, dict[str, Any]]:
    """Per variant label: impl, its settings, and per repetition the successful fetches of
    groups whose first fetch started in the measurement window (``reps``: list of lists of
    :class:`~chive_lab.analysis.Transfer`), with counts of groups and failed fetches; the later
    fetches of a group whose first fetch failed are left out (``dropped``)."""
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    out: dict[str, dict[str, Any]] = {}
    for v in scenario.variants:
        o = v.options
        entry = out[v.label] = {"impl": o.impl, "scheduler": o.scheduler or None,
                                "prioritised": o.prioritised if o.impl == "chive" else None,
                                "paper": o.paper, "reps": [], "groups": 0, "errors": 0, "dropped": 0,
                                "first_errors": 0, "error_texts": [], "service_ready_s": []}
        entry["phases"] = ph.variant_phases(rep_dirs(out_dir, v.label)) if o.impl == "chive" else {}
        for d in rep_dirs(out_dir, v.label):
            run = json.loads((d / "run.json").read_text())
            lo = float(run["t0"]) + float(run.get("warmup_s", 0.0))
            if isinstance(run.get("service_ready_s"), (int, float)):
                entry["service_ready_s"].append(float(run["service_ready_s"]))
            ok: list[an.Transfer] = []
            for i in range(p.clients):
                # Group (SOCKS user) -> whether its first fetch started in the window and
                # succeeded: later fetches count only then (after a failed first fetch the
                # next one builds the circuits, and is neither a first nor a reusing fetch).
                first_ok: dict[str, bool] = {}
                for obj in an.read_jsonl(d / f"{onion_stem(i)}.jsonl"):
                    rec = an.parse_record(obj, "onion", client=onion_stem(i))
                    if not isinstance(rec, an.Transfer):
                        continue
                    group = str(obj.get("socks_user"))
                    if rec.seq == 0:
                        first_ok[group] = rec.start >= lo and rec.ok
                        if rec.start < lo:
                            continue
                        entry["groups"] += 1
                    elif not first_ok.get(group, False):
                        entry["dropped"] += rec.start >= lo
                        continue
                    if rec.ok:
                        ok.append(rec)
                    elif not rec.censored:
                        entry["errors"] += 1
                        entry["first_errors"] += rec.seq == 0
                        if len(entry["error_texts"]) < 3:
                            entry["error_texts"].append(str(rec.error))
            entry["reps"].append(ok)
    return out


def values(variant: Mapping[str, Any], name: str) -> list[list[float]]:
    """Per repetition, the ``name`` seconds of a variant's fetches."""
    return [[m for r in rep if (m := measure(r, name)) is not None] for rep in variant["reps"]]


def _pooled(variant: Mapping[str, Any], name: str) -> list[float]:
    return [x for rep in values(variant, name) for x in rep]


def summarize(data: Mapping[str, Mapping[str, Any]], p: Params) -> dict[str, Any]:
    """summary.json's ``variants`` (per measure: stats.summarize + a 95% CI of the mean),
    ``targets`` and ``paper``."""
    out: dict[str, Any] = {"variants": {}}
    for label, v in data.items():
        e: dict[str, Any] = {k: v[k] for k in ("impl", "scheduler", "prioritised", "paper", "groups",
                                                "errors", "first_errors", "dropped", "error_texts")}
        e["repetitions"] = len(v["reps"])
        e["service_ready_s"] = v["service_ready_s"]
        e["phases_ms"] = v.get("phases", {})
        for m in MEASURES:
            vals = _pooled(v, m)
            e[m] = stats.summarize(vals)
            ci = stats.mean_ci(vals)
            e[m]["mean_ci95"] = None if ci is None else [ci[1], ci[2]]
        out["variants"][label] = e
    out["targets"] = targets(out, p)
    out["paper"] = dict(p.paper_numbers)
    return out


def _stat(summary: Mapping[str, Any], label: str | None, statistic: str, m: str = "setup_first") -> float | None:
    if not label:
        return None
    return summary["variants"].get(label, {}).get(m, {}).get(statistic)


def targets(summary: Mapping[str, Any], p: Params) -> dict[str, Any]:
    """The issue's targets judged on first-fetch set-up, from the scenario's ``targets``:
    ``ewma_below_rr`` (1 - ewma/rr at least the declared reduction) and ``ewma_vs_tor``
    (ewma/tor at most the declared fraction); ``met`` is None when a variant it needs has no
    data or the scenario declares no targets. ``ewma_middle_vs_rr`` (the paper's two-of-seven
    case) is reported without a threshold."""
    t = dict(p.targets)
    missing = [k for k in TARGET_KEYS if k not in t]
    if missing:
        return {"declared": False, "missing_keys": missing}
    statistic = str(t["statistic"])
    if statistic not in STATISTICS:
        return {"declared": False, "error": f"statistic must be one of {STATISTICS}, got {statistic!r}"}
    rr, ewma, tor = (_stat(summary, t[k], statistic) for k in ("rr", "ewma", "tor"))
    need, frac = float(t["ewma_below_rr"]), float(t["tor_fraction"])
    reduction = None if rr is None or ewma is None or rr <= 0 else 1.0 - ewma / rr
    ratio = None if tor is None or ewma is None or tor <= 0 else ewma / tor
    out: dict[str, Any] = {
        "declared": True, "statistic": statistic, "measure": "setup_first",
        "ewma_below_rr": {"met": None if reduction is None else reduction >= need, "reduction": reduction,
                          "needed": need, "rr": [t["rr"], rr], "ewma": [t["ewma"], ewma]},
        "ewma_vs_tor": {"met": None if ratio is None else ratio <= frac, "ratio": ratio, "needed": frac,
                        "ewma": [t["ewma"], ewma], "tor": [t["tor"], tor]},
    }
    mid = _stat(summary, t.get("ewma_middle"), statistic)
    out["ewma_middle_vs_rr"] = {"reduction": None if rr is None or mid is None or rr <= 0 else 1.0 - mid / rr,
                                "ewma_middle": [t.get("ewma_middle"), mid], "rr": [t["rr"], rr]}
    return out


# ----------------------------------------------------------------- figures
def figures(data: Mapping[str, Any]) -> list[an.Figure]:
    """ECDFs with 95% bands: first-fetch set-up (the paper's Fig 14), later set-up, fetch."""
    figs = []
    for m, what in MEASURES.items():
        fig = an.Figure(name=f"cdf_{m}", title=f"{what}: ECDF", xlabel="seconds",
                        ylabel="fraction of fetches",
                        note=("the paper's Fig 14 (connection initialisation, first fetch); " if m == "setup_first"
                              else "") + "band: 95% (per-repetition percentiles, or DKW with one repetition)")
        for label, v in data.items():
            band = stats.ecdf_band(values(v, m))
            if band is not None:
                fig.series.append(an.Series(label, band.x.tolist(), band.center.tolist(), band.lo.tolist(),
                                            band.hi.tolist(), style="step"))
        figs.append(fig)
    return figs


def _fmt(v: float | None, nd: int = 2) -> str:
    return "" if v is None else f"{v:.{nd}f}"


COLUMNS = ["variant", "groups", "errors", "set-up 1st mean s", "set-up 1st p50 s", "set-up 1st p90 s",
           "set-up later p50 s", "fetch p50 s", "fetch p90 s"]


def table_rows(summary: Mapping[str, Any]) -> list[list[Any]]:
    """One row per variant."""
    rows = []
    for label, e in summary["variants"].items():
        s1, sl, f = e["setup_first"], e["setup_later"], e["fetch"]
        rows.append([label, e["groups"], e["errors"], _fmt(s1["mean"]), _fmt(s1["p50"]), _fmt(s1["p90"]),
                     _fmt(sl["p50"]), _fmt(f["p50"]), _fmt(f["p90"])])
    return rows


def _verdict(met: bool | None) -> str:
    return "met" if met else "missed" if met is False else "n/a (no data)"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.1f}%"


def _s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def _neg_pct(x: float | None) -> str:
    return "n/a" if x is None else _pct(-x)


def paper_lines(summary: Mapping[str, Any]) -> list[str]:
    """The paper's numbers beside ours (first-fetch set-up, change against rr, later set-ups)."""
    pn, t = summary.get("paper", {}), summary.get("targets", {})
    lines = ["| | paper (live Tor, 2009) | ours |", "|---|---|---|"]
    if not t.get("declared"):
        return lines + ["", "(the scenario declares no targets: no variant to compare)"]
    rr, ewma, tor = t["ewma_below_rr"]["rr"], t["ewma_below_rr"]["ewma"], t["ewma_vs_tor"]["tor"]
    mid = t["ewma_middle_vs_rr"]["ewma_middle"]
    stat = t["statistic"]
    paper_change = _neg_pct(pn["reduction"]) if "reduction" in pn else ""
    lines += [f"| first-fetch set-up ({stat}), round-robin | {pn.get('rr_mean_s', '')} s | {_s(rr[1])} ({rr[0]}) |",
              f"| the same, EWMA on 2 of 7 hops | {pn.get('ewma_mean_s', '')} s | {_s(mid[1])} ({mid[0]}) |",
              f"| change against round-robin, 2 of 7 hops | {paper_change} | "
              f"{_neg_pct(t['ewma_middle_vs_rr']['reduction'])} |",
              f"| the same, EWMA on every relay | not measured (expected a larger change) | {_s(ewma[1])} "
              f"({ewma[0]}), {_neg_pct(t['ewma_below_rr']['reduction'])} |",
              f"| the same, tor 0.4.9 (KIST + EWMA) | — | {_s(tor[1])} ({tor[0]}) |"]
    if "later_setup_mean_s" in pn:
        later = [f"{label} {_s(e['setup_later']['mean'])}" for label, e in summary["variants"].items()]
        lines.append(f"| set-up of the later fetches (mean) | {pn['later_setup_mean_s']} s | {', '.join(later)} |")
    if pn.get("note"):
        lines += ["", f"Paper: {pn['note']}."]
    return lines


def write_comparison(out: Path, summary: Mapping[str, Any]) -> None:
    """comparison.md: our table, the targets and the paper's numbers beside ours."""
    lines = ["# Paper 001, Effects on hidden services: onion-service set-up under bulk load", "",
             f"Parameters: {json.dumps(summary['params'])}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in table_rows(summary)]
    lines += ["", "## The paper's numbers beside ours", "", *paper_lines(summary), "", "## Targets (issue 19)", ""]
    t = summary["targets"]
    if not t.get("declared"):
        lines.append(f"- not declared in the scenario: {json.dumps(t)}")
    else:
        a, b = t["ewma_below_rr"], t["ewma_vs_tor"]
        lines.append(f"- EWMA at least {100 * a['needed']:.0f}% below rr in first-fetch set-up "
                     f"({t['statistic']}): **{_verdict(a['met'])}** — change {_neg_pct(a['reduction'])}")
        lines.append(f"- EWMA at most {b['needed']:g} of tor's first-fetch set-up ({t['statistic']}): "
                     f"**{_verdict(b['met'])}** — ratio {_fmt(b['ratio'], 3) or 'n/a'}")
    steps = ph.table_lines({label: e.get("phases_ms", {}) for label, e in summary["variants"].items()})
    if steps:
        lines += ["", "## Where the set-up goes (chive; median ms, from the onion client's log)", "",
                  "Set-up = descriptor fetch (when not cached) + join (the steps below, from the start of "
                  "the attempt that joined) + BEGIN/CONNECTED on the joined circuit.", "", *steps]
    errs = [f"{label}: {', '.join(e['error_texts'])}" for label, e in summary["variants"].items() if e["error_texts"]]
    if errs:
        lines += ["", "## Failed fetches (first three per variant)", "", *[f"- {x}" for x in errs]]
    (out / "comparison.md").write_text("\n".join(lines) + "\n")


def analyze(out_dir: Path, scenario: Any) -> an.Analysis:
    """``chive-lab analyze``: summary, figures (written by the report into OUT/figures), table,
    and OUT/paper001/comparison.md + summary.json."""
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    data = load_variants(out_dir, scenario)
    params = {k: v for k, v in p.__dict__.items() if k not in ("targets", "paper_numbers")}
    summary: dict[str, Any] = {"schema": 1, "kind": KIND_NAME, "units": {"time": "s"},
                               "params": {**params, "duration": scenario.duration, "warmup": scenario.warmup},
                               **summarize(data, p)}
    own = out_dir / "paper001"
    own.mkdir(parents=True, exist_ok=True)
    (own / "summary.json").write_text(json.dumps(summary, indent=2, default=list))
    write_comparison(own, summary)
    table = an.Table(title="onion-service fetches per variant (seconds)", columns=COLUMNS,
                     rows=table_rows(summary))
    return an.Analysis(summary=summary, figures=figures(data), tables=[table],
                       notes=["This kind's own files: paper001/comparison.md (the paper's numbers beside "
                              "ours, targets) and paper001/summary.json."])
