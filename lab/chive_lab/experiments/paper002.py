"""Paper 002 (Marks, Tschorsch, Scheuermann), plain-TCP reproduction.

Hosts A, B, C on 10 Mbit/s full-duplex links to one switch (netns backend).
A→B bulk from 0 to 250 s, B→C bulk from 50 to 300 s (times × ``scale``;
``--quick`` uses 0.2). Variants, declared in the scenario's ``[[variant]]`` tables:

``mode`` (``uni``: one connection per pair, one direction each; ``bidir``: one
connection per pair, data both ways; ``split``: two one-direction connections
per pair), ``ackprio`` (``chive shape`` on ``ackprio_hosts``), ``shape.bulk_ceil``,
and the paper figure and text it is compared with (``fig``, ``paper``):
:class:`VariantOptions`, declared in the scenario (``scenarios/paper002-tcp-*.toml``).

Per run: application bytes per second per flow from :mod:`chive_lab.tcpbulk`.
Analysis: multi-run means over 10 s slots with 90% confidence intervals, one
representative run, mean goodput per flow while both pairs are active, and the
variance of the 1 s throughput samples of the flows towards B between 100 and
250 s (Fig 9). Output of ``chive-lab run`` into OUT/paper002: ``throughput_<variant>.png/.csv``,
``variance.png/.csv``, ``summary.json`` (schema 1) and ``comparison.md``; per run
``runs/<variant>/<rep>/flows.json`` and the raw tcpbulk records.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import analysis as an
from .. import netns, stats
from ..errors import LabError
from ..kinds import ExperimentKind, RepetitionContext
from ..options import option
from . import bulk

KIND_NAME = "paper002-tcp"

#: Paper timeline in seconds (scaled by ``scale``).
AB_START, AB_STOP, BC_START, BC_STOP = 0.0, 250.0, 50.0, 300.0
OVERLAP = (50.0, 250.0)  # both pairs active: mean goodput
VAR_WINDOW = (100.0, 250.0)  # Fig 9
SLOT = 10.0  # Fig 3 averaging slot
MODES = ("uni", "bidir", "split")

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


@dataclass(frozen=True)
class Params(bulk.TestbedParams):
    """The scenario's keys of this kind (``scenario.options``): the testbed's, and the hosts
    that get ``chive shape`` in ACK-priority variants."""

    ackprio_hosts: tuple[str, ...] = option(("B",), choices=bulk.HOSTS)
    delay_ms: float = option(0.0, lo=0.0, hi=1000.0)


@dataclass(frozen=True)
class VariantOptions:
    """What a ``[[variant]]`` of this kind declares."""

    mode: str = option(choices=MODES)
    ackprio: bool = False
    shape: bulk.ShapeOptions = field(default_factory=bulk.ShapeOptions)
    fig: str = option("-", doc="the paper figure it is compared with")
    paper: str = option("", doc="what the paper reports for it")


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
def run_repetition_raw(v: VariantOptions, out_dir: Path, p: Params, *, chive_bin: Path | None = None,
                       progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Run one repetition of variant ``v``; return ``{flow: [bit/s per second]}``
    and keep the raw tcpbulk records in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    link = netns.LinkSpec(p.rate, delay_ms=p.delay_ms, queue_packets=p.queue_packets, queue_at=p.queue_at,
                          switch_port_packets=p.switch_port_packets)
    hosts = [netns.HostSpec(n, link, cc=p.cc) for n in ("A", "B", "C")]
    conns = connections(v.mode, p)
    end = max(c.stop for c in conns)
    py = sys.executable
    tb = netns.Testbed(hosts, chive_bin=chive_bin, progress=progress)
    try:
        tb.up()
        shape_cmds: list[str] = []
        if v.ackprio:
            for h in p.ackprio_hosts:
                shape_cmds = tb.set_ack_priority(h, bulk_ceil=v.shape.bulk_ceil)
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
                if time.time() > deadline:
                    raise LabError("run overran its deadline")
                time.sleep(0.2)
        (out_dir / "qdisc-B.txt").write_text(tb.qdisc_stats("B"))
    finally:
        tb.down()
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
def analyze_raw(results: dict[str, list[dict[str, list[float]]]], p: Params, out: Path,
                variants: Mapping[str, VariantOptions] | None = None) -> dict:
    """Write figures, CSVs, summary.json and comparison.md; return the summary.
    ``variants``: each variant's declaration (default: the shipped scenarios')."""
    out.mkdir(parents=True, exist_ok=True)
    variants = variants if variants is not None else bulk.declared(KIND)
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
        mode = variants[variant].mode
        flows = sorted(runs[0])
        vs: dict = {}
        extra: dict = {"runs": len(runs)}
        for f in flows:
            per_run = [stats.mean(stats.window(r[f], *ov)) for r in runs]
            samples = [x for r in runs for x in stats.window(r[f], *vw)]
            vs[f] = {"goodput_bps": stats.mean(per_run), "variance": stats.variance(samples)}
            if f == "A->B":
                solo = [stats.mean(stats.window(r[f], p.t(10), p.t(50))) for r in runs]
                vs[f]["solo_goodput_bps"] = stats.mean(solo)
                vs[f]["ratio_to_solo"] = stats.mean(per_run) / stats.mean(solo) if stats.mean(solo) else None
            if f == "B->C" and mode == "uni":
                solo = [stats.mean(stats.window(r[f], p.t(260), p.t(300))) for r in runs]
                vs[f]["solo_goodput_bps"] = stats.mean(solo)
        pooled = [x for r in runs for f in towards_b(mode) for x in stats.window(r[f], *vw)]
        extra["towards_b_variance"] = stats.variance(pooled)
        # The paper's Fig 9 samples: 10 s slot means (scaled with the timeline), pooled over
        # the flows towards B and all runs; per run too, to show how much runs differ.
        slots = [x for r in runs for f in towards_b(mode) for x in stats.slot_means(r[f], *vw, slot)]
        extra["towards_b_variance_slots"] = stats.variance(slots)
        extra["towards_b_variance_slots_per_run"] = [
            stats.variance([x for f in towards_b(mode) for x in stats.slot_means(r[f], *vw, slot)]) for r in runs]
        extra["variance_slot_s"] = slot
        var_rows.append((variant, stats.variance(pooled), len(pooled),
                         stats.mean([vs[f]["goodput_bps"] for f in towards_b(mode)]), stats.variance(slots)))
        summary["variants"][variant] = vs
        summary["extra"][variant] = extra
        flows = sorted(runs[0])
        bulk.write_throughput(out, variant, runs, slot, flows, flows,
                              f"{variant}: mean over {len(runs)} run(s), {slot:g} s slots, 90% CI "
                              f"(paper Fig {variants[variant].fig})", rep_window=ov)
    bulk.write_variance(out, var_rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    _write_comparison(out, summary, var_rows, variants)
    return summary


def _write_comparison(out: Path, summary: dict, var_rows, variants: Mapping[str, VariantOptions]) -> None:
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
                         f"{variants[v].paper if f == 'A->B' else ''} |")
    lines += [""] + bulk.variance_table(var_rows, "bidir")
    lines += ["", PAPER_VARIANCE, ""]
    (out / "comparison.md").write_text("\n".join(lines))



# ------------------------------------------------------------------ the kind
def analyze(out_dir: Path, scenario: Any) -> an.Analysis:
    """``chive-lab analyze``: read ``runs/<variant>/<rep>/flows.json``, write this kind's
    figures and CSVs into ``out_dir/paper002`` and return the analysis (summary schema 1)."""
    out_dir = Path(out_dir)
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    variants = bulk.declared(KIND, scenario)
    results = bulk.read_flows(bulk.repetition_dirs(out_dir, list(variants)))
    summary = analyze_raw(results, p, out_dir / "paper002", variants)
    table = bulk.goodput_table("Paper 002, plain TCP: goodput while both pairs are active", "flow", "ratio to solo",
                               summary, lambda d: None if d.get("ratio_to_solo") is None
                               else round(d["ratio_to_solo"], 2), variants, PAPER_VARIANCE)
    notes = ["This kind's own figures (multi-run mean + representative run per variant, variance): "
             "paper002/throughput_<variant>.png, paper002/variance.png, CSV beside each, and "
             "paper002/comparison.md."]
    slot = SLOT * p.scale
    figures = [bulk.throughput_figure(f"paper002_throughput_{v}",
                                      f"{v}: throughput per flow (paper Fig {variants[v].fig})",
                                      runs, sorted(runs[0]), slot)
               for v, runs in results.items() if runs]
    figures.append(bulk.variance_figure("paper002_variance", "variance of 1 s throughput towards B (Fig 9)",
                                        summary))
    return an.Analysis(summary=summary, figures=figures, tables=[table], notes=notes)


class Paper002Tcp(ExperimentKind):
    """See the module documentation."""

    name = KIND_NAME
    Options = Params
    VariantOptions = VariantOptions

    def run_repetition(self, ctx: RepetitionContext) -> None:
        p = bulk.repetition_options(ctx, "paper002", Params)
        ctx.status(f"{ctx.variant.label}: {p.t(BC_STOP):g} s of bulk TCP on A, B, C")
        flows = run_repetition_raw(ctx.variant.options, Path(ctx.run_dir), p, chive_bin=ctx.binary,
                                   progress=ctx.log)
        bulk.save_flows(Path(ctx.run_dir), flows)

    def analyze(self, out_dir: Path, scenario: Any) -> an.Analysis:
        return analyze(out_dir, scenario)


KIND = Paper002Tcp()
