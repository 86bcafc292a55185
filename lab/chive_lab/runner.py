"""Running experiments: backends, experiment kinds, the overlay repetition, the
manifest, and ``run`` / ``analyze`` as library calls (``chive-lab run`` and
``chive-lab analyze`` are thin wrappers).

Extension points (one line each):

* :data:`BACKENDS` — backend name -> factory of an object with ``name``,
  ``start(spec, dir, *, impl, progress) -> NetworkInfo`` and
  ``stop(dir) -> DownReport``. ``loopback`` wraps :class:`Network`.
* :data:`KINDS` — scenario ``kind`` -> module (or importable module name)
  providing ``run_repetition(ctx: RepetitionContext) -> None`` and
  ``analyze(out_dir: Path, scenario: Scenario) -> analysis.Analysis``, and
  optionally ``parse_options(raw: dict) -> object`` for its own top-level
  scenario keys (raise LabError for unknown ones),
  ``versions() -> dict`` for the manifest, and ``preflight(scenario) -> None``,
  called before anything starts, to refuse a run that would fail part-way
  (a missing tool for one of the chosen variants).

Output directory::

    OUT/scenario.toml  manifest.json  summary.json  report.html  figures/*.png|csv
    OUT/runs/<variant>/<rep>/run.json            timing, commands, status
    OUT/runs/<variant>/<rep>/net/                the network directory (configs, logs, metrics)
    OUT/runs/<variant>/<rep>/logs/<node>.log     copies of every node's log
    OUT/runs/<variant>/<rep>/clients/<class>-<i>.jsonl / .stderr   perf records / messages
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from . import analysis as an
from . import scenario as sc
from .errors import LabError
from .network import Network, NetworkInfo, NetworkSpec, default_binary, repo_root
from .process import DownReport

__all__ = [
    "BACKENDS",
    "KINDS",
    "Backend",
    "LoopbackBackend",
    "RepetitionContext",
    "analyze_dir",
    "collect_tor_step",
    "get_kind",
    "perf_argv",
    "run_experiment",
]

PERF_TERM_GRACE_S = 5.0
PROGRESS_EVERY_S = 1.0
# Lines of a client's record file read per progress tick at most (keeps the tick cheap).
_TAIL_MAX_BYTES = 4 << 20


# ---------------------------------------------------------------------------
# Backends


class Backend(Protocol):
    """Where a network runs."""

    name: str

    def start(self, spec: NetworkSpec, dir: Path, *, impl: str = "chive",
              progress: Callable[[str], None] | None = None) -> NetworkInfo:
        """Start a network described by ``spec`` in ``dir``; return how to use it."""
        ...

    def stop(self, dir: Path) -> DownReport:
        """Stop the network in ``dir`` (always safe to call, also after a failed start)."""
        ...


class LoopbackBackend:
    """Everything on 127.0.0.1; bandwidth from the relays' token buckets."""

    name = "loopback"

    def start(self, spec: NetworkSpec, dir: Path, *, impl: str = "chive",
              progress: Callable[[str], None] | None = None) -> NetworkInfo:
        """:meth:`Network.up` with ``spec.impl`` set to ``impl`` (chive, or tor where
        NetworkSpec supports it)."""
        if impl != "chive":
            if "impl" not in {f.name for f in dataclasses.fields(NetworkSpec)}:
                raise LabError(f"impl {impl!r} is not available in the loopback backend (only 'chive' here)")
        if "impl" in {f.name for f in dataclasses.fields(NetworkSpec)}:
            spec = dataclasses.replace(spec, impl=impl)
        return Network.up(spec, dir, progress=progress)

    def stop(self, dir: Path) -> DownReport:
        """:meth:`Network.down`; a directory without a state file has nothing to stop."""
        if not (Path(dir) / "state.json").exists():
            return DownReport()
        return Network.down(dir)


BACKENDS: dict[str, Callable[[], Backend]] = {
    "loopback": LoopbackBackend,
    "netns": lambda: importlib.import_module("chive_lab.netns").NetnsBackend(),  # root; brief K
}


def get_backend(name: str) -> Backend:
    """An instance of the backend called ``name``."""
    try:
        return BACKENDS[name]()
    except KeyError:
        raise LabError(f"unknown backend {name!r} (available: {', '.join(sorted(BACKENDS))})") from None


