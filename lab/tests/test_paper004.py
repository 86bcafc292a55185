"""The paper004-window kind: scenario, variants, the tor authority's consensus parameters,
and the analysis (times from perf records, K–S, KDE/CDF figures, targets, relay delays) on
synthetic run directories."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chive_lab import netns, stats
from chive_lab import scenario as sc
from chive_lab.errors import LabError
from chive_lab.experiments import paper004 as p4
from chive_lab.experiments.paper004 import analysis as p4a
from chive_lab.figures import write_figure
from chive_lab.kinds import get_kind
from chive_lab.tor import tor_unavailable_reason
from chive_lab.tor_netns import TorOverlay

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "paper004-circuit-window.toml"
TOR_MISSING = tor_unavailable_reason()


def test_scenario_declares_the_paper_setup():
    s = sc.load_scenario(SCENARIO)
    assert s.kind == "paper004-window" and isinstance(s.options, p4.Params)
    assert s.options.sizes == (40960, 51200, 1048576)
    assert s.options.dirtiness == 60 and 20 <= 2 * s.options.delay_ms <= 80
    v = {x.label: x.options for x in s.variants}
    assert v["chive"].exits == {"chive-w100": 100, "chive-w101": 101, "chive-w1000": 1000}
    assert v["chive-vegas"].params == {"cc_alg": 2}
    assert v["tor-w101"].params == {"cc_alg": 0, "circwindow": 101} and v["tor-w101"].impl == "tor"
    assert v["tor-vegas"].params == {"cc_alg": 2}
    quick = sc.load_scenario(SCENARIO, quick=True)
    assert quick.repetitions == 1 and quick.duration < s.duration
    assert "30 ms per hop" in get_kind("paper004-window").describe_run(s)


def test_variant_options_are_checked():
    with pytest.raises(LabError, match="100..1000"):
        p4._check_exits({"x": 99}, "exits")
    with pytest.raises(LabError, match="at least one"):
        p4._check_exits({}, "exits")
    with pytest.raises(LabError, match="no CircuitWindow"):
        p4.VariantOptions(impl="tor", exits={"t": 101})
    with pytest.raises(LabError, match="one exit"):
        p4.VariantOptions(impl="tor", exits={"a": 0, "b": 0})
    # Client options: chive's only, and not the ones the kind sets.
    assert p4.VariantOptions(exits={"a": 0}, client={"PinnedExitCircuits": 0}).client == {"PinnedExitCircuits": 0}
    with pytest.raises(LabError, match="chive's"):
        p4.VariantOptions(impl="tor", exits={"t": 0}, client={"PinnedExitCircuits": 0})
    with pytest.raises(LabError, match="set by the kind"):
        p4._check_client({"MaxCircuitDirtiness": 10}, "client")
    with pytest.raises(LabError, match="option name"):
        p4._check_client({"bad key": 1}, "client")


@pytest.mark.serial
@pytest.mark.skipif(TOR_MISSING is not None, reason=f"tor: {TOR_MISSING}")
def test_tor_authority_gets_the_consensus_params(tmp_path):
    tb = netns.Testbed([netns.HostSpec(h, netns.LinkSpec("10mbit")) for h in ("A", "B")])
    ov = TorOverlay(tb, tmp_path, binary=Path("/bin/true"))
    ov.add_authority("A", params={"cc_alg": 0, "circwindow": 101})
    ov.add_relay("B", "relayB")
    for i, n in enumerate(ov.tor_nodes.values()):
        n.fingerprint, n.v3ident = f"{i:040X}", f"{i + 100:040X}"
    assert ("ConsensusParams", "cc_alg=0 circwindow=101") in ov.torrc_lines("authority")
    assert not any(k == "ConsensusParams" for k, _ in ov.torrc_lines("relayB"))
    ov2 = TorOverlay(tb, tmp_path / "2", binary=Path("/bin/true"))
    with pytest.raises(LabError, match="no Tor equivalent"):
        ov2.add_authority("A", params={"OutbufCells": 10})
    with pytest.raises(LabError, match="circwindow"):
        TorOverlay(tb, tmp_path / "3", binary=Path("/bin/true")).add_authority("A", params={"circwindow": 50})


# ------------------------------------------------------------------ analysis
def _fetch(start: float, connect: float, ttfb: float, ttlb: float, size: int) -> dict:
    return {"type": "transfer", "start": start, "socket_connected": start, "socks_connected": start + connect,
            "request_sent": start + connect, "first_byte": start + ttfb, "last_byte": start + ttlb,
            "bytes": size, "expected_bytes": size, "status": 200, "error": None}


def _fetch_times(seed: int, spread: float, n: int):
    """``draw(mu)``: ``n`` fetch times, ``mu`` plus an exponential of scale ``spread`` seconds,
    from one generator seeded ``seed``."""
    rng = np.random.default_rng(seed)
    return lambda mu: list(mu + rng.exponential(spread, n))


def _write_run(out: Path, variant: str, exits: dict, times: dict, t0: float = 1000.0) -> Path:
    """runs/<variant>/1 with perf files: times[(label, size)] = list of ttlb seconds."""
    d = out / "runs" / variant / "1"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"t0": t0, "warmup_s": 5.0, "measure_s": 100.0}))
    for (label, size), ttlbs in times.items():
        lines = [_fetch(t0 - 1, 0.1, 0.2, 9.0, size)]  # before the warm-up ended: ignored
        lines += [_fetch(t0 + 5 + i, 0.3, 0.5, t, size) for i, t in enumerate(ttlbs)]
        lines.append({"type": "transfer", "start": t0 + 50, "bytes": 10, "status": None,
                      "error": "http: connection closed after 10 of 40960 body bytes"})
        lines.append({"type": "transfer", "start": t0 + 60, "bytes": 10, "error": "cut at deadline"})
        (d / f"{p4.perf_stem(label, size)}.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    net = d / "net" / "exit0"
    net.mkdir(parents=True)
    cells = [{"type": "cell", "queued": t0 + 10 + i, "dequeued": t0 + 10 + i, "written": t0 + 10 + i + i / 1000}
             for i in range(20)]
    cells.append({"type": "cell", "queued": t0 + 1, "dequeued": t0 + 1, "written": t0 + 2})  # warm-up
    (net / "metrics.jsonl").write_text("\n".join(json.dumps(c) for c in cells) + "\n")
    return d


def _scenario(tmp_path: Path) -> sc.Scenario:
    text = SCENARIO.read_text().replace("sizes = [40960, 51200, 1048576]", "sizes = [40960, 1048576]")
    path = tmp_path / "s.toml"
    path.write_text(text)
    return sc.load_scenario(path)


@pytest.mark.real_figures
def test_analysis_measures_tests_and_judges_targets(tmp_path):
    s = _scenario(tmp_path)
    small, large = 40960, 1048576
    draw = _fetch_times(seed=1, spread=0.1, n=40)
    _write_run(tmp_path, "chive", s.variant("chive").options.exits, {
        ("chive-w100", small): draw(1.0), ("chive-w100", large): draw(9.0),
        ("chive-w101", small): draw(1.0), ("chive-w101", large): draw(9.0),
        ("chive-w1000", small): draw(2.0), ("chive-w1000", large): draw(4.0)})
    _write_run(tmp_path, "chive-vegas", {}, {("chive-vegas", small): draw(0.9), ("chive-vegas", large): draw(2.0)})
    _write_run(tmp_path, "tor-vegas", {}, {("tor-vegas", small): draw(1.0), ("tor-vegas", large): draw(3.0)})
    a = p4a.analyze(tmp_path, s)
    e = a.summary["series"]["chive-w101"]["sizes"][str(small)]
    assert e["n"] == 40 and e["errors"] == 1  # the early fetch and the cut one do not count
    assert e["connect"]["p50"] == pytest.approx(0.3) and e["ttfb"]["p50"] == pytest.approx(0.5)
    assert e["ttlb"]["p50"] == pytest.approx(np.median(_pooled_ttlb(tmp_path, "chive", "chive-w101", small)))
    ks = {(r["a"], r["b"], r["size"], r["measure"]): r for r in a.summary["ks"]}
    assert ks[("chive-w101", "chive-w1000", large, "ttlb")]["pvalue"] < 1e-6
    assert ks[("chive-w101", "chive-w1000", small, "connect")]["statistic"] == 0.0
    t = a.summary["targets"]
    assert t["direction_chive"]["met"] is True
    assert t["direction_tor"]["met"] is None  # no tor fixed-window series in this run
    assert t["cc_as_fast_as_best_fixed"]["met"] is True
    assert t["cc_vs_tor_vegas"]["ratio"] == pytest.approx(
        a.summary["series"]["tor-vegas"]["sizes"][str(large)]["ttlb"]["p50"]
        / a.summary["series"]["chive-vegas"]["sizes"][str(large)]["ttlb"]["p50"])
    assert t["cc_vs_tor_vegas"]["met"] is True  # ~3.1 / ~2.1
    delays = a.summary["relay_delay_ms"]["exit"]["chive-w100"]
    assert delays["n"] == 20 and delays["p50"] == pytest.approx(9.5) and delays["p95"] < 20
    names = {f.name for f in a.figures}
    assert {"kde_ttlb_40960", "cdf_ttlb_1048576", "kde_connect_40960", "cdf_ttfb_40960"} <= names
    fig = next(f for f in a.figures if f.name == "cdf_ttlb_1048576")
    assert {x.label for x in fig.series} >= {"chive-w101", "chive-vegas"}
    assert all(x.lo is not None for x in fig.series)  # the band
    png, csv_path = write_figure(fig, tmp_path / "figs")
    assert png.stat().st_size > 0 and csv_path.read_text().startswith("series,x,y,lo,hi")
    md = (tmp_path / "paper004" / "comparison.md").read_text()
    assert "The paper's findings beside ours" in md and "| chive-w101 | 40 |" in md


def _pooled_ttlb(out: Path, variant: str, label: str, size: int) -> list[float]:
    recs = [json.loads(x) for x in (out / "runs" / variant / "1" / f"{p4.perf_stem(label, size)}.jsonl")
            .read_text().splitlines()]
    return [r["last_byte"] - r["start"] for r in recs if r.get("status") == 200 and r["start"] >= 1005]


def test_median_ci_and_missing_data():
    assert stats.median_ci([1.0, 2.0]) is None
    lo, hi = stats.median_ci(list(range(1, 101)))
    assert lo < 50.5 < hi and hi - lo < 25
    # Missing and non-finite values are left out, as summarize does.
    assert stats.median_ci([None, float("nan"), 1.0, 2.0]) is None
    assert stats.percentile([1.0, None, 3.0], 50) == 2.0 and stats.percentile([], 95) is None
    # A series with no fetches still gets a row, no KDE (stats.kde needs two values).
    assert stats.kde([1.0], [0.0, 1.0]) is None


# ------------------------------------------------------------ fresh circuits
FRESH = SCENARIO.with_name("paper004-fresh-circuit.toml")


def test_fresh_circuit_gives_every_fetch_its_own_socks_user():
    p = p4.Params()
    reused = p4.torperf_argv("chive", "10.0.0.1:9050", "http://w/bytes/1", 1.0, 10.0, p, "chive-w101-40960")
    fresh = p4.torperf_argv("chive", "10.0.0.1:9050", "http://w/bytes/1", 1.0, 10.0, p, "chive-w101-40960",
                            fresh=True)
    assert reused[reused.index("--socks-user") + 1] == "chive-w101-40960" and "--isolate" not in reused
    assert "--isolate" in fresh and "--socks-user" not in fresh
    assert fresh[fresh.index("--label") + 1] == "chive-w101-40960"  # the class stays the series-size
    s = sc.load_scenario(FRESH)
    assert s.kind == "paper004-window" and all(v.options.fresh_circuit for v in s.variants)
    assert not any(v.options.fresh_circuit for v in sc.load_scenario(SCENARIO).variants)
    series = {label for v in s.variants for label in v.options.exits}
    t = s.options.targets
    assert {t[k] for k in ("small", "large", "tor_small", "tor_large", "cc", "tor_cc")} <= series
    v = {x.label: x.options for x in s.variants}
    assert v["tor-w100-fresh"].params == {"cc_alg": 0, "circwindow": 100}
    assert v["chive-fresh"].exits == {"chive-w101-fresh": 101, "chive-w1000-fresh": 1000}
    # The network-wide small window (tor's circwindow is always network-wide) on chive too.
    assert v["chive-net101-fresh"].params == {"cc_alg": 0, "circwindow": 101}
    assert "chive-net101-fresh" in t["fixed"]


def _fresh_scenario(tmp_path: Path) -> tuple[sc.Scenario, str]:
    text = FRESH.read_text().replace("sizes = [40960, 51200, 1048576]", "sizes = [40960, 1048576]")
    path = tmp_path / "scenario.toml"
    path.write_text(text)
    return sc.load_scenario(path), text


def _write_fresh_runs(out: Path, s: sc.Scenario) -> None:
    small, large = 40960, 1048576
    draw = _fetch_times(seed=7, spread=0.2, n=30)
    _write_run(out, "chive-fresh", s.variant("chive-fresh").options.exits, {
        ("chive-w101-fresh", small): draw(1.0), ("chive-w101-fresh", large): draw(9.0),
        ("chive-w1000-fresh", small): draw(1.2), ("chive-w1000-fresh", large): draw(4.0)})
    _write_run(out, "tor-w101-fresh", {}, {("tor-w101-fresh", small): draw(1.0)})
    _write_run(out, "tor-vegas-fresh", {}, {("tor-vegas-fresh", small): draw(1.0),
                                            ("tor-vegas-fresh", large): draw(3.0)})


def test_transfer_measure_and_the_tor_window_note(tmp_path):
    s, _ = _fresh_scenario(tmp_path)
    _write_fresh_runs(tmp_path, s)
    a = p4a.analyze(tmp_path, s)
    e = a.summary["series"]["chive-w101-fresh"]["sizes"]["40960"]
    # _fetch: the stream opens 0.3 s after the start, so transfer = ttlb - 0.3 for every fetch.
    assert e["transfer"]["n"] == e["ttlb"]["n"] == 30
    assert e["transfer"]["p50"] == pytest.approx(e["ttlb"]["p50"] - 0.3)
    assert a.summary["series"]["chive-w101-fresh"]["fresh_circuit"] is True
    ks = {(r["a"], r["b"], r["size"], r["measure"]) for r in a.summary["ks"]}
    assert ("chive-w101-fresh", "chive-w1000-fresh", 1048576, "transfer") in ks
    assert {"kde_transfer_40960", "cdf_transfer_1048576"} <= {f.name for f in a.figures}
    md = (tmp_path / "paper004" / "comparison.md").read_text()
    assert "circuit_sent_cell_for_sendme" in md and "## Fresh circuits" in md
    # Without a tor series at a window that is not a multiple of 100, no such note.
    s2 = sc.select_variants(s, ["chive-fresh", "tor-vegas-fresh"])
    p4a.analyze(tmp_path, s2)
    assert "circuit_sent_cell_for_sendme" not in (tmp_path / "paper004" / "comparison.md").read_text()


def test_onionperf_export_of_a_paper004_run_recomputes_the_summary(tmp_path):
    """`chive-lab export --onionperf` on this kind: one source per series; TTFB/TTLB of the
    in-window successes, recomputed the way Tor Metrics does, equal summary.json's."""
    from chive_lab.cli import main
    from chive_lab.onionperf import source_name

    out = tmp_path / "run"
    out.mkdir()
    s, text = _fresh_scenario(out)
    _write_fresh_runs(out, s)
    variants = ["chive-fresh", "tor-w101-fresh", "tor-vegas-fresh"]
    (out / "manifest.json").write_text(json.dumps({"variants": variants, "quick": False}))
    assert main(["analyze", str(out)]) == 0
    assert main(["export", "--onionperf", str(out)]) == 0
    summary = json.loads((out / "paper004" / "summary.json").read_text())
    doc = json.loads((out / "onionperf.analysis.json").read_text())
    assert doc["type"] == "onionperf" and doc["version"] == "4.0"
    series = ["chive-w101-fresh", "chive-w1000-fresh", "tor-w101-fresh", "tor-vegas-fresh"]
    assert set(doc["data"]) == {source_name(x) for x in series}
    checked = 0
    for label in series:
        streams = doc["data"][source_name(label)]["tgen"]["streams"].values()
        for size in (40960, 1048576):
            want = summary["series"][label]["sizes"][str(size)]
            mine = [x for x in streams if x["chive"]["class"] == f"{label}-{size}"]
            ok = [x for x in mine if x["is_success"] and x["chive"]["in_window"]]
            assert len(ok) == want["n"]
            assert sum(1 for x in mine if x["is_error"] and x["chive"]["in_window"]
                       and "cut at deadline" not in str(x["chive"]["error"])) == want["errors"]
            if not ok:
                continue
            for measure, key in (("ttfb", "usecs-to-first-byte-recv"), ("ttlb", "usecs-to-last-byte-recv")):
                got = stats.summarize([int(x["time_info"][key]) / 1e6 for x in ok])
                for q in ("p10", "p25", "p50", "p75", "p90"):
                    assert got[q] == pytest.approx(want[measure][q], abs=2e-6), (label, size, measure, q)
                checked += 1
            assert all(x["stream_info"]["recvsize"] == str(size) for x in ok)
    assert checked == 2 * 7  # 3 series with both sizes, tor-w101-fresh with 40 KiB only


