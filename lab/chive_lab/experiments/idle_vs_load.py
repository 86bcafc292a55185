"""Experiment kind ``idle-vs-load``: web fetch times idle and under bulk load,
bulk goodput, and 3-hop goodput without rate limits — the measurement of
``lab/scripts/ewma_load.py`` as a scenario kind, so that ``impl = "both"``
puts chive and the real Tor side by side in one report (issue 5).

One repetition of one variant, in this order (all transfers by ``chive perf``):

1. **load network**: ``[network]`` (default 4 relays at 1 MB/s) plus the
   variant's overrides, started with the scenario's backend and the variant's
   impl;
2. **idle**: ``samples`` fetches of ``fetch_size`` bytes (50 KiB), one every
   ``fetch_interval`` s (0.5), each on a fresh circuit (``--isolate``),
   class ``web_idle``;
3. **load**: ``bulk_clients`` (2) continuous downloads, each on its own
   circuit (class ``bulk``, progress every second); after ``bulk_ramp`` s
   (5) the same fetches again (class ``web_load``); the bulk goodput is the
   bytes the bulk downloads received while those fetches ran, divided by that
   time; then the bulk downloads are stopped;
4. the load network is stopped (Tor's own metrics collected before and after);
5. **goodput network**: ``goodput_relays`` (3) relays, no rate limit, the
   variant's other overrides; ``goodput_runs`` downloads of ``goodput_bytes``
   (50 MB) one after the other on one circuit (class ``goodput_3hop``,
   goodput = bytes / time from start to last byte); stopped likewise.
   ``goodput_bytes = 0`` skips this network. With ``goodput_network = "load"``
   the downloads run on the load network instead, after its relays' rate
   limits were lifted by a config reload (:mod:`chive_lab.unlimit`; loopback
   backend only), so one network is started, not two (``--quick``, the tests).

Scenario keys of this kind (besides the common ones; ``duration`` and
``warmup`` are not used: the phases define the time)::

    kind = "idle-vs-load"
    [network]            # as for the overlay kind; default relays 4, bandwidth_rate 1000000
    [load]               # every key optional
    fetch_size = 51200   samples = 40   fetch_interval = 0.5   fetch_timeout = 60
    bulk_clients = 2     bulk_ramp = 5
    goodput_relays = 3   goodput_bytes = 50000000   goodput_runs = 3   goodput_timeout = 300
    goodput_network = "own"   # or "load": the load network, rate limits lifted

Files of a repetition: ``clients/web_idle.jsonl``, ``clients/web_load.jsonl``,
``clients/bulk-<i>.jsonl``, ``clients/goodput_3hop.jsonl`` (perf records, and
``.stderr``), ``net/`` and ``net-goodput/`` (the two networks), ``logs/``,
``tor-metrics.json`` (tor only: ``{"load"|"goodput": {"before_stop",
"after_stop"}}``, only ``"load"`` when the goodput ran on it), ``run.json``
(phase times, commands, status).
"""

from __future__ import annotations

import dataclasses
import html
import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

from .. import analysis as an
from .. import scenario as sc
from ..errors import LabError
from ..kinds import ExperimentKind
from ..network import NetworkSpec
from ..options import option
from ..options import parse_options as parse_scenario_options
from ..rundir import backend_network, run_status, stop_procs, write_json
from ..unlimit import lift_rate_limits
from .overlay_analysis import analyze_runs

__all__ = ["KIND", "LoadOptions", "Options", "analyze", "chive_vs_tor", "run_repetition"]

CLASSES = ("web_idle", "web_load", "bulk", "goodput_3hop")
# 10 GiB: chive httpd's largest /bytes body; a bulk download never ends within a phase.
BULK_BYTES = 10 * 1024 * 1024 * 1024
DEFAULT_RATE = 1_000_000
# Bounds that catch unit mistakes and keep one repetition finite.
MAX_SAMPLES = 100_000
MAX_BULK_CLIENTS = 32
# Extra seconds a perf process may take beyond its own schedule and timeouts.
PERF_SLACK_S = 30.0


