"""The runner: perf command lines, network specs, registries, a plugged-in
experiment kind, and a real end-to-end run of a tiny scenario (skipped
without the chive binary)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from labcli import chive_cli_missing  # tests/ is on sys.path (conftest)

from chive_lab import kinds, runner
from chive_lab.analysis import Analysis, Figure, Series
from chive_lab.errors import LabError, RunFailed
from chive_lab.experiments import overlay
from chive_lab.scenario import load_scenario, parse_scenario

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "lab" / "tests" / "data" / "tiny.toml"
BIN = Path("/x/chive")


def _client(**kw):
    base = {"name": "s", "clients": [dict({"class": "web", "size": 89088}, **kw)]}
    return parse_scenario(base).clients[0]


def test_perf_argv_new_perf():
    argv, warns = overlay.perf_argv(BIN, _client(pause=2.0, isolate=True, parallel=2, start_delay=1.5),
                                   socks="127.0.0.1:9", http="http://127.0.0.1:8", run_seconds=40, seed=5)
    assert warns == []
    assert argv[:8] == [str(BIN), "perf", "--socks", "127.0.0.1:9", "--url", "http://127.0.0.1:8/bytes/89088",
                        "--count", "0"]
    s = " ".join(argv)
    for part in ("--label web", "--duration 40", "--progress 1", "--pause 2", "--seed 5", "--isolate",
                 "--parallel 2", "--start-delay 1.5", "--timeout 100"):
        assert part in s


def test_perf_argv_socks_user_only_without_isolate():
    argv, _ = overlay.perf_argv(BIN, _client(pause=1.0), socks="s", http="http://h", run_seconds=10, seed=1,
                               socks_user="web-0")
    assert "--socks-user web-0" in " ".join(argv)
    argv, _ = overlay.perf_argv(BIN, _client(pause=1.0, isolate=True), socks="s", http="http://h",
                               run_seconds=10, seed=1, socks_user="web-0")
    assert "--socks-user" not in argv and "--isolate" in argv


def test_perf_argv_think_upload_and_old_perf():
    argv, _ = overlay.perf_argv(BIN, _client(think={"dist": "exp", "mean": 5}, method="post"),
                               socks="s", http="http://h", run_seconds=10, seed=1)
    s = " ".join(argv)
    assert "--think exp --think-mean 5" in s and "--url http://h/upload" in s
    assert "--method post --upload-bytes 89088" in s
    old = {"--socks", "--url", "--count", "--interval", "--isolate", "--timeout"}
    argv, warns = overlay.perf_argv(BIN, _client(pause=2.0), socks="s", http="http://h", run_seconds=10,
                                   seed=1, flags=old)
    s = " ".join(argv)
    assert "--pause" not in s and "--interval 2" in s and "--label" not in s and "--seed" not in s
    assert any("--pause" in w for w in warns) and any("--label" in w for w in warns)


def test_client_seeds_do_not_depend_on_variant_but_on_rep_and_index():
    assert kinds.client_seed(1, 1, 0) == kinds.client_seed(1, 1, 0)
    assert len({kinds.client_seed(1, r, i) for r in range(3) for i in range(3)}) == 9


def test_network_spec_merges_variant_overrides():
    s = load_scenario(ROOT / "scenarios" / "paper001-ewma-halflife-sweep.toml")
    spec = overlay.network_spec(s, s.variant("H=10"), BIN)
    assert spec.relay_overrides == {"Scheduler": "ewma", "QuietReserve": 0, "CircuitPriorityHalflife": 10}
    assert spec.bandwidth_rate == 1_000_000 and spec.relays == 4
    rr = overlay.network_spec(s, s.variant("rr"), BIN)
    assert rr.relay_overrides == {"Scheduler": "rr", "QuietReserve": 0}


def test_registries():
    assert isinstance(runner.get_backend("loopback"), runner.LoopbackBackend)
    with pytest.raises(LabError, match="unknown backend"):
        runner.get_backend("nope")
    assert kinds.get_kind("overlay") is overlay.KIND
    with pytest.raises(LabError, match="unknown experiment kind"):
        kinds.get_kind("nope")


def _kind(run_repetition, analyze, **methods):
    """A kind built from functions (a subclass of the one interface)."""
    attrs = {"name": "", "run_repetition": lambda self, ctx: run_repetition(ctx),
             "analyze": lambda self, out, s: analyze(out, s)}
    attrs.update({k: (lambda f: lambda self, *a, **kw: f(*a, **kw))(f) for k, f in methods.items()})
    return type("FakeKind", (kinds.ExperimentKind,), attrs)()


class _NullBackend:
    name = "null"

    def start(self, spec, dir, *, impl="chive", progress=None):
        raise AssertionError("not used by the fake kind")

    def stop(self, dir):
        raise AssertionError("not used by the fake kind")


@pytest.mark.real_figures
def test_plugged_in_kind_runs_through_the_same_flow(tmp_path, monkeypatch):
    calls = []

    def run_repetition(ctx):
        calls.append((ctx.variant.label, ctx.rep))
        (ctx.run_dir / "data.txt").write_text(str(ctx.rep))

    def analyze(out, scenario):
        n = len(list(Path(out).glob("runs/*/*/data.txt")))
        fig = Figure(name="fake", title="fake", xlabel="x", ylabel="y",
                     series=[Series(label="a", x=[0.0, 1.0], y=[float(n), 2.0])])
        return Analysis(summary={"schema": 1, "variants": {}, "files": n}, figures=[fig])

    mod = _kind(run_repetition, analyze, parse_options=lambda raw: raw)
    monkeypatch.setitem(kinds.KINDS, "fake", mod)
    monkeypatch.setitem(runner.BACKENDS, "null", _NullBackend)
    scen = tmp_path / "fake.toml"
    scen.write_text('name = "fake"\nkind = "fake"\nbackend = "null"\nrepetitions = 2\n'
                    '[variants]\nX = [1, 2]\n[hosts]\nA = "x"\n')
    out = tmp_path / "out"
    rc = runner.run_experiment(scen, out, progress=False)
    assert rc == 0
    # repetitions interleaved across variants
    assert calls == [("X=1", 1), ("X=2", 1), ("X=1", 2), ("X=2", 2)]
    assert json.loads((out / "summary.json").read_text())["files"] == 4
    assert (out / "figures" / "fake.png").stat().st_size > 0
    assert (out / "report.html").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["variants"] == ["X=1", "X=2"]
    for key in ("git", "host", "versions", "start", "end", "command", "seed"):
        assert key in manifest
    assert manifest["host"]["cores"] >= 1
    with pytest.raises(LabError, match="already holds"):
        runner.run_experiment(scen, out, progress=False)


def test_failing_repetition_stops_and_still_reports(tmp_path, monkeypatch):
    def run_repetition(ctx):
        raise LabError("relay1 refused key Bogus")

    mod = _kind(run_repetition, lambda out, s: Analysis(summary={"schema": 1, "variants": {}}))
    monkeypatch.setitem(kinds.KINDS, "failing", mod)
    scen = tmp_path / "f.toml"
    scen.write_text('name = "f"\nkind = "failing"\n[variants]\nX = [1, 2]\n')
    rc = runner.run_experiment(scen, tmp_path / "o", progress=False)
    assert rc == 1
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "Bogus" in manifest["failures"][0]["error"]
    assert (tmp_path / "o" / "report.html").is_file()


def test_a_failed_run_fails_only_itself(tmp_path, monkeypatch):
    """RunFailed in one repetition (a node that would not start): that run is recorded as
    failed (manifest, failed.json, console), the batch goes on, and the analysis leaves it
    out and says so."""
    seen = []

    def run_repetition(ctx):
        seen.append((ctx.variant.label, ctx.rep))
        if (ctx.variant.label, ctx.rep) == ("X=2", 1):
            raise RunFailed("tor relay2 did not bootstrap")
        (ctx.run_dir / "data.txt").write_text("1")

    def analyze(out, s):
        from chive_lab.analysis import discover_runs

        runs = discover_runs(Path(out), [v.label for v in s.variants])
        return Analysis(summary={"schema": 1, "variants": {k: len(v) for k, v in runs.items()}})

    monkeypatch.setitem(kinds.KINDS, "flaky", _kind(run_repetition, analyze))
    scen = tmp_path / "f.toml"
    scen.write_text('name = "f"\nkind = "flaky"\nrepetitions = 2\n[variants]\nX = [1, 2]\n')
    rc = runner.run_experiment(scen, tmp_path / "o", progress=False)
    assert rc == 1
    assert seen == [("X=1", 1), ("X=2", 1), ("X=1", 2), ("X=2", 2)]  # the batch went on
    out = tmp_path / "o"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "partial"
    assert manifest["failures"] == [{"variant": "X=2", "rep": 1, "error": "tor relay2 did not bootstrap"}]
    assert json.loads((out / "runs" / "X=2" / "1" / "failed.json").read_text())["error"].startswith("tor relay2")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["variants"] == {"X=1": 2, "X=2": 1}  # the failed run is left out
    assert [(f["variant"], f["rep"]) for f in summary["failed_runs"]] == [("X=2", 1)]
    assert "1 repetition(s) failed" in (out / "report.html").read_text()
    assert "failed; going on" in (out / "runner.log").read_text()


def _skip_reason() -> str | None:
    return chive_cli_missing("cargo build --release", "perf")


#: The one figure the tiny end-to-end run rasterises (the others are declared and written
#: empty: rendering every PNG was most of the test's analysis time; figures.py's own tests
#: render the rest of the writer).
RENDERED = "ttlb_cdf_web.png"


@pytest.mark.serial
@pytest.mark.e2e
@pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
@pytest.mark.real_figures
def test_tiny_scenario_end_to_end(tmp_path, monkeypatch, capsys):
    from matplotlib.figure import Figure as MplFigure

    from chive_lab import cli, figures

    real_savefig, real_palette = MplFigure.savefig, figures.palette_png

    def savefig(fig, fname, *args, **kwargs):
        if Path(fname).name == RENDERED:
            return real_savefig(fig, fname, *args, **kwargs)
        Path(fname).write_bytes(b"")

    monkeypatch.setattr(MplFigure, "savefig", savefig)
    monkeypatch.setattr(figures, "palette_png", lambda p: real_palette(p) if p.name == RENDERED else None)
    out = tmp_path / "exp"
    # `chive-lab run` in this process (its argument parsing included), so that only one
    # figure is rasterised; `analyze` and `compare` below run as commands.
    rc = cli.main(["run", str(TINY), "--out", str(out), "--quick"])
    assert rc == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == 1
    assert list(summary["variants"]) == ["OutbufCells=32", "OutbufCells=64"]
    for label, classes in summary["variants"].items():
        assert set(classes) == {"web", "bulk"}
        for cls, m in classes.items():
            assert m["transfers"] > 0, (label, cls)
            assert m["errors"] == 0, (label, cls)
            assert 0 < m["ttfb"]["p50"] <= m["ttlb"]["p50"]
            assert m["ttlb"]["p25"] <= m["ttlb"]["p50"] <= m["ttlb"]["p75"]
            assert m["ks_vs_first"]["pvalue"] is not None
    html = (out / "report.html").read_text()
    pngs = sorted((out / "figures").glob("*.png"))
    assert out / "figures" / RENDERED in pngs and len(pngs) > 1
    # The rendered one is a real (palette) PNG; every figure is written, in the report and
    # has its CSV with the plotted points.
    assert (out / "figures" / RENDERED).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for png in pngs:
        csv_path = png.with_suffix(".csv")
        assert csv_path.is_file() and f"figures/{png.name}" in html
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
        assert rows and set(rows[0]) == {"series", "x", "y", "lo", "hi"}
    # the CDF CSV holds exactly the web ttlb percentiles' sample range
    with open(out / "figures" / "ttlb_cdf_web.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["series"].startswith("OutbufCells=32")]
    xs = [float(r["x"]) for r in rows]
    ys = [float(r["y"]) for r in rows]
    assert ys[-1] == pytest.approx(1.0) and xs == sorted(xs)
    median_from_csv = next(x for x, y in zip(xs, ys) if y >= 0.5)
    p50 = summary["variants"]["OutbufCells=32"]["web"]["ttlb"]["p50"]
    assert abs(median_from_csv - p50) <= (max(xs) - min(xs)) * 0.2 + 1e-3
    # node logs and perf records collected; nothing left running
    run_dir = out / "runs" / "OutbufCells=32" / "1"
    assert (run_dir / "logs" / "relay1.log").is_file() and (run_dir / "clients" / "web-0.jsonl").is_file()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "ok" and meta["down"]["ok"]
    from chive_lab.process import is_running
    for c in meta["clients"]:
        assert not is_running(c["pid"])
    # analyze recomputes the same summary from the raw records
    again = subprocess.run([sys.executable, "-m", "chive_lab", "analyze", str(out)], capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 0 and json.loads(again.stdout)["variants"] == summary["variants"]
    cmp = subprocess.run([sys.executable, "-m", "chive_lab", "compare", str(out), str(out)], capture_output=True,
                         text=True, timeout=60)
    assert cmp.returncode == 0 and "+0.0%" in cmp.stdout
