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

Variants (the client's link options; relays keep their defaults):

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

Outputs: ``throughput_<variant>.png/.csv`` (download and upload per second, mean over runs),
``download_ratio.png/.csv``, ``summary.json`` (schema 1), ``comparison.md``, ``manifest.json``;
per run the perf records, ``links-A.jsonl``, relay and client logs.

Standalone: ``python -m chive_lab.experiments.client_uplink --quick --out DIR``; as a scenario:
``chive-lab run scenarios/client-uplink.toml --quick --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import netns
from ..errors import LabError
from ..kinds import ExperimentKind
from ..tor_netns import TorOverlay, check_tor_variants, standalone_variants
from . import paper002 as p2
from . import paper002_overlay as po

KIND_NAME = "client-uplink"

#: The client's link options per variant; relays keep their defaults.
VARIANTS: dict[str, dict] = {
    "kernelbuf": {"client": {"LinkUnsentLimit": 0}},
    "unsent-limit": {"client": {}},
    # The baseline: Debian's tor as client, relays and authority on the same hosts (KIST bounds
    # what its channels hand to the kernel; Vegas paces its circuits).
    "tor": {"client": {}, "impl": "tor"},
    # Tor's own knob for it: KIST keeps at most (1 + KISTSockBufSizeFactor) congestion windows
    # in the socket; 0 leaves only what the window can send now.
    "tor-sockbuf0": {"client": {}, "impl": "tor", "torrc": {"KISTSockBufSizeFactor": 0}},
}
#: The variants that run Debian's tor instead of chive.
TOR_VARIANTS = [v for v, d in VARIANTS.items() if d.get("impl") == "tor"]
#: Timeline (seconds, x scale): downloads run throughout, uploads join at UP_START.
DOWN_START, UP_START, END = 0.0, 40.0, 120.0
SOLO_WINDOW, BOTH_WINDOW = (10.0, 40.0), (60.0, 120.0)
ENTRY_PORT, MIDDLE_PORT, EXIT_PORT = 9001, 9002, 9003
SOCKS_PORT, HTTP_PORT, DIR_PORT = 9050, 8080, 7000
MAX_LOOPS = 16


@dataclass
class Params:
    """Parameters of one experiment (scenario-level)."""

    rate: str = "10mbit"
    scale: float = 1.0
    cc: str = "cubic"
    queue_packets: int = 1000
    #: "host": TCP Small Queues keep the qdisc short, the backlog is in the socket (today's
    #: Linux); "switch": a queue the client's TCP cannot see (a modem's buffer).
    queue_at: str = "host"
    #: The switch's buffer towards A (the provider's side of the link; None: queue_packets).
    switch_port_packets: int | None = None
    downloads: int = 1
    uploads: int = 4
    transfer_bytes: int = 64 * 1024 * 1024
    log_level: str = "info"

    def t(self, seconds: float) -> float:
        """A timeline point scaled."""
        return seconds * self.scale


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
def run_repetition_raw(variant: str, rep: int, out_dir: Path, p: Params, *,
                       chive_bin: Path | None = None, progress: Callable[[str], None] | None = None,
                       stop: threading.Event | None = None) -> dict[str, list[float]]:
    """Run one repetition; return ``{"down"|"up"|<loop>: [bit/s per second]}`` and keep the
    perf records, socket samples and logs in ``out_dir``."""
    v = VARIANTS[variant]
    say = progress or (lambda _m: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    hosts = [netns.HostSpec("A", netns.LinkSpec(p.rate, queue_packets=p.queue_packets, queue_at=p.queue_at,
                                                 switch_port_packets=p.switch_port_packets),
                            cc=p.cc),
             netns.HostSpec("B", netns.LinkSpec(None), cc=p.cc)]
    ls = loops(p)
    end = p.t(END)
    tb = netns.Testbed(hosts, chive_bin=chive_bin, progress=say, widen_allowed_cc=True)
    t0 = 0.0
    try:
        tb.up()
        tor = v.get("impl") == "tor"
        ov = (TorOverlay if tor else netns.Overlay)(tb, out_dir / "net", binary=chive_bin,
                                                    log=p.log_level, progress=say)
        ov.add_authority("B", port=DIR_PORT)
        for nick, port in (("relayB1", ENTRY_PORT), ("relayB2", MIDDLE_PORT), ("relayB3", EXIT_PORT)):
            ov.add_relay("B", nick, port=port)
        # Tor has no .exit notation: its client pins the exit in its torrc.
        pins = {"EntryNodes": ["relayB1"], "MiddleNodes": ["relayB2"],
                **({"ExitNodes": ["relayB3"]} if tor else {})}
        ov.add_client("A", "clientA", port=SOCKS_PORT, extra={**pins, **v["client"]},
                      **({"torrc": v["torrc"]} if "torrc" in v else {}))
        ov.add_httpd("B", "httpd", port=HTTP_PORT)
        ov.start(timeout=60)
        t0 = time.time() + 0.5
        samplers = [po.start_sampler(tb, "B", ["ss-sample", "--port", str(HTTP_PORT)], t0 + end + 5,
                                     out_dir / "rx-httpd.jsonl"),
                    po.start_sampler(tb, "A", ["link-sample", "--ports", str(ENTRY_PORT)], t0 + end + 5,
                                     out_dir / "links-A.jsonl")]
        perf = []
        for lp in ls:
            url = ov.url("httpd", "/upload" if lp.upload else f"/bytes/{p.transfer_bytes}", exit="relayB3")
            perf.append(po.start_perf_loop(tb, ov, "clientA", url, (t0 + lp.start, t0 + lp.stop), end,
                                           lp.name, lp.name, p.transfer_bytes if lp.upload else None,
                                           out_dir / f"perf-{lp.name}"))
        (out_dir / "run.json").write_text(json.dumps(
            {"t0": t0, "variant": variant, "rep": rep, "params": p.__dict__, "impl": "tor" if tor else "chive",
             **({"tor_version": ov.tools.version} if isinstance(ov, TorOverlay) else {})}, default=list))
        say(f"client-uplink: {variant}: {end:g} s of transfers")
        po.wait_for_loops(perf, samplers, t0 + end, stop)
        if isinstance(ov, TorOverlay):
            (out_dir / "tor.json").write_text(json.dumps(ov.evidence(), indent=1))
        (out_dir / "qdisc-A.txt").write_text(tb.qdisc_stats("A") + tb.qdisc_stats("sw", "vA"))
        ov.stop()
    finally:
        tb.down()
    return collect(out_dir, ls, t0, math.ceil(end))


def collect(out_dir: Path, ls: list[Loop], t0: float, seconds: int) -> dict[str, list[float]]:
    """Bit/s per second per loop and summed per direction. Downloads are counted where they
    arrive (the client's perf); uploads at the web server (``ss``), since perf counts what it
    wrote into the SOCKS socket."""
    out: dict[str, list[float]] = {"down": [0.0] * seconds, "up": [0.0] * seconds}
    outcomes = {}
    for lp in ls:
        s, counts = po.perf_series(out_dir / f"perf-{lp.name}.jsonl", t0, seconds)
        outcomes[lp.name] = counts
        if lp.upload:
            continue
        out[lp.name] = s
        out["down"] = [a + b for a, b in zip(out["down"], s)]
    if any(lp.upload for lp in ls):
        out["up"] = po.rx_series(out_dir / "rx-httpd.jsonl", t0, seconds)
    (out_dir / "transfers.json").write_text(json.dumps(outcomes, indent=1))
    errors = {k: c["error_texts"] for k, c in outcomes.items() if c.get("errors")}
    if errors:
        raise LabError(f"transfers failed: {json.dumps(errors)[:500]}")
    return out


def client_socket(run_dir: Path, t0: float, window: tuple[float, float]) -> dict:
    """The client's link socket over ``window``: mean and max unsent bytes, mean TCP RTT."""
    rows = po.link_queues(run_dir, t0, window)
    if not rows:
        return {}
    # One link (clientA -> relayB1); if the circuit manager opened a second, take the busier.
    row = max(rows, key=lambda r: r["notsent_mean"])
    return {k: row[k] for k in ("notsent_mean", "notsent_max", "rtt_ms_mean", "samples")}


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
        down_solo = [p2._mean(p2._window(r["down"], *solo)) for r in runs]
        down_both = [p2._mean(p2._window(r["down"], *both)) for r in runs]
        up_both = [p2._mean(p2._window(r["up"], *both)) for r in runs]
        ratios = [b / s if s else float("nan") for s, b in zip(down_solo, down_both)]
        entry = {"runs": len(runs),
                 "download_solo_bps": p2._mean(down_solo), "download_with_upload_bps": p2._mean(down_both),
                 "upload_bps": p2._mean(up_both),
                 "download_ratio": p2._mean(ratios), "download_ratio_per_run": ratios,
                 "download_ratio_ci90": _ci90(ratios)}
        socks = [s for s in (sockets or {}).get(variant, []) if s]
        if socks:
            entry["client_socket"] = {k: p2._mean([s[k] for s in socks if s.get(k) is not None])
                                      for k in ("notsent_mean", "notsent_max", "rtt_ms_mean")}
        summary["variants"][variant] = entry
        ratio_rows.append((variant, entry["download_ratio"], entry["download_ratio_ci90"]))
        p2.write_throughput(out, variant, runs, 10.0 * p.scale, p, ["down", "up"], ["down", "up"],
                            f"client-uplink {variant}: mean over {len(runs)} run(s); uploads from "
                            f"{p.t(UP_START):g} s", rep_flow="down", rep_window=both)
    _write_ratio(out, ratio_rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=True))
    _write_comparison(out, summary)
    return summary


def _ci90(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    if len(xs) < 2:
        return float("nan")
    return p2._t90(len(xs)) * math.sqrt(p2._var(xs) / len(xs))


def _write_ratio(out: Path, rows) -> None:
    with (out / "download_ratio.csv").open("w") as fh:
        fh.write("variant,download_ratio,ci90_half\n")
        for v, r, ci in rows:
            fh.write(f"{v},{r:.4f},{ci:.4f}\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar([r[0] for r in rows], [0 if r[1] != r[1] else r[1] for r in rows], color="tab:blue",
           yerr=[0 if r[2] != r[2] else r[2] for r in rows], capsize=4)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("download while uploading / alone")
    ax.set_title("client on one link: download kept while its uploads run (90% CI)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "download_ratio.png", dpi=110)
    plt.close(fig)


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


# --------------------------------------------------------------------- CLI
def run_all(variants: list[str], runs: int, p: Params, out: Path, *, chive_bin: Path | None = None,
            progress: Callable[[str], None] | None = None) -> dict:
    """``runs`` repetitions of each variant, interleaved (so drift hits both alike), then analyse."""
    say = progress or (lambda _m: None)
    git = p2.git_at_start()
    results: dict[str, list] = {v: [] for v in variants}
    sockets: dict[str, list] = {v: [] for v in variants}
    errors: list[str] = []
    for i in range(runs):
        for v in variants:
            say(f"client-uplink: {v} run {i + 1}/{runs}")
            run_dir = out / "runs" / f"{v}-{i}"
            try:
                results[v].append(run_repetition_raw(v, i, run_dir, p, chive_bin=chive_bin, progress=say))
                sockets[v].append(client_socket(run_dir, _t0(run_dir), (p.t(BOTH_WINDOW[0]), p.t(BOTH_WINDOW[1]))))
            except LabError as e:
                errors.append(f"{v} run {i}: {e}")
                say(f"client-uplink: {v} run {i} failed: {e}")
    manifest = {"kind": KIND_NAME, "variants": variants, "runs": runs, "params": p.__dict__,
                "errors": errors, "host": platform.node(), "kernel": platform.release(),
                "git": git, "started_by": os.getpid(), "finished": time.time()}
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    summary = analyze_raw(results, p, out, sockets)
    if errors:
        summary["errors"] = errors
    return summary


def _t0(run_dir: Path) -> float:
    return float(json.loads((run_dir / "run.json").read_text())["t0"])


def main(argv: list[str] | None = None) -> int:
    """``python -m chive_lab.experiments.client_uplink``."""
    ap = argparse.ArgumentParser(prog="python -m chive_lab.experiments.client_uplink",
                                 description="A client downloading while it uploads over one shaped link: "
                                             "chive with and without its LinkUnsentLimit, and Debian's "
                                             "tor (variants tor, tor-sockbuf0; left out when tor is "
                                             "not installed).")
    ap.add_argument("--out", type=Path, required=True, help="output directory")
    ap.add_argument("--quick", action="store_true", help="scale 0.25 (30 s per run), 1 run")
    ap.add_argument("--runs", type=int, default=None, help="repetitions per variant (default 3, quick 1)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {', '.join(VARIANTS)}")
    ap.add_argument("--rate", default="10mbit", help="the client's link rate, tc syntax (default 10mbit)")
    ap.add_argument("--cc", default="cubic", help="TCP congestion control on both hosts (default cubic)")
    ap.add_argument("--switch-port-packets", type=int, default=None,
                    help="the switch's buffer towards the client, packets (default 1000, like its own queue)")
    ap.add_argument("--downloads", type=int, default=1, help="download circuits (default 1)")
    ap.add_argument("--uploads", type=int, default=4, help="upload circuits (default 4)")
    ap.add_argument("--chive-bin", type=Path, default=None, help="the chive binary (default: the build's)")
    a = ap.parse_args(argv)
    chosen = [v.strip() for v in a.variants.split(",") if v.strip()]
    if not chosen or any(v not in VARIANTS for v in chosen):
        ap.error(f"--variants: choose among {', '.join(VARIANTS)}")
    for name, n in (("--downloads", a.downloads), ("--uploads", a.uploads)):
        if not 0 <= n <= MAX_LOOPS:
            ap.error(f"{name} must be within 0..{MAX_LOOPS}")
    if a.downloads == 0:
        ap.error("--downloads must be at least 1 (the download is what is measured)")
    runs = a.runs if a.runs is not None else (1 if a.quick else 3)
    if not 1 <= runs <= 1000:
        ap.error("--runs must be within 1..1000")
    netns.parse_rate(a.rate)
    why = netns.available()
    if why:
        print(f"client-uplink: {why}", file=sys.stderr)
        return 2
    if a.switch_port_packets is not None and not 1 <= a.switch_port_packets <= 100_000:
        ap.error("--switch-port-packets must be within 1..100000")
    p = Params(rate=a.rate, scale=0.25 if a.quick else 1.0, cc=a.cc, downloads=a.downloads, uploads=a.uploads,
               switch_port_packets=a.switch_port_packets)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        chosen = standalone_variants(KIND_NAME, chosen, TOR_VARIANTS,
                                     explicit=a.variants != ",".join(VARIANTS), say=say)
    except LabError as e:
        ap.error(str(e))
    summary = run_all(chosen, runs, p, a.out, chive_bin=a.chive_bin, progress=say)
    print(json.dumps(summary["variants"], indent=1))
    return 1 if summary.get("errors") else 0


# ------------------------------------------------- `chive-lab run` adapter
_TESTBED_KEYS = ("rate", "scale", "cc", "queue_packets", "queue_at", "switch_port_packets")
_OPTION_KEYS = {*_TESTBED_KEYS, "downloads", "uploads", "transfer_bytes", "log_level"}


def parse_options(raw: dict) -> Params:
    """The scenario's keys as :class:`Params`; LabError for unknown or bad ones."""
    unknown = sorted(set(raw) - _OPTION_KEYS)
    if unknown:
        raise LabError(f"unknown key {unknown[0]} (kind {KIND_NAME!r} takes {', '.join(sorted(_OPTION_KEYS))})")
    base = p2.parse_options({k: raw[k] for k in raw if k in _TESTBED_KEYS})
    p = Params(rate=base.rate, scale=base.scale, cc=base.cc, queue_packets=base.queue_packets,
               queue_at=raw.get("queue_at", "host"), switch_port_packets=base.switch_port_packets)
    for key, lo in (("downloads", 1), ("uploads", 0)):
        if key in raw:
            n = raw[key]
            if isinstance(n, bool) or not isinstance(n, int) or not lo <= n <= MAX_LOOPS:
                raise LabError(f"{key} must be an integer within {lo}..{MAX_LOOPS}, got {n!r}")
            setattr(p, key, n)
    # Checked as the overlay kind checks them (same defaults when absent).
    shared = po.parse_options({k: raw[k] for k in ("transfer_bytes", "log_level") if k in raw})
    p.transfer_bytes, p.log_level = shared.transfer_bytes, shared.log_level
    return p


def preflight(scenario) -> None:
    """``chive-lab run``: refuse the tor variant when tor is not installed."""
    check_tor_variants(KIND_NAME, [v.label for v in scenario.variants], TOR_VARIANTS)


def run_repetition(ctx) -> None:
    """``chive-lab run`` entry: one repetition of ``ctx.variant`` into ``ctx.run_dir``."""
    why = netns.available()
    if why:
        raise LabError(f"client-uplink needs the netns backend: {why}")
    p = ctx.scenario.options if isinstance(ctx.scenario.options, Params) else Params()
    name = ctx.variant.label
    if name not in VARIANTS:
        raise LabError(f"variant {name!r}: client-uplink variants are {', '.join(VARIANTS)}")
    ctx.status(f"{name}: {p.t(END):g} s of downloads, uploads from {p.t(UP_START):g} s")
    run_dir = Path(ctx.run_dir)
    series = run_repetition_raw(name, ctx.rep, run_dir, p, chive_bin=ctx.binary, progress=ctx.log)
    (run_dir / "flows.json").write_text(json.dumps(series))
    sock = client_socket(run_dir, _t0(run_dir), (p.t(BOTH_WINDOW[0]), p.t(BOTH_WINDOW[1])))
    (run_dir / "client_socket.json").write_text(json.dumps(sock))


def _unsent_kb(entry: dict) -> float | None:
    """The client socket's mean unsent kB of a summary entry, None when not sampled."""
    v = entry.get("client_socket", {}).get("notsent_mean")
    return round(v / 1e3, 1) if v is not None and v == v else None


def analyze(out_dir, scenario=None):
    """``chive-lab analyze`` entry: this kind's files into ``out_dir/client_uplink``."""
    from .. import analysis as an

    out_dir = Path(out_dir)
    p = scenario.options if scenario is not None and isinstance(scenario.options, Params) else Params()
    dirs = p2.repetition_dirs(out_dir, VARIANTS, scenario)
    results = {v: [json.loads((d / "flows.json").read_text()) for d in reps] for v, reps in dirs.items()}
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
                                     series=p2.slot_series(runs, ["down", "up"], 10.0 * p.scale,
                                                           len(runs[0]["down"])),
                                     note="mean over runs in 10 s slots (x scale); band: 90% CI"))
    return an.Analysis(summary=summary, figures=figures, tables=[table],
                       notes=["This kind's own files: client_uplink/throughput_<variant>.png, "
                              "client_uplink/download_ratio.png, CSV beside each, comparison.md."])

class _Kind(ExperimentKind):
    name = 'client-uplink'

    def parse_options(self, raw):
        return parse_options(raw)

    def run_repetition(self, ctx):
        run_repetition(ctx)

    def analyze(self, out_dir, scenario):
        return analyze(out_dir, scenario)

    def preflight(self, scenario):
        preflight(scenario)


KIND = _Kind()


if __name__ == "__main__":
    sys.exit(main())
