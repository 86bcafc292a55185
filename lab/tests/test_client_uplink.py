"""Client-uplink experiment: options, analysis on synthetic series, and a very short real run."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from chive_lab import netns
from chive_lab.errors import LabError
from chive_lab.experiments import client_uplink as cu
from chive_lab.tor import tor_unavailable_reason

SKIP = netns.available()


def _series(down_solo: float, down_both: float, up: float, p: cu.Params) -> dict[str, list[float]]:
    end = int(p.t(cu.END))
    up_start = p.t(cu.UP_START)
    return {"down": [down_solo if t < up_start else down_both for t in range(end)],
            "up": [0.0 if t < up_start else up for t in range(end)]}


def test_parse_options_and_defaults():
    p = cu.KIND.parse_options({})
    assert (p.queue_at, p.downloads, p.uploads, p.switch_port_packets) == ("host", 1, 4, None)
    p = cu.KIND.parse_options({"uploads": 0, "downloads": 2, "queue_at": "switch", "switch_port_packets": 100,
                          "scale": 0.5, "transfer_bytes": 4096})
    assert (p.uploads, p.downloads, p.queue_at, p.switch_port_packets, p.scale) == (0, 2, "switch", 100, 0.5)
    for bad in ({"nope": 1}, {"downloads": 0}, {"uploads": 99}, {"uploads": True}, {"queue_at": "nic"},
                {"transfer_bytes": 1}, {"log_level": "INFO; rm"}, {"switch_port_packets": 0}):
        with pytest.raises(LabError):
            cu.KIND.parse_options(bad)


def test_loops_follow_the_timeline():
    p = cu.Params(scale=0.5, downloads=2, uploads=3)
    ls = cu.loops(p)
    assert [lp.name for lp in ls] == ["down0", "down1", "up0", "up1", "up2"]
    assert all(lp.start == 0 and lp.stop == 60 for lp in ls if not lp.upload)
    assert all(lp.start == 20 and lp.stop == 60 for lp in ls if lp.upload)


def test_analysis_on_synthetic_runs(tmp_path):
    p = cu.Params(scale=0.25)
    results = {"kernelbuf": [_series(9e6, 3e6, 8e6, p), _series(9e6, 4.5e6, 8e6, p)],
               "unsent-limit": [_series(9e6, 8.1e6, 8e6, p), _series(9e6, 8.1e6, 8e6, p)]}
    sockets = {"kernelbuf": [{"notsent_mean": 9e5, "notsent_max": 1e6, "rtt_ms_mean": 20.0}] * 2,
               "unsent-limit": [{"notsent_mean": 5e4, "notsent_max": 6.6e4, "rtt_ms_mean": 30.0}] * 2}
    s = cu.analyze_raw(results, p, tmp_path, sockets)
    kb, ul = s["variants"]["kernelbuf"], s["variants"]["unsent-limit"]
    assert kb["download_solo_bps"] == pytest.approx(9e6)
    assert kb["download_with_upload_bps"] == pytest.approx(3.75e6)
    assert kb["download_ratio_per_run"] == pytest.approx([1 / 3, 0.5])
    assert kb["download_ratio"] == pytest.approx(5 / 12)
    assert kb["download_ratio_ci90"] > 0
    assert ul["download_ratio"] == pytest.approx(0.9) and ul["download_ratio_ci90"] == pytest.approx(0.0)
    assert ul["upload_bps"] == pytest.approx(8e6)
    assert ul["client_socket"]["notsent_max"] == pytest.approx(6.6e4)
    for f in ("throughput_kernelbuf.png", "throughput_unsent-limit.csv", "download_ratio.csv",
              "download_ratio.png", "summary.json", "comparison.md"):
        assert (tmp_path / f).is_file(), f
    assert "| unsent-limit | 2 | 9.00 | 8.10 | 0.90" in (tmp_path / "comparison.md").read_text()


def test_analyze_reads_the_runner_layout(tmp_path):
    p = cu.Params(scale=0.25)
    for variant, both, sock in (("kernelbuf", 4.5e6, {"notsent_mean": 3.4e5}), ("unsent-limit", 8.5e6, {})):
        for rep in (1, 2):
            d = tmp_path / "runs" / variant / str(rep)
            d.mkdir(parents=True)
            (d / "flows.json").write_text(json.dumps(_series(9e6, both, 8e6, p)))
            (d / "client_socket.json").write_text(json.dumps(sock))
    sc = SimpleNamespace(options=p, variants=[SimpleNamespace(label=v) for v in ("kernelbuf", "unsent-limit")])
    a = cu.analyze(tmp_path, sc)
    rows = {r[0]: r for r in a.tables[0].rows}
    assert rows["kernelbuf"][3] == pytest.approx(0.5) and rows["kernelbuf"][5] == pytest.approx(340.0)
    assert rows["unsent-limit"][3] == pytest.approx(8.5 / 9, abs=1e-3) and rows["unsent-limit"][5] is None
    assert (tmp_path / "client_uplink" / "download_ratio.csv").is_file()
    assert len(a.figures) == 2


def test_registered_kind_and_scenario_validate():
    from pathlib import Path

    from chive_lab import kinds, scenario

    assert kinds.get_kind("client-uplink") is cu.KIND
    sc = scenario.load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "client-uplink.toml", quick=True)
    assert isinstance(sc.options, cu.Params) and sc.options.scale == 0.25
    assert [v.label for v in sc.variants] == ["kernelbuf", "unsent-limit", "tor", "tor-sockbuf0"]
    assert sc.variant("kernelbuf").options.client == {"LinkUnsentLimit": 0}
    assert sc.variant("tor-sockbuf0").options.torrc == {"KISTSockBufSizeFactor": 0}


@pytest.mark.serial
@pytest.mark.skipif(SKIP is not None, reason=f"client-uplink real run: {SKIP}")
def test_short_real_run_keeps_the_client_backlog_small(tmp_path):
    """unsent-limit and tor (if installed) for 12 s (uploads from 4 s): every transfer
    verified, and with the client's default LinkUnsentLimit its link socket never held much
    more than 64 KiB unsent; nothing left behind."""
    from pathlib import Path

    from chive_lab import scenario
    from chive_lab.runner import run_experiment

    before = set(netns.our_namespaces())
    started = time.monotonic()
    src = Path(__file__).resolve().parents[2] / "scenarios" / "client-uplink.toml"
    scen = tmp_path / "cu.toml"
    scen.write_text(src.read_text().replace("scale = 1.0", "scale = 0.1")
                    .replace("uploads = 4", "uploads = 2\ntransfer_bytes = 4000000")
                    .replace("repetitions = 3", "repetitions = 1"))
    # Two of the four variants, one per implementation: the lab runs every chive variant
    # through the same code (kernelbuf differs from unsent-limit by one client option,
    # LinkUnsentLimit = 0, whose effect the Rust tests check), and tor-sockbuf0 differs from
    # tor by one torrc line (checked in test_tor_netns.py).
    declared = scenario.load_scenario(scen)
    variants = [v.label for v in declared.variants if v.label in ("unsent-limit", "tor")
                and (v.options.impl != "tor" or tor_unavailable_reason() is None)]
    assert "unsent-limit" in variants
    out = tmp_path / "out"
    rc = run_experiment(scen, out, variants=variants, progress=False)
    assert rc == 0, (out / "runner.log").read_text()
    # Keeps the test short, with room for a loaded 2-core machine (170 s for 3 variants at load
    # 20-25, session 14; docs/testing.md).
    assert time.monotonic() - started < 120 * len(variants)
    s = json.loads((out / "client_uplink" / "summary.json").read_text())
    for v in variants:
        e = s["variants"][v]
        assert e["download_solo_bps"] > 1e6 and e["upload_bps"] > 1e6, (v, e)
        assert e["client_socket"], v
    # TCP_NOTSENT_LOWAT decides when the socket is writable again, not how much one write
    # takes: one batch of the writer (OutbufCells = 64 cells, ~543 bytes each in TLS) may
    # land on top of what is below the limit.
    sock = s["variants"]["unsent-limit"]["client_socket"]
    assert sock["notsent_max"] <= 64 * 1024 + 64 * 543, sock
    for v in variants:
        transfers = json.loads((out / "runs" / v / "1" / "transfers.json").read_text())
        assert all(c["errors"] == 0 for c in transfers.values()), (v, transfers)
    if "tor" in variants:  # the tor client's streams stayed on their pinned path
        tor = json.loads((out / "runs" / "tor" / "1" / "tor.json").read_text())
        assert tor["paths"] == {"clientA": ["relayB1,relayB2,relayB3"]} and not tor["path_violations"], tor
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["git"]) == {"revision", "dirty"} and manifest["repetitions"] == 1
    # (Only this process's namespaces: other runs may come and go meanwhile.)
    assert not {n for n in set(netns.our_namespaces()) - before
                if n.startswith(f"{netns.PREFIX}{os.getpid()}-")}
