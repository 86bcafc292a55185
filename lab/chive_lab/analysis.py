"""Analysis of an experiment directory: raw records in, ``summary.json`` and
figure/table data out.

Reading (tolerant: a missing key takes a default, a malformed line is
counted and skipped) and computing are separate: :func:`load_transfers` and
friends read files, everything else is a pure function over
:class:`Transfer` / :class:`ProgressSample` lists, unit-tested on synthetic data.

Time metrics (seconds), per transfer:

* ``ttfb`` = first_byte - start, ``ttlb`` = last_byte - start: measured from
  the moment the client began (socket connect to the SOCKS port), as Tor
  Metrics / OnionPerf report them; they include circuit and stream setup.
* ``ttfb_req`` = first_byte - request_sent, ``ttlb_req`` = last_byte -
  request_sent: measured from the end of the HTTP request, as tornettools
  reports them; they exclude SOCKS/stream setup.

A transfer counts when it started inside the measurement window
[t0 + warmup, t0 + warmup + duration]. Inside it, a transfer is *ok* (no
error, last byte seen), *censored* (cut by the end of the run: error
"interrupted", or no record end) or an *error*.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from . import stats

__all__ = [
    "Analysis",
    "Figure",
    "ProgressSample",
    "RunData",
    "Series",
    "Table",
    "Transfer",
    "analyze_overlay",
    "class_metrics",
    "load_run",
    "parse_record",
    "queue_delays",
    "read_jsonl",
    "throughput_series",
    "tor_section",
    "window_goodput",
]

SUMMARY_SCHEMA = 1
MEASURES = ("ttfb", "ttlb", "ttfb_req", "ttlb_req")
# A line longer than this is not one of ours (perf lines are < 2 KiB).
MAX_LINE_BYTES = 1 << 20
# Bound on lines read per file (a week of 1 s progress records from 64 loops fits).
MAX_LINES_PER_FILE = 5_000_000
CENSOR_ERRORS = ("interrupted", "cut at deadline")


# ---------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class Transfer:
    """One transfer record of ``chive perf`` (older perf versions: missing keys default)."""

    cls: str
    start: float
    socket_connected: float | None = None
    socks_connected: float | None = None
    request_sent: float | None = None
    first_byte: float | None = None
    last_byte: float | None = None
    bytes: int = 0
    expected_bytes: int | None = None
    status: int | None = None
    error: str | None = None
    loop: int = 0
    seq: int | None = None
    client: str = ""
    """Which perf process (file stem) wrote it."""
    partials: Mapping[str, float | None] = field(default_factory=dict)

    @property
    def censored(self) -> bool:
        """Cut short by the end of the run rather than failed."""
        return self.error is not None and any(w in self.error.lower() for w in CENSOR_ERRORS)

    @property
    def ok(self) -> bool:
        """Completed without error (HTTP 2xx when a status is known)."""
        if self.error is not None or self.last_byte is None:
            return False
        return self.status is None or 200 <= self.status < 300

    def metric(self, name: str) -> float | None:
        """ttfb / ttlb / ttfb_req / ttlb_req in seconds, None if not reached."""
        end = self.first_byte if name.startswith("ttfb") else self.last_byte
        begin = self.request_sent if name.endswith("_req") else self.start
        if end is None or begin is None:
            return None
        return end - begin

    @property
    def goodput(self) -> float | None:
        """Bytes per second from start to last byte (None if not ok or zero time)."""
        ttlb = self.metric("ttlb")
        if not self.ok or ttlb is None or ttlb <= 0:
            return None
        return self.bytes / ttlb


@dataclass(frozen=True)
class ProgressSample:
    """A progress record: cumulative body bytes of one transfer at time t."""

    cls: str
    loop: int
    transfer: int | None
    t: float
    bytes: int
    client: str = ""


def _opt_float(obj: Mapping[str, Any], key: str) -> float | None:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _opt_int(obj: Mapping[str, Any], key: str) -> int | None:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v


def parse_record(obj: Any, default_class: str, client: str = "") -> Transfer | ProgressSample | None:
    """One JSON object from perf's stdout as a Transfer or ProgressSample;
    None if it is neither (unknown type, no start time)."""
    if not isinstance(obj, dict):
        return None
    kind = obj.get("type", "transfer")
    cls = obj.get("class")
    cls = cls if isinstance(cls, str) and cls else default_class
    if kind == "progress":
        t = _opt_float(obj, "t")
        b = _opt_int(obj, "bytes")
        if t is None or b is None:
            return None
        return ProgressSample(cls=cls, loop=_opt_int(obj, "loop") or 0, transfer=_opt_int(obj, "transfer"),
                              t=t, bytes=b, client=client)
    if kind != "transfer":
        return None
    start = _opt_float(obj, "start")
    if start is None:
        return None
    err = obj.get("error")
    partials_raw = obj.get("partials")
    partials = {}
    if isinstance(partials_raw, dict):
        for k, v in list(partials_raw.items())[:64]:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                partials[str(k)] = float(v)
            else:
                partials[str(k)] = None
    return Transfer(
        cls=cls,
        start=start,
        socket_connected=_opt_float(obj, "socket_connected"),
        socks_connected=_opt_float(obj, "socks_connected"),
        request_sent=_opt_float(obj, "request_sent"),
        first_byte=_opt_float(obj, "first_byte"),
        last_byte=_opt_float(obj, "last_byte"),
        bytes=_opt_int(obj, "bytes") or 0,
        expected_bytes=_opt_int(obj, "expected_bytes"),
        status=_opt_int(obj, "status"),
        error=None if err is None else str(err)[:500],
        loop=_opt_int(obj, "loop") or 0,
        seq=_opt_int(obj, "seq"),
        client=client,
        partials=partials,
    )


def read_jsonl(path: Path) -> Iterator[Any]:
    """JSON values of a JSON-lines file; malformed or over-long lines are
    skipped (yielded as None so callers can count them)."""
    try:
        f = open(path, "rb")
    except OSError:
        return
    with f:
        for i, line in enumerate(f):
            if i >= MAX_LINES_PER_FILE:
                break
            if len(line) > MAX_LINE_BYTES:
                yield None
                continue
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                yield None


@dataclass
class RunData:
    """What one repetition of one variant collected."""

    variant: str
    rep: int
    t0: float | None
    """When the clients started (UNIX seconds), from run.json."""
    warmup: float
    duration: float
    transfers: list[Transfer] = field(default_factory=list)
    progress: list[ProgressSample] = field(default_factory=list)
    cells: list[tuple[float, float | None, float | None]] = field(default_factory=list)
    """Relay metrics samples (queued, dequeued, written)."""
    bad_lines: int = 0
    status: str = "unknown"

    @property
    def window(self) -> tuple[float, float]:
        """Measurement window [t0 + warmup, t0 + warmup + duration]."""
        if self.t0 is None:
            starts = [t.start for t in self.transfers]
            t0 = min(starts) if starts else 0.0
        else:
            t0 = self.t0
        return t0 + self.warmup, t0 + self.warmup + self.duration

    def measured(self, cls: str | None = None) -> list[Transfer]:
        """Transfers that started inside the window (optionally of one class)."""
        lo, hi = self.window
        return [t for t in self.transfers if lo <= t.start <= hi and (cls is None or t.cls == cls)]


def load_run(run_dir: Path, variant: str, rep: int, warmup: float, duration: float) -> RunData:
    """Read one repetition's directory: run.json, clients/*.jsonl and any relay
    metrics JSON lines under net/ or metrics/."""
    meta: dict[str, Any] = {}
    try:
        meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            meta = {}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        meta = {}
    t0 = _opt_float(meta, "t0")
    data = RunData(variant=variant, rep=rep, t0=t0, warmup=warmup, duration=duration,
                   status=str(meta.get("status", "unknown")))
    for path in sorted((run_dir / "clients").glob("*.jsonl")):
        default_class = path.stem.rsplit("-", 1)[0]
        for obj in read_jsonl(path):
            rec = parse_record(obj, default_class, client=path.stem)
            if rec is None:
                if obj is None or not isinstance(obj, dict):
                    data.bad_lines += 1
                continue
            if isinstance(rec, Transfer):
                data.transfers.append(rec)
            else:
                data.progress.append(rec)
    for path in _metrics_files(run_dir):
        for obj in read_jsonl(path):
            if isinstance(obj, dict) and obj.get("type") == "cell":
                q = _opt_float(obj, "queued")
                if q is not None:
                    data.cells.append((q, _opt_float(obj, "dequeued"), _opt_float(obj, "written")))
    return data


def _metrics_files(run_dir: Path) -> list[Path]:
    found = []
    for base in (run_dir / "metrics", run_dir / "net"):
        if base.is_dir():
            found.extend(p for p in base.rglob("*.jsonl") if p.is_file())
    return sorted(set(found))


# ---------------------------------------------------------------------------
# Figures and tables as data (rendered by chive_lab.report; any experiment kind can produce them)


@dataclass
class Series:
    """One plotted line. ``style``: ``step`` (a CDF), ``line``, ``points`` or ``hline`` (y[0] across)."""

    label: str
    x: list[float]
    y: list[float]
    lo: list[float] | None = None
    hi: list[float] | None = None
    style: str = "line"


@dataclass
class Figure:
    """A figure: its data is written verbatim to ``<name>.csv`` beside ``<name>.png``."""

    name: str
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    xscale: str = "linear"
    note: str = ""
    """Shown under the figure (how the band was computed, etc.)."""
    xticks: list[tuple[float, str]] | None = None


@dataclass
class Table:
    """A table in the report."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    note: str = ""


