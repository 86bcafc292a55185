"""Running an experiment: every variant x repetition of a scenario through its
kind (:mod:`chive_lab.kinds`), the manifest, then analysis and report;
``run_experiment`` / ``analyze_dir`` are the library calls behind
``chive-lab run`` and ``chive-lab analyze``.

Extension point: :data:`BACKENDS` — backend name -> factory of an object with
``name``, ``start(spec, dir, *, impl, progress) -> NetworkInfo`` and
``stop(dir) -> DownReport``. ``loopback`` wraps :class:`Network`. Kinds are
registered in :data:`chive_lab.kinds.KINDS`.

A repetition that raises :class:`~chive_lab.errors.RunFailed` is recorded as
failed (``failed.json`` in its directory, the manifest's ``failures``, the
console) and the batch goes on; any other LabError stops the batch (a
configuration error would repeat in every run). What was collected is
analysed in every case.

Output directory::

    OUT/scenario.toml  manifest.json  summary.json  report.html  figures/*.png|csv
    OUT/runs/<variant>/<rep>/...                 what the kind writes (run.json, logs, records)
    OUT/runs/<variant>/<rep>/failed.json         only if that repetition failed
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Protocol

from . import analysis as an
from . import scenario as sc
from .errors import LabError, RunFailed
from .kinds import RepetitionContext, client_seed, get_kind
from .manifest import build_manifest, load_manifest, scenario_of
from .network import Network, NetworkInfo, NetworkSpec, default_binary
from .process import DownReport
from .rundir import mark_failed, write_json
from .tor_summary import tor_section

__all__ = [
    "BACKENDS",
    "Backend",
    "LoopbackBackend",
    "analyze_dir",
    "get_backend",
    "load_manifest",
    "run_experiment",
    "scenario_of",
]


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
# run / analyze


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
    kind.preflight(scenario)
    backend = get_backend(scenario.backend)
    binary = Path(binary) if binary is not None else default_binary()
    if getattr(kind, "needs_chive_binary", False) and not binary.is_file():
        raise LabError(f"chive binary not found: {binary} (run `cargo build --release` or set CHIVE_BIN)")
    out = Path(out).resolve()
    if (out / "runs").exists() or (out / "manifest.json").exists():
        raise LabError(f"{out} already holds an experiment; use a new directory")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(scenario_path, out / "scenario.toml")
    labels = [v.label for v in scenario.variants]
    manifest = build_manifest(scenario, binary, argv or sys.argv, labels, scenario.repetitions)
    write_json(out / "manifest.json", manifest)
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

    def failed(e: LabError, variant: str, rep: int) -> None:
        status.newline()
        log(f"error in {variant} rep {rep}: {e}")
        if e.log_tail:
            log(f"--- last lines of the {e.node} log ---\n{e.log_tail}\n---")
        manifest["failures"].append({"variant": variant, "rep": rep, "error": str(e)})

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
                except RunFailed as e:
                    # Only this repetition: record it, leave it out of the analysis, go on.
                    failed(e, variant.label, rep)
                    mark_failed(run_dir, variant.label, rep, str(e))
                    log(f"{variant.label} rep {rep} failed; going on with the next repetition")
                    rc = 1
                except LabError as e:
                    failed(e, variant.label, rep)
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
            manifest["status"] = "ok" if not manifest["failures"] else "partial"  # some runs failed
        manifest["end"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_json(out / "manifest.json", manifest)
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


def _failed_runs(out: Path) -> list[dict]:
    """The repetitions the runner recorded as failed (``failed.json``), in directory order."""
    import json

    found = []
    for path in sorted(Path(out).glob("runs/*/*/failed.json")):
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            found.append({"variant": path.parent.parent.name, "rep": path.parent.name, "error": "?"})
    return found


def analyze_dir(out: Path) -> an.Analysis:
    """``chive-lab analyze``: recompute OUT/summary.json from the raw records
    (failed repetitions left out, and counted in ``failed_runs``)."""
    out = Path(out)
    scenario = scenario_of(out)
    kind = get_kind(scenario.kind)
    result = kind.analyze(out, scenario)
    tor_part, tor_tables = tor_section(out, scenario)
    if tor_part is not None:
        result.summary["tor"] = tor_part
        result.tables.extend(tor_tables)
    failed = _failed_runs(out)
    if failed:
        result.summary["failed_runs"] = failed
        result.notes.append(f"{len(failed)} repetition(s) failed and are left out of this analysis: "
                            + "; ".join(f"{f.get('variant')} rep {f.get('rep')}: {f.get('error')}" for f in failed))
    write_json(out / "summary.json", result.summary)
    return result
