"""Scenario parsing: valid files, errors that name the key, [quick], variant labels."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from chive_lab.errors import LabError
from chive_lab.scenario import deep_merge, load_scenario, parse_scenario, select_variants, variant_label

ROOT = Path(__file__).resolve().parents[2]

BASE = """
name = "t"
duration = 30
warmup = 5
repetitions = 2
[network]
relays = 4
bandwidth_rate = 1000000
[network.relay]
CircuitPriorityHalflife = 30
[network.params]
circwindow = 1000
[[clients]]
class = "web"
count = 2
size = 89088
pause = 2.0
isolate = true
[[clients]]
class = "bulk"
size = 5000000
continuous = true
[variants]
Scheduler = ["rr", "ewma"]
[quick]
duration = 4
repetitions = 1
[quick.network]
relays = 3
"""


def parse(text: str, quick: bool = False):
    return parse_scenario(tomllib.loads(text), quick=quick)


def test_valid_scenario_fields():
    s = parse(BASE)
    assert s.name == "t" and s.duration == 30.0 and s.warmup == 5.0 and s.repetitions == 2
    assert s.network.relays == 4 and s.network.bandwidth_rate == 1_000_000
    assert s.network.relay == {"CircuitPriorityHalflife": 30}
    assert s.network.params == {"circwindow": 1000}
    web, bulk = s.clients
    assert (web.cls, web.count, web.size, web.pause, web.isolate) == ("web", 2, 89088, 2.0, True)
    assert bulk.continuous and bulk.count == 1
    assert [v.label for v in s.variants] == ["rr", "ewma"]
    assert s.variants[1].relay == {"Scheduler": "ewma"}
    assert s.kind == "overlay" and s.backend == "loopback" and s.impl == "chive"


def test_quick_overrides_merge_tables():
    s = parse(BASE, quick=True)
    assert s.duration == 4.0 and s.repetitions == 1 and s.quick
    assert s.network.relays == 3
    # keys not in [quick] keep their values, including inside merged tables
    assert s.network.bandwidth_rate == 1_000_000 and s.warmup == 5.0


@pytest.mark.parametrize(
    "change, needle",
    [
        ('durration = 3\n', "durration"),
        ('[network.bogus]\nx = 1\n', "network.bogus"),
        ('[[clients]]\nclass = "x"\nsize = 1\ncontinuous = true\nsizee = 2\n', "clients[2].sizee"),
    ],
)
def test_unknown_keys_are_named(change, needle):
    with pytest.raises(LabError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse(change + BASE if not change.startswith("[") else BASE + change)


@pytest.mark.parametrize(
    "old, new, needle",
    [
        ("duration = 30", "duration = -1", "duration"),
        ("repetitions = 2", "repetitions = 0", "repetitions"),
        ("size = 89088", "size = \"big\"", r"clients\[0\].size"),
        ("relays = 4", "relays = 1", "network.relays"),
        ("pause = 2.0", "pause = 2.0\ninterval = 1", r"clients\[0\].*at most one"),
        ("continuous = true", "", r"clients\[1\].*continuous"),
        ("circwindow = 1000", "circwindow = 1.5", "network.params.circwindow"),
        ("CircuitPriorityHalflife = 30", "Nickname = \"x\"", "managed by the lab"),
        ('Scheduler = ["rr", "ewma"]', 'Scheduler = []', "variants.Scheduler"),
        ('Scheduler = ["rr", "ewma"]', 'Scheduler = ["rr", "rr"]', "two variants"),
    ],
)
def test_bad_values_are_named(old, new, needle):
    assert old in BASE
    with pytest.raises(LabError, match=needle):
        parse(BASE.replace(old, new, 1))


def test_missing_name_and_clients():
    with pytest.raises(LabError, match="name"):
        parse("duration = 3\n[[clients]]\nclass='a'\nsize=1\ncontinuous=true\n")
    with pytest.raises(LabError, match="clients"):
        parse('name = "x"\n')


def test_variant_labels():
    assert variant_label({"Scheduler": "rr"}) == "rr"
    assert variant_label({"CircuitPriorityHalflife": 10}) == "H=10"
    assert variant_label({"CircuitPriorityHalflife": 1.5}) == "H=1.5"
    assert variant_label({"CircuitPriorityHalflife": 10.0}) == "H=10"
    assert variant_label({"Scheduler": "ewma", "CircuitPriorityHalflife": 3}) == "Scheduler=ewma,H=3"
    assert variant_label({"OutbufCells": 32}) == "OutbufCells=32"
    assert variant_label({}) == "base"


def test_matrix_and_explicit_variants_and_params():
    text = BASE.replace('[variants]\nScheduler = ["rr", "ewma"]',
                        '[[variant]]\nlabel = "rr"\nScheduler = "rr"\n'
                        '[variants]\nCircuitPriorityHalflife = [3, 10]\n"params.circwindow" = [101, 1000]')
    s = parse(text)
    assert [v.label for v in s.variants] == [
        "rr", "H=3,circwindow=101", "H=3,circwindow=1000", "H=10,circwindow=101", "H=10,circwindow=1000"]
    v = s.variant("H=10,circwindow=101")
    assert v.relay == {"CircuitPriorityHalflife": 10} and v.params == {"circwindow": 101}
    assert select_variants(s, ["rr"]).variants[0].label == "rr"
    with pytest.raises(LabError, match="no variant"):
        select_variants(s, ["nope"])


def test_impl_both_adds_an_impl_dimension():
    s = parse(BASE.replace('name = "t"', 'name = "t"\nimpl = "both"'))
    assert [v.label for v in s.variants] == [
        "impl=chive,Scheduler=rr", "impl=chive,Scheduler=ewma", "impl=tor,Scheduler=rr", "impl=tor,Scheduler=ewma"]
    assert s.variants[2].impl == "tor" and s.variants[2].relay == {"Scheduler": "rr"}


def test_paper_entries_validated():
    ok = parse(BASE + '[[paper]]\nvariant = "ewma"\nclass = "web"\nmetric = "ttlb_p50"\nvalue = 9.04\n')
    assert ok.paper[0].value == 9.04 and ok.paper[0].cls == "web"
    with pytest.raises(LabError, match="unknown metric"):
        parse(BASE + '[[paper]]\nmetric = "speed"\nvalue = 1\n')
    with pytest.raises(LabError, match="needs value"):
        parse(BASE + '[[paper]]\nmetric = "ttlb_p50"\n')
    r = parse(BASE + '[[paper]]\nmetric = "ttlb_p50_change_pct"\nlow = -20\nhigh = -10\n')
    assert (r.paper[0].low, r.paper[0].high) == (-20.0, -10.0)


def test_other_kind_gets_its_keys_through_the_registry(monkeypatch):
    from chive_lab import kinds

    class FakeKind(kinds.ExperimentKind):
        def parse_options(self, raw):
            return {"parsed": raw}

    monkeypatch.setitem(kinds.KINDS, "fake-kind", FakeKind())
    s = parse('name = "k"\nkind = "fake-kind"\n[hosts]\nA = 1\n')
    assert s.options == {"parsed": {"hosts": {"A": 1}}}
    with pytest.raises(LabError, match="unknown experiment kind"):
        parse('name = "k"\nkind = "nope"\n')


def test_deep_merge():
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": 3}, "d": [2]}) == {"a": {"b": 3, "c": 2}, "d": [2]}


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.toml")) + [ROOT / "lab/tests/data/tiny.toml"],
                         ids=lambda p: p.name)
def test_shipped_scenarios_load(path):
    full = load_scenario(path)
    quick = load_scenario(path, quick=True)
    assert full.variants and quick.duration <= full.duration and quick.repetitions <= full.repetitions


def test_paper_scenarios_exist_with_paper_numbers():
    names = {p.stem for p in (ROOT / "scenarios").glob("paper00[01]-*.toml")}
    assert {"paper000-ewma-web-vs-bulk", "paper000-ewma-bulk-ks", "paper001-ewma-halflife-sweep",
            "paper000-ewma-cpu-overhead"} <= names
    sweep = load_scenario(ROOT / "scenarios/paper001-ewma-halflife-sweep.toml")
    assert [v.label for v in sweep.variants] == ["rr", "H=1.5", "H=3", "H=4.5", "H=10", "H=20", "H=33", "H=66", "H=99"]
    for stem in names:
        path = ROOT / "scenarios" / f"{stem}.toml"
        scen = load_scenario(path)
        if scen.kind == "paper001-onion":
            # That kind compares its own measures (set-up, not ttlb): its numbers sit in
            # [paper_numbers], which its analysis reads.
            assert tomllib.loads(path.read_text())["paper_numbers"]["rr_mean_s"] > 0
        else:
            assert scen.paper, stem


def test_file_errors(tmp_path):
    with pytest.raises(LabError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(LabError, match="not valid TOML"):
        load_scenario(bad)


def test_network_client_keys_reach_the_client_config(tmp_path):
    """[network.client] keys go into the chive client's config (EntryNodes/MiddleNodes pin
    paths so that every variant shares the same relays); lab-managed keys are refused."""
    from chive_lab import config as cfg
    from chive_lab.experiments.overlay import network_spec

    s = parse(BASE.replace("[network.params]", '[network.client]\nEntryNodes = ["relay1"]\n'
                                               'MiddleNodes = ["relay2"]\n[network.params]'))
    assert s.network.client == {"EntryNodes": ["relay1"], "MiddleNodes": ["relay2"]}
    spec = network_spec(s, s.variants[0], None)
    assert spec.client_overrides == {"EntryNodes": ["relay1"], "MiddleNodes": ["relay2"]}
    spec.validate()
    c = cfg.client_config(data_dir=tmp_path, socks_port=9050, authority="127.0.0.1:1",
                          authority_identity="00", log="info", overrides=spec.client_overrides)
    assert c["EntryNodes"] == ["relay1"] and c["SocksPort"] == "127.0.0.1:9050"
    for bad, msg in (('SocksPort = "127.0.0.1:1"', "managed by the lab"),
                     ('"bad key" = 1', "bad config key"),
                     ("EntryNodes = {x = 1}", "cannot go into")):
        with pytest.raises(LabError, match=msg) as e:
            parse(BASE.replace("[network.params]", f"[network.client]\n{bad}\n[network.params]"))
        assert "network.client" in str(e.value)
    assert parse(BASE).network.client == {}
