"""Pooling finished ``paper002-overlay`` results: each result's per-second series
read back from its throughput CSVs (``chive-lab run`` outputs, or the
standalone ones written before every run went through ``chive-lab run``),
checked to come from one setup, and analysed as one batch
(``chive-lab pool --out DIR SRC...``)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

from ...errors import LabError
from ...manifest import git_state
from ...pooling import POOL_MAY_DIFFER, manifest_git
from .analysis import analyze_raw
from .evidence import extra_channel_pairs
from .options import Params, Targets, VariantOptions
from .targets import declared_variants


def _scenario_declarations(result_dir: Path) -> tuple[dict[str, VariantOptions], Targets | None]:
    """The variants and targets a result's ``scenario.toml`` declares (empty without one)."""
    from ...scenario import load_scenario

    if not (result_dir / "scenario.toml").is_file():
        return {}, None
    scenario = load_scenario(result_dir / "scenario.toml")
    opts = scenario.options if isinstance(scenario.options, Params) else None
    return ({v.label: v.options for v in scenario.variants if isinstance(v.options, VariantOptions)},
            opts.targets if opts is not None else None)


def read_result(result_dir: Path) -> tuple[Params, dict[str, list[dict[str, list[float]]]]]:
    """A finished run's :class:`Params` and per-run series (every 1 s sample of every
    direction and loop, from ``throughput_<variant>.csv``), from a ``chive-lab run`` output
    (files in ``paper002_overlay/``) or a standalone one (files at the top)."""
    p, results, _evidence = read_result_with_evidence(result_dir)
    return p, results


def read_result_with_evidence(result_dir: Path) -> tuple[Params, dict[str, list[dict[str, list[float]]]],
                                                        dict[str, list[dict | None]]]:
    """:func:`read_result` plus each run's evidence from ``summary.json`` (in run order;
    ``None`` for every run of a variant whose evidence does not cover all its runs)."""
    result_dir = Path(result_dir)
    inner = result_dir / "paper002_overlay"
    base = inner if (inner / "summary.json").is_file() else result_dir
    try:
        summary = json.loads((base / "summary.json").read_text())
        raw = summary["params"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LabError(f"{result_dir}: not a paper002-overlay result ({e})") from e
    fields = Params.__dataclass_fields__
    p = Params(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in fields})
    results: dict[str, list[dict[str, list[float]]]] = {}
    for variant in summary.get("variants", {}):
        path = base / f"throughput_{variant}.csv"
        runs: dict[int, dict[str, dict[int, float]]] = {}
        try:
            lines = _read_text_maybe_gzipped(path).splitlines()
        except (OSError, EOFError) as e:
            raise LabError(f"{result_dir}: {e}") from e
        for line in lines[1:]:
            try:
                run, second, flow, bps = line.split(",")
                runs.setdefault(int(run), {}).setdefault(flow, {})[int(second)] = float(bps)
            except ValueError as e:
                raise LabError(f"{path}: bad row {line!r}") from e
        results[variant] = [{flow: [by_s.get(t, 0.0) for t in range(max(by_s) + 1)]
                             for flow, by_s in runs[r].items()} for r in sorted(runs)]
    evidence: dict[str, list[dict | None]] = {}
    for variant, runs_of in results.items():
        ev = summary.get("extra", {}).get(variant, {}).get("evidence", {})
        # Evidence is keyed by run directory in run order (analyze_raw writes the CSV runs in
        # the same order); only a full set can be matched to the runs.
        evs = list(ev.values()) if isinstance(ev, dict) else []
        evidence[variant] = evs if len(evs) == len(runs_of) else [None] * len(runs_of)
    return p, results, evidence


def _read_text_maybe_gzipped(path: Path) -> str:
    """``path``'s text, or ``path.gz``'s when only the compressed copy exists (results/ keeps
    the large per-second CSVs of pooled folders gzipped to stay under its size limit)."""
    if not path.is_file() and path.with_name(path.name + ".gz").is_file():
        with gzip.open(path.with_name(path.name + ".gz"), "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text()


def pool(result_dirs: list[Path], out: Path, *, exclude_extra_channels: bool = False) -> dict:
    """Analyse the runs of several finished results as one batch (same testbed and traffic,
    checked): the paper pooled 100 runs; ours accumulate across sessions. Each run's evidence
    comes along (keyed ``<result>#<n>``); ``exclude_extra_channels`` leaves out runs that
    :func:`extra_channel_pairs` flags (listed in ``pool.json``)."""
    if not result_dirs:
        raise LabError("pool: no results given")
    variants, targets = declared_variants(), None
    for d in result_dirs:  # what the results' own scenarios declare (none for standalone results)
        declared, declared_t = _scenario_declarations(Path(d))
        variants.update(declared)
        targets = targets or declared_t
    merged: dict[str, list] = {}
    evidence: dict[str, dict] = {}
    excluded: list[str] = []
    first: Params | None = None
    sources = []
    for d in result_dirs:
        p, results, evs = read_result_with_evidence(d)
        if first is None:
            first = p
        for k in first.__dict__:
            if k not in POOL_MAY_DIFFER and getattr(p, k) != getattr(first, k):
                raise LabError(f"pool: {d} has {k} = {getattr(p, k)!r}, {result_dirs[0]} has "
                               f"{getattr(first, k)!r}: only runs of one setup can be pooled")
        for v, runs in results.items():
            for i, (run, ev) in enumerate(zip(runs, evs[v]), start=1):
                key = f"{Path(d).name}#{i}"
                if exclude_extra_channels and extra_channel_pairs(v, ev, variants):
                    excluded.append(f"{v} {key}")
                    continue
                merged.setdefault(v, []).append(run)
                if ev is not None:
                    evidence.setdefault(v, {})[key] = ev
        sources.append({"dir": str(d), "runs": {v: len(r) for v, r in results.items()},
                        "git": manifest_git(Path(d))})
    assert first is not None
    if targets is not None:
        first = dataclasses.replace(first, targets=targets)
    summary = analyze_raw(merged, first, out, evidence, variants)
    (out / "pool.json").write_text(json.dumps({"sources": sources, "git": git_state(),
                                               "pooled_by": "chive-lab pool",
                                               "excluded_extra_channels": excluded}, indent=1))
    return summary