@dataclass
class Analysis:
    """Output of a kind's ``analyze``: the summary plus what the report shows."""

    summary: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------
# Pure computations


def _round(v: float | None, nd: int = 6) -> float | None:
    return None if v is None else round(float(v), nd)


def class_metrics(runs: Sequence[RunData], cls: str) -> dict[str, Any]:
    """Summary of one class over the repetitions of one variant (pooled).

    ``goodput_bps`` is the median per-transfer goodput in **bytes** per second
    (bytes / ttlb); ``aggregate_goodput_bps`` is the class's successfully
    transferred bytes per second of measurement window, averaged over
    repetitions; ``errors`` counts failed transfers (censored ones excluded).
    """
    measured = [t for r in runs for t in r.measured(cls)]
    ok = [t for t in measured if t.ok]
    out: dict[str, Any] = {}
    for m in MEASURES:
        s = stats.summarize(t.metric(m) for t in ok)
        out[m] = {k: (_round(v) if k != "n" else v) for k, v in s.items()}
    goodputs = [g for g in (t.goodput for t in ok) if g is not None]
    out["goodput_bps"] = _round(float(np.median(goodputs)), 1) if goodputs else None
    aggregates = []
    for r in runs:
        lo, hi = r.window
        if hi > lo:
            aggregates.append(sum(t.bytes for t in r.measured(cls) if t.ok) / (hi - lo))
    out["aggregate_goodput_bps"] = _round(float(np.mean(aggregates)), 1) if aggregates else None
    out["transfers"] = len(ok)
    out["errors"] = sum(1 for t in measured if not t.ok and not t.censored)
    out["censored"] = sum(1 for t in measured if t.censored)
    per_rep = []
    for r in runs:
        vals = [t.metric("ttlb") for t in r.measured(cls) if t.ok]
        per_rep.append(_round(float(np.median(vals))) if vals else None)
    out["ttlb_p50_per_repetition"] = per_rep
    ci = stats.mean_ci([v for v in per_rep if v is not None])
    out["ttlb_p50_ci95"] = None if ci is None else [_round(ci[1]), _round(ci[2])]
    return out


