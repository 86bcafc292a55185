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
from .rundir import is_failed

__all__ = [
    "Analysis",
    "Figure",
    "ProgressSample",
    "RunData",
    "Series",
    "Table",
    "Transfer",
    "class_metrics",
    "discover_runs",
    "load_run",
    "parse_record",
    "queue_delays",
    "read_jsonl",
    "throughput_series",
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
    """A figure: its data is written to ``<name>.csv`` beside ``<name>.png`` (floats at
    6 significant digits, :func:`chive_lab.figures.csv_cell`)."""

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


def fmt(v: Any, nd: int = 3) -> Any:
    """A table cell: "" for None, a float with ``nd`` decimals, anything else as is."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return v


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


def discover_runs(out_dir: Path, variants: Sequence[str]) -> dict[str, list[tuple[int, Path]]]:
    """``runs/<variant>/<rep>`` directories that exist, per variant, in rep order
    (a repetition the runner recorded as failed, :func:`chive_lab.rundir.is_failed`, is left out)."""
    found: dict[str, list[tuple[int, Path]]] = {}
    for label in variants:
        base = out_dir / "runs" / label
        reps = []
        if base.is_dir():
            for p in base.iterdir():
                if p.is_dir() and p.name.isdigit() and not is_failed(p):
                    reps.append((int(p.name), p))
        found[label] = sorted(reps)
    return found


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
