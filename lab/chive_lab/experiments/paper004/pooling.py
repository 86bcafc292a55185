"""``chive-lab pool --out OUT SRC...`` for ``paper004-window``: the repetitions of several
``chive-lab run`` outputs of one setup analysed as one batch (the shared rules and files:
:mod:`chive_lab.pooling`). Writes OUT/summary.json, OUT/paper004/{summary.json,comparison.md},
OUT/figures (PNG + CSV each), OUT/scenario.toml (the first source's) and OUT/pool.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...pooling import pool_results
from . import KIND_NAME, Params
from .analysis import analyze, variant_reps


def pool(sources: list[Path], out: Path) -> dict[str, Any]:
    """Analyse the sources' runs as one batch into ``out``; the summary."""
    return pool_results(sources, out, KIND_NAME, Params, variant_reps, analyze)
