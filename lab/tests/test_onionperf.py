"""OnionPerf export: OnionPerf's field names, and TTFB/TTLB recomputed from the export the way
Tor Metrics does (usecs-to-*-byte-recv / 1e6) equal summary.json's."""

from __future__ import annotations

import json
import re

import pytest

from chive_lab import stats
from chive_lab.analysis import ProgressSample, RunData, Transfer
from chive_lab.experiments.overlay_analysis import analyze_runs
from chive_lab.cli import main
from chive_lab.onionperf import DECILES, document, source_name
from chive_lab.scenario import parse_scenario

SCEN = parse_scenario({
    "name": "s", "duration": 50, "warmup": 5,
    "clients": [{"class": "web", "size": 51200, "pause": 1.0}, {"class": "bulk", "size": 1048576, "pause": 1.0}],
    "variants": {"Scheduler": ["rr", "ewma"]},
})


def _transfer(i: int, cls: str, size: int, scale: float, **kw) -> Transfer:
    start = 100.0 + i * 0.7
    first = start + scale * (0.3 + (i % 7) * 0.011)
    last = first + scale * (0.5 + (i % 5) * 0.0371)
    fields = dict(cls=cls, start=start, socket_connected=start + 0.0002, socks_connected=start + 0.2 * scale,
                  request_sent=start + 0.2 * scale + 0.0001, first_byte=first, last_byte=last, bytes=size,
                  expected_bytes=size, status=200, loop=0, seq=i, client=f"{cls}-0",
                  partials={"10240": first + 0.01, str(size): last, "5242880": None})
    fields.update(kw)
    return Transfer(**fields)


def _runs() -> dict[str, list[RunData]]:
    runs = {}
    for variant, scale in (("rr", 1.0), ("ewma", 0.8)):
        reps = []
        for rep in (1, 2):
            ts = [_transfer(i, "web", 51200, scale * rep) for i in range(60)]
            ts += [_transfer(i, "bulk", 1048576, 3 * scale * rep) for i in range(0, 60, 3)]
            # An error, a censored one and one in the warm-up: in the export, not in the summary's figures.
            ts.append(_transfer(61, "web", 51200, scale, error="connection reset", last_byte=None, bytes=100))
            ts.append(_transfer(62, "web", 51200, scale, error="interrupted", last_byte=None, bytes=0))
            ts.append(_transfer(-10, "web", 51200, scale))
            progress = [ProgressSample(cls="bulk", loop=0, transfer=3, t=ts[61].first_byte + 0.5, bytes=600_000,
                                       client="bulk-0")]
            reps.append(RunData(variant=variant, rep=rep, t0=100.0, warmup=5.0, duration=50.0, transfers=ts,
                                progress=progress, status="ok"))
        runs[variant] = reps
    return runs


def _recomputed(doc, variant: str, cls: str, measure: str) -> list[float]:
    key = "usecs-to-first-byte-recv" if measure == "ttfb" else "usecs-to-last-byte-recv"
    streams = doc["data"][source_name(variant)]["tgen"]["streams"].values()
    return [int(s["time_info"][key]) / 1e6 for s in streams
            if s["is_success"] and s["chive"]["in_window"] and s["chive"]["class"] == cls]


def _assert_same_as_summary(doc, summary) -> None:
    checked = 0
    for variant, classes in summary["variants"].items():
        for cls, m in classes.items():
            for measure in ("ttfb", "ttlb"):
                s = stats.summarize(_recomputed(doc, variant, cls, measure))
                assert s["n"] == m[measure]["n"] > 0
                for p in ("p25", "p50", "p75", "p90"):
                    assert s[p] == pytest.approx(m[measure][p], abs=2e-6), (variant, cls, measure, p)
                checked += 1
    assert checked == 8


def test_ttfb_and_ttlb_from_the_export_equal_the_summary():
    runs = _runs()
    summary = analyze_runs(SCEN, runs).summary
    _assert_same_as_summary(document(runs), summary)


