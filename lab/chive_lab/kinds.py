"""Experiment kinds behind one interface, and their registry.

A scenario's ``kind`` names an :class:`ExperimentKind`. The runner, the
scenario parser, the report and the CLI use only this interface, so a new
kind is one class and one line in :data:`KINDS`:

* :attr:`ExperimentKind.Options` — a frozen dataclass of the kind's own
  top-level scenario keys, validated generically (:mod:`chive_lab.options`);
* :attr:`ExperimentKind.VariantOptions` — a frozen dataclass of what one
  ``[[variant]]`` declares (None: variants are relay config overrides, as for
  the ``overlay`` kind); a variant given only by its label takes its keys
  from the shipped scenario files of the kind (:func:`shipped_declarations`),
  so result folders recorded before the declarations moved into the
  scenarios analyse as before;
* :meth:`preflight` — refuse, before anything starts, a run that would fail
  part-way (a tool missing for one of the chosen variants);
* :meth:`run_repetition` — one repetition of one variant into ``ctx.run_dir``;
  raise :class:`~chive_lab.errors.RunFailed` when only this repetition failed
  (the batch goes on), any other LabError to stop the batch;
* :meth:`analyze` — the raw records of an output directory into an
  :class:`~chive_lab.analysis.Analysis` (summary, figures, tables);
* :meth:`pool` — several finished results of one setup analysed as one
  batch (``chive-lab pool``), where the kind supports it;
* :meth:`describe_run` — the report's line about what one repetition does.
"""

from __future__ import annotations

import importlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from . import options as opts
from .errors import LabError

__all__ = [
    "KINDS",
    "ExperimentKind",
    "RepetitionContext",
    "client_seed",
    "get_kind",
    "kind_of_result",
    "shipped_declarations",
]


@dataclass
class RepetitionContext:
    """Everything one repetition needs."""

    scenario: Any
    """The :class:`chive_lab.scenario.Scenario`."""
    variant: Any
    """The :class:`chive_lab.scenario.Variant` to run."""
    rep: int
    """1-based repetition number."""
    run_dir: Path
    """OUT/runs/<variant>/<rep> (created)."""
    seed: int
    """Seed for this repetition; the same for every variant (common random numbers)."""
    backend: Any
    """The :class:`chive_lab.runner.Backend` of the scenario."""
    binary: Path
    status: Callable[[str], None] = lambda _msg: None
    """Progress-line updater (one short line)."""
    log: Callable[[str], None] = lambda _msg: None
    """Messages worth keeping (go to OUT/runner.log and stderr)."""


def client_seed(seed: int, rep: int, index: int) -> int:
    """Seed of client process ``index`` in repetition ``rep`` (independent of the variant)."""
    return (seed * 1_000_003 + rep * 10_007 + index) % (2**32)


class ExperimentKind:
    """Base class of the experiment kinds (override what applies)."""

    name: str = ""
    Options: type | None = None
    """Frozen dataclass of the kind's top-level scenario keys (None: it takes none)."""
    VariantOptions: type | None = None
    """Frozen dataclass of a ``[[variant]]``'s keys (None: relay config overrides)."""
    needs_chive_binary: bool = False
    """Whether ``chive-lab run`` must find the chive binary before it starts."""

    def parse_options(self, raw: Mapping[str, Any]) -> Any:
        """The scenario's keys that are not common to every kind, validated."""
        if self.Options is None:
            if raw:
                raise LabError(f"unknown key {sorted(raw)[0]} (kind {self.name!r} takes no extra keys)")
            return None
        return opts.parse_options(self.Options, raw)

    def options_of(self, scenario: Any) -> Any:
        """The scenario's validated :attr:`Options`, or the defaults when it has none (a
        result analysed without its scenario, tests)."""
        if self.Options is not None and isinstance(getattr(scenario, "options", None), self.Options):
            return scenario.options
        return self.Options() if self.Options is not None else None

    def parse_variant(self, label: str, raw: Mapping[str, Any], path: str) -> Any:
        """One variant's keys (``raw``, label removed) as :attr:`VariantOptions`; a variant
        given only by its label takes its keys from the shipped scenarios of the kind."""
        assert self.VariantOptions is not None
        if not raw:
            raw = shipped_declarations(self.name).get(label, {})
            if not raw:
                raise LabError(f"{path}: variant {label!r} declares no keys and no shipped scenario "
                               f"of kind {self.name!r} declares it")
        return opts.parse_options(self.VariantOptions, raw, path)

    def preflight(self, scenario: Any) -> None:
        """Refuse a run that would fail part-way (LabError), before anything starts."""

    def run_repetition(self, ctx: RepetitionContext) -> None:
        """One repetition of ``ctx.variant`` into ``ctx.run_dir``."""
        raise NotImplementedError

    def analyze(self, out_dir: Path, scenario: Any) -> Any:
        """``chive-lab analyze``: an :class:`~chive_lab.analysis.Analysis` from the raw records."""
        raise NotImplementedError

    def pool(self, sources: list[Path], out: Path, **options: Any) -> dict[str, Any]:
        """``chive-lab pool``: analyse several results of one setup as one batch; the summary."""
        raise LabError(f"kind {self.name!r} cannot pool results")

    def describe_run(self, scenario: Any) -> str | None:
        """The report's sentence about what one repetition does (None: warm-up + duration)."""
        return None

    def onionperf_runs(self, out_dir: Path, scenario: Any) -> Any:
        """``chive-lab export --onionperf``: the transfers of a run as ``{source: [RunData]}``
        (one OnionPerf source each), for a kind that keeps its perf records elsewhere than
        ``runs/<variant>/<rep>/clients/*.jsonl``; None: that generic layout, one source per
        variant. A transfer is "in the window" (``RunData.window``) exactly when the kind's
        analysis counts it, so the export recomputes summary.json's times."""
        return None


