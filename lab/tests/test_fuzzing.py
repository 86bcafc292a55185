"""The scenario fuzz target (chive_lab.fuzzing): the seeds validate, the regression inputs and a
short deterministic batch of edits run without a finding, and a finding is not swallowed."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from chive_lab import fuzzing, scenario
from chive_lab.errors import LabError

REGRESSIONS = Path(__file__).parent / "data" / "fuzz-scenario"
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fuzz_scenarios.py"


def test_every_repository_scenario_is_a_raw_seed_that_validates():
    seeds = dict(fuzzing.seed_inputs())
    files = sorted(p.name for p in fuzzing.SCENARIO_DIR.glob("*.toml"))
    assert files and len(seeds) == 3 * len(files)
    for name in files:
        for prefix in ("raw-", "raw-quick-"):
            s = fuzzing.check_scenario_input(seeds[prefix + name])
            assert s is not None and s.quick == (prefix == "raw-quick-"), name
        # The edit seed starts from the same file; its one edit may or may not leave it valid.
        fuzzing.check_scenario_input(seeds["edit-" + name])


def test_regression_inputs_replay_without_a_finding():
    inputs = sorted(p for p in REGRESSIONS.iterdir() if p.is_file() and p.suffix != ".md")
    assert inputs, f"no regression inputs in {REGRESSIONS}"
    for path in inputs:
        fuzzing.check_scenario_input(path.read_bytes())


def test_a_short_batch_of_edits_finds_nothing():
    # make test's short pass (make fuzz runs the coverage-guided fuzzer): 200 inputs from a
    # fixed seed, every impl/quick combination, each validated twice.
    rng = random.Random(18)
    valid = 0
    for _ in range(200):
        mode = 1 | (rng.getrandbits(3) << 1)
        data = bytes([mode]) + rng.randbytes(rng.randint(1, 48))
        if fuzzing.check_scenario_input(data) is not None:
            valid += 1
    # Some edits keep a valid scenario, most make it invalid: both sides are reached.
    assert 0 < valid < 200


def test_edits_are_a_function_of_the_input():
    data = bytes(range(1, 40))
    assert fuzzing.edited_document(data) == fuzzing.edited_document(data)
    assert fuzzing.edited_document(data) != fuzzing.seed_documents()[1][1]


def test_an_error_other_than_lab_error_is_a_finding(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("variants")

    monkeypatch.setattr(fuzzing, "scenario_from_bytes", broken)
    with pytest.raises(KeyError):
        fuzzing.check_scenario_input(b"\x00name = 'x'\n")
    monkeypatch.setattr(fuzzing, "scenario_from_bytes", lambda *a, **k: (_ for _ in ()).throw(LabError("bad")))
    assert fuzzing.check_scenario_input(b"\x00name = 'x'\n") is None


def test_a_scenario_the_runner_cannot_use_is_a_finding(monkeypatch):
    good = fuzzing.check_scenario_input(dict(fuzzing.seed_inputs())["raw-paper003-switching.toml"])
    assert good is not None and len(good.variants) > 1
    twice = scenario._replace(good, variants=good.variants + good.variants[:1])
    monkeypatch.setattr(fuzzing, "scenario_from_bytes", lambda *a, **k: twice)
    with pytest.raises(AssertionError, match="not unique"):
        fuzzing.check_scenario_input(b"\x00")


def test_bytes_and_files_are_read_alike(tmp_path):
    bad = b"name = 'x'\nkind = 'no-such-kind'\n"
    with pytest.raises(LabError, match="unknown experiment kind") as from_bytes:
        scenario.scenario_from_bytes(bad, "x.toml")
    (tmp_path / "x.toml").write_bytes(bad)
    with pytest.raises(LabError) as from_file:
        scenario.load_scenario(tmp_path / "x.toml")
    assert str(from_file.value).endswith(str(from_bytes.value).removeprefix("x.toml"))
    with pytest.raises(LabError, match="larger than"):
        scenario.scenario_from_bytes(b"#" * (scenario.MAX_SCENARIO_BYTES + 1), "big.toml")


def test_the_fuzzer_script_explains_itself():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--seconds" in out.stdout and "atheris" in out.stdout
