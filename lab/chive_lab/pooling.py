"""``chive-lab pool`` for kinds whose analysis reads repetition directories: the repetitions of
several ``chive-lab run`` outputs of one setup analysed as one batch. The runs stay where they
are (OUT gets no ``runs/``): the kind's analysis reads each source's ``runs/<variant>/<rep>``.
The first source's scenario gives the ``[targets]`` and the testbed: name the newest result
first when the scenario's targets changed since an older one.

A kind uses :func:`pool_results` with its analysis (which must accept the repetition
directories per variant) and gets OUT/summary.json, OUT/figures (PNG + CSV each),
OUT/scenario.toml (the first source's) and OUT/pool.json (which source gave which runs)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Callable

from .errors import LabError
from .manifest import git_state, scenario_of
from .rundir import is_failed

#: Options that may differ between pooled results (not the testbed or the traffic).
POOL_MAY_DIFFER = frozenset({"log_level", "targets"})

#: Per variant label, its repetition directories under ``OUT/runs`` of one result.
RepDirs = Callable[[Path, Any], dict[str, list[Path]]]


def rep_dirs(out_dir: Path, label: str, *, finished: bool = True) -> list[Path]:
    """The repetition directories ``OUT/runs/<label>/<n>`` of one result, in repetition order;
    with ``finished`` only those that wrote their ``run.json`` and did not fail."""
    vdir = Path(out_dir) / "runs" / label
    if not vdir.is_dir():
        return []
    dirs = [d for d in vdir.iterdir() if d.is_dir()]
    if finished:
        dirs = [d for d in dirs if (d / "run.json").is_file() and not is_failed(d)]
    return sorted(dirs, key=lambda d: int(d.name) if d.name.isdigit() else 0)


def manifest_git(src: Path) -> Any:
    """The ``git`` entry of a result's manifest (the revision that ran), or None."""
    try:
        return json.loads((Path(src) / "manifest.json").read_text()).get("git")
    except (OSError, ValueError, AttributeError):
        return None


def pooled_scenario(sources: list[Path], kind_name: str, params_type: type,
                    reps_of_result: RepDirs) -> tuple[Any, dict[str, list[Path]], list[dict[str, Any]]]:
    """The scenario to analyse the sources' runs with (the first source's, with the variants of
    every source), each variant's repetition directories in source order, and per source what it
    gave. LabError when a source is not a ``kind_name`` run, when its testbed, traffic, warm-up or
    duration differ from the first's, or when two sources declare one variant differently."""
    if not sources:
        raise LabError("pool: no results given")
    first = None
    variants: dict[str, Any] = {}
    reps_of: dict[str, list[Path]] = {}
    given: list[dict[str, Any]] = []
    for src in map(Path, sources):
        scenario = scenario_of(src)
        if scenario.kind != kind_name or not isinstance(scenario.options, params_type):
            raise LabError(f"pool: {src} is a {scenario.kind!r} result, not {kind_name!r}")
        if first is None:
            first = scenario
        a, b = scenario.options.__dict__, first.options.__dict__
        for k in a:
            if k not in POOL_MAY_DIFFER and a[k] != b[k]:
                raise LabError(f"pool: {src} has {k} = {a[k]!r}, {sources[0]} has {b[k]!r}: "
                               "only runs of one setup can be pooled")
        if (scenario.warmup, scenario.duration) != (first.warmup, first.duration):
            raise LabError(f"pool: {src} has warm-up/duration {scenario.warmup:g}/{scenario.duration:g} s, "
                           f"{sources[0]} {first.warmup:g}/{first.duration:g} s")
        runs = reps_of_result(src, scenario)
        for v in scenario.variants:
            if v.label in variants and variants[v.label].options != v.options:
                raise LabError(f"pool: variant {v.label!r} is declared differently in {src}")
            variants.setdefault(v.label, v)
            reps_of.setdefault(v.label, []).extend(runs.get(v.label, []))
        given.append({"dir": str(src), "runs": {label: len(d) for label, d in runs.items()},
                      "git": manifest_git(src)})
    assert first is not None
    return dataclasses.replace(first, variants=tuple(variants.values())), reps_of, given


def pool_results(sources: list[Path], out: Path, kind_name: str, params_type: type,
                 reps_of_result: RepDirs,
                 analyze: Callable[[Path, Any, dict[str, list[Path]]], Any]) -> dict[str, Any]:
    """Analyse the sources' runs as one batch into ``out`` with the kind's ``analyze(out,
    scenario, reps_of)`` (an :class:`~chive_lab.analysis.Analysis`); the summary."""
    from .figures import write_figure
    from .rundir import write_json

    scenario, reps_of, given = pooled_scenario([Path(s) for s in sources], kind_name, params_type,
                                               reps_of_result)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = analyze(out, scenario, reps_of)
    result.summary["pooled"] = {"sources": given,
                                "repetitions": {label: len(d) for label, d in reps_of.items()}}
    write_json(out / "summary.json", result.summary)
    for fig in result.figures:
        write_figure(fig, out / "figures")
    shutil.copyfile(Path(sources[0]) / "scenario.toml", out / "scenario.toml")
    (out / "pool.json").write_text(json.dumps({"sources": given, "git": git_state(),
                                               "pooled_by": "chive-lab pool"}, indent=1))
    return result.summary