# Scenario ``kind`` -> "module:attribute" of its ExperimentKind instance (imported on first use).
KINDS: dict[str, Any] = {
    "overlay": "chive_lab.experiments.overlay:KIND",  # perf clients on a loopback/netns network
    "paper002-tcp": "chive_lab.experiments.paper002:KIND",  # plain-TCP reproduction on netns
    "paper002-overlay": "chive_lab.experiments.paper002_overlay:KIND",  # chive relays on netns
    "client-uplink": "chive_lab.experiments.client_uplink:KIND",  # a client uploading while it downloads
    "idle-vs-load": "chive_lab.experiments.idle_vs_load:KIND",  # web idle vs under load, 3-hop goodput
    "paper004-window": "chive_lab.experiments.paper004:KIND",  # circuit windows, torperf-style, with tor
    "paper003-switching": "chive_lab.experiments.paper003_switching:KIND",  # circuit switching, with tor conflux
    "paper001-onion": "chive_lab.experiments.paper001_onion:KIND",  # onion-service set-up under load, with tor
}


def get_kind(name: str) -> ExperimentKind:
    """The experiment kind called ``name``."""
    try:
        target = KINDS[name]
    except KeyError:
        raise LabError(f"unknown experiment kind {name!r} (available: {', '.join(sorted(KINDS))})") from None
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        try:
            target = getattr(importlib.import_module(module), attr or "KIND")
        except (ImportError, AttributeError) as e:
            raise LabError(f"experiment kind {name!r}: cannot load {KINDS[name]}: {e}") from e
    for attr in ("run_repetition", "analyze", "parse_options"):
        if not callable(getattr(target, attr, None)):
            raise LabError(f"experiment kind {name!r} has no {attr}()")
    return target


def kind_of_result(result_dir: Path) -> str:
    """The kind of a finished result: its ``scenario.toml``'s ``kind``, else the ``kind`` of its
    ``summary.json`` (results written before every run went through ``chive-lab run``, with
    the kind's files at the top or one directory down)."""
    import json

    result_dir = Path(result_dir)
    try:
        doc = tomllib.loads((result_dir / "scenario.toml").read_text(encoding="utf-8"))
        return str(doc.get("kind", "overlay"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        pass
    for path in [result_dir / "summary.json", *sorted(result_dir.glob("*/summary.json"))]:
        try:
            kind = json.loads(path.read_text(encoding="utf-8")).get("kind")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(kind, str):
            return kind
    raise LabError(f"{result_dir}: not a result directory (no scenario.toml or summary.json with a kind)")


# ---------------------------------------------------------------------------
# What the shipped scenarios declare


def scenarios_dir() -> Path | None:
    """The repository's ``scenarios/`` directory, if this lab runs from a checkout."""
    from .network import repo_root

    root = repo_root()
    return None if root is None else root / "scenarios"


_SHIPPED: dict[str, dict[str, Any]] = {}


def shipped_declarations(kind: str, key: str = "variant") -> dict[str, Any]:
    """What the shipped scenario files (``scenarios/*.toml``) of ``kind`` declare:
    for ``key = "variant"`` each variant's keys by label (from ``[[variant]]``
    tables that have more than a label), for another ``key`` (``targets``) the
    first such table found. Files are read in name order; LabError if two
    declare one variant differently."""
    cache_key = f"{kind}\0{key}"
    if cache_key in _SHIPPED:
        return _SHIPPED[cache_key]
    found: dict[str, Any] = {}
    origin: dict[str, str] = {}
    base = scenarios_dir()
    for path in sorted(base.glob("*.toml")) if base is not None and base.is_dir() else []:
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if doc.get("kind", "overlay") != kind:
            continue
        if key != "variant":
            if not found and isinstance(doc.get(key), dict):
                found = dict(doc[key])
            continue
        for item in doc.get("variant", []) if isinstance(doc.get("variant"), list) else []:
            if not isinstance(item, dict) or "label" not in item:
                continue
            decl = {k: v for k, v in item.items() if k != "label"}
            if not decl:
                continue
            label = str(item["label"])
            if label in found and found[label] != decl:
                raise LabError(f"variant {label!r} of kind {kind!r} is declared differently in "
                               f"{origin[label]} and {path.name}")
            found.setdefault(label, decl)
            origin.setdefault(label, path.name)
    _SHIPPED[cache_key] = found
    return found
