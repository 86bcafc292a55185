"""lab/scripts/cpu_rounds.py: variant specs, the rotation, the per-round comparison on synthetic
rows with known answers, and one short real run of two variants."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cpu_rounds.py"
spec = importlib.util.spec_from_file_location("cpu_rounds", SCRIPT)
cr = importlib.util.module_from_spec(spec)
sys.modules["cpu_rounds"] = cr  # dataclasses look their module up while the class is made
spec.loader.exec_module(cr)


def test_variant_specs():
    v = cr.parse_variant("freed param=cc_alg=2 param=cc_cwnd_max=1000 set=OutbufCells=64 bin=/x/chive")
    assert (v.label, str(v.binary)) == ("freed", "/x/chive")
    assert v.relay_cpu_args() == ["--param", "cc_alg=2", "--param", "cc_cwnd_max=1000",
                                  "--set", "OutbufCells=64"]
    assert cr.parse_variant("main").binary == cr.DEFAULT_CHIVE
    for bad in ("", "bin=/x", "a b", "a param=cc_alg", "a flag=1=2", "a bin=", "-x"):
        with pytest.raises(ValueError):
            cr.parse_variant(bad)


def test_each_variant_runs_first_equally_often():
    for k in (2, 3, 5):
        orders = [cr.round_order(k, n) for n in range(1, 2 * k + 1)]
        assert all(sorted(o) == list(range(k)) for o in orders)
        assert sorted(o[0] for o in orders) == sorted(list(range(k)) * 2)


def _row(rnd, variant, a, b, exit_, client, goodput):
    return {"round": rnd, "variant": variant, "relay_a": a, "relay_b": b, "exit": exit_,
            "client": client, "goodput_MBps": goodput}


def test_summary_compares_inside_each_round():
    rows = [
        _row(1, "base", 1.6, 1.8, 3.0, 2.5, 170), _row(1, "new", 1.5, 1.5, 2.6, 2.4, 190),
        _row(2, "base", 2.0, 2.2, 3.4, 2.9, 140), _row(2, "new", 1.9, 2.1, 3.5, 2.8, 150),
        _row(3, "base", 1.5, 1.5, 2.9, 2.4, 180), _row(3, "new", 1.5, 1.5, 2.5, 2.4, 190),
    ]
    base, new = cr.summarize(rows, ["base", "new"])
    assert base["relays"] == pytest.approx(1.7) and "relays_diff" not in base
    assert (base["relays_min"], base["relays_max"]) == (1.5, 2.2)
    # relays (mean of the two per run): -0.2, -0.1, 0.0 -> median -0.1, lower in 2, one tie
    assert new["relays_diff"] == pytest.approx(-0.1)
    assert (new["relays_sign"]["lower"], new["relays_sign"]["ties"]) == (2, 1)
    assert new["exit_diff"] == pytest.approx(-0.4)
    assert new["exit_sign"]["higher"] == 1
    assert new["goodput_MBps_diff"] == pytest.approx(10)
    table = cr.summary_table([base, new])
    assert "| new | 1.50 (1.50–2.10) | 2.60 | 2.40 | 190.0 |" in table
    assert "relays -0.10 (lower in 2 of 3" in table


def test_a_round_missing_a_variant_is_left_out_of_its_comparison():
    rows = [_row(1, "base", 2, 2, 3, 3, 100), _row(1, "new", 1, 1, 2, 2, 120), _row(2, "base", 2, 2, 3, 3, 100)]
    _, new = cr.summarize(rows, ["base", "new"])
    assert new["relays_sign"]["lower"] == 1 and new["rounds"] == 1


def test_results_rows_become_one_line():
    res = {"rows": [
        {"impl": "chive", "process": "relay1", "role": "relay", "ns_per_byte": 1.8, "goodput_MBps": 160.0},
        {"impl": "chive", "process": "relay2", "role": "exit", "ns_per_byte": 3.0, "goodput_MBps": 160.0},
        {"impl": "chive", "process": "relay3", "role": "relay", "ns_per_byte": 1.6, "goodput_MBps": 160.0},
        {"impl": "chive", "process": "client", "role": "client", "ns_per_byte": 2.5, "goodput_MBps": 160.0},
        {"impl": "chive", "process": "httpd", "role": "httpd", "ns_per_byte": 0.2, "goodput_MBps": 160.0},
    ]}
    assert cr.row_from_results(res) == {"relay_a": 1.6, "relay_b": 1.8, "exit": 3.0, "client": 2.5,
                                        "goodput_MBps": 160.0}
    res["rows"] = [r for r in res["rows"] if r["role"] != "exit"]
    with pytest.raises(ValueError):
        cr.row_from_results(res)


def test_arguments_are_checked(tmp_path):
    with pytest.raises(SystemExit):
        cr.parse_args(["--variant", "only"])
    with pytest.raises(SystemExit):
        cr.parse_args(["--variant", "a", "--variant", "a"])
    with pytest.raises(SystemExit):
        cr.parse_args(["--variant", "a", "--variant", f"b bin={tmp_path / 'none'}"])
    with pytest.raises(SystemExit):
        cr.parse_args(["--variant", "a", "--variant", "b param=x"])


def test_a_failed_run_is_left_out_and_the_rounds_go_on(tmp_path, monkeypatch, capsys):
    def fake_run_one(v, _args, out):
        if v.label == "b" and out.name == "b.2":
            raise cr.RunFailed("relay_cpu.py exited 1: see the log")
        return {"relay_a": 1.5, "relay_b": 1.6, "exit": 2.5, "client": 2.2,
                "goodput_MBps": 180.0 if v.label == "a" else 190.0}

    monkeypatch.setattr(cr, "run_one", fake_run_one)
    binary = sys.executable  # any file that exists: the runs are faked
    out = tmp_path / "out"
    assert cr.main(["--variant", f"a bin={binary}", "--variant", f"b bin={binary}", "--rounds", "3",
                    "--out", str(out)]) == 1
    rows = list(csv.DictReader(open(out / "rounds.csv")))
    assert [(r["round"], r["variant"]) for r in rows] == [("1", "a"), ("1", "b"), ("2", "a"), ("3", "a"), ("3", "b")]
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "failed runs" and m["failed"] == [
        {"round": 2, "variant": "b", "error": "relay_cpu.py exited 1: see the log"}]
    b = m["summary"][1]
    assert b["rounds"] == 2 and b["goodput_MBps_sign"]["higher"] == 2
    assert "1 run(s) failed" in capsys.readouterr().err


@pytest.mark.skipif(not cr.DEFAULT_CHIVE.exists() or not cr.PYTHON.exists() or shutil.which("curl") is None,
                    reason="needs target/release/chive, .venv and curl")
@pytest.mark.serial
def test_short_real_rounds(tmp_path, capsys):
    out = tmp_path / "out"
    # 20 MB: relay_cpu.py finds the exit by polling /proc while the body flows (its own test).
    assert cr.main(["--variant", "fixed", "--variant", "vegas param=cc_alg=2", "--rounds", "1",
                    "--bytes", "20000000", "--runs", "1", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "rounds.csv")))
    assert [r["variant"] for r in rows] == ["fixed", "vegas"]
    assert all(float(r["relay_a"]) > 0 and float(r["goodput_MBps"]) > 0 for r in rows)
    run_params = json.loads((out / "runs" / "vegas.1" / "manifest.json").read_text())["params"]
    assert run_params == ["cc_alg=2"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "complete" and [v["label"] for v in m["variants"]] == ["fixed", "vegas"]
    assert "| vegas |" in capsys.readouterr().out
