"""The run manifest (``OUT/manifest.json``): what ran, where, from which
revision, with which versions; written when a run starts and completed when
it ends. Also reading it back, and the scenario as it was run."""

from __future__ import annotations

import importlib
import json
import os
import platform
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from . import scenario as sc
from .errors import LabError
from .network import repo_root

__all__ = ["build_manifest", "cmd_output", "git_state", "load_manifest", "scenario_of"]


def cmd_output(argv: list[str], timeout: float = 10.0) -> str | None:
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
        git["revision"] = cmd_output(["git", "-C", str(root), "rev-parse", "HEAD"])
        status = cmd_output(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
        git["dirty"] = None if status is None else bool(status)
    return git


def build_manifest(scenario: sc.Scenario, binary: Path, argv: list[str], variants: list[str],
                   repetitions: int) -> dict[str, Any]:
    """The run manifest (written at the start, completed at the end)."""
    git = git_state()
    impls = {scenario.impl} | {v.impl for v in scenario.variants if v.impl}
    versions = {
        "chive": cmd_output([str(binary), "--version"]),
        "python": platform.python_version(),
        "numpy": _module_version("numpy"),
        "scipy": _module_version("scipy"),
        "matplotlib": _module_version("matplotlib"),
    }
    if impls & {"tor", "both"}:
        tor = cmd_output(["tor", "--version"])
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
