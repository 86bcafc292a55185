"""Statistics and analysis on synthetic data with known answers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from chive_lab import stats
from chive_lab.analysis import (
    ProgressSample,
    RunData,
    Transfer,
    class_metrics,
    load_run,
    parse_record,
    queue_delays,
    throughput_series,
)
from chive_lab.experiments.overlay_analysis import analyze_runs
from chive_lab.scenario import parse_scenario


def test_summarize_known_percentiles():
    s = stats.summarize(range(1, 102))  # 1..101: p_k = 1 + k
    assert s["p10"] == 11 and s["p25"] == 26 and s["p50"] == 51 and s["p75"] == 76 and s["p90"] == 91
    assert s["mean"] == 51 and s["n"] == 101
    assert s["sd"] == pytest.approx(np.std(np.arange(1, 102), ddof=1))
    empty = stats.summarize([])
    assert empty["n"] == 0 and empty["p50"] is None
    assert stats.summarize([None, float("nan"), 2.0])["p50"] == 2.0


def test_ecdf_and_dkw():
    x, p = stats.ecdf([3, 1, 2, 2])
    assert x.tolist() == [1, 2, 2, 3] and p.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert stats.ecdf_at([1, 2, 3, 4], [0, 2, 10]).tolist() == [0.0, 0.5, 1.0]
    # DKW: eps = sqrt(ln(2/0.05) / (2n)); n=100 -> 0.1358
    assert stats.dkw_epsilon(100) == pytest.approx(math.sqrt(math.log(40) / 200))
    assert stats.dkw_epsilon(100) == pytest.approx(0.13581, abs=1e-5)


def test_ecdf_band_dkw_with_one_repetition():
    band = stats.ecdf_band([list(range(100))])
    assert band.method == "dkw"
    eps = stats.dkw_epsilon(100)
    mid = np.argmin(abs(band.center - 0.5))
    assert band.hi[mid] - band.center[mid] == pytest.approx(eps)
    assert (band.lo >= 0).all() and (band.hi <= 1).all()


def test_ecdf_band_percentile_across_repetitions():
    # Three repetitions, shifted by 0, 10, 20: at x=15, the per-rep ECDFs are 1, 0.5, 0 -> band contains both extremes' percentiles.
    reps = [np.arange(0, 10) + 0.5, np.arange(10, 20) + 0.5, np.arange(20, 30) + 0.5]
    band = stats.ecdf_band(reps)
    assert band.method == "percentile"
    i = np.searchsorted(band.x, 15.0)
    at = band.x[i]
    per = [stats.ecdf_at(r, [at])[0] for r in reps]
    assert band.lo[i] == pytest.approx(np.percentile(per, 2.5))
    assert band.hi[i] == pytest.approx(np.percentile(per, 97.5))
    assert (band.lo <= band.center + 1e-12).all() and (band.center <= band.hi + 1e-12).all()
    assert stats.ecdf_band([[], []]) is None


def test_sign_test_counts_directions_and_drops_ties():
    r = stats.sign_test([-0.1, -0.2, -0.05, 0.0, 0.3])
    assert (r["lower"], r["higher"], r["ties"]) == (3, 1, 1)
    assert r["pvalue"] == pytest.approx(0.625)  # 2 * P(X <= 1), X ~ B(4, 1/2)
    assert stats.sign_test([-1] * 8)["pvalue"] == pytest.approx(2 / 256)
    assert stats.sign_test([0.0, float("nan")])["pvalue"] is None


def test_ks_test_known_cases():
    same = stats.ks_test([1, 2, 3, 4], [1, 2, 3, 4])
    assert same["statistic"] == 0.0 and same["pvalue"] == 1.0
    apart = stats.ks_test(range(0, 50), range(100, 150))
    assert apart["statistic"] == 1.0 and apart["pvalue"] < 1e-10
    assert stats.ks_test([], [1])["statistic"] is None


def test_kde_integrates_to_one_and_peaks_near_mode():
    rng = np.random.default_rng(1)
    data = rng.normal(5.0, 1.0, 500)
    grid = np.linspace(0, 10, 1001)
    dens = stats.kde(data, grid)
    assert np.trapezoid(dens, grid) == pytest.approx(1.0, abs=0.01)
    assert abs(grid[np.argmax(dens)] - 5.0) < 0.5
    assert stats.kde([1.0], grid) is None and stats.kde([2.0, 2.0], grid) is None


def test_mean_ci_t_interval():
    m, lo, hi = stats.mean_ci([1.0, 2.0, 3.0])
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t_{0.975, 2} * s / sqrt(n)
    assert m == 2.0 and lo == pytest.approx(2 - half) and hi == pytest.approx(2 + half)
    assert stats.mean_ci([4.0]) == (4.0, 4.0, 4.0)
    assert stats.mean_ci([]) is None


def test_binned_rate_spreads_linearly():
    # 1000 bytes between t=0.5 and t=2.5: 250 in bin 0, 500 in bin 1, 250 in bin 2
    rate = stats.binned_rate([[(0.5, 0), (2.5, 1000)]], 0.0, 4.0)
    assert rate.tolist() == [250.0, 500.0, 250.0, 0.0]
    # two transfers add; a counter going back to 0 starts a new transfer
    rate = stats.binned_rate([[(0, 0), (1, 100)], [(0, 0), (1, 50), (1.5, 0), (2, 30)]], 0, 2)
    assert rate.tolist() == [150.0, 30.0]


def test_parse_record_tolerates_old_and_new_formats():
    old = {"url": "u", "start": 10.0, "first_byte": 10.5, "last_byte": 11.0, "bytes": 5, "error": None,
           "request_sent": 10.2, "status": 200}
    t = parse_record(old, "web")
    assert isinstance(t, Transfer) and t.cls == "web" and t.loop == 0 and t.partials == {}
    assert t.metric("ttfb") == 0.5 and t.metric("ttlb") == 1.0
    assert t.metric("ttfb_req") == pytest.approx(0.3) and t.metric("ttlb_req") == pytest.approx(0.8)
    assert t.ok and t.goodput == 5.0
    new = dict(old, type="transfer", **{"class": "bulk"}, loop=2, seq=7, partials={"10240": 10.6, "20480": None})
    t2 = parse_record(new, "web")
    assert t2.cls == "bulk" and t2.loop == 2 and t2.seq == 7 and t2.partials == {"10240": 10.6, "20480": None}
    p = parse_record({"type": "progress", "class": "bulk", "loop": 1, "t": 3.0, "bytes": 9, "transfer": 4}, "x")
    assert isinstance(p, ProgressSample) and (p.loop, p.transfer, p.bytes) == (1, 4, 9)
    assert parse_record({"type": "other"}, "x") is None
    assert parse_record({"start": "soon"}, "x") is None
    assert parse_record([1, 2], "x") is None
    bad = parse_record(dict(old, last_byte=None, error="interrupted"), "web")
    assert bad.censored and not bad.ok
    http_err = parse_record(dict(old, status=404), "web")
    assert not http_err.ok


def _t(start, ttlb, cls="web", error=None, ttfb=None, nbytes=1000, req=0.1):
    return Transfer(cls=cls, start=start, request_sent=start + req,
                    first_byte=None if error else start + (ttfb if ttfb is not None else ttlb / 2),
                    last_byte=None if error else start + ttlb, bytes=nbytes, status=200, error=error)


def test_class_metrics_warmup_errors_censoring():
    run = RunData(variant="v", rep=1, t0=100.0, warmup=10.0, duration=50.0)
    run.transfers = [
        _t(101.0, 99.0),            # in warm-up: dropped
        *[_t(110.0 + i, 1.0 + i) for i in range(5)],   # ttlb 1..5
        _t(120.0, 0, error="connection refused"),
        _t(159.0, 0, error="interrupted"),
        _t(170.0, 2.0),             # after the window: dropped
        _t(115.0, 1.0, cls="bulk"),
    ]
    m = class_metrics([run], "web")
    assert m["transfers"] == 5 and m["errors"] == 1 and m["censored"] == 1
    assert m["ttlb"]["p50"] == 3.0 and m["ttlb"]["p25"] == 2.0 and m["ttlb"]["p75"] == 4.0
    assert m["ttfb"]["p50"] == 1.5
    assert m["ttlb_req"]["p50"] == pytest.approx(2.9)
    assert m["goodput_bps"] == pytest.approx(1000 / 3.0, abs=0.1)
    assert m["aggregate_goodput_bps"] == pytest.approx(5 * 1000 / 50.0)


def test_throughput_series_from_progress_and_records():
    run = RunData(variant="v", rep=1, t0=0.0, warmup=0.0, duration=4.0)
    run.transfers = [Transfer(cls="bulk", start=0.0, first_byte=0.0, last_byte=3.0, bytes=3000, status=200, seq=0,
                              client="bulk-0"),
                     Transfer(cls="web", start=1.0, first_byte=1.0, last_byte=2.0, bytes=500, status=200, client="web-0")]
    run.progress = [ProgressSample(cls="bulk", loop=0, transfer=0, t=1.0, bytes=500, client="bulk-0"),
                    ProgressSample(cls="bulk", loop=0, transfer=0, t=2.0, bytes=2500, client="bulk-0")]
    assert throughput_series(run, "bulk").tolist() == [500.0, 2000.0, 500.0, 0.0]
    assert throughput_series(run, "web").tolist() == [0.0, 500.0, 0.0, 0.0]


def test_queue_delays():
    run = RunData(variant="v", rep=1, t0=0.0, warmup=0.0, duration=1.0)
    run.cells = [(0.0, 0.1, 0.3), (1.0, 1.3, 1.4), (2.0, None, None)]
    q = queue_delays([run])
    assert q["queue"]["p50"] == pytest.approx(0.2) and q["queue"]["n"] == 2
    assert q["outbuf"]["p50"] == pytest.approx(0.15)
    assert queue_delays([RunData(variant="v", rep=1, t0=0, warmup=0, duration=1)]) is None


SCEN = parse_scenario({
    "name": "s", "duration": 50, "warmup": 0,
    "clients": [{"class": "web", "size": 1000, "pause": 1.0}],
    "variants": {"Scheduler": ["rr", "ewma"]},
})


def test_analyze_runs_summary_schema_and_ks():
    rr = RunData(variant="rr", rep=1, t0=0.0, warmup=0.0, duration=50.0,
                 transfers=[_t(float(i), 2.0 + i * 0.01) for i in range(40)])
    ew = RunData(variant="ewma", rep=1, t0=0.0, warmup=0.0, duration=50.0,
                 transfers=[_t(float(i), 1.0 + i * 0.01) for i in range(40)])
    res = analyze_runs(SCEN, {"rr": [rr], "ewma": [ew]})
    s = res.summary
    assert s["schema"] == 1 and list(s["variants"]) == ["rr", "ewma"]
    web = s["variants"]["ewma"]["web"]
    for key in ("ttfb", "ttlb"):
        assert set(web[key]) >= {"p25", "p50", "p75"}
    assert {"goodput_bps", "errors", "ks_vs_first"} <= set(web)
    assert set(web["ks_vs_first"]) >= {"statistic", "pvalue"}
    assert web["ks_vs_first"]["statistic"] == 1.0 and web["ks_vs_first"]["pvalue"] < 1e-6
    assert s["variants"]["rr"]["web"]["ks_vs_first"]["statistic"] == 0.0
    assert web["ttlb"]["p50"] < s["variants"]["rr"]["web"]["ttlb"]["p50"]
    json.dumps(s)  # JSON-serialisable
    names = {f.name for f in res.figures}
    assert {"ttlb_cdf_web", "ttfb_cdf_web", "ttlb_kde_web", "throughput_web", "ttlb_percentiles_web"} <= names
    assert res.tables and res.tables[0].rows[1][0] == "ewma"


def test_load_run_reads_files_and_skips_bad_lines(tmp_path):
    d = tmp_path / "run"
    (d / "clients").mkdir(parents=True)
    (d / "net" / "relay1").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"t0": 100.0, "status": "ok"}))
    lines = [json.dumps({"start": 101.0, "first_byte": 101.5, "last_byte": 102.0, "bytes": 10, "error": None}),
             "not json", "", json.dumps({"type": "progress", "t": 101.2, "bytes": 3, "loop": 0, "transfer": 0}),
             "x" * 10]
    (d / "clients" / "web-0.jsonl").write_text("\n".join(lines) + "\n")
    (d / "net" / "relay1" / "metrics.jsonl").write_text(
        json.dumps({"type": "cell", "queued": 1.0, "dequeued": 1.5, "written": 1.7}) + "\n"
        + json.dumps({"type": "other"}) + "\n")
    run = load_run(d, "v", 1, 0.0, 10.0)
    assert len(run.transfers) == 1 and run.transfers[0].cls == "web" and run.transfers[0].client == "web-0"
    assert len(run.progress) == 1 and run.bad_lines == 2 and run.status == "ok"
    assert run.cells == [(1.0, 1.5, 1.7)]
    assert run.window == (100.0, 110.0)
