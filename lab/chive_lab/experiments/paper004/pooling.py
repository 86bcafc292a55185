"""``chive-lab pool --out OUT SRC...`` for ``paper004-window``: the repetitions of several
``chive-lab run`` outputs of one setup analysed as one batch. The runs stay where they are
(OUT gets no ``runs/``): the analysis reads each source's ``runs/<variant>/<rep>``. Writes
OUT/summary.json, OUT/paper004/{summary.json,comparison.md}, OUT/figures (PNG + CSV each),
OUT/scenario.toml (the first source's) and OUT/pool.json (which source gave which runs).
The first source's scenario also gives the ``[targets]``: name the newest result first when
the scenario's targets changed since an older one."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from ...errors import LabError
from ...manifest import git_state, scenario_of
from . import KIND_NAME, Params
from .analysis import analyze, variant_reps

#: Params that may differ between pooled results (not the testbed or the traffic).
POOL_MAY_DIFFER = {"log_level", "targets"}


def pooled_scenario(sources: list[Path]) -> tuple[Any, dict[str, list[Path]], list[dict[str, Any]]]:
    """The scenario to analyse the sources' runs with (the first source's, with the variants of
    every source), each variant's repetition directories in source order, and per source what it
    gave. LabError when a source is not a paper004 run, when its testbed, traffic, warm-up or
    duration differ from the first's, or when two sources declare one variant differently."""
    if not sources:
        raise LabError("pool: no results given")
    first = None
    variants: dict[str, Any] = {}
    reps_of: dict[str, list[Path]] = {}
    given: list[dict[str, Any]] = []
    for src in sources:
        src = Path(src)
        scenario = scenario_of(src)
        if scenario.kind != KIND_NAME or not isinstance(scenario.options, Params):
            raise LabError(f"pool: {src} is a {scenario.kind!r} result, not {KIND_NAME!r}")
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
        runs = variant_reps(src, scenario)
        for v in scenario.variants:
            if v.label in variants and variants[v.label].options != v.options:
                raise LabError(f"pool: variant {v.label!r} is declared differently in {src}")
            variants.setdefault(v.label, v)
            reps_of.setdefault(v.label, []).extend(runs.get(v.label, []))
        given.append({"dir": str(src), "runs": {label: len(d) for label, d in runs.items()},
                      "git": _git_of(src)})
    assert first is not None
    return dataclasses.replace(first, variants=tuple(variants.values())), reps_of, given


def _git_of(src: Path) -> Any:
    try:
        return json.loads((src / "manifest.json").read_text()).get("git")
    except (OSError, ValueError, AttributeError):
        return None


def pool(sources: list[Path], out: Path) -> dict[str, Any]:
    """Analyse the sources' runs as one batch into ``out``; the summary."""
    from ...figures import write_figure
    from ...rundir import write_json

    scenario, reps_of, given = pooled_scenario([Path(s) for s in sources])
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
