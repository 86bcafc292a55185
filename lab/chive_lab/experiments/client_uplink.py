"""A client that uploads while it downloads, over its own access link (paper 002 at the edge).

Paper 002's effect is not only a relay's: any host whose uplink is full delays what it must
send for the traffic it receives. For an onion-routing client that is the SENDMEs its
downloads depend on: a download circuit may have only a window of cells unacknowledged, and
the client's SENDMEs for it wait behind whatever upload data the client has already handed
to the kernel. With the kernel's autotuned send buffer that is every upload cell the circuit
windows allow (~250 kB per upload stream), so each SENDME waits ~0.2 s per upload circuit at
10 Mbit/s and the download runs at its window per that delay. `LinkUnsentLimit` on the client
(TCP_NOTSENT_LOWAT, as on relays since session 6) keeps the kernel's share small, so the
backlog waits in the client's circuit queues, where the scheduler sends a quiet circuit's
SENDME before the next upload cell.

Testbed (netns backend, root): host A (the client's home: one link of ``rate``, its queue in
the host's own qdisc, so TCP Small Queues keep it short and the backlog sits in the socket,
as on any current Linux) and host B (unshaped: the authority, three relays and a web server).
clientA pins its circuits to relayB1, relayB2, relayB3 (EntryNodes, MiddleNodes, ``.exit``):
``downloads`` loops from 0 to 120 s and ``uploads`` loops from 40 to 120 s (times x ``scale``),
each on its own circuit, all verified.

Variants (the client's link options, relays keep their defaults), declared in the scenario's
``[[variant]]`` tables (:class:`VariantOptions`: ``impl``, ``client``, ``torrc``):

* ``kernelbuf``    ``LinkUnsentLimit = 0``: the kernel's autotuned send buffer (chive before
  session 7, and any client that writes all it may)
* ``unsent-limit`` the default (64 KiB)
* ``tor``          the baseline: Debian's tor as client, relays and authority (the client
  pins the exit with ``ExitNodes``); KIST bounds what Tor's channels hand to the kernel
* ``tor-sockbuf0`` the same with the client's ``KISTSockBufSizeFactor 0`` (Tor's own knob: no
  congestion window's worth of unsent data on top of what the window can send)

Measured per run: download goodput alone (10-40 s) and while the uploads run (60-120 s), its
ratio, upload goodput (counted where it arrives), and the client's link socket (``ss`` once a
second inside A): bytes written but not sent, and TCP's RTT.

Outputs in OUT/client_uplink: ``throughput_<variant>.png/.csv`` (download and upload per
second, mean over runs), ``download_ratio.png/.csv``, ``summary.json`` (schema 1),
``comparison.md``; per run the perf records, ``links-A.jsonl``, relay and client logs.
Run it with ``chive-lab run scenarios/client-uplink.toml --quick --out DIR``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .. import analysis as an
from .. import netns, stats
from ..errors import LabError
from ..figures import save_plot
from ..kinds import RepetitionContext
from ..options import option
from . import bulk
from . import netns_overlay as no

KIND_NAME = "client-uplink"

#: Timeline (seconds, x scale): downloads run throughout, uploads join at UP_START.
DOWN_START, UP_START, END = 0.0, 40.0, 120.0
SOLO_WINDOW, BOTH_WINDOW = (10.0, 40.0), (60.0, 120.0)
ENTRY_PORT, MIDDLE_PORT, EXIT_PORT = 9001, 9002, 9003
SOCKS_PORT, HTTP_PORT, DIR_PORT = 9050, 8080, 7000
MAX_LOOPS = 16


@dataclass(frozen=True)
class Params(bulk.TestbedParams):
    """The scenario's keys of this kind (``scenario.options``)."""

    #: "host" here: TCP Small Queues keep the qdisc short, the backlog is in the socket (today's
    #: Linux); "switch": a queue the client's TCP cannot see (a modem's buffer). The switch's
    #: buffer towards A (``switch_port_packets``) is the provider's side of the link.
    queue_at: str = option("host", choices=("host", "switch"))
    downloads: int = option(1, lo=1, hi=MAX_LOOPS)
    uploads: int = option(4, lo=0, hi=MAX_LOOPS)
    transfer_bytes: int = option(64 * 1024 * 1024, lo=1024, hi=10 * 1024**3)
    log_level: str = option("info", check=bulk.check_log_level)


