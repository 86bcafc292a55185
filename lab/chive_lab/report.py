"""The report: ``report.html`` with PNG figures, one CSV per figure holding
exactly the plotted data, the tables, the paper's numbers beside ours, and
the manifest. Also ``compare`` (two experiment directories side by side).

Rendering is generic over :class:`chive_lab.analysis.Figure`, so every
experiment kind gets the same report by returning figures as data.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from .analysis import Analysis
from .errors import LabError
from .figures import write_csv, write_figure

__all__ = ["compare", "format_compare", "ours_metric", "paper_rows", "write_csv", "write_figure", "write_report"]

FIGURES_DIR = "figures"


# ---------------------------------------------------------------------------
# Paper numbers


def ours_metric(summary: Mapping[str, Any], metric: str, variant: str | None, cls: str | None,
                baseline: str | None = None) -> float | None:
    """Our value of a paper metric from summary.json (None when not available).

    ``<measure>_<stat>`` (measure ttfb/ttlb/ttfb_req/ttlb_req, stat
    p10..p90/mean/sd), ``goodput_bps``, ``aggregate_goodput_bps``, ``errors``,
    ``ks_statistic``, ``ks_pvalue``; a ``_change_pct`` suffix gives the change
    in percent against ``baseline`` (default: the first variant).
    """
    variants = summary.get("variants", {})
    order = summary.get("variants_order") or list(variants)
    if variant is None:
        variant = order[-1] if order else None
    if metric.endswith("_change_pct"):
        base_label = baseline or (order[0] if order else None)
        base = ours_metric(summary, metric.removesuffix("_change_pct"), base_label, cls)
        mine = ours_metric(summary, metric.removesuffix("_change_pct"), variant, cls)
        if base in (None, 0) or mine is None:
            return None
        return (mine - base) / base * 100.0
    entry = variants.get(variant, {})
    if cls is None:
        cls = next(iter(entry), None)
    m = entry.get(cls)
    if not isinstance(m, dict):
        return None
    if metric in ("goodput_bps", "aggregate_goodput_bps", "errors"):
        return m.get(metric)
    if metric == "ks_statistic":
        return m.get("ks_vs_first", {}).get("statistic")
    if metric == "ks_pvalue":
        return m.get("ks_vs_first", {}).get("pvalue")
    measure, _, stat = metric.rpartition("_")
    return m.get(measure, {}).get(stat)


def paper_rows(scenario: Any, summary: Mapping[str, Any]) -> list[list[Any]]:
    """Rows of the 'paper vs ours' table."""
    rows = []
    for p in scenario.paper:
        ours = ours_metric(summary, p.metric, p.variant, p.cls, p.baseline)
        paper = f"{p.value:g}" if p.value is not None else f"{p.low:g} .. {p.high:g}"
        inside = ""
        if ours is not None and p.low is not None and p.high is not None:
            inside = "yes" if p.low <= ours <= p.high else "no"
        rows.append([p.variant or "", p.cls or "", p.metric, paper,
                     "" if ours is None else f"{ours:.4g}", inside, p.note])
    return rows


# ---------------------------------------------------------------------------
# HTML


def _table_html(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], note: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r) + "</tr>" for r in rows)
    out = f"<h3>{html.escape(title)}</h3><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if note:
        out += f"<p class=note>{html.escape(note)}</p>"
    return out


_CSS = """
body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f0f0f0} td:first-child,th:first-child{text-align:left}
.note{color:#555;font-size:13px} figure{margin:1.5em 0} img{max-width:100%;border:1px solid #eee}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:12px}
"""


def _status_line(scenario: Any, status: Any) -> str:
    """The overlay kind's run description (warm-up + duration per repetition)."""
    return (
        f"<p>Status: <b>{html.escape(str(status))}</b>. Variants: "
        f"{html.escape(', '.join(v.label for v in scenario.variants))}; "
        f"{scenario.repetitions} repetition(s) of {scenario.warmup:g} s warm-up (discarded) + "
        f"{scenario.duration:g} s measured{' (--quick)' if scenario.quick else ''}; backend "
        f"{html.escape(scenario.backend)}, implementation {html.escape(scenario.impl)}.</p>"
    )


def write_report(out: Path, result: Analysis) -> Path:
    """Write OUT/report.html and OUT/figures/*.png|csv; return the HTML path."""
    from .kinds import get_kind
    from .manifest import load_manifest, scenario_of

    out = Path(out)
    scenario = scenario_of(out)
    manifest = load_manifest(out)
    fig_dir = out / FIGURES_DIR
    fig_dir.mkdir(exist_ok=True)
    for old in list(fig_dir.glob("*.png")) + list(fig_dir.glob("*.csv")):
        old.unlink()  # figures of an earlier analysis must not linger
    parts = [f"<!doctype html><meta charset=utf-8><title>{html.escape(scenario.name)}</title>",
             f"<style>{_CSS}</style>", f"<h1>{html.escape(scenario.name)}</h1>"]
    if scenario.description:
        parts.append(f"<p>{html.escape(scenario.description)}</p>")
    if scenario.reproduces:
        parts.append(f"<p><b>Reproduces:</b> {html.escape(scenario.reproduces)}</p>")
    status = manifest.get("status")
    described = get_kind(scenario.kind).describe_run(scenario)
    if described is not None:
        # The kind's own timeline (phases, a fixed paper timeline) replaces warm-up + duration.
        parts.append(f"<p>Status: <b>{html.escape(str(status))}</b>. {described}</p>")
    else:
        parts.append(_status_line(scenario, status))
    parts.append(
        "<p class=note>ttfb / ttlb: time to first / last byte measured from the start of the transfer "
        "(socket connect to the SOCKS port), as Tor Metrics and OnionPerf report them. ttfb_req / ttlb_req: "
        "measured from when the HTTP request was sent, as tornettools reports them. Transfers that started "
        "during the warm-up are discarded; transfers cut by the end of a run are <i>censored</i>, not errors.</p>"
    )
    for note in result.notes:
        parts.append(f"<p class=note>Note: {html.escape(note)}</p>")
    for w in _warnings(out):
        parts.append(f"<p class=note>Warning: {html.escape(w)}</p>")

    if scenario.paper:
        parts.append("<h2>Paper vs. ours</h2>")
        parts.append(_table_html(
            "paper numbers beside ours", ["variant", "class", "metric", "paper", "ours", "in range", "note"],
            paper_rows(scenario, result.summary),
            note="The papers measured the live Tor network or a 2010 testbed; absolute times differ "
                 "from a loopback network, so compare relative changes (*_change_pct) and test outcomes.",
        ))
    parts.append("<h2>Results</h2>")
    for t in result.tables:
        parts.append(_table_html(t.title, t.columns, t.rows, t.note))
    parts.append("<h2>Figures</h2>")
    for fig in result.figures:
        png, csv_path = write_figure(fig, fig_dir)
        parts.append(
            f"<figure><img src='{FIGURES_DIR}/{png.name}' alt='{html.escape(fig.title)}'>"
            f"<figcaption>{html.escape(fig.title)} — data: <a href='{FIGURES_DIR}/{csv_path.name}'>"
            f"{csv_path.name}</a>{'. ' + html.escape(fig.note) if fig.note else ''}</figcaption></figure>"
        )
    if not result.figures:
        parts.append("<p>No data to plot.</p>")
    parts.append("<h2>Manifest</h2>")
    parts.append(f"<pre>{html.escape(json.dumps(manifest, indent=2))}</pre>")
    parts.append("<p class=note>Raw data: runs/&lt;variant&gt;/&lt;rep&gt;/ (clients/*.jsonl, logs/, net/, "
                 "run.json); summary.json (schema in docs/summary-schema.md).</p>")
    path = out / "report.html"
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


def _warnings(out: Path) -> list[str]:
    seen: list[str] = []
    for run_json in sorted(out.glob("runs/*/*/run.json")):
        try:
            meta = json.loads(run_json.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(meta, dict):
            continue
        for w in meta.get("warnings", []) or []:
            if isinstance(w, str) and w not in seen:
                seen.append(w)
        st = meta.get("status")
        if isinstance(st, str) and st not in ("ok",):
            msg = f"{run_json.parent.relative_to(out)}: {st}"
            if msg not in seen:
                seen.append(msg)
    return seen[:50]


# ---------------------------------------------------------------------------
# compare


def _load_summary(d: Path) -> dict[str, Any]:
    try:
        obj = json.loads((Path(d) / "summary.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LabError(f"{d}: no readable summary.json ({e}); run `chive-lab analyze {d}` first") from e
    if not isinstance(obj, dict) or obj.get("schema") != 1 or not isinstance(obj.get("variants"), dict):
        raise LabError(f"{d}/summary.json is not a schema-1 summary")
    return obj


def compare(dir1: Path, dir2: Path) -> list[list[Any]]:
    """Rows (class, variant, measure, stat, value 1, value 2, change %) for
    every class/variant present in both summaries, ttlb and ttfb p50/p75."""
    a, b = _load_summary(dir1), _load_summary(dir2)
    rows = []
    for label, classes in a["variants"].items():
        other = b["variants"].get(label)
        if not isinstance(other, dict) or not isinstance(classes, dict):
            continue
        for cls, m in classes.items():
            n = other.get(cls)
            if not isinstance(n, dict) or not isinstance(m, dict):
                continue
            for measure in ("ttlb", "ttfb"):
                for stat in ("p50", "p75"):
                    v1 = (m.get(measure) or {}).get(stat)
                    v2 = (n.get(measure) or {}).get(stat)
                    change = None
                    if isinstance(v1, (int, float)) and isinstance(v2, (int, float)) and v1:
                        change = (v2 - v1) / v1 * 100.0
                    rows.append([cls, label, measure, stat, v1, v2, change])
    return rows


def format_compare(rows: Sequence[Sequence[Any]], name1: str, name2: str) -> str:
    """A plain-text table of :func:`compare` rows."""
    header = ["class", "variant", "metric", name1, name2, "change"]
    body = []
    for cls, label, measure, stat, v1, v2, change in rows:
        body.append([cls, label, f"{measure} {stat}",
                     "-" if v1 is None else f"{v1:.3f}", "-" if v2 is None else f"{v2:.3f}",
                     "-" if change is None else f"{change:+.1f}%"])
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in body]
    if not body:
        lines.append("(no class/variant in common)")
    return "\n".join(lines)
