"""What the netns bulk-transfer kinds share (``paper002-tcp``, ``paper002-overlay``,
``client-uplink``): the testbed's option fields (also ``paper001-onion``'s and
``paper004``'s, with the one-link-per-host :func:`testbed`), ``chive shape``'s variant
options, where a run's per-second series live, and their figures — mean over
runs per slot with 90% intervals plus a representative run, and the Fig 9
variance bars — each saved with its data by :func:`chive_lab.figures.save_plot`.

A run's result is ``{flow: [bit/s per second]}`` (``runs/<variant>/<rep>/flows.json``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import analysis as an
from .. import netns
from .. import stats
from ..errors import LabError
from ..figures import save_plot
from ..options import option
from ..rundir import is_failed

__all__ = [
    "DelayTestbedParams",
    "ShapeOptions",
    "TestbedParams",
    "check_log_level",
    "check_rate",
    "read_flows",
    "repetition_dirs",
    "slot_series",
    "testbed",
    "throughput_figure",
    "goodput_table",
    "variance_figure",
    "variance_table",
    "write_throughput",
    "write_variance",
]

#: Bounds of the testbed options (packets; the time scale of a paper timeline).
MAX_QUEUE_PACKETS = 100_000
SCALE_RANGE = (0.01, 10.0)
HOSTS = ("A", "B", "C")


def check_rate(value: str, path: str) -> str:
    """A link rate in tc syntax (``10mbit``)."""
    try:
        netns.parse_rate(value)
    except LabError as e:
        raise LabError(f"{path}: {e}") from e
    return value


def check_log_level(value: str, path: str) -> str:
    """A tracing filter for the nodes (``info``, ``chive_core=debug``)."""
    if not re.fullmatch(r"[a-z_=,:]{1,64}", value):
        raise LabError(f"{path}: must be a tracing filter such as \"info\", got {value!r}")
    return value


def rate_option(default: str = "10mbit") -> Any:
    return option(default, check=check_rate, doc="every shaped link's rate, tc syntax")


def scale_option() -> Any:
    return option(1.0, lo=SCALE_RANGE[0], hi=SCALE_RANGE[1], doc="time scale of the timeline")


def packets_option(default: int | None) -> Any:
    return option(default, lo=1, hi=MAX_QUEUE_PACKETS)


@dataclass(frozen=True)
class TestbedParams:
    """The testbed keys every netns bulk kind takes (its ``Params`` add their own after these)."""

    rate: str = rate_option()
    scale: float = scale_option()
    cc: str = option("cubic", doc="the hosts' TCP congestion control")
    queue_packets: int = packets_option(1000)
    #: "switch": a host's outgoing queue its TCP cannot see (a pre-TSQ kernel, or a modem);
    #: "host": in the host's own qdisc, where TCP Small Queues keep it short.
    queue_at: str = option("switch", choices=("host", "switch"))
    #: The switch's port buffer towards each host (None: queue_packets), see netns.LinkSpec.
    switch_port_packets: int | None = packets_option(None)

    def t(self, seconds: float) -> float:
        """A timeline point scaled."""
        return seconds * self.scale


@dataclass(frozen=True)
class DelayTestbedParams(TestbedParams):
    """The testbed keys of the kinds whose hosts each sit behind one access link with a one-way
    delay (:func:`testbed`; ``paper001-onion``, ``paper004-window``)."""

    queue_at: str = option("host", choices=("host", "switch"))
    delay_ms: float = option(15.0, lo=0.0, hi=500.0, doc="one-way delay of every access link")

    def describe_links(self, hosts: Sequence[str]) -> str:
        """The report's words for the testbed of ``hosts``."""
        return f"{len(hosts)} hosts, {self.rate} links with {self.delay_ms:g} ms one-way delay each"


@dataclass(frozen=True)
class ShapeOptions:
    """A variant's ``chive shape`` settings beyond ACK priority (``shape.bulk_ceil``)."""

    bulk_ceil: float | None = option(None, lo=0.0, hi=1.0,
                                     doc="the data class may borrow up to this share of the link")


def testbed(p: TestbedParams, hosts: Sequence[str], *, delay_ms: float = 0.0, chive_bin: Path | None = None,
            progress: Any = None) -> netns.Testbed:
    """A testbed of ``hosts``, each behind the same access link: ``p``'s rate, queues and TCP
    congestion control, ``delay_ms`` one way; any congestion control may be used on its
    sockets (``widen_allowed_cc``: tor and chive set their own)."""
    link = netns.LinkSpec(p.rate, delay_ms=delay_ms, queue_packets=p.queue_packets, queue_at=p.queue_at,
                          switch_port_packets=p.switch_port_packets)
    return netns.Testbed([netns.HostSpec(h, link, cc=p.cc) for h in hosts], chive_bin=chive_bin,
                         progress=progress, widen_allowed_cc=True)