# ---------------------------------------------------------------------------
# Experiment kinds


@dataclass
class RepetitionContext:
    """Everything one repetition needs."""

    scenario: sc.Scenario
    variant: sc.Variant
    rep: int
    """1-based repetition number."""
    run_dir: Path
    """OUT/runs/<variant>/<rep> (created)."""
    seed: int
    """Seed for this repetition; the same for every variant (common random numbers)."""
    backend: Backend
    binary: Path
    status: Callable[[str], None] = lambda _msg: None
    """Progress-line updater (one short line)."""
    log: Callable[[str], None] = lambda _msg: None
    """Messages worth keeping (go to OUT/runner.log and stderr)."""


KINDS: dict[str, Any] = {
    "overlay": "chive_lab.runner",
    "paper002-tcp": "chive_lab.experiments.paper002",  # plain-TCP reproduction on netns (brief K)
    "paper002-overlay": "chive_lab.experiments.paper002_overlay",  # chive relays on netns (brief M)
    "client-uplink": "chive_lab.experiments.client_uplink",  # a client uploading while it downloads (netns)
    "idle-vs-load": "chive_lab.experiments.idle_vs_load",  # web idle vs under load, 3-hop goodput (issue 5)
}


def get_kind(name: str) -> Any:
    """The module implementing experiment kind ``name``."""
    try:
        target = KINDS[name]
    except KeyError:
        raise LabError(f"unknown experiment kind {name!r} (available: {', '.join(sorted(KINDS))})") from None
    if isinstance(target, str):
        try:
            target = importlib.import_module(target)
        except ImportError as e:
            raise LabError(f"experiment kind {name!r}: cannot import {target}: {e}") from e
    for attr in ("run_repetition", "analyze"):
        if not callable(getattr(target, attr, None)):
            raise LabError(f"experiment kind {name!r} has no {attr}()")
    return target


def _parse_kind_options(kind: str, raw: dict[str, Any]) -> Any:
    module = get_kind(kind)
    parser = getattr(module, "parse_options", None)
    if parser is None:
        if raw:
            raise LabError(f"unknown key {sorted(raw)[0]} (kind {kind!r} takes no extra keys)")
        return None
    return parser(raw)


sc.set_kind_options_parser(_parse_kind_options)


# ---------------------------------------------------------------------------
# The overlay kind


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


