"""Paper 002 (Marks, Tschorsch, Scheuermann), plain-TCP reproduction.

Hosts A, B, C on 10 Mbit/s full-duplex links to one switch (netns backend).
A→B bulk from 0 to 250 s, B→C bulk from 50 to 300 s (times × ``scale``;
``--quick`` uses 0.2). Variants (paper figure in brackets):

* ``uni``            one connection per pair, one direction each  (Figs 2a, 3)
* ``uni-ackprio``    the same with ``chive shape`` on B            (Fig 5)
* ``bidir``          one connection per pair, data both ways       (Fig 6)
* ``bidir-ackprio``  the same with ACK prioritisation              (Fig 7)
* ``split``          two one-direction connections per pair        (extra)
* ``split-ackprio``  the same with ACK prioritisation              (Fig 8)

Per run: application bytes per second per flow from :mod:`chive_lab.tcpbulk`.
Analysis: multi-run means over 10 s slots with 90% confidence intervals, one
representative run, mean goodput per flow while both pairs are active, and the
variance of the 1 s throughput samples of the flows towards B between 100 and
250 s (Fig 9). Output in ``--out``: ``throughput_<variant>.png/.csv``,
``variance.png/.csv``, ``summary.json`` (schema 1), ``comparison.md``,
``runs/<variant>-<i>/*.json`` and ``manifest.json``.

Standalone: ``python -m chive_lab.experiments.paper002 --quick --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import LabError
from ..kinds import ExperimentKind
from .. import netns

KIND_NAME = "paper002-tcp"

#: Paper timeline in seconds (scaled by ``scale``).
AB_START, AB_STOP, BC_START, BC_STOP = 0.0, 250.0, 50.0, 300.0
OVERLAP = (50.0, 250.0)  # both pairs active: mean goodput
VAR_WINDOW = (100.0, 250.0)  # Fig 9
SLOT = 10.0  # Fig 3 averaging slot

VARIANTS: dict[str, dict] = {
    "uni": {"mode": "uni", "ackprio": False, "fig": "2a, 3"},
    "uni-ackprio": {"mode": "uni", "ackprio": True, "fig": "5"},
    "bidir": {"mode": "bidir", "ackprio": False, "fig": "6"},
    "bidir-ackprio": {"mode": "bidir", "ackprio": True, "fig": "7"},
    "split": {"mode": "split", "ackprio": False, "fig": "-"},
    "split-ackprio": {"mode": "split", "ackprio": True, "fig": "8"},
    # `chive shape --bulk-ceil 0.95`: B's data class may borrow the idle ACK-class rate up to
    # the 95% root. The check that borrowing keeps the paper's Fig 5 result (A->B near solo).
    "uni-ackprio-borrow": {"mode": "uni", "ackprio": True, "fig": "5", "shape": {"bulk_ceil": 0.95}},
    "split-ackprio-borrow": {"mode": "split", "ackprio": True, "fig": "8", "shape": {"bulk_ceil": 0.95}},
}

#: What the paper reports (text of Secs III-V; the figures have no tables).
PAPER = {
    "uni": "A->B alone: slightly < 10 Mbit/s; drops by ~1/3 once B->C starts, oscillating (Figs 2a, 3)",
    "uni-ackprio": "both flows close to optimal and stable (Fig 5)",
    "bidir": "towards B ~200 kB/s (1.6 Mbit/s) with high variation (Fig 6)",
    "bidir-ackprio": "each flow ~half of a single connection (fair, near-full use) but strong "
                     "oscillations and multi-second breakdowns in single runs (Fig 7)",
    "split": "(not measured in the paper)",
    "split-ackprio": "about half each, much steadier, no multi-second breakdowns (Fig 8)",
    "uni-ackprio-borrow": "(the paper caps the data class at 90%)",
    "split-ackprio-borrow": "(the paper caps the data class at 90%)",
}
PAPER_VARIANCE = ("Fig 9: variance of towards-B throughput, 100-250 s: bidir (no ACK prio) "
                  "highest, ACK prio lower, split + ACK prio lowest (no numbers in the text)")


@dataclass
class Conn:
    """One TCP connection: ``client`` connects to ``server``."""

    client: str
    server: str
    start: float
    stop: float
    client_sends: bool
    server_sends: bool


@dataclass
class Params:
    """Parameters of one experiment (scenario-level)."""

    rate: str = "10mbit"
    scale: float = 1.0
    cc: str = "cubic"
    queue_packets: int = 1000
    queue_at: str = "switch"
    ackprio_hosts: tuple[str, ...] = ("B",)
    delay_ms: float = 0.0
    #: The switch's port buffer towards each host (None: queue_packets), see netns.LinkSpec.
    switch_port_packets: int | None = None

    def t(self, seconds: float) -> float:
        """A paper time scaled."""
        return seconds * self.scale


def connections(mode: str, p: Params) -> list[Conn]:
    """The connections of a variant mode."""
    ab = (p.t(AB_START), p.t(AB_STOP))
    bc = (p.t(BC_START), p.t(BC_STOP))
    if mode == "uni":
        return [Conn("A", "B", *ab, True, False), Conn("B", "C", *bc, True, False)]
    if mode == "bidir":
        return [Conn("A", "B", *ab, True, True), Conn("B", "C", *bc, True, True)]
    if mode == "split":
        return [Conn("A", "B", *ab, True, False), Conn("B", "A", *ab, True, False),
                Conn("B", "C", *bc, True, False), Conn("C", "B", *bc, True, False)]
    raise LabError(f"unknown mode {mode!r}")


def towards_b(mode: str) -> list[str]:
    """The flows the paper plots: data arriving at B."""
    return ["A->B"] if mode == "uni" else ["A->B", "C->B"]


# ----------------------------------------------------------------- running
def run_repetition_raw(variant: str, rep: int, out_dir: Path, p: Params, *,
                   chive_bin: Path | None = None, progress: Callable[[str], None] | None = None,
                   stop: threading.Event | None = None, live: list | None = None) -> dict[str, list[float]]:
    """Run one repetition of ``variant``; return ``{flow: [bit/s per second]}``
    and keep the raw tcpbulk records in ``out_dir``."""
    v = VARIANTS[variant]
    out_dir.mkdir(parents=True, exist_ok=True)
    link = netns.LinkSpec(p.rate, delay_ms=p.delay_ms, queue_packets=p.queue_packets, queue_at=p.queue_at,
                          switch_port_packets=p.switch_port_packets)
    hosts = [netns.HostSpec(n, link, cc=p.cc) for n in ("A", "B", "C")]
    conns = connections(v["mode"], p)
    end = max(c.stop for c in conns)
    py = sys.executable
    tb = netns.Testbed(hosts, chive_bin=chive_bin, progress=progress)
    if live is not None:
        live.append(tb)
    try:
        tb.up()
        shape_cmds: list[str] = []
        if v["ackprio"]:
            for h in p.ackprio_hosts:
                shape_cmds = tb.set_ack_priority(h, bulk_ceil=v.get("shape", {}).get("bulk_ceil"))
        (out_dir / "shape.txt").write_text("\n".join(shape_cmds) + "\n")
        t0 = time.time() + 1.5
        procs = []
        for i, c in enumerate(conns):
            port = 5001 + i
            lf, cf = out_dir / f"conn{i}-{c.server}.json", out_dir / f"conn{i}-{c.client}.json"
            la = [py, "-m", "chive_lab.tcpbulk", "listen", "--bind", f"{tb.addr(c.server)}:{port}",
                  "--t0", str(t0), "--stop-at", str(t0 + c.stop), "--cc", p.cc, "--out", str(lf)]
            if c.server_sends:
                la.append("--send")
            lp = tb.popen(c.server, la, stdout=subprocess.PIPE, text=True, cwd=_lab_dir())
            if lp.stdout is None or lp.stdout.readline().strip() != "ready":
                raise LabError(f"tcpbulk listener on {c.server} did not start")
            ca = [py, "-m", "chive_lab.tcpbulk", "connect", "--to", f"{tb.addr(c.server)}:{port}",
                  "--t0", str(t0), "--start-at", str(t0 + c.start), "--stop-at", str(t0 + c.stop),
                  "--cc", p.cc, "--out", str(cf)]
            if c.client_sends:
                ca.append("--send")
            procs.append(tb.popen(c.client, ca, cwd=_lab_dir()))
            procs.append(lp)
        deadline = t0 + end + netns_grace()
        for pr in procs:
            while pr.poll() is None:
                if (stop is not None and stop.is_set()) or time.time() > deadline:
                    raise LabError("run interrupted or overran its deadline")
                time.sleep(0.2)
        (out_dir / "qdisc-B.txt").write_text(tb.qdisc_stats("B"))
    finally:
        tb.down()
        if live is not None and tb in live:
            live.remove(tb)
    return collect_flows(out_dir, conns, math.ceil(end))


def netns_grace() -> float:
    """Seconds a run may take beyond its timeline (tcpbulk's own grace + margin)."""
    return 25.0


def _lab_dir() -> str:
    return str(Path(__file__).resolve().parents[2])


def collect_flows(out_dir: Path, conns: list[Conn], seconds: int) -> dict[str, list[float]]:
    """Per flow ``X->Y``: received application bit/s per second 0..seconds-1."""
    flows: dict[str, list[float]] = {}
    for i, c in enumerate(conns):
        for receiver, sender, path in ((c.server, c.client, out_dir / f"conn{i}-{c.server}.json"),
                                       (c.client, c.server, out_dir / f"conn{i}-{c.client}.json")):
            sends = c.client_sends if sender == c.client else c.server_sends
            if not sends:
                continue
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise LabError(f"missing or bad tcpbulk record {path}: {e}") from e
            series = [0.0] * seconds
            for k, b in rec.get("rx", {}).items():
                sec = int(k)
                if 0 <= sec < seconds:
                    series[sec] += 8.0 * float(b)
            name = f"{sender}->{receiver}"
            prev = flows.get(name)
            flows[name] = series if prev is None else [a + b for a, b in zip(prev, series)]
    return flows


# ---------------------------------------------------------------- analysis
def _t90(n: int) -> float:
    """Two-sided 90% Student t quantile for n samples (n-1 dof)."""
    try:
        from scipy import stats

        return float(stats.t.ppf(0.95, n - 1))
    except ImportError:  # normal approximation
        return 1.645


def _window(series: list[float], lo: float, hi: float) -> list[float]:
    return series[int(math.floor(lo)):int(math.ceil(hi))]


def _slot_means(series: list[float], lo: float, hi: float, slot: float) -> list[float]:
    """Means of the 1 s samples of ``series`` in [lo, hi) over consecutive ``slot``-second
    slots (the paper's Fig 9 samples are 10 s slots); a partial last slot is left out."""
    n = max(1, int(round(slot)))
    xs = _window(series, lo, hi)
    return [_mean(xs[i:i + n]) for i in range(0, len(xs) - n + 1, n)]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _var(xs: list[float]) -> float:
    if len(xs) < 2:
        return float("nan")
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def analyze_raw(results: dict[str, list[dict[str, list[float]]]], p: Params, out: Path) -> dict:
    """Write figures, CSVs, summary.json and comparison.md; return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    slot = SLOT * p.scale
    ov = (p.t(OVERLAP[0]), p.t(OVERLAP[1]))
    vw = (p.t(VAR_WINDOW[0]), p.t(VAR_WINDOW[1]))
    summary: dict = {"schema": 1, "kind": KIND_NAME, "units": {"goodput_bps": "bit/s",
                                                          "variance": "(bit/s)^2"},
                     "params": {"rate": p.rate, "scale": p.scale, "cc": p.cc,
                                "queue_packets": p.queue_packets, "queue_at": p.queue_at,
                                "switch_port_packets": p.switch_port_packets,
                                "ackprio_hosts": list(p.ackprio_hosts),
                                "goodput_window_s": list(ov), "variance_window_s": list(vw)},
                     "variants": {}, "extra": {}}
    var_rows = []
    for variant, runs in results.items():
        if not runs:
            continue
        mode = VARIANTS[variant]["mode"]
        flows = sorted(runs[0])
        vs: dict = {}
        extra: dict = {"runs": len(runs)}
        for f in flows:
            per_run = [_mean(_window(r[f], *ov)) for r in runs]
            samples = [x for r in runs for x in _window(r[f], *vw)]
            vs[f] = {"goodput_bps": _mean(per_run), "variance": _var(samples)}
            if f == "A->B":
                solo = [_mean(_window(r[f], p.t(10), p.t(50))) for r in runs]
                vs[f]["solo_goodput_bps"] = _mean(solo)
                vs[f]["ratio_to_solo"] = _mean(per_run) / _mean(solo) if _mean(solo) else None
            if f == "B->C" and mode == "uni":
                solo = [_mean(_window(r[f], p.t(260), p.t(300))) for r in runs]
                vs[f]["solo_goodput_bps"] = _mean(solo)
        pooled = [x for r in runs for f in towards_b(mode) for x in _window(r[f], *vw)]
        extra["towards_b_variance"] = _var(pooled)
        # The paper's Fig 9 samples: 10 s slot means (scaled with the timeline), pooled over
        # the flows towards B and all runs; per run too, to show how much runs differ.
        slots = [x for r in runs for f in towards_b(mode) for x in _slot_means(r[f], *vw, slot)]
        extra["towards_b_variance_slots"] = _var(slots)
        extra["towards_b_variance_slots_per_run"] = [
            _var([x for f in towards_b(mode) for x in _slot_means(r[f], *vw, slot)]) for r in runs]
        extra["variance_slot_s"] = slot
        var_rows.append((variant, _var(pooled), len(pooled),
                         _mean([vs[f]["goodput_bps"] for f in towards_b(mode)]), _var(slots)))
        summary["variants"][variant] = vs
        summary["extra"][variant] = extra
        _write_variant(out, variant, runs, slot, p)
    _write_variance(out, var_rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    _write_comparison(out, summary, var_rows)
    return summary


def _slot_stats(runs: list[dict[str, list[float]]], flow: str, slot: float, end: int):
    rows = []
    n_slots = int(math.ceil(end / slot))
    for k in range(n_slots):
        lo, hi = k * slot, min((k + 1) * slot, end)
        vals = [_mean(_window(r[flow], lo, hi)) for r in runs]
        m = _mean(vals)
        half = (_t90(len(vals)) * math.sqrt(_var(vals) / len(vals))) if len(vals) > 1 else float("nan")
        rows.append((lo, hi, m, half, len(vals)))
    return rows


def representative(runs: list[dict[str, list[float]]], flow: str, lo: float, hi: float) -> int:
    """Index of the run whose mean of ``flow`` in [lo, hi) is closest to the median."""
    means = [_mean(_window(r[flow], lo, hi)) for r in runs]
    med = sorted(means)[len(means) // 2]
    return min(range(len(runs)), key=lambda i: abs(means[i] - med))


def _write_variant(out: Path, variant: str, runs, slot: float, p: Params) -> None:
    flows = sorted(runs[0])
    write_throughput(out, variant, runs, slot, p, flows, flows,
                     f"{variant}: mean over {len(runs)} run(s), {slot:g} s slots, 90% CI "
                     f"(paper Fig {VARIANTS[variant]['fig']})")


def write_throughput(out: Path, variant: str, runs, slot: float, p: Params, csv_flows, plot_flows,
                     title: str, hline: tuple[float, str] | None = None, rep_flow: str = "A->B",
                     rep_window: tuple[float, float] | None = None) -> None:
    """throughput_<variant>.csv (every 1 s sample of every run), throughput_avg_<variant>.csv
    (slot means with 90% CIs across runs) and throughput_<variant>.png (those means, and the
    representative run's 1 s samples: the median run of ``rep_flow`` over ``rep_window``, by
    default the paper's overlap); `hline` = (bytes/s, label) draws a reference line."""
    end = len(runs[0][csv_flows[0]])
    with (out / f"throughput_{variant}.csv").open("w") as fh:
        fh.write("run,second,flow,throughput_bps\n")
        for i, r in enumerate(runs):
            for f in csv_flows:
                for s, v in enumerate(r[f]):
                    fh.write(f"{i},{s},{f},{v:.0f}\n")
    stats = {f: _slot_stats(runs, f, slot, end) for f in csv_flows}
    with (out / f"throughput_avg_{variant}.csv").open("w") as fh:
        fh.write("slot_start,slot_end,flow,mean_bps,ci90_half_bps,runs\n")
        for f in csv_flows:
            for lo, hi, m, half, n in stats[f]:
                fh.write(f"{lo:g},{hi:g},{f},{m:.0f},{half:.0f},{n}\n")
    rep = representative(runs, rep_flow, *(rep_window or (p.t(OVERLAP[0]), p.t(OVERLAP[1]))))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for f in plot_flows:
        xs = [(lo + hi) / 2 for lo, hi, *_ in stats[f]]
        ms = [m / 8000 for _, _, m, _, _ in stats[f]]
        hs = [0 if math.isnan(h) else h / 8000 for *_, h, _ in stats[f]]
        ax1.errorbar(xs, ms, yerr=hs, capsize=2, marker="o", ms=3, label=f)
        ax2.plot(range(end), [v / 8000 for v in runs[rep][f]], lw=0.8, label=f)
    if hline is not None:
        ax1.axhline(hline[0] / 8000, color="gray", lw=0.6, ls="--", label=hline[1])
    ax1.set_title(title, fontsize=9)
    ax2.set_title(f"representative run #{rep}, 1 s samples", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_ylabel("throughput [kB/s]")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax2.set_xlabel("time [s]")
    fig.tight_layout()
    fig.savefig(out / f"throughput_{variant}.png", dpi=110)
    plt.close(fig)


def _write_variance(out: Path, rows) -> None:
    with (out / "variance.csv").open("w") as fh:
        fh.write("variant,variance_bps2,variance_kBps2,samples,mean_towards_b_bps,slot_variance_kBps2\n")
        for v, var, n, m, slot_var in rows:
            fh.write(f"{v},{var:.6g},{var / 64e6:.6g},{n},{m:.0f},{slot_var / 64e6:.6g}\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r[0] for r in rows]
    xs = list(range(len(rows)))
    for offset, col, colour, label in ((-0.2, 1, "tab:gray", "1 s samples"),
                                       (0.2, 4, "tab:blue", "10 s slot means (paper)")):
        vals = [0 if math.isnan(r[col]) else r[col] / 64e6 for r in rows]
        ax.bar([x + offset for x in xs], vals, width=0.4, color=colour, label=label)
    ax.set_xticks(xs, names)
    ax.legend(fontsize=8)
    ax.set_ylabel("variance [(kB/s)^2]")
    ax.set_title("variance of throughput towards B, 100-250 s (paper Fig 9)", fontsize=9)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(out / "variance.png", dpi=110)
    plt.close(fig)


def variance_table(var_rows, baseline: str) -> list[str]:
    """comparison.md's Fig 9 table: each variant's towards-B variance at 1 s and over the
    paper's 10 s slots, each relative to ``baseline``'s (rows as analyze_raw builds them)."""
    lines = [f"| variant | variance towards B, 1 s [(kB/s)^2] | relative to {baseline} "
             f"| 10 s slots (paper's Fig 9) [(kB/s)^2] | relative to {baseline} |", "|---|---|---|---|---|"]
    base = next((r[1] for r in var_rows if r[0] == baseline), None)
    base_slots = next((r[4] for r in var_rows if r[0] == baseline), None)
    for v, var, _n, _m, slot_var in var_rows:
        rel = f"{var / base:.3f}" if base else ""
        rel_slots = f"{slot_var / base_slots:.3f}" if base_slots else ""
        lines.append(f"| {v} | {var / 64e6:.0f} | {rel} | {slot_var / 64e6:.0f} | {rel_slots} |")
    return lines


def _write_comparison(out: Path, summary: dict, var_rows) -> None:
    lines = ["# Paper 002, plain TCP: ours beside the paper", "",
             f"Parameters: {json.dumps(summary['params'])}", "",
             "| variant | flow | solo Mbit/s | both-active Mbit/s | ratio to solo | paper |",
             "|---|---|---|---|---|---|"]
    for v, flows in summary["variants"].items():
        for f, d in flows.items():
            solo = d.get("solo_goodput_bps")
            ratio = d.get("ratio_to_solo")
            lines.append(f"| {v} | {f} | {'' if solo is None else f'{solo / 1e6:.2f}'} | "
                         f"{d['goodput_bps'] / 1e6:.2f} | {'' if ratio is None else f'{ratio:.2f}'} | "
                         f"{PAPER[v] if f == 'A->B' else ''} |")
    lines += [""] + variance_table(var_rows, "bidir")
    lines += ["", PAPER_VARIANCE, ""]
    (out / "comparison.md").write_text("\n".join(lines))


# --------------------------------------------------------------------- CLI
def run_all(variants: list[str], runs: int, p: Params, out: Path, *, parallel: int = 1,
            chive_bin: Path | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Run ``runs`` repetitions of each variant (``parallel`` testbeds at once), then analyse."""
    say = progress or (lambda _m: None)
    git = git_at_start()
    jobs = [(v, i) for i in range(runs) for v in variants]
    results: dict[str, list] = {v: [None] * runs for v in variants}
    errors: list[str] = []
    live: list = []
    stop = threading.Event()
    lock = threading.Lock()

    def worker() -> None:
        while not stop.is_set():
            with lock:
                if not jobs:
                    return
                v, i = jobs.pop(0)
            say(f"paper002: {v} run {i + 1}/{runs}")
            try:
                results[v][i] = run_repetition_raw(v, i, out / "runs" / f"{v}-{i}", p, chive_bin=chive_bin,
                                               stop=stop, live=live)
            except Exception as e:  # noqa: BLE001 - reported, the others go on
                errors.append(f"{v} run {i}: {e}")
                say(f"paper002: {v} run {i} failed: {e}")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, parallel))]
    for th in threads:
        th.start()
        time.sleep(0.3)  # stagger namespace creation
    try:
        for th in threads:
            while th.is_alive():
                th.join(0.5)
    except KeyboardInterrupt:
        stop.set()
        for tb in list(live):
            tb.down()
        for th in threads:
            th.join(10)
        raise
    done = {v: [r for r in rs if r is not None] for v, rs in results.items()}
    manifest = {"kind": KIND_NAME, "variants": variants, "runs": runs, "params": p.__dict__,
                "errors": errors, "host": platform.node(), "kernel": platform.release(),
                "git": git, "started_by": os.getpid(), "finished": time.time()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=list))
    summary = analyze_raw(done, p, out)
    if errors:
        summary["errors"] = errors
    return summary


def git_at_start() -> dict:
    """The checkout's revision and whether it had local changes, for the manifest; call it
    when the run starts (a commit made while it runs must not be credited with it)."""
    from ..manifest import git_state

    return git_state()


def add_testbed_arguments(ap: argparse.ArgumentParser, variants, default_runs: int) -> None:
    """Command-line options both paper-002 experiments share."""
    ap.add_argument("--out", type=Path, required=True,
                    help="output directory (figures, CSVs, summary.json, comparison.md, runs/)")
    ap.add_argument("--quick", action="store_true", help="scale 0.2 (0-50 s / 10-60 s), 1 run")
    ap.add_argument("--scale", type=float, default=None, help="time scale (default 1, quick 0.2)")
    ap.add_argument("--runs", type=int, default=None,
                    help=f"repetitions per variant (default {default_runs}, quick 1)")
    ap.add_argument("--variants", default=",".join(variants),
                    help=f"comma-separated subset of {', '.join(variants)}")
    ap.add_argument("--rate", default="10mbit", help="every access link's rate, tc syntax (default 10mbit)")
    ap.add_argument("--cc", default="cubic", help="cubic (paper) or bbr")
    ap.add_argument("--queue-at", choices=["host", "switch"], default="switch",
                    help="where a host's outgoing queue lives (see netns.LinkSpec.queue_at)")
    ap.add_argument("--queue-packets", type=int, default=1000,
                    help="each host's outgoing FIFO in packets (default 1000, the paper era's txqueuelen)")
    ap.add_argument("--switch-port-packets", type=int, default=None,
                    help="the switch's port buffer towards each host (default: --queue-packets)")


def resolve_testbed_arguments(ap: argparse.ArgumentParser, a, variants,
                              default_runs: int) -> tuple[list[str], float, int]:
    """(variants, scale, runs) from the shared options, with the quick defaults applied."""
    chosen = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in chosen if v not in variants]
    if bad:
        ap.error(f"unknown variants {bad}")
    scale = a.scale if a.scale is not None else (0.2 if a.quick else 1.0)
    if not 0.01 <= scale <= 10:
        ap.error("--scale must be within 0.01..10")
    runs = a.runs if a.runs is not None else (1 if a.quick else default_runs)
    for name, value in (("--queue-packets", a.queue_packets), ("--switch-port-packets", a.switch_port_packets)):
        if value is not None and not 1 <= value <= 100_000:
            ap.error(f"{name} must be within 1..100000")
    return chosen, scale, runs


def main(argv: list[str] | None = None) -> int:
    """``python -m chive_lab.experiments.paper002``."""
    ap = argparse.ArgumentParser(prog="python -m chive_lab.experiments.paper002",
                                 description="Paper 002 plain-TCP reproduction on the netns backend.")
    add_testbed_arguments(ap, VARIANTS, default_runs=10)
    ap.add_argument("--parallel", type=int, default=1, help="testbeds at once (default 1)")
    ap.add_argument("--ackprio-hosts", default="B", help="hosts that get `chive shape` (default B)")
    ap.add_argument("--chive-bin", type=Path, default=None,
                    help="the chive binary for `chive shape` (default: the workspace's build)")
    a = ap.parse_args(argv)
    why = netns.available()
    if why:
        print(f"paper002: {why}", file=sys.stderr)
        return 2
    variants, scale, runs = resolve_testbed_arguments(ap, a, VARIANTS, default_runs=10)
    p = Params(rate=a.rate, scale=scale, cc=a.cc, queue_packets=a.queue_packets, queue_at=a.queue_at,
               switch_port_packets=a.switch_port_packets, ackprio_hosts=tuple(h.strip() for h in a.ackprio_hosts.split(",") if h.strip()))
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        summary = run_all(variants, runs, p, a.out, parallel=a.parallel, chive_bin=a.chive_bin,
                          progress=say)
    except KeyboardInterrupt:
        say("paper002: interrupted; testbeds removed")
        return 130
    print(json.dumps(summary["variants"], indent=1))
    return 1 if summary.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())


# ------------------------------------------------- `chive-lab run` adapter
# chive_lab.runner.KINDS maps kind "paper002-tcp" to this module: it calls
# parse_options() on the scenario's own keys, run_repetition(ctx) per variant
# and repetition, and analyze(out_dir, scenario) once at the end.

_OPTION_KEYS = {"rate", "scale", "cc", "queue_packets", "queue_at", "ackprio_hosts", "switch_port_packets"}


def parse_options(raw: dict) -> Params:
    """The scenario's paper002 keys (``rate``, ``scale``, ``cc``, ``queue_packets``,
    ``queue_at``, ``ackprio_hosts``, ``switch_port_packets``) as :class:`Params`; LabError for others."""
    unknown = sorted(set(raw) - _OPTION_KEYS)
    if unknown:
        raise LabError(f"unknown key {unknown[0]} (kind {KIND_NAME!r} takes {', '.join(sorted(_OPTION_KEYS))})")
    p = Params()
    if "rate" in raw:
        netns.parse_rate(str(raw["rate"]))
        p.rate = str(raw["rate"])
    if "scale" in raw:
        s = raw["scale"]
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0.01 <= s <= 10:
            raise LabError(f"scale must be a number within 0.01..10, got {s!r}")
        p.scale = float(s)
    if "cc" in raw:
        if not isinstance(raw["cc"], str):
            raise LabError("cc must be a string such as \"cubic\"")
        p.cc = raw["cc"]
    if "queue_packets" in raw:
        q = raw["queue_packets"]
        if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 100_000:
            raise LabError(f"queue_packets must be an integer within 1..100000, got {q!r}")
        p.queue_packets = q
    if "switch_port_packets" in raw:
        q = raw["switch_port_packets"]
        if isinstance(q, bool) or not isinstance(q, int) or not 1 <= q <= 100_000:
            raise LabError(f"switch_port_packets must be an integer within 1..100000, got {q!r}")
        p.switch_port_packets = q
    if "queue_at" in raw:
        if raw["queue_at"] not in ("host", "switch"):
            raise LabError("queue_at must be \"host\" or \"switch\"")
        p.queue_at = raw["queue_at"]
    if "ackprio_hosts" in raw:
        hs = raw["ackprio_hosts"]
        if not isinstance(hs, list) or not all(h in ("A", "B", "C") for h in hs):
            raise LabError("ackprio_hosts must be a list of \"A\", \"B\", \"C\"")
        p.ackprio_hosts = tuple(hs)
    return p


def _variant_name(label: str) -> str:
    if label not in VARIANTS:
        raise LabError(f"variant {label!r}: paper002 variants are {', '.join(VARIANTS)}")
    return label


def run_repetition(ctx) -> None:
    """``chive-lab run`` entry: one repetition of ``ctx.variant`` into ``ctx.run_dir``."""
    why = netns.available()
    if why:
        raise LabError(f"paper002 needs the netns backend: {why}")
    p = ctx.scenario.options if isinstance(ctx.scenario.options, Params) else Params()
    name = _variant_name(ctx.variant.label)
    ctx.status(f"{name}: {p.t(BC_STOP):g} s of bulk TCP on A, B, C")
    flows = run_repetition_raw(name, ctx.rep, Path(ctx.run_dir), p, chive_bin=ctx.binary,
                               progress=ctx.log)
    (Path(ctx.run_dir) / "flows.json").write_text(json.dumps(flows))


def repetition_dirs(out_dir: Path, variants, scenario=None) -> dict[str, list[Path]]:
    """``runs/<variant>/<rep>`` directories that hold a ``flows.json``, per known variant, in the
    scenario's variant order (or ``variants``' order), repetitions in numeric order."""
    found: dict[str, list[Path]] = {}
    for vdir in sorted((Path(out_dir) / "runs").glob("*")):
        if not vdir.is_dir() or vdir.name not in variants:
            continue
        found[vdir.name] = sorted((d for d in vdir.iterdir() if (d / "flows.json").is_file()),
                                  key=lambda d: int(d.name) if d.name.isdigit() else 0)
    order = [v.label for v in scenario.variants] if scenario is not None else list(variants)
    return {v: found[v] for v in order if v in found}



def slot_series(runs, names, slot: float, end: int):
    """Figure series in kB/s for ``names``: the mean over runs per ``slot``-second slot,
    with the 90% confidence band (shared by the plain-TCP and the overlay figures)."""
    from .. import analysis as an

    series = []
    for f in names:
        st = _slot_stats(runs, f, slot, end)
        xs = [(lo + hi) / 2 for lo, hi, *_ in st]
        ms = [m / 8000 for _, _, m, _, _ in st]
        hs = [0.0 if math.isnan(h) else h / 8000 for *_, h, _ in st]
        series.append(an.Series(label=f, x=xs, y=ms, lo=[m - h for m, h in zip(ms, hs)],
                                hi=[m + h for m, h in zip(ms, hs)]))
    return series

def analyze(out_dir, scenario=None):
    """``chive-lab analyze`` entry: read ``runs/<variant>/<rep>/flows.json``, write
    this kind's figures and CSVs into ``out_dir/figures`` and return an
    :class:`chive_lab.analysis.Analysis` whose summary is schema 1."""
    from .. import analysis as an

    out_dir = Path(out_dir)
    p = scenario.options if scenario is not None and isinstance(scenario.options, Params) else Params()
    results = {v: [json.loads((d / "flows.json").read_text()) for d in reps]
               for v, reps in repetition_dirs(out_dir, VARIANTS, scenario).items()}
    summary = analyze_raw(results, p, out_dir / "paper002")
    rows = []
    for v, flows in summary["variants"].items():
        for f, d in flows.items():
            rows.append([v, f, round(d["goodput_bps"] / 1e6, 2),
                         None if d.get("ratio_to_solo") is None else round(d["ratio_to_solo"], 2),
                         round(d["variance"] / 64e6) if d["variance"] == d["variance"] else None,
                         PAPER[v] if f == "A->B" else ""])
    table = an.Table(title="Paper 002, plain TCP: goodput while both pairs are active",
                     columns=["variant", "flow", "Mbit/s", "ratio to solo", "variance (kB/s)^2", "paper"],
                     rows=rows, note=PAPER_VARIANCE)
    notes = ["This kind's own figures (multi-run mean + representative run per variant, variance): "
             "paper002/throughput_<variant>.png, paper002/variance.png, CSV beside each, and "
             "paper002/comparison.md."]
    figures = []
    slot = SLOT * p.scale
    for v, runs in results.items():
        if not runs:
            continue
        end = len(next(iter(runs[0].values())))
        series = slot_series(runs, sorted(runs[0]), slot, end)
        figures.append(an.Figure(name=f"paper002_throughput_{v}",
                                 title=f"{v}: throughput per flow (paper Fig {VARIANTS[v]['fig']})",
                                 xlabel="time [s]", ylabel="throughput [kB/s]", series=series,
                                 note=f"mean over {len(runs)} run(s) in {slot:g} s slots; band: 90% CI"))
    var = [(v, summary["extra"][v]["towards_b_variance"]) for v in summary["variants"]]
    figures.append(an.Figure(name="paper002_variance", title="variance of 1 s throughput towards B (Fig 9)",
                             xlabel="variant #", ylabel="variance [(kB/s)^2]",
                             series=[an.Series(label="towards B", x=list(range(len(var))),
                                               y=[(x / 64e6) if x == x else 0.0 for _, x in var],
                                               style="points")],
                             xticks=[(float(i), v) for i, (v, _) in enumerate(var)]))
    return an.Analysis(summary=summary, figures=figures, tables=[table], notes=notes)

class _Kind(ExperimentKind):
    name = 'paper002-tcp'

    def parse_options(self, raw):
        return parse_options(raw)

    def run_repetition(self, ctx):
        run_repetition(ctx)

    def analyze(self, out_dir, scenario):
        return analyze(out_dir, scenario)


KIND = _Kind()