def repetition_options(ctx: Any, kind_name: str, params: type) -> Any:
    """The start of a netns kind's repetition: LabError without the netns backend, else the
    scenario's options (``params()`` if it has none)."""
    why = netns.available()
    if why:
        raise LabError(f"{kind_name} needs the netns backend: {why}")
    return ctx.scenario.options if isinstance(ctx.scenario.options, params) else params()


def save_flows(run_dir: Path, series: Mapping[str, list[float]]) -> None:
    """A repetition's per-second series (``flows.json``, what the analysis reads)."""
    (Path(run_dir) / "flows.json").write_text(json.dumps(series))


# ---------------------------------------------------------------------------
# Where the series are


def repetition_dirs(out_dir: Path, labels: Sequence[str]) -> dict[str, list[Path]]:
    """``runs/<variant>/<rep>`` directories that hold a ``flows.json`` (failed runs left
    out), per variant in ``labels``' order, repetitions in numeric order."""
    found: dict[str, list[Path]] = {}
    for vdir in sorted((Path(out_dir) / "runs").glob("*")):
        if not vdir.is_dir() or vdir.name not in labels:
            continue
        found[vdir.name] = sorted((d for d in vdir.iterdir() if (d / "flows.json").is_file() and not is_failed(d)),
                                  key=lambda d: int(d.name) if d.name.isdigit() else 0)
    return {v: found[v] for v in labels if v in found}


def read_flows(dirs: Mapping[str, list[Path]]) -> dict[str, list[dict[str, list[float]]]]:
    """Each repetition's ``flows.json``, per variant."""
    return {v: [json.loads((d / "flows.json").read_text()) for d in reps] for v, reps in dirs.items()}


# ---------------------------------------------------------------------------
# Figures


def slot_series(runs, names, slot: float, end: int) -> list[an.Series]:
    """Figure series in kB/s for ``names``: the mean over runs per ``slot``-second slot,
    with the 90% confidence band."""
    series = []
    for f in names:
        st = stats.slot_stats(runs, f, slot, end)
        xs = [(lo + hi) / 2 for lo, hi, *_ in st]
        ms = [m / 8000 for _, _, m, _, _ in st]
        hs = [0.0 if math.isnan(h) else h / 8000 for *_, h, _ in st]
        series.append(an.Series(label=f, x=xs, y=ms, lo=[m - h for m, h in zip(ms, hs)],
                                hi=[m + h for m, h in zip(ms, hs)]))
    return series


def throughput_figure(name: str, title: str, runs, names, slot: float) -> an.Figure:
    """The report's figure of one variant: :func:`slot_series` over the whole run."""
    end = len(runs[0][names[0]])
    return an.Figure(name=name, title=title, xlabel="time [s]", ylabel="throughput [kB/s]",
                     series=slot_series(runs, names, slot, end),
                     note=f"mean over {len(runs)} run(s) in {slot:g} s slots; band: 90% CI")


def goodput_table(title: str, flow_column: str, extra_column: str, summary: Mapping[str, Any],
                  extra: Callable[[Mapping[str, Any]], Any], variants: Mapping[str, Any], note: str) -> an.Table:
    """The paper-002 kinds' report table: a row per variant and flow of ``summary`` (goodput in
    Mbit/s, ``extra(flow's summary)`` under ``extra_column``, variance in (kB/s)^2 or None for
    NaN, and beside A->B the variant's ``paper`` finding)."""
    rows = [[v, f, round(d["goodput_bps"] / 1e6, 2), extra(d),
             round(d["variance"] / 64e6) if d["variance"] == d["variance"] else None,
             variants[v].paper if f == "A->B" else ""]
            for v, flows in summary["variants"].items() for f, d in flows.items()]
    return an.Table(title=title, columns=["variant", flow_column, "Mbit/s", extra_column, "variance (kB/s)^2",
                                          "paper"], rows=rows, note=note)


