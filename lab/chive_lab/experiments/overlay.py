"""The ``overlay`` kind: a network (loopback or netns backend) loaded by the
scenario's ``chive perf`` clients for warm-up + duration, per variant and
repetition; analysed per client class (:mod:`.overlay_analysis`).

Scenario keys of this kind (besides the common ones): ``[network]`` and
``[[clients]]`` (:mod:`chive_lab.scenario` validates them); variants are relay
config overrides and consensus parameters.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import analysis as an
from .. import scenario as sc
from ..errors import LabError
from ..kinds import ExperimentKind, RepetitionContext, client_seed
from ..network import NetworkSpec
from ..options import option
from ..rundir import backend_network, mmss, run_status, stop_procs, write_json
from .overlay_analysis import analyze_overlay

__all__ = ["KIND", "OverlayKind", "OverlayOptions", "network_spec", "perf_argv", "perf_flags"]

PROGRESS_EVERY_S = 1.0
# Lines of a client's record file read per progress tick at most (keeps the tick cheap).
_TAIL_MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class OverlayOptions:
    """The overlay kind's scenario keys: the network and its clients."""

    network: sc.NetworkConfig = option(default_factory=sc.NetworkConfig, parse=lambda v, _p: sc.parse_network(v))
    clients: tuple[sc.ClientSpec, ...] = option(default=None, parse=lambda v, _p: sc.parse_clients(v))

    def __post_init__(self) -> None:
        if self.clients is None:
            sc.parse_clients([])  # raises: at least one [[clients]] table is needed


def network_spec(scenario: sc.Scenario, variant: sc.Variant, binary: Path | None) -> NetworkSpec:
    """The NetworkSpec of one variant: scenario network + variant overrides."""
    net = scenario.network
    relay = dict(net.relay)
    if net.bandwidth_burst is not None:
        relay["BandwidthBurst"] = net.bandwidth_burst
    relay.update(variant.relay)
    params = dict(net.params)
    params.update(variant.params)
    return NetworkSpec(
        relays=net.relays,
        bandwidth_rate=net.bandwidth_rate,
        relay_overrides=relay,
        authority_params=params,
        client_overrides=dict(net.client),
        binary=binary,
        timeout=net.timeout,
        consensus_interval=net.consensus_interval,
        log_level=net.log_level,
    )