@dataclass(frozen=True)
class VariantOptions:
    """What a ``[[variant]]`` of this kind declares."""

    impl: str = option("chive", choices=("chive", "tor"), doc="tor: Debian's tor in every role")
    client: dict[str, Any] = option(default_factory=dict, doc="the client's link options (chive)")
    torrc: dict[str, Any] = option(default_factory=dict, doc="more torrc options of the tor client")


@dataclass(frozen=True)
class Loop:
    """One perf loop of clientA, on its own circuit (SOCKS user ``name``)."""

    name: str
    upload: bool
    start: float
    stop: float


def loops(p: Params) -> list[Loop]:
    """The download and upload loops of a run."""
    return ([Loop(f"down{i}", False, p.t(DOWN_START), p.t(END)) for i in range(p.downloads)]
            + [Loop(f"up{i}", True, p.t(UP_START), p.t(END)) for i in range(p.uploads)])


# ----------------------------------------------------------------- running
def run_repetition_raw(variant: str, v: VariantOptions, rep: int, out_dir: Path, p: Params, *,
                       chive_bin: Path | None = None,
                       progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Run one repetition of ``variant`` (declared as ``v``); return ``{"down"|"up"|<loop>:
    [bit/s per second]}`` and keep the perf records, socket samples and logs in ``out_dir``."""
    say = progress or (lambda _m: None)
    hosts = [netns.HostSpec("A", netns.LinkSpec(p.rate, queue_packets=p.queue_packets, queue_at=p.queue_at,
                                                 switch_port_packets=p.switch_port_packets),
                            cc=p.cc),
             netns.HostSpec("B", netns.LinkSpec(None), cc=p.cc)]
    ls = loops(p)
    end = p.t(END)
    tb = netns.Testbed(hosts, chive_bin=chive_bin, progress=say, widen_allowed_cc=True)
    t0 = 0.0
    with no.netns_repetition(out_dir, tb, v.impl, chive_bin=chive_bin, log_level=p.log_level,
                             progress=say) as run:
        ov = run.ov
        ov.add_authority("B", port=DIR_PORT)
        for nick, port in (("relayB1", ENTRY_PORT), ("relayB2", MIDDLE_PORT), ("relayB3", EXIT_PORT)):
            ov.add_relay("B", nick, port=port)
        # Tor has no .exit notation: its client pins the exit in its torrc.
        pins = {"EntryNodes": ["relayB1"], "MiddleNodes": ["relayB2"],
                **({"ExitNodes": ["relayB3"]} if run.tor else {})}
        ov.add_client("A", "clientA", port=SOCKS_PORT, extra={**pins, **v.client},
                      **({"torrc": dict(v.torrc)} if v.torrc else {}))
        ov.add_httpd("B", "httpd", port=HTTP_PORT)
        ov.start(timeout=60)
        t0 = time.time() + 0.5
        samplers = [no.start_sampler(tb, "B", ["ss-sample", "--port", str(HTTP_PORT)], t0 + end + 5,
                                     out_dir / "rx-httpd.jsonl"),
                    no.start_sampler(tb, "A", ["link-sample", "--ports", str(ENTRY_PORT)], t0 + end + 5,
                                     out_dir / "links-A.jsonl")]
        perf = []
        for lp in ls:
            url = ov.url("httpd", "/upload" if lp.upload else f"/bytes/{p.transfer_bytes}", exit="relayB3")
            perf.append(no.start_perf_loop(tb, ov, "clientA", url, (t0 + lp.start, t0 + lp.stop), end,
                                           lp.name, lp.name, p.transfer_bytes if lp.upload else None,
                                           out_dir / f"perf-{lp.name}"))
        run.write_run({"t0": t0, "variant": variant, "rep": rep, "params": p.__dict__,
                       "impl": "tor" if run.tor else "chive"})
        say(f"client-uplink: {variant}: {end:g} s of transfers")
        no.wait_for_loops(perf, samplers, t0 + end)
        (out_dir / "qdisc-A.txt").write_text(tb.qdisc_stats("A") + tb.qdisc_stats("sw", "vA"))
    return collect(out_dir, ls, t0, math.ceil(end))


def collect(out_dir: Path, ls: list[Loop], t0: float, seconds: int) -> dict[str, list[float]]:
    """Bit/s per second per loop and summed per direction. Downloads are counted where they
    arrive (the client's perf); uploads at the web server (``ss``), since perf counts what it
    wrote into the SOCKS socket."""
    out: dict[str, list[float]] = {"down": [0.0] * seconds, "up": [0.0] * seconds}
    outcomes = {}
    for lp in ls:
        s, counts = no.perf_series(out_dir / f"perf-{lp.name}.jsonl", t0, seconds)
        outcomes[lp.name] = counts
        if lp.upload:
            continue
        out[lp.name] = s
        out["down"] = [a + b for a, b in zip(out["down"], s)]
    if any(lp.upload for lp in ls):
        out["up"] = no.rx_series(out_dir / "rx-httpd.jsonl", t0, seconds)
    (out_dir / "transfers.json").write_text(json.dumps(outcomes, indent=1))
    errors = {k: c["error_texts"] for k, c in outcomes.items() if c.get("errors")}
    if errors:
        raise LabError(f"transfers failed: {json.dumps(errors)[:500]}")
    return out


def client_socket(run_dir: Path, t0: float, window: tuple[float, float]) -> dict:
    """The client's link socket over ``window``: mean and max unsent bytes, mean TCP RTT."""
    rows = no.link_queues(run_dir, t0, window)
    if not rows:
        return {}
    # One link (clientA -> relayB1); if the circuit manager opened a second, take the busier.
    row = max(rows, key=lambda r: r["notsent_mean"])
    return {k: row[k] for k in ("notsent_mean", "notsent_max", "rtt_ms_mean", "samples")}


def _t0(run_dir: Path) -> float:
    return float(json.loads((run_dir / "run.json").read_text())["t0"])


# ---------------------------------------------------------------- analysis
def analyze_raw(results: dict[str, list[dict[str, list[float]]]], p: Params, out: Path,
                sockets: dict[str, list[dict]] | None = None) -> dict:
    """Figures, CSVs, summary.json and comparison.md from per-run series (bit/s per second)."""
    out.mkdir(parents=True, exist_ok=True)
    solo = (p.t(SOLO_WINDOW[0]), p.t(SOLO_WINDOW[1]))
    both = (p.t(BOTH_WINDOW[0]), p.t(BOTH_WINDOW[1]))
    summary: dict = {"schema": 1, "kind": KIND_NAME, "units": {"goodput_bps": "bit/s"},
                     "params": {**p.__dict__, "solo_window_s": list(solo), "both_window_s": list(both)},
                     "variants": {}}
    ratio_rows = []
    for variant, runs in results.items():
        if not runs:
            continue
        down_solo = [stats.mean(stats.window(r["down"], *solo)) for r in runs]
        down_both = [stats.mean(stats.window(r["down"], *both)) for r in runs]
        up_both = [stats.mean(stats.window(r["up"], *both)) for r in runs]
        ratios = [b / s if s else float("nan") for s, b in zip(down_solo, down_both)]
        entry = {"runs": len(runs),
                 "download_solo_bps": stats.mean(down_solo), "download_with_upload_bps": stats.mean(down_both),
                 "upload_bps": stats.mean(up_both),
                 "download_ratio": stats.mean(ratios), "download_ratio_per_run": ratios,
                 "download_ratio_ci90": stats.ci90_half(ratios)}
        socks = [s for s in (sockets or {}).get(variant, []) if s]
        if socks:
            entry["client_socket"] = {k: stats.mean([s[k] for s in socks if s.get(k) is not None])
                                      for k in ("notsent_mean", "notsent_max", "rtt_ms_mean")}
        summary["variants"][variant] = entry
        ratio_rows.append((variant, entry["download_ratio"], entry["download_ratio_ci90"]))
        bulk.write_throughput(out, variant, runs, 10.0 * p.scale, ["down", "up"], ["down", "up"],
                              f"client-uplink {variant}: mean over {len(runs)} run(s); uploads from "
                              f"{p.t(UP_START):g} s", rep_window=both, rep_flow="down")
    _write_ratio(out, ratio_rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    _write_comparison(out, summary)
    return summary


def _write_ratio(out: Path, rows) -> None:
    """download_ratio.png with its data download_ratio.csv: each variant's ratio and 90% CI."""
    def draw(plt):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.bar([r[0] for r in rows], [0 if r[1] != r[1] else r[1] for r in rows], color="tab:blue",
               yerr=[0 if r[2] != r[2] else r[2] for r in rows], capsize=4)
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("download while uploading / alone")
        ax.set_title("client on one link: download kept while its uploads run (90% CI)", fontsize=9)
        fig.tight_layout()
        return fig

    save_plot(out, "download_ratio", ["variant", "download_ratio", "ci90_half"],
              ([v, f"{r:.4f}", f"{ci:.4f}"] for v, r, ci in rows), draw, dpi=110)


def _write_comparison(out: Path, summary: dict) -> None:
    lines = ["# A client uploading while it downloads, over one link", "",
             f"Parameters: {json.dumps(summary['params'])}", "",
             "| variant | runs | download alone Mbit/s | download while uploading Mbit/s | ratio (90% CI) "
             "| upload Mbit/s | client socket unsent, mean / max kB | client socket RTT ms |",
             "|---|---|---|---|---|---|---|---|"]
    for v, e in summary["variants"].items():
        cs = e.get("client_socket", {})
        unsent = (f"{cs['notsent_mean'] / 1e3:.0f} / {cs['notsent_max'] / 1e3:.0f}"
                  if "notsent_mean" in cs else "")
        rtt = f"{cs['rtt_ms_mean']:.0f}" if cs.get("rtt_ms_mean") is not None else ""
        lines.append(f"| {v} | {e['runs']} | {e['download_solo_bps'] / 1e6:.2f} | "
                     f"{e['download_with_upload_bps'] / 1e6:.2f} | {e['download_ratio']:.2f} "
                     f"(± {e['download_ratio_ci90']:.2f}) | {e['upload_bps'] / 1e6:.2f} | {unsent} | {rtt} |")
    lines += ["", "Paper 002 has no client numbers; its Sec. IV is the same mechanism on a relay's "
              "access link (ACKs waiting behind outgoing data). Here the SENDMEs wait instead.", ""]
    (out / "comparison.md").write_text("\n".join(lines))



# ------------------------------------------------------------------ the kind
def _unsent_kb(entry: dict) -> float | None:
    """The client socket's mean unsent kB of a summary entry, None when not sampled."""
    v = entry.get("client_socket", {}).get("notsent_mean")
    return round(v / 1e3, 1) if v is not None and v == v else None


def analyze(out_dir: Path, scenario: Any) -> an.Analysis:
    """``chive-lab analyze``: this kind's files into ``out_dir/client_uplink``."""
    out_dir = Path(out_dir)
    p = scenario.options if isinstance(scenario.options, Params) else Params()
    dirs = bulk.repetition_dirs(out_dir, [v.label for v in scenario.variants])
    results = bulk.read_flows(dirs)
    sockets = {v: [json.loads((d / "client_socket.json").read_text()) for d in reps
                   if (d / "client_socket.json").is_file()] for v, reps in dirs.items()}
    summary = analyze_raw(results, p, out_dir / "client_uplink", sockets)
    rows = [[v, round(e["download_solo_bps"] / 1e6, 2), round(e["download_with_upload_bps"] / 1e6, 2),
             round(e["download_ratio"], 3), round(e["upload_bps"] / 1e6, 2),
             _unsent_kb(e)]
            for v, e in summary["variants"].items()]
    table = an.Table(title="Client download alone and while its uploads share the link",
                     columns=["variant", "alone Mbit/s", "with uploads Mbit/s", "ratio", "upload Mbit/s",
                              "client unsent kB"], rows=rows)
    figures = []
    for v, runs in results.items():
        if runs:
            figures.append(an.Figure(name=f"client_uplink_{v}", title=f"client-uplink {v}",
                                     xlabel="time [s]", ylabel="throughput [kB/s]",
                                     series=bulk.slot_series(runs, ["down", "up"], 10.0 * p.scale,
                                                             len(runs[0]["down"])),
                                     note="mean over runs in 10 s slots (x scale); band: 90% CI"))
    return an.Analysis(summary=summary, figures=figures, tables=[table],
                       notes=["This kind's own files: client_uplink/throughput_<variant>.png, "
                              "client_uplink/download_ratio.png, CSV beside each, comparison.md."])


class ClientUplink(no.NetnsKind):
    """See the module documentation."""

    name = KIND_NAME
    Options = Params
    VariantOptions = VariantOptions

    def doing(self, scenario: Any, p: Params) -> str:
        return f"{p.t(END):g} s of downloads, uploads from {p.t(UP_START):g} s"

    def repetition(self, ctx: RepetitionContext, p: Params, run_dir: Path) -> None:
        bulk.save_flows(run_dir, run_repetition_raw(ctx.variant.label, ctx.variant.options, ctx.rep, run_dir, p,
                                                    chive_bin=ctx.binary, progress=ctx.log))
        sock = client_socket(run_dir, _t0(run_dir), (p.t(BOTH_WINDOW[0]), p.t(BOTH_WINDOW[1])))
        (run_dir / "client_socket.json").write_text(json.dumps(sock))

    def analyze(self, out_dir: Path, scenario: Any) -> an.Analysis:
        return analyze(out_dir, scenario)


KIND = ClientUplink()
