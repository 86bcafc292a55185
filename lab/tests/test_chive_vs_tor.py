"""chive and the real Tor in one experiment (issue 5): the `idle-vs-load` kind,
`impl = "both"` / `--impl`, Tor's metrics and unmapped options in the summary
and report.

The unit tests run anywhere. `test_quick_scenario_end_to_end` runs
scenarios/chive-vs-tor-ewma.toml --quick on the real binary and the real Tor
(one network per impl: the --quick goodput runs on the load network, its rate
limits lifted; about 1–2 minutes) and is skipped, with the reason, when either is missing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from chive_lab import analysis as an
from chive_lab import tor_summary
from chive_lab import scenario as sc
from chive_lab.errors import LabError
from chive_lab.experiments import idle_vs_load as ivl
from chive_lab.process import ProcessRecord, is_running, is_same_process

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "chive-vs-tor-ewma.toml"

BASE = """
name = "t"
kind = "idle-vs-load"
impl = "both"
[network]
relays = 4
[load]
samples = 3
[variants]
Scheduler = ["rr", "ewma"]
"""


def _parse(text: str, **kw) -> sc.Scenario:
    import tomllib

    return sc.parse_scenario(tomllib.loads(text), **kw)


# ---------------------------------------------------------------------------
# Scenario and options


def test_both_runs_every_variant_on_each_impl_with_readable_names():
    s = _parse(BASE)
    assert [sc.impl_of(s, v) for v in s.variants] == ["chive", "chive", "tor", "tor"]
    assert [sc.display_label(v) for v in s.variants] == ["chive/rr", "chive/ewma", "tor/rr", "tor/ewma"]
    assert s.options.network.bandwidth_rate == 1_000_000  # the kind's default rate
    assert s.options.load.samples == 3 and s.options.load.fetch_size == 51200


def test_impl_override_replaces_the_files_impl():
    s = _parse(BASE.replace('impl = "both"', 'impl = "chive"'))
    assert [v.label for v in s.variants] == ["rr", "ewma"]
    s = _parse(BASE.replace('impl = "both"', 'impl = "chive"'), impl="both")
    assert len(s.variants) == 4 and {sc.impl_of(s, v) for v in s.variants} == {"chive", "tor"}
    with pytest.raises(LabError, match="--impl"):
        _parse(BASE, impl="arti")


@pytest.mark.parametrize("old, new, match", [
    ("samples = 3", "samples = 0", "load.samples"),
    ("samples = 3", "bogus = 1", "load.bogus"),
    ("samples = 3", "fetch_interval = -1", "load.fetch_interval"),
    ('name = "t"', 'name = "t"\nwat = 1', "unknown key wat"),
])
def test_bad_options_name_the_key(old, new, match):
    with pytest.raises(LabError, match=match):
        _parse(BASE.replace(old, new))


def test_shipped_scenario_parses_with_the_issue_reference():
    full = sc.load_scenario(SCENARIO)
    quick = sc.load_scenario(SCENARIO, quick=True)
    assert full.kind == quick.kind == "idle-vs-load"
    assert [sc.display_label(v) for v in quick.variants] == ["chive/ewma", "tor/ewma"]
    assert len(full.variants) == 4
    labels = {v.label for v in full.variants}
    refs = {(p.cls, p.metric) for p in full.paper}
    assert {("web_idle", "ttlb_p50"), ("web_load", "ttlb_p50"), ("goodput_3hop", "goodput_bps")} <= refs
    assert all(p.variant in labels for p in full.paper)


# ---------------------------------------------------------------------------
# Pure analysis


def _prog(t: float, nbytes: int, transfer: int = 0, client: str = "bulk-0") -> an.ProgressSample:
    return an.ProgressSample(cls="bulk", loop=0, transfer=transfer, t=t, bytes=nbytes, client=client)


def test_window_goodput_interpolates_and_sums_transfers():
    # Two downloads at 1000 B/s and 500 B/s, sampled every second from t=0.
    prog = [_prog(t, 1000 * t) for t in range(11)] + [_prog(t, 500 * t, client="bulk-1") for t in range(11)]
    assert an.window_goodput(prog, 2.5, 7.5) == pytest.approx(1500.0)
    # A transfer that starts inside the window counts from 0; one that ended keeps its last count.
    prog = [_prog(4, 0, 1), _prog(6, 2000, 1)] + [_prog(0, 0, 2), _prog(2, 1000, 2)]
    assert an.window_goodput(prog, 0.0, 10.0) == pytest.approx((2000 + 1000) / 10.0)
    assert an.window_goodput([], 0, 1) is None
    assert an.window_goodput(prog, 5, 5) is None


def test_chive_vs_tor_rows_take_both_impls_from_the_summary():
    s = _parse(BASE)

    def entry(idle, load, bulk, gp):
        return {"web_idle": {"ttlb": {"p50": idle, "p75": idle * 2, "n": 3}, "errors": 0},
                "web_load": {"ttlb": {"p50": load, "p75": load * 2, "n": 3}, "errors": 1},
                "bulk": {"aggregate_goodput_bps": bulk},
                "goodput_3hop": {"goodput_bps": gp, "ttlb": {"n": 1}, "errors": 0}}

    variants = {v.label: entry(0.1 * (i + 1), 0.5 * (i + 1), 9e5, 1e7 * (i + 1)) for i, v in enumerate(s.variants)}
    rows = ivl.chive_vs_tor(s, variants)
    assert [(r["impl"], r["variant"]) for r in rows] == [("chive", "rr"), ("chive", "ewma"), ("tor", "rr"),
                                                          ("tor", "ewma")]
    last = rows[-1]
    assert last["web_idle_ttlb_p50"] == pytest.approx(0.4) and last["web_load_ttlb_p75"] == pytest.approx(4.0)
    assert last["load_idle_p50_ratio"] == pytest.approx(5.0)
    assert last["goodput_3hop_bps"] == pytest.approx(4e7) and last["errors"] == 1


def test_unmapped_options_are_reported_for_tor_variants_only():
    s = _parse(BASE.replace("[variants]", "[network.relay]\nOutbufCells = 64\n[variants]"))
    unmapped = tor_summary.tor_unmapped(s)
    keys = {u["key"]: u for u in unmapped}
    assert "OutbufCells" in keys and "Scheduler" not in keys
    assert sorted(keys["OutbufCells"]["variants"]) == sorted(v.label for v in s.variants if v.impl == "tor")
    assert keys["OutbufCells"]["reason"]
    assert tor_summary.tor_unmapped(_parse(BASE.replace('impl = "both"', 'impl = "chive"'))) == []


def test_tor_section_reads_metrics_and_says_no_tor_equivalent(tmp_path):
    s = _parse(BASE.replace("[variants]", "[network.relay]\nOutbufCells = 64\n[variants]"))
    tor_label = next(v.label for v in s.variants if v.impl == "tor")
    run = tmp_path / "runs" / tor_label / "1"
    run.mkdir(parents=True)
    snap = {"nodes": {"relay1": {"role": "relay", "live": {"traffic_written_bytes": 3_000_000}},
                      "client": {"role": "client", "live": {"circuits": [{}, {}]}}},
            "circuit_build_times": {"count": 7, "median_ms": 45, "mean_ms": 50.0, "abandoned": 1}}
    (run / "tor-metrics.json").write_text(json.dumps({"load": {"before_stop": snap, "after_stop": {"error": "x"}}}))
    part, tables = tor_summary.tor_section(tmp_path, s)
    m = part["metrics"][tor_label][0]
    assert (m["cbt_count"], m["cbt_median_ms"], m["client_circuits"]) == (7, 45, 2)
    assert m["relay_written_bytes"] == {"relay1": 3_000_000} and m["errors"] == ["after_stop: x"]
    text = json.dumps([t.rows for t in tables])
    assert "no Tor equivalent" in text and "OutbufCells" in text
    assert tor_summary.tor_section(tmp_path, _parse(BASE.replace('impl = "both"', 'impl = "chive"'))) == (None, [])


# ---------------------------------------------------------------------------
# End to end


def _skip_reason() -> str | None:
    from chive_lab.network import default_binary
    from chive_lab.tor import tor_unavailable_reason

    reason = tor_unavailable_reason()
    if reason is not None:
        return reason
    binary = default_binary()
    if not binary.is_file():
        return f"{binary} does not exist (run `make build`)"
    return None


def _records(out: Path) -> list[ProcessRecord]:
    """Every process the run recorded: network nodes (state.json) and perf clients (run.json)."""
    from chive_lab.state import load_state

    recs = []
    for state in out.glob("runs/*/*/net*/state.json"):
        recs.extend(load_state(state.parent).nodes)
    return recs


def _class_diagnostics(out: Path, label: str, cls: str) -> str:
    """What a failed class left behind, for the assertion message: its
    transfer records' errors and the tail of the perf client's stderr (CI
    shows only the test output; the run directory is gone with the machine)."""
    clients = out / "runs" / label / "1" / "clients"
    lines = []
    try:
        for line in (clients / f"{cls}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "transfer":
                lines.append(f"transfer seq={rec.get('seq')} bytes={rec.get('bytes')} error={rec.get('error')!r}")
    except (OSError, ValueError) as e:
        lines.append(f"no records: {e}")
    try:
        lines.append("stderr: " + " | ".join((clients / f"{cls}.stderr").read_text().splitlines()[-8:]))
    except OSError as e:
        lines.append(f"no stderr: {e}")
    try:
        lines.append("run.json status: " + str(json.loads((out / "runs" / label / "1" / "run.json").read_text()).get("status")))
    except (OSError, ValueError) as e:
        lines.append(f"no run.json: {e}")
    return "\n".join(lines)


@pytest.mark.serial
def test_quick_scenario_end_to_end(tmp_path):
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(f"chive vs tor end to end: {reason}")
    from chive_lab.runner import run_experiment

    out = tmp_path / "cvt"
    rc = run_experiment(SCENARIO, out, quick=True, progress=False, argv=["test"])
    try:
        assert rc == 0, (out / "runner.log").read_text()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["schema"] == 1 and summary["kind"] == "idle-vs-load"
        rows = {r["impl"]: r for r in summary["chive_vs_tor"]}
        assert set(rows) == {"chive", "tor"}
        for impl, r in rows.items():
            # Each figure and the perf client whose records it comes from.
            for key, cls in (("web_idle_ttlb_p50", "web_idle"), ("web_idle_ttlb_p75", "web_idle"),
                             ("web_load_ttlb_p50", "web_load"), ("web_load_ttlb_p75", "web_load"),
                             ("bulk_goodput_bps", "bulk-0"), ("goodput_3hop_bps", "goodput_3hop")):
                assert isinstance(r[key], float) and r[key] > 0, (
                    f"{impl}: {key} = {r[key]!r}; row {r}\n{_class_diagnostics(out, r['label'], cls)}")
        # Under two bulk downloads Tor's fetches through 1 MB/s relays are slower than idle;
        # chive's EWMA with its quiet reserve keeps them near the idle time (docs/scheduling.md),
        # far below Tor's.
        tor_row, chive_row = rows["tor"], rows["chive"]
        assert tor_row["web_load_ttlb_p50"] > tor_row["web_idle_ttlb_p50"], tor_row
        assert chive_row["web_load_ttlb_p50"] < tor_row["web_load_ttlb_p50"], (chive_row, tor_row)
        # Schema 1's required keys stay.
        for label, classes in summary["variants"].items():
            for cls in ("web_idle", "web_load"):
                m = classes[cls]
                assert {"p25", "p50", "p75"} <= set(m["ttlb"]) and "ks_vs_first" in m and "errors" in m
        tor_label = rows["tor"]["label"]
        doc = json.loads((out / "runs" / tor_label / "1" / "tor-metrics.json").read_text())
        # --quick measures the 3-hop goodput on the load network, its rate limits lifted: one
        # network per impl, Tor's view collected around its stop.
        assert set(doc) == {"load"} and {"before_stop", "after_stop"} <= set(doc["load"])
        for r in rows.values():
            meta = json.loads((out / "runs" / r["label"] / "1" / "run.json").read_text())
            assert meta["goodput_network"] == "load" and len(meta["unlimited_relays"]) == 4, meta
            assert not (out / "runs" / r["label"] / "1" / "net-goodput").exists()
        assert list((out / "runs" / tor_label / "1" / "net").glob("relay*/tor-metrics.json"))
        tor_metrics = summary["tor"]["metrics"][tor_label]
        assert any((m["cbt_count"] or 0) > 0 for m in tor_metrics)
        assert any(sum(m["relay_written_bytes"].values()) > 0 for m in tor_metrics)
        html = (out / "report.html").read_text()
        assert "chive vs. Tor" in html
        assert "Tor&#x27;s own view" in html or "Tor's own view" in html
        assert list((out / "figures").glob("ttlb_cdf_web_load.*"))
    finally:
        recs = _records(out)
        assert recs, "no state.json found"
        left = [r.name for r in recs if is_same_process(r) and is_running(r.pid)]
        assert not left, f"processes left running: {left}"
        perf = []
        for run_json in out.glob("runs/*/*/run.json"):
            for c in json.loads(run_json.read_text()).get("clients", []):
                perf.append(c.get("exit", "missing"))
        assert perf and None not in perf and "missing" not in perf
        shutil.rmtree(out, ignore_errors=True)