_MAX_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class LoadOptions:
    """The ``[load]`` table."""

    fetch_size: int = option(51200, lo=1, hi=1 << 30)
    samples: int = option(40, lo=1, hi=MAX_SAMPLES)
    fetch_interval: float = option(0.5, positive=True, hi=_MAX_S)
    fetch_timeout: float = option(60.0, positive=True, hi=_MAX_S)
    bulk_clients: int = option(2, lo=0, hi=MAX_BULK_CLIENTS)
    bulk_ramp: float = option(5.0, lo=0.0, hi=_MAX_S)
    goodput_relays: int = option(3, lo=3, hi=200)
    goodput_bytes: int = option(50_000_000, lo=0, hi=10 << 30)
    goodput_runs: int = option(3, lo=1, hi=1000)
    goodput_timeout: float = option(300.0, positive=True, hi=_MAX_S)
    goodput_network: str = option("own", choices=("own", "load"),
                                  doc="load: the goodput downloads on the load network, its rate limits lifted")


def _network(value: Any, path: str) -> sc.NetworkConfig:
    """``[network]`` as for the overlay kind, with this kind's default rate."""
    if not isinstance(value, dict):
        raise LabError(f"{path}: must be a table")
    return sc.parse_network({"bandwidth_rate": DEFAULT_RATE, **value})


@dataclass(frozen=True)
class Options:
    """This kind's scenario keys (``scenario.options``)."""

    network: sc.NetworkConfig = option(default_factory=lambda: _network({}, "network"), parse=_network)
    load: LoadOptions = option(default_factory=LoadOptions)


def _options(scenario: sc.Scenario) -> Options:
    opts = scenario.options
    return opts if isinstance(opts, Options) else parse_scenario_options(Options, {})


def _spec(net: sc.NetworkConfig, variant: sc.Variant, binary: Path, *, relays: int,
          rate: int | None) -> NetworkSpec:
    relay = dict(net.relay)
    if net.bandwidth_burst is not None and rate is not None:
        relay["BandwidthBurst"] = net.bandwidth_burst
    relay.update(variant.relay)
    if rate is None:
        # The goodput network has no rate limit, whatever the variant says.
        relay.pop("BandwidthRate", None)
        relay.pop("BandwidthBurst", None)
    params = dict(net.params)
    params.update(variant.params)
    return NetworkSpec(relays=relays, bandwidth_rate=rate or None, relay_overrides=relay,
                       authority_params=params, binary=binary, timeout=net.timeout,
                       consensus_interval=net.consensus_interval, log_level=net.log_level)


def _perf(binary: Path, socks: str, url: str, label: str, *extra: str) -> list[str]:
    return [str(binary), "perf", "--socks", socks, "--url", url, "--label", label, *extra]


class _Phases:
    """The perf processes of one repetition: started in their own session,
    output to clients/, always stopped by :meth:`stop_all`."""

    def __init__(self, run_dir: Path, meta: dict[str, Any]):
        self.clients = run_dir / "clients"
        self.clients.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.meta = meta
        self.procs: list[subprocess.Popen] = []

    def start(self, stem: str, argv: list[str]) -> subprocess.Popen:
        with open(self.clients / f"{stem}.jsonl", "wb") as out, open(self.clients / f"{stem}.stderr", "wb") as err:
            try:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=self.run_dir,
                                     start_new_session=True, close_fds=True)
            except OSError as e:
                raise LabError(f"cannot start chive perf: {e}") from e
        self.procs.append(p)
        self.meta["clients"].append({"name": stem, "pid": p.pid, "argv": argv})
        return p

    def wait(self, p: subprocess.Popen, limit: float, status, what: str) -> None:
        """Wait for ``p`` (at most ``limit`` s), updating the progress line."""
        t0 = time.monotonic()
        while p.poll() is None:
            elapsed = time.monotonic() - t0
            if elapsed > limit:
                raise LabError(f"{what}: chive perf did not finish within {limit:g} s")
            status(f"{what} {elapsed:.0f}s")
            time.sleep(0.5)

    def stop(self, procs: list[subprocess.Popen]) -> None:
        codes = stop_procs(procs)
        for c in self.meta["clients"]:
            if c["pid"] in codes:
                c["exit"] = codes[c["pid"]]

    def stop_all(self) -> None:
        self.stop([p for p in self.procs if p.poll() is None])
        for c in self.meta["clients"]:
            for p in self.procs:
                if p.pid == c["pid"] and "exit" not in c:
                    c["exit"] = p.returncode


