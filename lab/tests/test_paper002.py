"""Paper 002 plain-TCP experiment: analysis on synthetic data, and a very quick real run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from chive_lab import netns, stats
from chive_lab.errors import LabError
from chive_lab.experiments import bulk
from chive_lab.experiments import paper002 as p2

NOT_AVAILABLE = netns.available()


def _synthetic(mode: str, ab_mid: float, jitter: float, n: int, scale: float = 0.2):
    p = p2.Params(scale=scale)
    end = int(p.t(p2.BC_STOP))
    runs = []
    for r in range(n):
        flows = {}
        for c in p2.connections(mode, p):
            for snd, rcv, on in ((c.client, c.server, c.client_sends), (c.server, c.client, c.server_sends)):
                if not on:
                    continue
                s = []
                for t in range(end):
                    active = c.start <= t < c.stop
                    v = 9.5e6 if active else 0.0
                    if active and f"{snd}->{rcv}" == "A->B" and p.t(50) <= t:
                        v = ab_mid + (jitter if (t + r) % 2 else -jitter)
                    s.append(v)
                flows[f"{snd}->{rcv}"] = s
        runs.append(flows)
    return p, runs


def test_connections_per_mode():
    p = p2.Params(scale=1.0)
    assert len(p2.connections("uni", p)) == 2
    bid = p2.connections("bidir", p)
    assert all(c.client_sends and c.server_sends for c in bid)
    split = p2.connections("split", p)
    assert {(c.client, c.server) for c in split} == {("A", "B"), ("B", "A"), ("B", "C"), ("C", "B")}
    assert max(c.stop for c in split) == 300
    with pytest.raises(LabError):
        p2.connections("nope", p)


def test_analysis_on_synthetic_runs(tmp_path):
    p, steady = _synthetic("uni", 9.0e6, 0.0, 3)
    _, shaky = _synthetic("bidir", 3.0e6, 2.0e6, 3)
    s = p2.analyze_raw({"uni-ackprio": steady, "bidir": shaky}, p, tmp_path)
    ab = s["variants"]["uni-ackprio"]["A->B"]
    # Goodput window 10-50 s (scaled 50-250): exactly the mid value.
    assert ab["goodput_bps"] == pytest.approx(9.0e6)
    assert ab["solo_goodput_bps"] == pytest.approx(9.5e6)
    assert ab["ratio_to_solo"] == pytest.approx(9.0 / 9.5)
    assert ab["variance"] == pytest.approx(0.0)
    sh = s["variants"]["bidir"]["A->B"]
    assert sh["goodput_bps"] == pytest.approx(3.0e6, rel=0.02)
    assert sh["variance"] == pytest.approx((2.0e6) ** 2, rel=0.05)
    assert s["schema"] == 1
    # The paper's Fig 9 measure: 10 s slots (2 s at this scale) pooled over the flows towards B.
    # Slots average A->B's +-2 Mbit/s alternation away; what remains is the gap between A->B
    # (3 Mbit/s) and C->B (9.5 Mbit/s): 15 slots each in 100-250 s.
    ex = s["extra"]["bidir"]
    assert ex["variance_slot_s"] == pytest.approx(2.0)
    assert ex["towards_b_variance_slots"] == pytest.approx(3.25e6 ** 2 * 90 / 89)
    assert ex["towards_b_variance_slots_per_run"] == pytest.approx([3.25e6 ** 2 * 30 / 29] * 3)
    assert ex["towards_b_variance"] > ex["towards_b_variance_slots"]
    assert s["extra"]["uni-ackprio"]["towards_b_variance_slots"] == pytest.approx(0.0)
    var_csv = (tmp_path / "variance.csv").read_text().splitlines()
    assert var_csv[0].endswith(",slot_variance_kBps2")
    assert "10 s slots (paper's Fig 9)" in (tmp_path / "comparison.md").read_text()
    for f in ("throughput_uni-ackprio.csv", "throughput_avg_bidir.csv", "variance.csv",
              "comparison.md", "summary.json"):
        assert (tmp_path / f).is_file(), f
    # 90% CI over 3 identical runs is zero wide; the mean is right.
    rows = (tmp_path / "throughput_avg_uni-ackprio.csv").read_text().splitlines()
    first = rows[1].split(",")
    assert first[2] == "A->B" and float(first[3]) == pytest.approx(9.5e6) and float(first[4]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["variants"].keys() == {"uni-ackprio", "bidir"}
    # The report's table and Fig 9 from this summary (both paper-002 kinds use them).
    declared = {"uni-ackprio": p2.VariantOptions(mode="uni", paper="steady"),
                "bidir": p2.VariantOptions(mode="bidir", paper="shaky")}
    table = bulk.goodput_table("t", "flow", "ratio", s, lambda d: d.get("ratio_to_solo"), declared, "n")
    assert table.columns == ["variant", "flow", "Mbit/s", "ratio", "variance (kB/s)^2", "paper"]
    rows = {(r[0], r[1]): r[2:] for r in table.rows}
    assert rows[("uni-ackprio", "A->B")] == [9.0, pytest.approx(9.0 / 9.5), 0, "steady"]
    assert rows[("bidir", "A->B")][2] == pytest.approx((2.0e6) ** 2 / 64e6, rel=0.05)
    assert all(r[3] == "" for (_, f), r in rows.items() if f != "A->B")
    fig = bulk.variance_figure("v", "t", s)
    assert fig.xticks == [(0.0, "uni-ackprio"), (1.0, "bidir")]
    assert fig.series[0].y == [ex["towards_b_variance"] / 64e6 for ex in (s["extra"]["uni-ackprio"], ex)]


def test_representative_run_is_the_median():
    runs = [{"A->B": [x] * 10} for x in (1.0, 5.0, 9.0)]
    assert stats.representative(runs, "A->B", 0, 10) == 1


def test_parse_options():
    p = p2.KIND.parse_options({"scale": 0.2, "queue_at": "host", "ackprio_hosts": ["A", "B"], "rate": "20mbit"})
    assert p.scale == 0.2 and p.queue_at == "host" and p.ackprio_hosts == ("A", "B")
    assert p.switch_port_packets is None
    assert p2.KIND.parse_options({"switch_port_packets": 100}).switch_port_packets == 100
    for bad in ({"nope": 1}, {"scale": 0}, {"queue_at": "nic"}, {"ackprio_hosts": ["D"]}, {"rate": "fast"},
                {"switch_port_packets": 0}, {"switch_port_packets": "100"}, {"switch_port_packets": True}):
        with pytest.raises(LabError):
            p2.KIND.parse_options(bad)


@pytest.mark.skipif(NOT_AVAILABLE is not None, reason=f"netns: {NOT_AVAILABLE}")
def test_very_quick_run_produces_its_files(tmp_path):
    from test_netns import CHIVE  # conftest puts tests/ on sys.path

    if CHIVE is None:
        pytest.skip("target/release/chive with `shape` is not built")
    from chive_lab.runner import run_experiment

    # A->B 0-15 s, B->C 3-18 s; the variants as the shipped scenario declares them.
    src = (Path(__file__).resolve().parents[2] / "scenarios" / "paper002-tcp-ack-priority.toml").read_text()
    scen = tmp_path / "p2.toml"
    scen.write_text(src.replace("scale = 1.0", "scale = 0.06").replace("switch_port_packets = 100", ""))
    before = netns.our_namespaces()
    rc = run_experiment(scen, tmp_path / "out", variants=["uni", "uni-ackprio"], repetitions=1, binary=CHIVE,
                        progress=False)
    assert rc == 0, (tmp_path / "out" / "runner.log").read_text()
    # Nothing of ours left behind (another run's namespaces may come and go meanwhile).
    assert {n for n in netns.our_namespaces() if n.startswith(f"{netns.PREFIX}{os.getpid()}-")} <= set(before)
    out = tmp_path / "out" / "paper002"
    for f in ("throughput_uni.png", "throughput_uni.csv", "throughput_uni-ackprio.png", "variance.png",
              "variance.csv", "summary.json", "comparison.md"):
        assert (out / f).is_file(), f
    v = json.loads((out / "summary.json").read_text())["variants"]
    for flow in ("A->B", "B->C"):
        for var in ("uni", "uni-ackprio"):
            assert v[var][flow]["goodput_bps"] > 0 and not math.isnan(v[var][flow]["variance"])
    # ACK priority keeps A->B near its solo goodput. Whether A->B collapses without it depends
    # on timing on this kernel (seen in some 15 s runs, not in others: docs/netns.md), so the
    # comparison with `uni` is reported by the experiment, not asserted here.
    assert v["uni-ackprio"]["A->B"]["ratio_to_solo"] > 0.85
