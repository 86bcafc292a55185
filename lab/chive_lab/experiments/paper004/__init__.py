"""Paper 004 (Loesing 2009, "Reducing the Circuit Window Size in Tor") on the netns testbed:
torperf-style fetches of 40 KiB, 50 KiB and 1 MiB through exits with different circuit
windows, beside chive's congestion control and Debian's tor with the same settings.

The paper ran one exit with a 101-cell window (echelon1) and one with the usual 1000
(echelon2), two Tor clients without entry guards and with circuits at most 1 minute dirty,
and torperf's SOCKS clients choosing the exit with ``.exit``; it plotted kernel densities
of the time to connect, to the first byte and to the last byte (Figs 1-3).

Testbed (netns backend, root): five hosts, each behind its own access link of ``rate``
with ``delay_ms`` of one-way delay (``chive delayline``), so every overlay hop crosses two
delayed links (2 x ``delay_ms`` one way, 30 ms by default; the client-to-web path has four
such hops):

* C: the torperf client (``MaxCircuitDirtiness`` = ``dirtiness``, entry and middle pinned)
  and the background client (``bulk_loops`` back-to-back downloads of ``bulk_bytes``);
* G: the entry relay; M: the middle relay;
* E: the exits of the variant, plus the background load's own exit;
* W: the authority and the web server (``chive httpd``).

Per exit and size one ``chive perf`` loop (its own SOCKS user, so its own circuits) fetches
the file, pauses ``pause_s`` and fetches again, from ``warmup`` s for ``duration`` s. With
``fresh_circuit`` the loop gives every fetch a new random SOCKS username instead (``chive perf
--isolate``): chive and tor (IsolateSOCKSAuth, on by default) never share a circuit between
credentials, so every fetch starts on a circuit with a full window, nothing of an earlier fetch
in flight. The circuit set-up then falls into the time to connect (chive builds the pinned-exit
circuit on demand; tor may hand out a clean circuit it built ahead), and the analysis's
``transfer`` measure (stream open to last byte) is the part the window decides.

Variants (:class:`VariantOptions`): ``impl`` (chive, or tor: Debian's tor in every role),
``params`` (consensus parameters, chive's names: ``cc_alg``, ``circwindow``), ``exits``
(series label -> the exit's ``CircuitWindow``, 0 = the consensus window; tor exits take 0),
``paper`` (the paper's finding for the report), ``fresh_circuit`` (a new circuit per fetch),
``client`` (more options for chive's torperf client, e.g. ``{ PinnedExitCircuits = 0 }`` to
compare with and without the circuits it keeps at pinned exits; chive only).
Series labels are unique in a scenario.

Per run: ``perf-<series>-<size>.jsonl`` (transfer records), ``run.json``, node logs.
Analysis: :mod:`.analysis`; several results of one setup as one batch: :mod:`.pooling`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import netns
from ...errors import LabError
from ...kinds import RepetitionContext
from ...options import option
from .. import bulk
from .. import netns_overlay as no

KIND_NAME = "paper004-window"
HOSTS = ("C", "G", "M", "E", "W")
ENTRY_PORT, MIDDLE_PORT, EXIT_PORT0 = 9001, 9002, 9010
SOCKS_PERF, SOCKS_BULK, HTTP_PORT, DIR_PORT = 9050, 9051, 8080, 7000
BULK_EXIT = "exitbulk"
#: Tor's accepted circuit windows (circwindow, CircuitWindow).
WINDOW_RANGE = (100, 1000)


def _check_sizes(value: tuple[int, ...], path: str) -> tuple[int, ...]:
    if not value or len(set(value)) != len(value):
        raise LabError(f"{path}: needs distinct sizes, got {list(value)}")
    return value


@dataclass(frozen=True)
class Params(bulk.DelayTestbedParams):
    """The scenario's keys of this kind (``scenario.options``)."""

    sizes: tuple[int, ...] = option((40960, 51200, 1048576), lo=1024, hi=64 * 1024 * 1024, check=_check_sizes)
    pause_s: float = option(1.0, lo=0.0, hi=600.0, doc="pause between the fetches of one loop")
    dirtiness: int = option(60, lo=10, hi=3600, doc="the torperf client's MaxCircuitDirtiness")
    bulk_loops: int = option(2, lo=0, hi=16, doc="background downloads running throughout")
    bulk_bytes: int = option(16 * 1024 * 1024, lo=1024, hi=10 * 1024**3)
    fetch_timeout: float = option(120.0, lo=5.0, hi=3600.0)
    log_level: str = option("info", check=bulk.check_log_level)
    #: Series labels the analysis checks the issue's targets with (see .analysis.targets).
    targets: dict[str, Any] = option(default_factory=dict, doc="series labels and thresholds")


def _check_exits(value: dict[str, Any], path: str) -> dict[str, Any]:
    if not value:
        raise LabError(f"{path}: needs at least one exit")
    for label, w in value.items():
        if not label.replace("-", "").replace("_", "").isalnum() or len(label) > 32:
            raise LabError(f"{path}.{label}: a label is letters, digits, '-' or '_' (<= 32)")
        if isinstance(w, bool) or not isinstance(w, int) or not (w == 0 or WINDOW_RANGE[0] <= w <= WINDOW_RANGE[1]):
            raise LabError(f"{path}.{label}: CircuitWindow must be 0 (consensus) or 100..1000, got {w!r}")
    return value