def _with_network(ctx: Any, spec: NetworkSpec, net_dir: Path, impl: str, phase: str, meta: dict[str, Any], body):
    """Start a network, run ``body(info)``, then always stop it (Tor's metrics
    collected before and after the stop) and copy its logs to ``logs-<phase>/``."""
    ctx.status(f"{phase}: starting the {impl} network")
    with backend_network(ctx, spec, net_dir, impl, phase=phase, up_log=ctx.run_dir / f"up-{phase}.log",
                         logs_dir=ctx.run_dir / f"logs-{phase}", down=meta["down"], key=phase) as info:
        body(info)


def run_repetition(ctx: Any) -> None:
    """One repetition (see the module doc); stops everything it started, also
    on errors and KeyboardInterrupt, and writes run.json."""
    s = ctx.scenario
    opts = _options(s)
    load = opts.load
    impl = sc.impl_of(s, ctx.variant)
    run_dir: Path = ctx.run_dir
    meta: dict[str, Any] = {
        "variant": ctx.variant.label, "display": sc.display_label(ctx.variant), "rep": ctx.rep,
        "seed": ctx.seed, "impl": impl, "backend": ctx.backend.name, "kind": "idle-vs-load",
        "relay_overrides": dict(ctx.variant.relay), "params": dict(ctx.variant.params),
        "load": dataclasses.asdict(load), "status": "starting", "t0": None, "t_end": None,
        "phases": {}, "clients": [], "warnings": [], "down": {},
    }
    write_json(run_dir / "run.json", meta)
    phases = _Phases(run_dir, meta)
    fetch_wait = load.samples * load.fetch_interval + load.fetch_timeout + PERF_SLACK_S

    def fetches(info, label: str) -> None:
        argv = _perf(ctx.binary, info.socks, f"{info.http}/bytes/{load.fetch_size}", label,
                     "--count", str(load.samples), "--interval", f"{load.fetch_interval:g}", "--isolate",
                     "--timeout", f"{load.fetch_timeout:g}")
        t_start = time.time()
        phases.wait(phases.start(label, argv), fetch_wait, ctx.status, label)
        meta["phases"][label] = [t_start, time.time()]
        write_json(run_dir / "run.json", meta)

    def load_network(info) -> None:
        meta["t0"] = time.time()
        meta["status"] = "running"
        fetches(info, "web_idle")
        bulks = []
        for i in range(load.bulk_clients):
            argv = _perf(ctx.binary, info.socks, f"{info.http}/bytes/{BULK_BYTES}", "bulk", "--count", "0",
                         "--progress", "1", "--socks-user", f"bulk-{i}", "--timeout", "86400")
            bulks.append(phases.start(f"bulk-{i}", argv))
        t_bulk = time.time()
        while time.time() < t_bulk + load.bulk_ramp:
            ctx.status(f"bulk ramp {time.time() - t_bulk:.0f}s")
            if any(p.poll() is not None for p in bulks):
                raise LabError(f"a bulk download exited early (see {phases.clients}/bulk-*.stderr)")
            time.sleep(0.5)
        meta["phases"]["bulk"] = [t_bulk, None]
        fetches(info, "web_load")
        meta["phases"]["bulk"][1] = time.time()
        phases.stop(bulks)
        if shared_goodput:
            t_lift = time.time()
            ctx.status("lifting the relays' rate limits")
            meta["unlimited_relays"] = lift_rate_limits(run_dir / "net", impl)
            meta["phases"]["unlimit"] = [t_lift, time.time()]
            goodput_network(info)

    def goodput_network(info) -> None:
        argv = _perf(ctx.binary, info.socks, f"{info.http}/bytes/{load.goodput_bytes}", "goodput_3hop",
                     "--count", str(load.goodput_runs), "--socks-user", "goodput",
                     "--timeout", f"{load.goodput_timeout:g}")
        t_start = time.time()
        limit = load.goodput_runs * load.goodput_timeout + PERF_SLACK_S
        phases.wait(phases.start("goodput_3hop", argv), limit, ctx.status, "goodput_3hop")
        meta["phases"]["goodput_3hop"] = [t_start, time.time()]

    shared_goodput = load.goodput_bytes > 0 and load.goodput_network == "load"
    meta["goodput_network"] = "load" if shared_goodput else "own"
    try:
        with run_status(meta):
            if shared_goodput and ctx.backend.name != "loopback":
                raise LabError(f"load.goodput_network = \"load\" needs the loopback backend, not {ctx.backend.name}")
            spec = _spec(opts.network, ctx.variant, ctx.binary, relays=opts.network.relays,
                         rate=opts.network.bandwidth_rate)
            _with_network(ctx, spec, run_dir / "net", impl, "load", meta, load_network)
            phases.stop_all()
            if load.goodput_bytes > 0 and not shared_goodput:
                spec3 = _spec(opts.network, ctx.variant, ctx.binary, relays=load.goodput_relays, rate=None)
                _with_network(ctx, spec3, run_dir / "net-goodput", impl, "goodput", meta, goodput_network)
    finally:
        phases.stop_all()
        meta["t_end"] = time.time()
        write_json(run_dir / "run.json", meta)