def samples(runs: Sequence[RunData], cls: str, measure: str = "ttlb") -> list[list[float]]:
    """Per repetition, the ``measure`` of every ok measured transfer of ``cls``."""
    return [[v for v in (t.metric(measure) for t in r.measured(cls) if t.ok) if v is not None] for r in runs]


def throughput_series(run: RunData, cls: str, bin_s: float = 1.0) -> np.ndarray:
    """Bytes/s of class ``cls`` in 1 s bins over the whole run (warm-up
    included, so the plot shows it), from each transfer's progress records
    together with its start / first byte / partial / last-byte times (short
    transfers may have no progress record at all)."""
    lo, hi = run.window
    t0 = lo - run.warmup
    by_transfer: dict[tuple[str, int, Any], list[tuple[float, float]]] = {}
    for p in run.progress:
        if p.cls == cls:
            by_transfer.setdefault((p.client, p.loop, p.transfer), []).append((p.t, float(p.bytes)))
    for i, t in enumerate(x for x in run.transfers if x.cls == cls):
        key = (t.client, t.loop, t.seq if t.seq is not None else f"#{i}")
        pts = by_transfer.setdefault(key, [])
        pts.append((t.start, 0.0))
        if t.first_byte is not None:
            pts.append((t.first_byte, 0.0))
        for size, when in t.partials.items():
            if when is not None and size.isdigit():
                pts.append((when, float(size)))
        if t.last_byte is not None:
            pts.append((t.last_byte, float(t.bytes)))
    return stats.binned_rate(by_transfer.values(), t0, hi, bin_s)