#: Options of the torperf client the kind sets itself (a variant may not override them).
_KIND_CLIENT_KEYS = ("EntryNodes", "MiddleNodes", "MaxCircuitDirtiness")


def _check_client(value: dict[str, Any], path: str) -> dict[str, Any]:
    for key in value:
        if not key.isalnum() or not key[:1].isupper():
            raise LabError(f"{path}.{key}: not a chive client option name")
        if key in _KIND_CLIENT_KEYS:
            raise LabError(f"{path}.{key}: set by the kind (pins and `dirtiness`)")
    return value


@dataclass(frozen=True)
class VariantOptions:
    """What a ``[[variant]]`` of this kind declares."""

    impl: str = option("chive", choices=("chive", "tor"), doc="tor: Debian's tor in every role")
    params: dict[str, Any] = option(default_factory=dict, doc="consensus parameters (cc_alg, circwindow)")
    exits: dict[str, Any] = option(default_factory=dict, check=_check_exits,
                                   doc="series label -> CircuitWindow (0: the consensus')")
    paper: str = option("", doc="the paper's finding for this setting")
    fresh_circuit: bool = option(False, doc="a new circuit per fetch (a random SOCKS username each)")
    client: dict[str, Any] = option(default_factory=dict, check=_check_client,
                                    doc="more options for chive's torperf client (chive only)")

    def __post_init__(self) -> None:
        if self.impl == "tor" and any(self.exits.values()):
            raise LabError("tor exits take no CircuitWindow (set circwindow in params)")
        if self.impl == "tor" and self.client:
            raise LabError("client options are chive's (tor clients are configured by the kind)")
        if self.impl == "tor" and len(self.exits) != 1:
            raise LabError("a tor variant has one exit (tor clients pin it; no .exit notation)")


def exit_nick(i: int) -> str:
    """Nickname of the variant's exit number ``i``."""
    return f"exit{i}"


def perf_stem(series: str, size: int) -> str:
    """File stem of the loop of ``series`` fetching ``size`` bytes."""
    return f"perf-{series}-{size}"


def run_repetition_raw(variant: str, v: VariantOptions, rep: int, out_dir: Path, p: Params, *,
                       measure_s: float, warmup_s: float, chive_bin: Path | None = None,
                       progress=None) -> dict[str, Any]:
    """One repetition of ``variant``: bring up the testbed and overlay, run the bulk loops and
    every (exit, size) torperf loop, keep the records in ``out_dir``; return run.json's dict."""
    say = progress or (lambda _m: None)
    tb = bulk.testbed(p, HOSTS, delay_ms=p.delay_ms, chive_bin=chive_bin, progress=say)
    end = warmup_s + measure_s
    info: dict[str, Any] = {"variant": variant, "rep": rep, "impl": v.impl, "params": p.__dict__,
                            "consensus": dict(v.params), "exits": {}, "measure_s": measure_s,
                            "warmup_s": warmup_s, "fresh_circuit": v.fresh_circuit,
                            "client": dict(v.client)}
    with no.netns_repetition(out_dir, tb, v.impl, chive_bin=chive_bin, log_level=p.log_level,
                             progress=say) as run:
        ov, tor = run.ov, run.tor
        ov.add_authority("W", port=DIR_PORT, params=dict(v.params))
        ov.add_relay("G", "entry", port=ENTRY_PORT)
        ov.add_relay("M", "middle", port=MIDDLE_PORT)
        for i, (label, window) in enumerate(v.exits.items()):
            over = {"CircuitWindow": window} if window else {}
            ov.add_relay("E", exit_nick(i), port=EXIT_PORT0 + i, **({"overrides": over} if over else {}))
            info["exits"][label] = {"nick": exit_nick(i), "CircuitWindow": window or None}
        if p.bulk_loops:
            ov.add_relay("E", BULK_EXIT, port=EXIT_PORT0 + len(v.exits))
        pins = {"EntryNodes": ["entry"], "MiddleNodes": ["middle"]}
        if tor:
            ov.add_client("C", "perf", port=SOCKS_PERF, extra={**pins, "ExitNodes": [exit_nick(0)]},
                          torrc={"MaxCircuitDirtiness": p.dirtiness})
            if p.bulk_loops:
                ov.add_client("C", "bulk", port=SOCKS_BULK, extra={**pins, "ExitNodes": [BULK_EXIT]})
        else:
            ov.add_client("C", "perf", port=SOCKS_PERF,
                          extra={**v.client, **pins, "MaxCircuitDirtiness": p.dirtiness})
            if p.bulk_loops:
                ov.add_client("C", "bulk", port=SOCKS_BULK, extra=pins)
        ov.add_httpd("W", "httpd", port=HTTP_PORT)
        ov.start(timeout=120)
        t0 = time.time() + 1.0
        info["t0"] = t0
        if tor:
            info["tor_consensus_params"] = ov.consensus_params
        run.write_run(info)
        loops = []
        for i in range(p.bulk_loops):
            url = _url(ov, tor, f"/bytes/{p.bulk_bytes}", BULK_EXIT)
            loops.append(no.start_perf_loop(tb, ov, "bulk", url, (t0, t0 + end), end, f"bulk{i}", "bulk",
                                            None, out_dir / f"bulk-{i}"))
        for i, label in enumerate(v.exits):
            for size in p.sizes:
                url = _url(ov, tor, f"/bytes/{size}", exit_nick(i))
                loops.append(_start_torperf(tb, ov, url, t0 + warmup_s, t0 + end, p, f"{label}-{size}",
                                            out_dir / perf_stem(label, size), fresh=v.fresh_circuit))
        say(f"{KIND_NAME}: {variant}: {end:g} s of fetches")
        no.wait_for_loops(loops, [], t0 + end + p.fetch_timeout)
    return info


