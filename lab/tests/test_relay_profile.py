"""lab/scripts/relay_profile.py: telling the path's roles apart, pruning folded stacks without
losing samples, the arguments, and one short real profile (needs perf)."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "relay_profile.py"
spec = importlib.util.spec_from_file_location("relay_profile", SCRIPT)
rp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rp)

from chive_lab import flamegraph  # noqa: E402  (after the script, which puts lab/ on the path)

HTTP = 8080


def _path_conns():
    # client 40001 -> relay2:5002 (guard; the client also holds an idle link to relay3:5003);
    # relay2 40002 -> relay3:5003; relay3 40003 -> relay1:5001; relay1 40004 -> httpd:8080 (exit).
    # Each relay also holds its authority connection.
    return {
        "client": {(40001, 5002), (40005, 5003), (40100, 7000)},
        "relay2": {(5002, 40001), (40002, 5003), (40101, 7000)},
        "relay3": {(5003, 40002), (40003, 5001), (5003, 40005)},
        "relay1": {(5001, 40003), (40004, HTTP)},
        "httpd": {(HTTP, 40004)},
    }


BUSY = {(40001, 5002): 50_000_000, (40005, 5003): 1_028, (40100, 7000): 0}


def test_roles_from_the_connections_and_the_client_s_busiest_link():
    assert rp.path_roles(_path_conns(), HTTP, BUSY) == {
        "guard": "relay2", "middle": "relay3", "exit": "relay1", "client": "client"}
    # Had the other link carried the download, relay3 would be the guard.
    swapped = {(40001, 5002): 10, (40005, 5003): 9_000_000}
    assert rp.path_roles(_path_conns(), HTTP, swapped)["guard"] == "relay3"


def test_roles_that_cannot_be_told_are_an_error():
    conns = _path_conns()
    conns["relay1"] = {(5001, 40003)}  # the download is over: nobody talks to the httpd
    with pytest.raises(ValueError, match="httpd none"):
        rp.path_roles(conns, HTTP, BUSY)
    with pytest.raises(ValueError, match="busiest connection none"):
        rp.path_roles(_path_conns(), HTTP, {})  # nothing received in the moment
    conns = _path_conns()
    del conns["relay3"]
    with pytest.raises(ValueError, match="need 3 relays"):
        rp.path_roles(conns, HTTP, BUSY)


SS = """\
0      0      127.0.0.1:42638 127.0.0.1:18998
\t bbr wscale:10,10 rto:204 cwnd:11 bytes_sent:5000 bytes_acked:5001 segs_out:3 segs_in:2
5000   0      127.0.0.1:18998 127.0.0.1:42638
\t bbr wscale:10,10 rto:200 cwnd:10 bytes_received:5000 segs_out:1 segs_in:3
0      0      [::1]:7000 [::1]:51000
\t cubic rto:200 bytes_received:12 segs_in:3
"""


def test_ss_parsing():
    assert rp.parse_ss_received(SS) == {(42638, 18998): 0, (18998, 42638): 5000, (7000, 51000): 12}
    assert rp.parse_ss_received("") == {}


def test_pruning_keeps_every_sample_and_every_wide_frame():
    folded = {"main;poll;aes": 500, "main;poll;copy": 480, "main;poll;rare;deep;deeper": 15,
              "main;odd": 5}
    kept = rp.prune_folded(folded, 0.01)
    assert sum(kept.values()) == sum(folded.values())
    assert kept["main;poll;aes"] == 500 and kept["main;poll;copy"] == 480
    assert kept["main;poll;rare;deep;deeper"] == 15  # 1.5 %: kept whole
    assert kept["main;[1 frames under 1 %]"] == 5
    assert rp.prune_folded(folded, 0.02)["main;poll;[3 frames under 2 %]"] == 15
    # The graph of the pruned stacks draws the same wide frames.
    assert flamegraph.build_tree(kept).children["main"].children["poll"].value == 995
    assert rp.prune_folded(folded, 0) == folded


def test_arguments_are_checked(capsys):
    for bad in (["--roles", "entry"], ["--roles", ""], ["--seconds", "0"], ["--prune", "0.5"],
                ["--freq", "0"], ["--set", "OutbufCells"]):
        with pytest.raises(SystemExit):
            rp.parse_args(bad)
        assert "error" in capsys.readouterr().err
    args = rp.parse_args(["--roles", "guard,exit"])
    assert args.roles == ["guard", "exit"] and args.seconds == 8.0


def test_summary_table():
    table = rp.summary_markdown({"middle": {"crypto": 20.0, "copies": 10.0}, "client": {"crypto": 30.0}},
                                {"middle": {"ns_per_byte": 1.5}, "client": {"ns_per_byte": 2.5}})
    assert "| group (% of samples) | middle | client |" in table
    assert "| crypto | 20.0 | 30.0 |" in table and "| copies | 10.0 | 0.0 |" in table
    assert "| 1.50 | 2.50 |" in table


@pytest.mark.skipif(not rp.relay_cpu.CHIVE.exists() or not rp.relay_cpu.LAB.exists()
                    or shutil.which("curl") is None or rp.check_perf() is not None,
                    reason="needs target/release/chive, chive-lab, curl and a working perf record")
@pytest.mark.serial
def test_short_real_profile(tmp_path):
    out = tmp_path / "out"
    assert rp.main(["--roles", "middle,client", "--seconds", "1.5", "--warmup", "1", "--freq", "299",
                    "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["bytes"] > 0
    assert set(manifest["processes"]) == {"guard", "middle", "exit", "client"}
    for role in ("middle", "client"):
        with open(out / f"{role}-groups.csv") as f:
            shares = [float(r["percent_of_samples"]) for r in csv.DictReader(f)]
        assert sum(shares) == pytest.approx(100, abs=0.5)
        ET.parse(out / f"{role}.svg")
        with gzip.open(out / f"{role}.folded.gz", "rt") as f:
            assert flamegraph.parse_folded(f)
    assert not (out / "guard.svg").exists()
    with open(out / "window.csv") as f:
        rows = {r["role"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"guard", "middle", "exit", "client"}
    assert all(float(r["ns_per_byte"]) > 0 for r in rows.values())
    assert "| CPU per relayed byte" in (out / "summary.md").read_text()