def variance_figure(name: str, title: str, summary: Mapping[str, Any]) -> an.Figure:
    """The report's Fig 9: each variant's towards-B variance (``summary["extra"]``) in (kB/s)^2
    (NaN drawn as 0)."""
    var = [(v, summary["extra"][v]["towards_b_variance"]) for v in summary["variants"]]
    return an.Figure(name=name, title=title, xlabel="variant #", ylabel="variance [(kB/s)^2]",
                     series=[an.Series(label="towards B", x=list(range(len(var))),
                                       y=[(x / 64e6) if x == x else 0.0 for _, x in var], style="points")],
                     xticks=[(float(i), v) for i, (v, _) in enumerate(var)])


def write_throughput(out: Path, variant: str, runs, slot: float, csv_flows, plot_flows, title: str,
                     rep_window: tuple[float, float], hline: tuple[float, str] | None = None,
                     rep_flow: str = "A->B") -> None:
    """throughput_<variant>.png with its data throughput_<variant>.csv (every 1 s sample of
    every run), and throughput_avg_<variant>.csv (slot means with 90% CIs across runs). The
    figure shows those means, and the representative run's 1 s samples: the median run of
    ``rep_flow`` over ``rep_window``; ``hline`` = (bit/s, label) draws a reference line."""
    end = len(runs[0][csv_flows[0]])
    slots = {f: stats.slot_stats(runs, f, slot, end) for f in csv_flows}
    save_plot(out, f"throughput_avg_{variant}", ["slot_start", "slot_end", "flow", "mean_bps", "ci90_half_bps", "runs"],
              ([f"{lo:g}", f"{hi:g}", f, f"{m:.0f}", f"{half:.0f}", n]
               for f in csv_flows for lo, hi, m, half, n in slots[f]), None)
    rep = stats.representative(runs, rep_flow, *rep_window)

    def draw(plt):
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
        for f in plot_flows:
            xs = [(lo + hi) / 2 for lo, hi, *_ in slots[f]]
            ms = [m / 8000 for _, _, m, _, _ in slots[f]]
            hs = [0 if math.isnan(h) else h / 8000 for *_, h, _ in slots[f]]
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
        return fig

    save_plot(out, f"throughput_{variant}", ["run", "second", "flow", "throughput_bps"],
              ([i, s, f, f"{v:.0f}"] for i, r in enumerate(runs) for f in csv_flows for s, v in enumerate(r[f])),
              draw, dpi=110)


def write_variance(out: Path, rows) -> None:
    """variance.png (paper Fig 9: towards-B variance per variant, 1 s samples and 10 s slot
    means) with its data variance.csv; ``rows``: (variant, variance, samples, mean towards B,
    slot variance)."""
    def draw(plt):
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
        return fig

    save_plot(out, "variance", ["variant", "variance_bps2", "variance_kBps2", "samples", "mean_towards_b_bps",
                                "slot_variance_kBps2"],
              ([v, f"{var:.6g}", f"{var / 64e6:.6g}", n, f"{m:.0f}", f"{slot_var / 64e6:.6g}"]
               for v, var, n, m, slot_var in rows), draw, dpi=110)


def variance_table(var_rows, baseline: str) -> list[str]:
    """comparison.md's Fig 9 table: each variant's towards-B variance at 1 s and over the
    paper's 10 s slots, each relative to ``baseline``'s."""
    lines = [f"| variant | variance towards B, 1 s [(kB/s)^2] | relative to {baseline} "
             f"| 10 s slots (paper's Fig 9) [(kB/s)^2] | relative to {baseline} |", "|---|---|---|---|---|"]
    base = next((r[1] for r in var_rows if r[0] == baseline), None)
    base_slots = next((r[4] for r in var_rows if r[0] == baseline), None)
    for v, var, _n, _m, slot_var in var_rows:
        rel = f"{var / base:.3f}" if base else ""
        rel_slots = f"{slot_var / base_slots:.3f}" if base_slots else ""
        lines.append(f"| {v} | {var / 64e6:.0f} | {rel} | {slot_var / 64e6:.0f} | {rel_slots} |")
    return lines


def declared(kind: Any, scenario: Any = None) -> dict[str, Any]:
    """Each variant's options: the scenario's (in its order), else what the shipped scenarios
    of ``kind`` declare (analyses of results without a scenario, and tests)."""
    if scenario is not None and getattr(scenario, "variants", None):
        out = {v.label: v.options for v in scenario.variants if getattr(v, "options", None) is not None}
        if out:
            return out
    from ..kinds import shipped_declarations

    return {label: kind.parse_variant(label, raw, f"variant {label}")
            for label, raw in shipped_declarations(kind.name).items()}