def client_seed(seed: int, rep: int, index: int) -> int:
    """Seed of perf process ``index`` in repetition ``rep`` (independent of the variant)."""
    return (seed * 1_000_003 + rep * 10_007 + index) % (2**32)


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


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _stop_procs(procs: list[subprocess.Popen]) -> dict[int, int | None]:
    """SIGTERM every perf process (each leads its own session), wait, SIGKILL stragglers."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + PERF_TERM_GRACE_S
    codes: dict[int, int | None] = {}
    for p in procs:
        try:
            codes[p.pid] = p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            try:
                codes[p.pid] = p.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                codes[p.pid] = None
    return codes


def _copy_logs(net_dir: Path, run_dir: Path) -> None:
    """Copy each node's log to run_dir/logs/<node>.log (the network dir keeps the originals)."""
    logs = run_dir / "logs"
    if not net_dir.is_dir():
        return
    for node in sorted(p for p in net_dir.iterdir() if p.is_dir()):
        for log in node.glob("*.log"):
            logs.mkdir(exist_ok=True)
            name = f"{node.name}.log" if log.name == "chive.log" else f"{node.name}-{log.name}"
            try:
                shutil.copyfile(log, logs / name)
            except OSError:
                pass


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
    _write_json(run_dir / "run.json", meta)
    procs: list[subprocess.Popen] = []
    files = []
    try:
        spec = network_spec(s, ctx.variant, ctx.binary)
        ctx.status("starting the network")
        with open(run_dir / "up.log", "a", encoding="utf-8") as uplog:
            def up_progress(msg: str) -> None:
                uplog.write(msg + "\n")
                uplog.flush()
            info = ctx.backend.start(spec, net_dir, impl=impl, progress=up_progress)
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
        _write_json(run_dir / "run.json", meta)
        end = meta["t0"] + run_seconds
        hard_end = end + s.drain
        while True:
            now = time.time()
            for t in tails:
                t.poll()
            done = sum(t.transfers for t in tails)
            errs = sum(t.errors for t in tails)
            phase = "warm-up" if now < meta["t0"] + s.warmup else ("measuring" if now < end else "draining")
            ctx.status(f"{_mmss(now - meta['t0'])}/{_mmss(run_seconds + s.drain)} {phase} "
                       f"transfers {done} errors {errs}")
            if now >= hard_end or (now >= end and all(p.poll() is not None for p in procs)):
                break
            if all(p.poll() is not None for p in procs):
                raise LabError(
                    "every chive perf process exited early (see " + str(clients_dir) + "/*.stderr)"
                )
            time.sleep(min(PROGRESS_EVERY_S, max(0.05, hard_end - now)))
        meta["status"] = "ok"
    except KeyboardInterrupt:
        meta["status"] = "interrupted"
        raise
    except LabError as e:
        meta["status"] = f"error: {e}"
        if e.log_tail:
            meta["error_log_tail"] = e.log_tail
        raise
    except Exception as e:  # keep what was collected, then re-raise
        meta["status"] = f"error: {type(e).__name__}: {e}"
        raise
    finally:
        meta["t_end"] = time.time()
        codes = _stop_procs(procs)
        for c in meta["clients"]:
            c["exit"] = codes.get(c["pid"])
        for f in files:
            f.close()
        if impl == "tor":
            collect_tor_step(net_dir, run_dir, "net", "before_stop")
        try:
            report = ctx.backend.stop(net_dir)
            meta["down"] = {"ok": report.ok, "failed": dict(report.failed)}
        except LabError as e:
            meta["down"] = {"ok": False, "error": str(e)}
        if impl == "tor":
            collect_tor_step(net_dir, run_dir, "net", "after_stop")
        _copy_logs(net_dir, run_dir)
        _write_json(run_dir / "run.json", meta)


TOR_METRICS_FILE = "tor-metrics.json"


