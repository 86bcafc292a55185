"""The experiment-kind interface: the registry, generic option validation, variants
declared in the scenarios (and label-only ones resolved from the shipped scenarios)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from chive_lab import kinds
from chive_lab.errors import LabError
from chive_lab.options import option, parse_options
from chive_lab.scenario import parse_scenario

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Inner:
    ceil: float | None = option(None, lo=0.0, hi=1.0)


@dataclass(frozen=True)
class Opts:
    rate: str = option("10mbit")
    count: int = option(1, lo=1, hi=16)
    share: float = option(0.5, positive=True, hi=1.0)
    mode: str = option("a", choices=("a", "b"))
    hosts: tuple[str, ...] = option(("A",), choices=("A", "B"))
    limit: int | None = option(None, lo=1)
    flag: bool = False
    table: dict = option(default_factory=dict)
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self) -> None:
        if self.mode == "b" and self.count > 8:
            raise LabError("mode = \"b\" takes count <= 8")


def test_options_are_validated_from_the_declaration():
    o = parse_options(Opts, {"count": 3, "share": 1, "hosts": ["A", "B"], "limit": 5, "flag": True,
                             "table": {"X": 1}, "inner": {"ceil": 0.95}})
    assert o == Opts(count=3, share=1.0, hosts=("A", "B"), limit=5, flag=True, table={"X": 1},
                     inner=Inner(ceil=0.95))
    assert parse_options(Opts, {}) == Opts()
    for raw, match in (({"nope": 1}, r"unknown key nope \(allowed here: .*count"),
                       ({"count": 0}, r"count: must be within 1\.\.16, got 0"),
                       ({"count": True}, "count: must be an integer"),
                       ({"count": "2"}, "count: must be an integer"),
                       ({"share": 0}, "share: must be > 0"),
                       ({"mode": "c"}, "mode: must be one of a, b"),
                       ({"hosts": ["C"]}, "hosts: must be one of A, B"),
                       ({"hosts": "A"}, "hosts: must be an array"),
                       ({"limit": 0}, "limit: must be >= 1"),
                       ({"flag": 1}, "flag: must be true or false"),
                       ({"inner": {"ceil": 2}}, r"inner\.ceil: must be within"),
                       ({"inner": {"x": 1}}, r"unknown key inner\.x"),
                       ({"mode": "b", "count": 9}, "count <= 8")):
        with pytest.raises(LabError, match=match):
            parse_options(Opts, raw)


def test_every_registered_kind_implements_the_interface():
    for name in kinds.KINDS:
        kind = kinds.get_kind(name)
        assert isinstance(kind, kinds.ExperimentKind) and kind.name == name


def test_shipped_variant_declarations_agree_and_resolve_label_only_variants():
    """Variants live in the scenario files; a label-only [[variant]] (as in result folders
    recorded before) takes the shipped declaration, and an unknown one is refused."""
    for name in ("paper002-tcp", "paper002-overlay", "client-uplink"):
        declared = kinds.shipped_declarations(name)
        assert declared, name
    s = parse_scenario({"name": "x", "kind": "paper002-overlay", "topology": "to-b",
                        "variant": [{"label": "split-ackprio-bbr-borrow"}, {"label": "mine", "split": "dynamic"}]})
    borrow, mine = s.variants
    assert borrow.options.shape.bulk_ceil == 0.95 and borrow.options.relay == {"LinkCongestionControl": "bbr"}
    assert mine.options.split == "dynamic" and not mine.options.ackprio
    with pytest.raises(LabError, match="no shipped scenario"):
        parse_scenario({"name": "x", "kind": "paper002-overlay", "variant": [{"label": "nope"}]})
    with pytest.raises(LabError, match=r"variant\[0\]\.split: must be one of"):
        parse_scenario({"name": "x", "kind": "paper002-overlay", "variant": [{"label": "v", "split": "x"}]})
    with pytest.raises(LabError, match=r"unknown key variant\[0\]\.Scheduler"):
        parse_scenario({"name": "x", "kind": "paper002-tcp", "variant": [{"label": "v", "mode": "uni",
                                                                         "Scheduler": "ewma"}]})


def test_targets_are_stated_in_the_scenario():
    s = parse_scenario({"name": "x", "kind": "paper002-overlay",
                        "targets": {"share_min": 0.4, "variance_ratio_max": 0.2},
                        "variant": [{"label": "one"}]})
    assert (s.options.targets.share_min, s.options.targets.variance_ratio_max) == (0.4, 0.2)
    assert s.options.targets.variant == "split-ackprio"
    with pytest.raises(LabError, match=r"targets\.share_min: missing"):
        parse_scenario({"name": "x", "kind": "paper002-overlay", "targets": {"variance_ratio_max": 0.2},
                        "variant": [{"label": "one"}]})


def test_kind_of_a_result(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "scenario.toml").write_text('name = "a"\nkind = "client-uplink"\n')
    assert kinds.kind_of_result(tmp_path / "a") == "client-uplink"
    (tmp_path / "b" / "paper002_overlay").mkdir(parents=True)
    (tmp_path / "b" / "paper002_overlay" / "summary.json").write_text('{"kind": "paper002-overlay"}')
    assert kinds.kind_of_result(tmp_path / "b") == "paper002-overlay"
    with pytest.raises(LabError, match="not a result directory"):
        kinds.kind_of_result(tmp_path / "c")


def test_pool_is_refused_by_kinds_without_it(tmp_path):
    with pytest.raises(LabError, match="cannot pool"):
        kinds.get_kind("overlay").pool([tmp_path], tmp_path / "out")
