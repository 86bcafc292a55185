"""Files of one repetition's directory that every kind writes the same way:
``run.json`` (written atomically), node logs copied out of the network
directory, Tor's own metrics, and stopping the client processes a repetition
started."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import LabError

__all__ = ["FAILED_FILE", "TOR_METRICS_FILE", "collect_tor_step", "copy_logs", "is_failed", "mark_failed", "mmss",
           "run_status", "stop_procs", "write_json"]

#: Written into a repetition's directory by the runner when that repetition failed
#: (:class:`~chive_lab.errors.RunFailed`): ``{"variant", "rep", "error"}``. Analyses skip it.
FAILED_FILE = "failed.json"

PERF_TERM_GRACE_S = 5.0


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def stop_procs(procs: list[subprocess.Popen]) -> dict[int, int | None]:
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


def copy_logs(net_dir: Path, run_dir: Path) -> None:
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
        write_json(path, doc)
    except OSError:
        pass
    return snap


@contextlib.contextmanager
def backend_network(ctx: Any, spec: Any, net_dir: Path, impl: str, *, phase: str, up_log: Path, logs_dir: Path,
                    down: dict[str, Any], key: str, before_stop: Callable[[], None] | None = None) -> Iterator[Any]:
    """One network of a repetition on the scenario's backend (``ctx.backend``, loopback or netns):
    started in ``net_dir`` from ``spec`` as ``impl`` (its progress appended to ``up_log``), its
    ``NetworkInfo`` handed to the body; then always, also after a failed start, an error or
    Ctrl-C: ``before_stop()`` (the body's own processes first), Tor's metrics before and after
    the stop (``tor-metrics.json`` under ``phase``), the backend's stop report in ``down[key]``
    and every node's log copied to ``logs_dir``."""
    try:
        with open(up_log, "a", encoding="utf-8") as uplog:
            def up_progress(msg: str) -> None:
                uplog.write(msg + "\n")
                uplog.flush()
            info = ctx.backend.start(spec, net_dir, impl=impl, progress=up_progress)
        yield info
    finally:
        if before_stop is not None:
            before_stop()
        if impl == "tor":
            collect_tor_step(net_dir, ctx.run_dir, phase, "before_stop")
        try:
            report = ctx.backend.stop(net_dir)
            down[key] = {"ok": report.ok, "failed": dict(report.failed)}
        except LabError as e:
            down[key] = {"ok": False, "error": str(e)}
        if impl == "tor":
            collect_tor_step(net_dir, ctx.run_dir, phase, "after_stop")
        logs_dir.mkdir(parents=True, exist_ok=True)
        copy_logs(net_dir, logs_dir)


@contextlib.contextmanager
def run_status(meta: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Record in ``meta["status"]`` (a repetition's ``run.json``) how the body ended, then let
    any exception go on to the runner: ``"ok"``; ``"interrupted"`` (KeyboardInterrupt);
    ``"error: <message>"`` for a :class:`LabError` (its log tail, if any, kept as
    ``error_log_tail``); ``"error: <Type>: <message>"`` for anything else. The caller's own
    ``finally`` (stop processes, copy logs, write run.json) runs after the status is set."""
    try:
        yield meta
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
    meta["status"] = "ok"


def mark_failed(run_dir: Path, variant: str, rep: int, error: str) -> None:
    """Record in ``run_dir`` that this repetition failed and why (see :data:`FAILED_FILE`)."""
    write_json(Path(run_dir) / FAILED_FILE, {"variant": variant, "rep": rep, "error": error})


def is_failed(run_dir: Path) -> bool:
    """Whether the runner recorded ``run_dir``'s repetition as failed."""
    return (Path(run_dir) / FAILED_FILE).is_file()


def mmss(seconds: float) -> str:
    """``MM:SS`` of a non-negative number of seconds (progress lines)."""
    seconds = max(0, int(seconds))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"