def perf_flags(binary: Path) -> set[str]:
    """The long options ``chive perf --help`` lists (to adapt to older perf builds)."""
    try:
        out = subprocess.run([str(binary), "perf", "--help"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LabError(f"cannot run `{binary} perf --help`: {e}") from e
    text = out.stdout.decode("utf-8", "replace") + out.stderr.decode("utf-8", "replace")
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", text))


def perf_argv(
    binary: Path,
    client: sc.ClientSpec,
    *,
    socks: str,
    http: str,
    run_seconds: float,
    seed: int,
    flags: set[str] | None = None,
    socks_user: str | None = None,
) -> tuple[list[str], list[str]]:
    """The ``chive perf`` command of one client process, and warnings about
    options this perf build lacks (``flags``: what its --help lists; None = all).

    Without ``isolate``, ``socks_user`` (when given) becomes ``--socks-user``:
    the client then keeps one circuit per perf process, as separate users
    would have, instead of every process sharing the SOCKS client's circuit."""
    have = (lambda f: True) if flags is None else (lambda f: f in flags)
    warnings: list[str] = []
    if client.method == "post":
        url = f"{http}/upload"
    else:
        url = f"{http}/bytes/{client.size}"
    argv = [str(binary), "perf", "--socks", socks, "--url", url, "--count", "0"]
    timeout = client.timeout if client.timeout is not None else run_seconds + 60.0
    argv += ["--timeout", f"{timeout:g}"]

    def opt(flag: str, *values: str, fallback: list[str] | None = None, why: str = "") -> None:
        if have(flag):
            argv.extend([flag, *values])
        else:
            if fallback:
                argv.extend(fallback)
            warnings.append(f"{client.cls}: this chive perf has no {flag}{why}")

    opt("--label", client.cls, why=" (records are classed by file name)")
    opt("--duration", f"{run_seconds:g}", why=" (stopped by SIGTERM only)")
    opt("--progress", "1", why=" (throughput over time from transfer records only)")
    if client.method == "post":
        argv += ["--method", "post", "--upload-bytes", str(client.size)]
    if client.pause is not None:
        opt("--pause", f"{client.pause:g}", fallback=["--interval", f"{client.pause:g}"],
            why="; used --interval instead (start-to-start, not end-to-start)")
    elif client.interval is not None:
        argv += ["--interval", f"{client.interval:g}"]
    elif client.think is not None:
        if have("--think"):
            argv += ["--think", client.think.dist, "--think-mean", f"{client.think.mean:g}"]
        else:
            argv += ["--interval", f"{client.think.mean:g}"]
            warnings.append(f"{client.cls}: this chive perf has no --think; used a fixed --interval of the mean")
    if have("--seed"):
        argv += ["--seed", str(seed)]
    if client.isolate:
        argv.append("--isolate")
    elif socks_user is not None and have("--socks-user"):
        argv += ["--socks-user", socks_user]
    if client.parallel > 1:
        opt("--parallel", str(client.parallel), why="; one loop per process")
    if client.start_delay > 0:
        opt("--start-delay", f"{client.start_delay:g}", why="; no start delay")
    if client.verify:
        argv.append("--verify")
    return argv, warnings


class _Tail:
    """Counts transfer records and errors appended to a perf output file."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""
        self.transfers = 0
        self.errors = 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(_TAIL_MAX_BYTES)
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop() if len(lines[-1]) < an.MAX_LINE_BYTES else b""
        for line in lines:
            if b'"progress"' in line:
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(obj, dict) and obj.get("type", "transfer") == "transfer":
                err = obj.get("error")
                if err is None:
                    self.transfers += 1
                elif "interrupted" not in str(err):
                    self.errors += 1


def run_repetition(ctx: RepetitionContext) -> None:
    """One overlay repetition: network up, perf clients for warm-up + duration,
    everything stopped (also on errors and Ctrl-C), logs copied, run.json written."""
    s = ctx.scenario
    run_dir = ctx.run_dir
    net_dir = run_dir / "net"
    clients_dir = run_dir / "clients"
    clients_dir.mkdir(parents=True, exist_ok=True)
    impl = ctx.variant.impl or s.impl
    meta: dict[str, Any] = {
        "variant": ctx.variant.label, "rep": ctx.rep, "seed": ctx.seed, "impl": impl,
        "backend": ctx.backend.name, "warmup": s.warmup, "duration": s.duration, "drain": s.drain,
        "relay_overrides": dict(ctx.variant.relay), "params": dict(ctx.variant.params),
        "status": "starting", "t0": None, "t_end": None, "clients": [], "warnings": [],
    }
    write_json(run_dir / "run.json", meta)
    procs: list[subprocess.Popen] = []
    files = []

    def stop_clients() -> None:
        """The perf clients first (in-flight transfers recorded as interrupted), then the network."""
        meta["t_end"] = time.time()
        codes = stop_procs(procs)
        for c in meta["clients"]:
            c["exit"] = codes.get(c["pid"])
        for f in files:
            f.close()

    try:
        with run_status(meta):
            spec = network_spec(s, ctx.variant, ctx.binary)
            ctx.status("starting the network")
            with backend_network(ctx, spec, net_dir, impl, phase="net", up_log=run_dir / "up.log",
                                 logs_dir=run_dir, down=meta, key="down", before_stop=stop_clients) as info:
                _run_clients(ctx, info, run_dir, meta, procs, files)
    finally:
        if meta["t_end"] is None:  # the network never started
            stop_clients()
        write_json(run_dir / "run.json", meta)


def _run_clients(ctx: RepetitionContext, info: Any, run_dir: Path, meta: dict[str, Any],
                 procs: list[subprocess.Popen], files: list) -> None:
    """The scenario's perf clients on the started network, for warm-up + duration (+ drain)."""
    s = ctx.scenario
    clients_dir = run_dir / "clients"
    flags = perf_flags(ctx.binary)
    run_seconds = s.warmup + s.duration
    tails = []
    index = 0
    commands = []
    for client in s.clients:
        for j in range(client.count):
            argv, warns = perf_argv(ctx.binary, client, socks=info.socks, http=info.http,
                                    run_seconds=run_seconds, seed=client_seed(ctx.seed, ctx.rep, index),
                                    flags=flags, socks_user=f"{client.cls}-{j}")
            for w in warns:
                if w not in meta["warnings"]:
                    meta["warnings"].append(w)
            stem = f"{client.cls}-{j}"
            commands.append((stem, argv))
            index += 1
    for w in meta["warnings"]:
        ctx.log(f"warning: {w}")
    meta["t0"] = time.time()
    for stem, argv in commands:
        out = open(clients_dir / f"{stem}.jsonl", "wb")
        err = open(clients_dir / f"{stem}.stderr", "wb")
        files += [out, err]
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 cwd=run_dir, start_new_session=True, close_fds=True)
        except OSError as e:
            raise LabError(f"cannot start chive perf: {e}") from e
        procs.append(p)
        meta["clients"].append({"name": stem, "pid": p.pid, "argv": argv})
        tails.append(_Tail(clients_dir / f"{stem}.jsonl"))
    meta["status"] = "running"
    write_json(run_dir / "run.json", meta)
    end = meta["t0"] + run_seconds
    hard_end = end + s.drain
    while True:
        now = time.time()
        for t in tails:
            t.poll()
        done = sum(t.transfers for t in tails)
        errs = sum(t.errors for t in tails)
        phase = "warm-up" if now < meta["t0"] + s.warmup else ("measuring" if now < end else "draining")
        ctx.status(f"{mmss(now - meta['t0'])}/{mmss(run_seconds + s.drain)} {phase} "
                   f"transfers {done} errors {errs}")
        if now >= hard_end or (now >= end and all(p.poll() is not None for p in procs)):
            break
        if all(p.poll() is not None for p in procs):
            raise LabError(
                "every chive perf process exited early (see " + str(clients_dir) + "/*.stderr)"
            )
        time.sleep(min(PROGRESS_EVERY_S, max(0.05, hard_end - now)))


class OverlayKind(ExperimentKind):
    """See the module documentation."""

    name = "overlay"
    Options = OverlayOptions
    needs_chive_binary = True

    def run_repetition(self, ctx: RepetitionContext) -> None:
        run_repetition(ctx)

    def analyze(self, out_dir: Path, scenario: Any) -> an.Analysis:
        return analyze_overlay(Path(out_dir), scenario)


KIND = OverlayKind()
