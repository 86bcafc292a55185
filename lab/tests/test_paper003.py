"""The paper003-switching kind: scenario and variant validation, the path variant's skip, and
the analysis (uploads, latency, switch records, Prometheus counters, capacity around switches,
targets, figures) on synthetic run directories."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from chive_lab import scenario as sc
from chive_lab.errors import LabError
from chive_lab.experiments import paper003_switching as p3
from chive_lab.experiments.paper003_switching import analysis as p3a
from chive_lab.figures import write_figure
from chive_lab.kinds import RepetitionContext, get_kind

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "paper003-switching.toml"


def test_scenario_declares_the_paper_testbed_and_variants():
    s = sc.load_scenario(SCENARIO)
    assert s.kind == "paper003-switching" and isinstance(s.options, p3.Params)
    p = s.options
    assert p.client_delays_ms == (120.0, 60.0, 20.0, 10.0)
    assert p.relay_rate_bytes == 187500 and p.upload_bytes == 12_300_000 and p.relay_limit == "link"
    assert p.rate_of("exit") == "3mbit"  # the paper's two exits in one
    v = {x.label: x.options for x in s.variants}
    assert v["multiplexed"].switching == "off" and v["connection"].switching == "connection"
    assert (v["connection"].alpha, v["connection"].beta) == (0.1, 0.5)
    sweep = {(o.alpha, o.beta) for o in v.values() if o.impl == "chive" and o.switching == "connection"}
    assert sweep == {(0.05, 0.1), (0.1, 0.5), (0.3, 0.75), (0.5, 0.9)}
    assert v["path"].switching == "path" and v["path"].spare_path
    assert v["tor-conflux"].impl == "tor" and v["tor-conflux"].conflux and v["tor-conflux"].spare_path
    assert v["tor-multiplexed"].impl == "tor" and not v["tor-multiplexed"].conflux
    # chive as tor runs (congestion control, stream XON/XOFF): consensus params per variant.
    assert v["path-vegas"].switching == "path" and v["path-vegas"].params == {"cc_alg": 2}
    assert v["multiplexed-vegas"].switching == "off" and v["multiplexed-vegas"].params == {"cc_alg": 2}
    assert v["path"].params == {}
    # The leg probe's settings side by side (client SwitchLegProbe: path keeps the default, 0).
    # The whole-move variants say "whole": the client's default is stripe since session 25.
    assert v["path"].client == {"SwitchLegUse": "whole"}
    assert v["path-ahead"].client == {"SwitchLegProbe": 2, "SwitchLegUse": "whole"}
    assert v["path-ahead"].spare_path
    # Striping over both legs (conflux-style), beside the paper's whole-stream move; each
    # stripe variant states its cap and moves (the defaults are 100 and 4 now).
    st = v["path-stripe"]
    assert st.client == {"SwitchLegUse": "stripe", "SwitchStripeLegCells": 0, "SwitchStripeMoves": 1}
    assert st.spare_path and st.switching == "path"
    p1 = v["path-probe-at-report"]
    assert p1.client == {"SwitchLegProbe": 1, "SwitchLegUse": "whole"} and p1.spare_path
    t = p.targets
    # Path mode (connection mode cannot gain on this testbed, docs/paper003-lab.md), striping with
    # a per-leg cap and several moves unconfirmed (session 24's run met all five targets).
    judged = v[t["switching"]]
    assert t["switching"] == "path-stripe-cap100-moves4" and judged.switching == "path"
    assert judged.client == {
        "SwitchLegUse": "stripe",
        "SwitchStripeLegCells": 100,
        "SwitchStripeMoves": 4,
    }
    assert t["switch_time_p50_max_s"] == 0.05 and t["throughput_ratio_min"] == 1.9
    assert t["latency_reduction_min"] == 0.37 and t["bytes_lost_max"] == 0
    quick = sc.load_scenario(SCENARIO, quick=True)
    assert quick.repetitions == 1 and quick.options.upload_bytes < p.upload_bytes
    assert "120/60/20/10 ms" in get_kind("paper003-switching").describe_run(s)


def test_variant_and_params_are_checked():
    with pytest.raises(LabError, match="must not exceed"):
        p3.VariantOptions(switching="connection", alpha=0.6, beta=0.5)
    with pytest.raises(LabError, match="tor variants"):
        p3.VariantOptions(impl="tor", switching="connection")
    with pytest.raises(LabError, match="tor's"):
        p3.VariantOptions(impl="chive", conflux=True, spare_path=True)
    with pytest.raises(LabError, match="spare_path"):
        p3.VariantOptions(impl="tor", conflux=True)
    with pytest.raises(LabError, match="one delay per client"):
        p3._check_delays((1.0, 2.0), "client_delays_ms")
    doc = {"name": "x", "kind": "paper003-switching", "backend": "netns", "relay_limit": "nowhere",
           "variant": [{"label": "m", "switching": "off"}]}
    with pytest.raises(LabError, match="relay_limit"):
        sc.parse_scenario(doc)


def test_relay_and_client_settings():
    conn = p3.VariantOptions(switching="connection", alpha=0.05, beta=0.1)
    assert p3.relay_options(conn, "entry1") == {"CircuitSwitching": "connection", "SwitchAlpha": 0.05,
                                                "SwitchBeta": 0.1, "ExitPolicy": ["reject *:*"]}
    assert "ExitPolicy" not in p3.relay_options(conn, "exit")
    assert p3.relay_options(p3.VariantOptions(), "middle1")["CircuitSwitching"] == "off"
    assert p3.client_pins(p3.VariantOptions()) == {"EntryNodes": ["entry1"], "MiddleNodes": ["middle1"]}
    tor = p3.client_pins(p3.VariantOptions(impl="tor", conflux=True, spare_path=True))
    assert tor == {"EntryNodes": ["entry1", "entry2"], "MiddleNodes": ["middle1", "middle2"], "ExitNodes": ["exit"]}
    link, bucket = p3.Params(), p3.Params(relay_limit="bucket")
    assert p3.relay_host(link, "entry2") == "G2" and p3.relay_host(bucket, "entry2") == "R"
    assert link.rate_of("exit") == link.rate_of("entry1") == "1.5mbit"
    assert p3.Params(exit_rate="3mbit").rate_of("exit") == "3mbit"


def _fake_binary(tmp_path: Path, client_help: str) -> Path:
    path = tmp_path / "chive"
    path.write_text(f"#!{sys.executable}\nimport sys\n"
                    f"sys.stdout.write({client_help!r} if sys.argv[1:2] == ['client'] else '')\n")
    path.chmod(0o755)
    return path


def test_path_variant_is_skipped_while_the_binary_has_no_path_mode(tmp_path):
    old = _fake_binary(tmp_path, '  EntryNodes = ["relayA"]   first hops\n  Log = "info"\n')
    assert "no CircuitSwitching option" in p3.path_mode_unavailable(old)
    new = tmp_path / "new"
    new.mkdir()
    help_ = '  CircuitSwitching = "path"        paper 003\'s path switching\n'
    assert p3.path_mode_unavailable(_fake_binary(new, help_)) is None
    s = sc.load_scenario(SCENARIO, quick=True)
    kind = p3.Paper003()
    variant = next(v for v in s.variants if v.label == "path")
    assert p3.client_options(variant.options) == {
        "CircuitSwitching": "path",
        "MetricsFile": "metrics.jsonl",
        "SwitchLegUse": "whole",
    }
    assert p3.client_options(p3.VariantOptions(switching="connection")) == {}
    anyleg = p3.VariantOptions(switching="path", spare_path=True, client={"SwitchLighterLeg": 0})
    assert p3.client_options(anyleg)["SwitchLighterLeg"] == 0
    with pytest.raises(LabError):
        p3.VariantOptions(impl="tor", client={"SwitchLighterLeg": 0})
    run_dir = tmp_path / "runs" / "path" / "1"
    run_dir.mkdir(parents=True)
    logged: list[str] = []
    ctx = RepetitionContext(scenario=s, variant=variant, rep=1, run_dir=run_dir, seed=1, backend=None,
                            binary=old, log=logged.append)
    kind.run_repetition(ctx)  # no testbed: skipped before anything starts
    assert "no CircuitSwitching" in json.loads((run_dir / "skipped.json").read_text())["reason"]
    assert logged and "skipped" in logged[0]


# ------------------------------------------------------------------ synthetic runs
T0 = 1_700_000_000.0


def _upload(h: str, secs: float, nbytes: int, error: str | None = None) -> dict:
    rec = {"type": "transfer", "class": "up", "loop": 0, "seq": 0, "start": T0, "socks_connected": T0 + 0.1,
           "request_sent": T0 + secs, "bytes": nbytes, "expected_bytes": nbytes}
    if error is None:
        rec.update(first_byte=T0 + secs, last_byte=T0 + secs, status=200)
    else:
        rec["error"] = error
    return rec


def _latency(k: int, rtt: float) -> dict:
    s = T0 + 0.5 * k
    return {"type": "transfer", "class": "lat", "loop": 0, "seq": k, "start": s, "socks_connected": s + 0.01,
            "request_sent": s + 0.02, "first_byte": s + 0.02 + rtt, "last_byte": s + 0.02 + rtt,
            "bytes": 512, "expected_bytes": 512, "status": 200}


def _write_run(d: Path, *, secs: dict[str, float], rtt: float, switch_times: list[float] = (),
               lost: int = 0, error: str | None = None, rate_after: float = 150_000.0,
               path_switch: float | None = None) -> None:
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"t0": T0, "uploads_done": T0 + max(secs.values())}))
    for h, s in secs.items():
        rec = _upload(h, s, 1_000_000, error if h == "C1" else None)
        (d / f"upload-{h}.jsonl").write_text(json.dumps(rec) + "\n")
        (d / f"latency-{h}.jsonl").write_text("".join(json.dumps(_latency(k, rtt)) + "\n" for k in range(10)))
    for nick in p3.RELAYS:
        nd = d / "net" / nick
        nd.mkdir(parents=True)
        lines = [json.dumps({"type": "relay", "t": T0 + k, "cells_out": 100,
                             "bytes_out_per_s": 100_000.0 if k < 10 else rate_after}) for k in range(20)]
        if nick == "entry1":
            lines += [json.dumps({"type": "switch", "t": T0 + 10, "circ": 1, "from": 1, "to": 2,
                                  "outcome": "switched", "triggered": T0 + 10 - st, "switch_time_s": st})
                      for st in switch_times]
            lines.append(json.dumps({"type": "switch", "t": T0 + 11, "circ": 2, "from": 1, "to": None,
                                     "outcome": "timed_out", "triggered": T0 + 9, "switch_time_s": 2.0}))
        (nd / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        prom = (f"# HELP x\nchive_switches_total {len(switch_times) if nick == 'entry1' else 0}\n"
                f"chive_switch_cells_lost_total {lost if nick == 'middle1' else 0}\n"
                "chive_switch_cells_resent_total 0\nchive_switch_cells_held_total{kind=\"a\"} 3\n")
        (nd / "metrics.prom").write_text(prom)
    if path_switch is not None:  # a path switch the client C2 recorded
        cd = d / "net" / "clientC2"
        cd.mkdir(parents=True)
        (cd / "metrics.jsonl").write_text(json.dumps({"type": "switch", "t": T0 + 12, "mode": "path", "circ": 3,
                                                      "outcome": "switched", "switch_time_s": path_switch,
                                                      "held_by": "stream_window"}) + "\n")


def _scenario(tmp_path: Path, labels: list[str]):
    """The quick scenario, its targets judging the connection variant (the synthetic runs'
    switching variant; the scenario itself judges path)."""
    s = sc.load_scenario(SCENARIO, quick=True)
    opts = dataclasses.replace(s.options, targets={**s.options.targets, "switching": "connection"})
    return sc.select_variants(dataclasses.replace(s, options=opts), labels)


def test_analysis_on_synthetic_runs(tmp_path):
    out = tmp_path / "out"
    secs_slow = {"C1": 40.0, "C2": 20.0, "C3": 10.0, "C4": 10.0}
    secs_fast = {"C1": 10.0, "C2": 5.0, "C3": 5.0, "C4": 4.0}
    _write_run(out / "runs" / "multiplexed" / "1", secs=secs_slow, rtt=2.0, rate_after=100_000.0)
    _write_run(out / "runs" / "connection" / "1", secs=secs_fast, rtt=1.0, switch_times=[0.01, 0.02, 0.03])
    (out / "runs" / "path" / "1").mkdir(parents=True)
    (out / "runs" / "path" / "1" / "skipped.json").write_text(json.dumps({"reason": "no path mode"}))
    tor = out / "runs" / "tor-conflux" / "1"
    _write_run(tor, secs={"C1": 8.0, "C2": 8.0, "C3": 8.0, "C4": 8.0}, rtt=1.5)
    legs = ["entry1,middle1,exit", "entry2,middle2,exit"]
    (tor / "tor.json").write_text(json.dumps({"stream_circuits": {"clientC1": {"up": legs, "lat": legs[:1]}}}))
    s = _scenario(tmp_path, ["multiplexed", "connection", "path", "tor-conflux"])
    res = p3a.analyze(out, s)
    v = res.summary["variants"]
    assert v["path"]["skipped"] == "no path mode" and v["path"]["repetitions"] == 0
    c, m = v["connection"], v["multiplexed"]
    assert c["upload"]["ok"] == 4 and c["upload"]["failed"] == 0
    assert c["upload"]["throughput_Bps"]["p50"] == pytest.approx(200_000.0)
    assert m["upload"]["throughput_Bps"]["p50"] == pytest.approx(75_000.0)
    assert c["latency_s"]["p50"] == pytest.approx(1.0) and m["latency_s"]["p50"] == pytest.approx(2.0)
    sw = c["switching"]
    assert sw["switches"] == 3 and sw["outcomes"] == {"switched": 3, "timed_out": 1}
    assert sw["switch_time_s"]["p50"] == pytest.approx(0.02) and sw["switch_time_s"]["p25"] == pytest.approx(0.015)
    assert sw["bytes_lost"] == 0 and sw["cells_held"] == 15 and c["drop_rate"] == 0.0
    # Capacity: 100 kB/s before the switch at T0 + 10, 150 kB/s after it.
    assert c["capacity_change_Bps"]["entry1"]["p50"] == pytest.approx(50_000.0)
    # The multiplexed run has no switch: it is measured at the connection run's switch offsets.
    assert m["capacity_change_Bps"]["exit"]["n"] == 3 and m["capacity_change_Bps"]["exit"]["p50"] == 0.0
    t = res.summary["targets"]
    assert t["lossless"]["met"] is True
    assert t["switch_time_p50"]["met"] is True
    assert t["throughput_ratio"]["ratio"] == pytest.approx(200 / 75) and t["throughput_ratio"]["met"] is True
    assert t["latency_reduction"]["reduction"] == pytest.approx(0.5) and t["latency_reduction"]["met"] is True
    assert v["tor-conflux"]["switching"] is None and v["tor-conflux"]["drop_rate"] is None
    assert v["tor-conflux"]["upload_circuits"] == [{"C1": legs}]
    assert t["not_below_conflux"]["met"] is True  # 200 kB/s against 125 kB/s
    names = {f.name for f in res.figures}
    assert {"fig4_switch_time_cdf", "fig7_throughput_cdf", "fig8_latency_cdf", "drop_rate",
            "fig6_capacity_change_connection", "fig6_capacity_change_multiplexed"} <= names
    for f in res.figures:
        png, csv = write_figure(f, tmp_path / "figs")
        assert csv.read_text().startswith("series,x,y")
    fig4 = next(f for f in res.figures if f.name == "fig4_switch_time_cdf")
    assert [s.label for s in fig4.series] == ["connection α=0.1 β=0.5 (n=3)"]
    comp = (out / "paper003" / "comparison.md").read_text()
    assert "| throughput p50 KB/s | 134 | 264 | 75.0 | 200.0 |" in comp
    assert json.loads((out / "paper003" / "summary.json").read_text())["kind"] == "paper003-switching"
    assert any("path: skipped" in n for n in res.notes)


def test_a_failed_upload_or_a_lost_cell_misses_lossless(tmp_path):
    out = tmp_path / "out"
    secs = {"C1": 10.0, "C2": 5.0, "C3": 5.0, "C4": 4.0}
    _write_run(out / "runs" / "multiplexed" / "1", secs=secs, rtt=1.0,
               error="upload reply mismatch: sha256 abc != def")
    _write_run(out / "runs" / "connection" / "1", secs=secs, rtt=1.0, switch_times=[0.5], lost=2, path_switch=0.7)
    res = p3a.analyze(out, _scenario(tmp_path, ["multiplexed", "connection"]))
    v = res.summary["variants"]
    assert v["multiplexed"]["upload"]["failed"] == 1 and "sha256" in v["multiplexed"]["upload"]["errors"][0]
    assert v["connection"]["switching"]["cells_lost"] == 2
    assert v["connection"]["switching"]["switches"] == 2  # the entry's and the client's (path) switch
    assert v["connection"]["switching"]["held_by"] == {"stream_window": 1}  # only path records say
    assert v["connection"]["switching"]["switch_time_s"]["p50"] == pytest.approx(0.6)
    assert v["connection"]["switching"]["bytes_lost"] == 2 * p3a.CELL_BYTES
    assert v["connection"]["drop_rate"] == pytest.approx(2 / 4000)  # both entries sent 2000 cells
    t = res.summary["targets"]
    assert t["lossless"]["met"] is False
    assert t["switch_time_p50"]["met"] is False  # 0.5 s > 50 ms


def test_conflux_legs_from_circuit_status(tmp_path):
    text = ("4 BUILT $A~entry1,$B~middle2,$C~exit BUILD_FLAGS=NEED_CAPACITY PURPOSE=CONFLUX_LINKED CONFLUX_ID=X1\n"
            "5 BUILT $D~entry2,$E~middle1,$C~exit PURPOSE=CONFLUX_LINKED SOCKS_USERNAME=\"up\" CONFLUX_ID=X1\n"
            "6 BUILT $A~entry1,$E~middle1,$C~exit PURPOSE=CONFLUX_LINKED CONFLUX_ID=X2\n"
            "7 EXTENDED $A~entry1 PURPOSE=GENERAL\n"
            "8 BUILT $A~entry1,$E~middle1,$C~exit PURPOSE=GENERAL SOCKS_USERNAME=\"lat\"\n")
    path = tmp_path / "circuit-status.txt"
    path.write_text(text)
    assert p3a.conflux_legs(path, "up") == ["entry1,middle2,exit", "entry2,middle1,exit"]
    assert p3a.conflux_legs(path, "lat") == []  # not a conflux leg
    assert p3a.conflux_legs(tmp_path / "missing.txt", "up") == []


def test_parse_prometheus_sums_label_sets():
    text = "# HELP a\n# TYPE a counter\na 1\nb{x=\"1\"} 2\nb{x=\"2\"} 3.5\nbad line here\n"
    assert p3a.parse_prometheus(text) == {"a": 1.0, "b": 5.5}


def test_pool_joins_the_main_variants_and_the_fig4_sweep_run_apart(tmp_path):
    """`chive-lab pool` on paper003 results: the main variants of one result and the (α, β)
    sweep of another analysed as one batch (runs read in place), and another testbed refused."""
    from chive_lab.cli import main

    secs = {"C1": 10.0, "C2": 5.0, "C3": 5.0, "C4": 4.0}
    srcs = []
    for i, runs in enumerate(({"multiplexed": [], "connection": [0.01, 0.03]},
                              {"connection": [0.02], "conn-a05-b09": [0.5, 0.7]})):
        out = tmp_path / f"src{i}"
        out.mkdir()
        (out / "scenario.toml").write_text(SCENARIO.read_text())
        (out / "manifest.json").write_text(json.dumps({"variants": list(runs), "quick": True}))
        for label, times in runs.items():
            _write_run(out / "runs" / label / "1", secs=secs, rtt=1.0, switch_times=times)
        srcs.append(out)
    pooled = tmp_path / "pooled"
    assert main(["pool", "--out", str(pooled), *map(str, srcs)]) == 0
    summary = json.loads((pooled / "summary.json").read_text())
    v = summary["variants"]
    assert set(v) == {"multiplexed", "connection", "conn-a05-b09"}
    assert v["connection"]["repetitions"] == 2 and v["connection"]["switching"]["switches"] == 3
    assert v["conn-a05-b09"]["switching"]["switch_time_s"]["p50"] == pytest.approx(0.6)
    assert summary["pooled"]["repetitions"] == {"multiplexed": 1, "connection": 2, "conn-a05-b09": 1}
    assert not (srcs[0] / "paper003").exists() and not (pooled / "runs").exists()
    assert (pooled / "paper003" / "comparison.md").is_file()
    fig4 = (pooled / "figures" / "fig4_switch_time_cdf.csv").read_text()
    assert "α=0.1 β=0.5" in fig4 and "α=0.5 β=0.9" in fig4
    assert json.loads((pooled / "pool.json").read_text())["sources"][1]["runs"] == {
        "connection": 1, "conn-a05-b09": 1}
    # Another testbed (the relays' rate) is refused.
    other = tmp_path / "other"
    other.mkdir()
    (other / "scenario.toml").write_text(SCENARIO.read_text().replace('relay_rate = "1.5mbit"', 'relay_rate = "3mbit"'))
    (other / "manifest.json").write_text(json.dumps({"variants": ["multiplexed"], "quick": True}))
    with pytest.raises(LabError, match="relay_rate"):
        get_kind("paper003-switching").pool([srcs[0], other], tmp_path / "refused")