def queue_delays(runs: Sequence[RunData]) -> dict[str, Any] | None:
    """Relay queue time (dequeued - queued) and outbuf time (written -
    dequeued) percentiles over all cell samples; None if there are none."""
    queue = [d - q for r in runs for q, d, _w in r.cells if d is not None and d >= q]
    outbuf = [w - d for r in runs for _q, d, w in r.cells if d is not None and w is not None and w >= d]
    if not queue and not outbuf:
        return None
    return {"queue": stats.summarize(queue), "outbuf": stats.summarize(outbuf)}


# ---------------------------------------------------------------------------
# Directory-level analysis of the overlay kind


def discover_runs(out_dir: Path, variants: Sequence[str]) -> dict[str, list[tuple[int, Path]]]:
    """``runs/<variant>/<rep>`` directories that exist, per variant, in rep order."""
    found: dict[str, list[tuple[int, Path]]] = {}
    for label in variants:
        base = out_dir / "runs" / label
        reps = []
        if base.is_dir():
            for p in base.iterdir():
                if p.is_dir() and p.name.isdigit():
                    reps.append((int(p.name), p))
        found[label] = sorted(reps)
    return found


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


def _fmt(v: Any, nd: int = 3) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return v


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


# ---------------------------------------------------------------------------
# Goodput of continuous downloads over a time window (the idle-vs-load kind)


def window_goodput(progress: Iterable[ProgressSample], lo: float, hi: float) -> float | None:
    """Bytes/s that the transfers behind ``progress`` received in ``[lo, hi]``.

    Each transfer (client, loop, transfer id) has cumulative byte counts over
    time; its bytes in the window are its count at ``hi`` minus its count at
    ``lo``, each linearly interpolated between the samples around it (0 before
    its first sample, its last count after its last sample). None when the
    window is empty or there are no samples."""
    if not hi > lo:
        return None
    curves: dict[tuple[str, int, Any], list[tuple[float, float]]] = {}
    for p in progress:
        curves.setdefault((p.client, p.loop, p.transfer), []).append((p.t, float(p.bytes)))
    if not curves:
        return None

    def at(pts: list[tuple[float, float]], t: float) -> float:
        if t <= pts[0][0]:
            # Before the first sample: the transfer had not counted anything we know of.
            return 0.0 if t < pts[0][0] else pts[0][1]
        for (t1, b1), (t2, b2) in zip(pts, pts[1:]):
            if t1 <= t <= t2:
                return b1 if t2 == t1 else b1 + (b2 - b1) * (t - t1) / (t2 - t1)
        return pts[-1][1]

    total = 0.0
    for pts in curves.values():
        pts.sort()
        total += max(0.0, at(pts, hi) - at(pts, lo))
    return total / (hi - lo)


# ---------------------------------------------------------------------------
# Tor's side of a run: options without a Tor equivalent, Tor's own metrics


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
    (written by :func:`chive_lab.runner.collect_tor_step`, one entry per network
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