# ---------------------------------------------------------------------------
# Analysis


def _run_meta(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads((path / "run.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _window(meta: Mapping[str, Any], phase: str) -> tuple[float, float] | None:
    w = (meta.get("phases") or {}).get(phase)
    if isinstance(w, list) and len(w) == 2 and all(isinstance(x, (int, float)) for x in w):
        return float(w[0]), float(w[1])
    return None


def chive_vs_tor(scenario: Any, variants: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per variant (in scenario order) with the issue's comparison:
    web (fetch_size) ttlb p50/p75 idle and under load, bulk goodput (both
    downloads together) and 3-hop goodput, in seconds and bytes/s."""
    rows = []
    for v in scenario.variants:
        entry = variants.get(v.label)
        if not isinstance(entry, dict):
            continue

        def get(cls: str, *keys: str) -> Any:
            cur: Any = entry.get(cls)
            for k in keys:
                cur = cur.get(k) if isinstance(cur, dict) else None
            return cur

        rest = {k: x for k, x in v.values.items() if k != "impl"}
        rows.append({
            "label": v.label,
            "impl": sc.impl_of(scenario, v),
            "variant": sc.variant_label(rest) if rest else "base",
            "display": sc.display_label(v),
            "web_idle_ttlb_p50": get("web_idle", "ttlb", "p50"),
            "web_idle_ttlb_p75": get("web_idle", "ttlb", "p75"),
            "web_load_ttlb_p50": get("web_load", "ttlb", "p50"),
            "web_load_ttlb_p75": get("web_load", "ttlb", "p75"),
            "load_idle_p50_ratio": _ratio(get("web_load", "ttlb", "p50"), get("web_idle", "ttlb", "p50")),
            "bulk_goodput_bps": get("bulk", "aggregate_goodput_bps"),
            "goodput_3hop_bps": get("goodput_3hop", "goodput_bps"),
            "web_idle_n": get("web_idle", "ttlb", "n"),
            "web_load_n": get("web_load", "ttlb", "n"),
            "goodput_3hop_n": get("goodput_3hop", "ttlb", "n"),
            "errors": sum(int(get(c, "errors") or 0) for c in ("web_idle", "web_load", "goodput_3hop")),
        })
    return rows


def _ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
        return a / b
    return None


def _mb(v: Any) -> str:
    return "" if not isinstance(v, (int, float)) else f"{v / 1e6:.2f}"


def _s(v: Any) -> str:
    return "" if not isinstance(v, (int, float)) else f"{v:.3f}"


def analyze(out_dir: Path, scenario: sc.Scenario) -> an.Analysis:
    """Per variant: the overlay statistics of each class (web_idle, web_load,
    goodput_3hop; bulk only by its window goodput), the chive-vs-tor table
    (``summary["chive_vs_tor"]``) and the overlay figures."""
    out_dir = Path(out_dir)
    labels = [v.label for v in scenario.variants]
    runs_by_variant: dict[str, list[an.RunData]] = {}
    bulk: dict[str, list[float]] = {}
    for label, reps in an.discover_runs(out_dir, labels).items():
        runs = []
        for rep, path in reps:
            meta = _run_meta(path)
            t0, t_end = meta.get("t0"), meta.get("t_end")
            duration = 0.0
            if isinstance(t0, (int, float)) and isinstance(t_end, (int, float)) and t_end > t0:
                duration = float(t_end - t0)
            run = an.load_run(path, label, rep, 0.0, max(duration, 1.0))
            runs.append(run)
            w = _window(meta, "bulk")
            if w is not None:
                g = an.window_goodput([p for p in run.progress if p.cls == "bulk"], *w)
                if g is not None:
                    bulk.setdefault(label, []).append(g)
        runs_by_variant[label] = runs
    view = SimpleNamespace(name=scenario.name, quick=scenario.quick, variants=scenario.variants, warmup=0.0,
                           duration=scenario.duration, impl=scenario.impl, paper=scenario.paper,
                           classes=list(CLASSES))
    result = analyze_runs(view, runs_by_variant)
    summary = result.summary
    summary["kind"] = "idle-vs-load"
    summary["impl"] = scenario.impl
    for label, entry in summary["variants"].items():
        b = entry.get("bulk")
        if isinstance(b, dict):
            values = bulk.get(label, [])
            agg = sum(values) / len(values) if values else None
            clients = _options(scenario).load.bulk_clients
            b["aggregate_goodput_bps"] = agg
            b["goodput_bps"] = None if agg is None or not clients else agg / clients
            b["window_goodput_per_repetition"] = values
    rows = chive_vs_tor(scenario, summary["variants"])
    load = _options(scenario).load
    summary["chive_vs_tor"] = rows
    summary["definitions"]["chive_vs_tor"] = (
        f"web: {load.fetch_size}-byte fetches every {load.fetch_interval:g} s on fresh circuits, ttlb (s) idle and "
        f"while {load.bulk_clients} bulk downloads run; bulk_goodput_bps: bytes/s the bulk downloads received "
        f"together during the loaded fetches; goodput_3hop_bps: median bytes/ttlb of {load.goodput_bytes}-byte "
        + (f"downloads on the load network (3 hops of its {_options(scenario).network.relays} relays) once "
           "their rate limits were lifted" if load.goodput_network == "load"
           else f"downloads through {load.goodput_relays} relays without rate limits"))
    summary["definitions"]["bulk.goodput_bps"] = "idle-vs-load: aggregate bulk goodput / number of bulk downloads"
    table = an.Table(
        title="chive vs. Tor",
        columns=["impl", "variant", "web idle p50 (s)", "web idle p75 (s)", "web load p50 (s)",
                 "web load p75 (s)", "load/idle p50", "bulk goodput (MB/s)", "3-hop goodput (MB/s)",
                 "n idle/load/3-hop", "errors"],
        rows=[[r["impl"], r["variant"], _s(r["web_idle_ttlb_p50"]), _s(r["web_idle_ttlb_p75"]),
               _s(r["web_load_ttlb_p50"]), _s(r["web_load_ttlb_p75"]),
               "" if r["load_idle_p50_ratio"] is None else f"{r['load_idle_p50_ratio']:.2f}x",
               _mb(r["bulk_goodput_bps"]), _mb(r["goodput_3hop_bps"]),
               f"{r['web_idle_n'] or 0}/{r['web_load_n'] or 0}/{r['goodput_3hop_n'] or 0}", r["errors"]]
              for r in rows],
        note=summary["definitions"]["chive_vs_tor"] + ". MB = 10^6 bytes. Times are ttlb from the start of the "
             "transfer (socket connect to the SOCKS port), as Tor Metrics/OnionPerf.",
    )
    result.tables.insert(0, table)
    # Series labels in figures: impl/variant reads better than impl=chive,Scheduler=ewma.
    names = {v.label: sc.display_label(v) for v in scenario.variants}
    for fig in result.figures:
        for series in fig.series:
            for label, name in names.items():
                if series.label == label or series.label.startswith(label + " "):
                    series.label = name + series.label[len(label):]
                    break
    return result


class IdleVsLoad(ExperimentKind):
    """See the module documentation."""

    name = "idle-vs-load"
    Options = Options
    needs_chive_binary = True

    def run_repetition(self, ctx: Any) -> None:
        run_repetition(ctx)

    def analyze(self, out_dir: Path, scenario: sc.Scenario) -> an.Analysis:
        return analyze(out_dir, scenario)

    def describe_run(self, scenario: sc.Scenario) -> str:
        # This kind's phases, not warmup/duration, define the time measured.
        load = _options(scenario).load
        return (f"Variants: {html.escape(', '.join(v.label for v in scenario.variants))}; "
                f"{scenario.repetitions} repetition(s); implementation {html.escape(scenario.impl)}. "
                f"Phases per repetition: {html.escape(str(load.samples))} fetches idle, the same under "
                f"{html.escape(str(load.bulk_clients))} bulk downloads, then the 3-hop goodput "
                f"network{' (--quick)' if scenario.quick else ''}.")


KIND = IdleVsLoad()