def test_pool_analyses_several_results_as_one_batch(tmp_path):
    """`chive-lab pool` on paper004 results: the runs of both sources in one analysis (the
    union of their variants), nothing copied, and a different testbed refused."""
    from chive_lab.cli import main

    srcs = []
    for i, variants in enumerate((["chive-fresh", "tor-w101-fresh", "tor-vegas-fresh"], ["chive-fresh"])):
        out = tmp_path / f"src{i}"
        out.mkdir()
        s, _ = _fresh_scenario(out)
        _write_fresh_runs(out, s) if i == 0 else _write_run(out, "chive-fresh", {}, {
            ("chive-w101-fresh", 40960): [1.0, 1.1, 1.2], ("chive-w1000-fresh", 40960): [2.0, 2.1]})
        (out / "manifest.json").write_text(json.dumps({"variants": variants, "quick": False}))
        srcs.append(out)
    pooled = tmp_path / "pooled"
    assert main(["pool", "--out", str(pooled), *map(str, srcs)]) == 0
    summary = json.loads((pooled / "summary.json").read_text())
    assert not (srcs[0] / "paper004").exists()  # never analysed: pool reads the raw runs
    assert summary["series"]["chive-w101-fresh"]["sizes"]["40960"]["n"] == 30 + 3
    assert summary["series"]["chive-w1000-fresh"]["sizes"]["40960"]["n"] == 30 + 2
    assert summary["series"]["tor-vegas-fresh"]["sizes"]["40960"]["n"] == 30
    assert summary["pooled"]["repetitions"]["chive-fresh"] == 2
    assert (pooled / "paper004" / "comparison.md").is_file() and not (pooled / "runs").exists()
    assert (pooled / "figures" / "cdf_ttlb_40960.csv").is_file()
    assert json.loads((pooled / "pool.json").read_text())["sources"][1]["runs"] == {"chive-fresh": 1}
    # Another testbed (delay) is refused.
    other = tmp_path / "other"
    other.mkdir()
    (other / "scenario.toml").write_text(FRESH.read_text().replace("delay_ms = 15.0", "delay_ms = 20.0"))
    (other / "manifest.json").write_text(json.dumps({"variants": ["chive-fresh"], "quick": False}))
    assert main(["pool", "--out", str(tmp_path / "p2"), str(srcs[0]), str(other)]) == 2