def collect_tor_step(net_dir: Path, run_dir: Path, phase: str, when: str) -> dict[str, Any]:
    """Tor's own view of the tor network in ``net_dir`` (``tor.collect_tor_metrics``)
    kept in ``run_dir/tor-metrics.json`` under ``[phase][when]`` (``when``:
    ``before_stop`` or ``after_stop``; the circuit-build-time histogram is only
    complete after the stop, when Tor has written its state file). Never raises:
    a failure is recorded as ``{"error": ...}`` so clean-up carries on."""
    try:
        from .tor import collect_tor_metrics

        snap: dict[str, Any] = collect_tor_metrics(net_dir)
    except (LabError, OSError, ValueError) as e:
        snap = {"error": str(e)}
    path = Path(run_dir) / TOR_METRICS_FILE
    doc: dict[str, Any] = {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            doc = loaded
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        pass
    entry = doc.get(phase)
    if not isinstance(entry, dict):
        entry = {}
    entry[when] = snap
    doc[phase] = entry
    try:
        _write_json(path, doc)
    except OSError:
        pass
    return snap


def analyze(out_dir: Path, scenario: sc.Scenario) -> an.Analysis:
    """The overlay kind's analysis (see :mod:`chive_lab.analysis`)."""
    return an.analyze_overlay(out_dir, scenario)


# ---------------------------------------------------------------------------
# Manifest


def _cmd_output(argv: list[str], timeout: float = 10.0) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.decode("utf-8", "replace").strip()[:500]


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _module_version(name: str) -> str | None:
    try:
        return getattr(importlib.import_module(name), "__version__", None)
    except ImportError:
        return None


def git_state() -> dict[str, Any]:
    """The checkout's revision and whether tracked files differ from it (None: unknown).
    Taken when a run starts: a commit made while it runs must not be credited with it."""
    root = repo_root()
    git: dict[str, Any] = {"revision": None, "dirty": None}
    if root is not None:
        git["revision"] = _cmd_output(["git", "-C", str(root), "rev-parse", "HEAD"])
        status = _cmd_output(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
        git["dirty"] = None if status is None else bool(status)
    return git


def build_manifest(scenario: sc.Scenario, binary: Path, argv: list[str], variants: list[str],
                   repetitions: int) -> dict[str, Any]:
    """The run manifest (written at the start, completed at the end)."""
    git = git_state()
    impls = {scenario.impl} | {v.impl for v in scenario.variants if v.impl}
    versions = {
        "chive": _cmd_output([str(binary), "--version"]),
        "python": platform.python_version(),
        "numpy": _module_version("numpy"),
        "scipy": _module_version("scipy"),
        "matplotlib": _module_version("matplotlib"),
    }
    if impls & {"tor", "both"}:
        tor = _cmd_output(["tor", "--version"])
        versions["tor"] = tor.splitlines()[0] if tor else None
    return {
        "schema": 1,
        "scenario": scenario.name,
        "kind": scenario.kind,
        "reproduces": scenario.reproduces,
        "quick": scenario.quick,
        "seed": scenario.seed,
        "repetitions": repetitions,
        "duration": scenario.duration,
        "warmup": scenario.warmup,
        "backend": scenario.backend,
        "impl": scenario.impl,
        "variants": variants,
        "variant_overrides": {v.label: {"relay": dict(v.relay), "params": dict(v.params), "impl": v.impl}
                              for v in scenario.variants},
        "git": git,
        "host": {
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
            "os": platform.platform(),
            "cores": os.cpu_count(),
            "memory_bytes": _memory_bytes(),
        },
        "versions": versions,
        "binary": str(binary),
        "command": argv,
        "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "end": None,
        "status": "running",
        "failures": [],
    }


# ---------------------------------------------------------------------------
# run / analyze


def _mmss(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


class _StatusLine:
    """One progress line on stderr: rewritten in place on a terminal, one line
    per 10 s otherwise (logs stay readable)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.last_print = 0.0
        self.prefix = ""

    def set_prefix(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, msg: str) -> None:
        if not self.enabled:
            return
        line = f"chive-lab: [{self.prefix}] {msg}"
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(100))
            sys.stderr.flush()
        elif now - self.last_print >= 10.0 or not msg[:1].isdigit():
            print(line, file=sys.stderr, flush=True)
            self.last_print = now

    def newline(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def run_experiment(
    scenario_path: Path,
    out: Path,
    *,
    quick: bool = False,
    variants: list[str] | None = None,
    repetitions: int | None = None,
    binary: Path | None = None,
    progress: bool = True,
    argv: list[str] | None = None,
    impl: str | None = None,
) -> int:
    """``chive-lab run``: every variant × repetition (repetitions interleaved, so
    slow drift of the machine affects every variant alike), then analyze and
    report. Returns the exit status: 0 ok, 1 a repetition failed, 130 interrupted.
    What was collected is analyzed in every case. ``impl`` (``--impl``) replaces
    the scenario's ``impl``: ``both`` runs every variant on chive and on tor."""
    scenario = sc.load_scenario(scenario_path, quick=quick, impl=impl)
    if variants:
        scenario = sc.select_variants(scenario, variants)
    if repetitions is not None:
        scenario = sc.with_repetitions(scenario, repetitions)
    kind = get_kind(scenario.kind)
    preflight = getattr(kind, "preflight", None)
    if preflight is not None:
        preflight(scenario)
    backend = get_backend(scenario.backend)
    binary = Path(binary) if binary is not None else default_binary()
    if scenario.kind in ("overlay", "idle-vs-load") and not binary.is_file():
        raise LabError(f"chive binary not found: {binary} (run `cargo build --release` or set CHIVE_BIN)")
    out = Path(out).resolve()
    if (out / "runs").exists() or (out / "manifest.json").exists():
        raise LabError(f"{out} already holds an experiment; use a new directory")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(scenario_path, out / "scenario.toml")
    labels = [v.label for v in scenario.variants]
    manifest = build_manifest(scenario, binary, argv or sys.argv, labels, scenario.repetitions)
    _write_json(out / "manifest.json", manifest)
    status = _StatusLine(progress)
    runner_log = open(out / "runner.log", "a", encoding="utf-8")

    said: set[str] = set()

    def log(msg: str) -> None:
        if msg.startswith("warning:"):
            if msg in said:  # the same perf warning comes with every repetition
                return
            said.add(msg)
        runner_log.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
        runner_log.flush()
        if progress:
            status.newline()
            print(f"chive-lab: {msg}", file=sys.stderr, flush=True)

    rc = 0
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        total = len(labels) * scenario.repetitions
        n = 0
        log(f"running {scenario.name}: {len(labels)} variant(s) x {scenario.repetitions} repetition(s), "
            f"{scenario.warmup:g} s warm-up + {scenario.duration:g} s each, into {out}")
        for rep in range(1, scenario.repetitions + 1):
            for variant in scenario.variants:
                n += 1
                run_dir = out / "runs" / variant.label / str(rep)
                run_dir.mkdir(parents=True, exist_ok=True)
                status.set_prefix(f"{n}/{total} {variant.label} rep {rep}")
                ctx = RepetitionContext(scenario=scenario, variant=variant, rep=rep, run_dir=run_dir,
                                        seed=client_seed(scenario.seed, rep, 0), backend=backend,
                                        binary=binary, status=status, log=log)
                try:
                    kind.run_repetition(ctx)
                    status.newline()
                except LabError as e:
                    status.newline()
                    log(f"error in {variant.label} rep {rep}: {e}")
                    if e.log_tail:
                        log(f"--- last lines of the {e.node} log ---\n{e.log_tail}\n---")
                    manifest["failures"].append({"variant": variant.label, "rep": rep, "error": str(e)})
                    rc = 1
                    raise _Abort() from e
    except KeyboardInterrupt:
        status.newline()
        log("interrupted: every process was stopped; analyzing what was collected")
        manifest["status"] = "interrupted"
        rc = 130
    except _Abort:
        manifest["status"] = "failed"
        log("stopping the experiment (a configuration error would repeat in every run); "
            "analyzing what was collected")
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if manifest["status"] == "running":
            manifest["status"] = "ok"
        manifest["end"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        _write_json(out / "manifest.json", manifest)
        runner_log.close()
    try:
        result = analyze_dir(out)
        from .report import write_report

        path = write_report(out, result)
        if progress:
            print(f"chive-lab: summary: {out / 'summary.json'}", file=sys.stderr)
            print(f"chive-lab: report:  {path}", file=sys.stderr)
    except LabError as e:
        print(f"chive-lab: error: analysis failed: {e}", file=sys.stderr)
        rc = rc or 1
    return rc


class _Abort(Exception):
    pass


def _raise_interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def load_manifest(out: Path) -> dict[str, Any]:
    """OUT/manifest.json as a dict (LabError if missing or damaged)."""
    try:
        obj = json.loads((Path(out) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LabError(f"{out}: no readable manifest.json ({e}); is this a `chive-lab run` directory?") from e
    if not isinstance(obj, dict):
        raise LabError(f"{out}/manifest.json is not an object")
    return obj


def scenario_of(out: Path) -> sc.Scenario:
    """The scenario as it was run (quick applied, variants and repetitions as recorded)."""
    manifest = load_manifest(out)
    impl = manifest.get("impl")
    scenario = sc.load_scenario(Path(out) / "scenario.toml", quick=bool(manifest.get("quick")),
                                impl=impl if impl in sc.IMPLS else None)
    labels = manifest.get("variants")
    if isinstance(labels, list) and labels:
        scenario = sc.select_variants(scenario, [str(x) for x in labels])
    reps = manifest.get("repetitions")
    if isinstance(reps, int) and not isinstance(reps, bool) and reps >= 1:
        scenario = sc.with_repetitions(scenario, reps)
    return scenario


def analyze_dir(out: Path) -> an.Analysis:
    """``chive-lab analyze``: recompute OUT/summary.json from the raw records."""
    out = Path(out)
    scenario = scenario_of(out)
    kind = get_kind(scenario.kind)
    result = kind.analyze(out, scenario)
    tor_part, tor_tables = an.tor_section(out, scenario)
    if tor_part is not None:
        result.summary["tor"] = tor_part
        result.tables.extend(tor_tables)
    _write_json(out / "summary.json", result.summary)
    return result