def _url(ov: Any, tor: bool, path: str, exit_: str) -> str:
    # Tor has no .exit notation: its clients pin the exit (ExitNodes) instead.
    return ov.url("httpd", path) if tor else ov.url("httpd", path, exit=exit_)


def torperf_argv(binary: str, socks: str, url: str, start_delay: float, duration: float, p: Params,
                 user: str, *, fresh: bool = False) -> list[str]:
    """``chive perf``'s arguments for one torperf-style loop labelled ``user``: its own SOCKS
    username (its own circuits, reused while not too dirty), or with ``fresh`` a random one
    per fetch (``--isolate``: a new circuit for every fetch)."""
    who = ["--isolate"] if fresh else ["--socks-user", user]
    return [binary, "perf", "--socks", socks, "--url", url, "--count", "0",
            "--duration", f"{max(1.0, duration):.3f}", "--start-delay", f"{max(0.0, start_delay):.3f}",
            "--pause", f"{p.pause_s:g}", "--verify", "--timeout", f"{p.fetch_timeout:g}",
            *who, "--label", user]


def _start_torperf(tb: netns.Testbed, ov: Any, url: str, start: float, stop: float, p: Params,
                   user: str, stem: Path, *, fresh: bool = False):
    """A torperf-style loop: fetch, pause ``p.pause_s``, fetch again, from ``start`` until
    ``stop`` (UNIX s); the fetch running at ``stop`` is completed (not cut), so the slow
    windows' 1 MiB fetches are not biased towards the fast ones."""
    now = time.time()
    argv = torperf_argv(str(ov.binary), ov.addr("perf"), url, start - now, stop - now, p, user, fresh=fresh)
    with open(f"{stem}.jsonl", "wb") as fh, open(f"{stem}.err", "wb") as fe:
        return tb.popen(ov.nodes["perf"].host, argv, stdout=fh, stderr=fe)


class Paper004(no.NetnsKind):
    """See the module documentation."""

    name = KIND_NAME
    Options = Params
    VariantOptions = VariantOptions

    def preflight(self, scenario: Any) -> None:
        """Refuse the tor variants when tor is not installed; series labels must be unique."""
        seen: dict[str, str] = {}
        for v in scenario.variants:
            for label in v.options.exits:
                if label in seen:
                    raise LabError(f"series {label!r} is declared by variants {seen[label]!r} and {v.label!r}")
                seen[label] = v.label
        super().preflight(scenario)

    def doing(self, scenario: Any, p: Params) -> str:
        return f"{scenario.warmup + scenario.duration:g} s of torperf fetches"

    def repetition(self, ctx: RepetitionContext, p: Params, run_dir: Path) -> None:
        run_repetition_raw(ctx.variant.label, ctx.variant.options, ctx.rep, run_dir, p,
                           measure_s=ctx.scenario.duration, warmup_s=ctx.scenario.warmup, chive_bin=ctx.binary,
                           progress=ctx.log)

    def analyze(self, out_dir: Path, scenario: Any):
        from .analysis import analyze

        return analyze(Path(out_dir), scenario)

    def pool(self, sources: list[Path], out: Path, **options: Any) -> dict[str, Any]:
        """``chive-lab pool``: several results of one setup as one batch (see :mod:`.pooling`)."""
        if options:
            raise LabError(f"pool: kind {KIND_NAME!r} takes no option {sorted(options)[0]}")
        from .pooling import pool

        return pool(sources, out)

    def onionperf_runs(self, out_dir: Path, scenario: Any):
        from .analysis import onionperf_runs

        return onionperf_runs(Path(out_dir), scenario)

    def describe_run(self, scenario: Any) -> str | None:
        p = self.options_of(scenario)
        return (f"{p.describe_links(HOSTS)} ({2 * p.delay_ms:g} ms per hop), {p.bulk_loops} background downloads; torperf loops "
                f"of {', '.join(str(s) for s in p.sizes)} bytes per exit for {scenario.duration:g} s "
                f"after {scenario.warmup:g} s")


KIND = Paper004()