def test_field_names_are_onionperfs():
    doc = json.loads(json.dumps(document(_runs())))
    assert doc["type"] == "onionperf" and doc["version"] == "4.0"
    assert set(doc["data"]) == {"rr", "ewma"}
    for name, source in doc["data"].items():
        assert re.fullmatch(r"[A-Za-z0-9-]+", name)
        assert {"measurement_ip", "tgen", "tor"} <= set(source)
        streams = source["tgen"]["streams"]
        assert len(streams) == 2 * (60 + 20 + 3)
        for sid, s in streams.items():
            assert s["stream_id"] == sid
            assert {"stream_info", "transport_info", "byte_info", "time_info", "is_complete", "is_error",
                    "is_success", "unix_ts_start", "unix_ts_end"} <= set(s)
            assert {"recvsize", "error", "name", "vertexid"} <= set(s["stream_info"])
            assert {"local", "proxy", "remote"} <= set(s["transport_info"])
            assert {"total-bytes-recv", "payload-bytes-recv", "payload-progress-recv"} <= set(s["byte_info"])
            assert {"usecs-to-socket-create", "usecs-to-socket-connect", "usecs-to-proxy-response",
                    "usecs-to-command", "usecs-to-first-byte-recv", "usecs-to-last-byte-recv"} <= set(s["time_info"])
            # OnionPerf writes these as strings parsed from tgen's log.
            for part in ("stream_info", "byte_info", "time_info", "transport_info"):
                assert all(isinstance(v, str) for v in s[part].values()), part
            assert s["unix_ts_end"] >= s["unix_ts_start"]
            if s["is_success"]:
                assert s["stream_info"]["error"] == "NONE"
                prog = s["elapsed_seconds"]["payload_progress_recv"]
                assert {"0.0", "1.0"} <= set(prog) <= set(DECILES)
                values = [prog[k] for k in DECILES if k in prog]
                assert values == sorted(values)
                assert prog["1.0"] == pytest.approx(int(s["time_info"]["usecs-to-last-byte-recv"]) / 1e6, abs=1e-6)
                assert "5242880" not in s["elapsed_seconds"]["payload_bytes_recv"], "never reached"
            else:
                assert s["is_error"] and "elapsed_seconds" not in s
                assert s["stream_info"]["error"] != "NONE"
                assert s["time_info"]["usecs-to-last-byte-recv"] == "-1"


def test_progress_records_fill_the_deciles():
    doc = document(_runs())
    bulk = doc["data"]["rr"]["tgen"]["streams"]["3:0:bulk-0:rep1"]
    prog = bulk["elapsed_seconds"]["payload_progress_recv"]
    # 600 000 of 1 048 576 bytes at first byte + 0.5 s: deciles 0.1 .. 0.5 reached by then.
    first = int(bulk["time_info"]["usecs-to-first-byte-recv"]) / 1e6
    for k in ("0.1", "0.5"):
        assert prog[k] == pytest.approx(first + 0.5)
    assert prog["0.6"] == prog["1.0"]


def test_cli_export_matches_summary_json(tmp_path):
    out = tmp_path / "run"
    (out).mkdir()
    (out / "scenario.toml").write_text(
        'name = "s"\nduration = 50\nwarmup = 5\n'
        '[[clients]]\nclass = "web"\nsize = 51200\npause = 1.0\n'
        '[[clients]]\nclass = "bulk"\nsize = 1048576\npause = 1.0\n'
        '[variants]\nScheduler = ["rr", "ewma"]\n')
    (out / "manifest.json").write_text(json.dumps({"variants": ["rr", "ewma"], "quick": False}))
    for variant, reps in _runs().items():
        for run in reps:
            d = out / "runs" / variant / str(run.rep)
            (d / "clients").mkdir(parents=True)
            (d / "run.json").write_text(json.dumps({"t0": run.t0, "status": "ok"}))
            for cls in ("web", "bulk"):
                lines = []
                for t in run.transfers:
                    if t.cls != cls:
                        continue
                    rec = {k: getattr(t, k) for k in ("start", "socket_connected", "socks_connected", "request_sent",
                                                      "first_byte", "last_byte", "bytes", "expected_bytes",
                                                      "status", "error", "loop", "seq")}
                    rec.update({"type": "transfer", "class": cls, "partials": dict(t.partials)})
                    lines.append(json.dumps(rec))
                lines += [json.dumps({"type": "progress", "class": p.cls, "loop": p.loop, "transfer": p.transfer,
                                      "t": p.t, "bytes": p.bytes}) for p in run.progress if p.cls == cls]
                (d / "clients" / f"{cls}-0.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["analyze", str(out)]) == 0
    assert main(["export", "--onionperf", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    doc = json.loads((out / "onionperf.analysis.json").read_text())
    _assert_same_as_summary(doc, summary)
    assert main(["export", "--onionperf", str(tmp_path / "nothing")]) == 1
