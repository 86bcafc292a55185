"""lab/scripts/relay_cpu.py: /proc parsing and the per-byte arithmetic on synthetic data with
known answers, plus one short real run (skipped without the chive binary)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "relay_cpu.py"
spec = importlib.util.spec_from_file_location("relay_cpu", SCRIPT)
rc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rc)

from chive_lab import iofloor, procstat  # noqa: E402  (after the script, which puts lab/ on the path)


def _stat(comm: str, utime: int, stime: int) -> str:
    # Fields 3.. of /proc/PID/stat: state, ppid, pgrp, session, tty, tpgid, flags, minflt,
    # cminflt, majflt, cmajflt, utime, stime, cutime, cstime, ...
    rest = ["S", "1", "2", "3", "0", "-1", "4194560", "100", "0", "0", "0",
            str(utime), str(stime), "77", "88", "20", "0", "9"]
    return f"4242 ({comm}) " + " ".join(rest) + "\n"


def test_stat_fields_counted_from_the_last_paren():
    assert rc.parse_stat(_stat("chive", 1234, 56)) == (1234, 56)
    # A command name holding spaces and parentheses must not shift the fields.
    assert rc.parse_stat(_stat("a) (b c) 9 9", 7, 8)) == (7, 8)
    with pytest.raises(ValueError):
        rc.parse_stat("4242 chive S 1 2")
    with pytest.raises(ValueError):
        rc.parse_stat("4242 (chive) S 1 2 3")


def test_status_lines_in_kib():
    status = "Name:\tchive\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nThreads:\t3\n"
    assert rc.parse_status_kib(status, "VmRSS") == 10240
    assert rc.parse_status_kib(status, "VmHWM") == 20480
    assert rc.parse_status_kib("Name:\tzombie\n", "VmRSS") is None


def test_cpu_per_byte_arithmetic():
    before = {"utime": 100, "stime": 50}
    after = {"utime": 300, "stime": 100}
    d = rc.cpu_delta(before, after, 100)
    assert d == {"user_s": 2.0, "sys_s": 0.5, "cpu_s": 2.5}
    # 2.5 s of CPU for 500 MB is 5 ns per byte.
    assert rc.ns_per_byte(d["cpu_s"], 500_000_000) == pytest.approx(5.0)
    with pytest.raises(ValueError):
        rc.cpu_delta(after, before, 100)


def test_read_proc_and_exit_detection_on_a_fake_proc(tmp_path):
    proc = tmp_path
    for pid, (u, s), inode in ((11, (40, 2), 9001), (12, (30, 3), 9002), (13, (1, 1), 9003)):
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(_stat("chive", u, s))
        (d / "status").write_text(f"VmHWM:\t{pid * 100} kB\nVmRSS:\t{pid * 10} kB\n")
        os.symlink(f"socket:[{inode}]", d / "fd" / "7")
        os.symlink("/dev/null", d / "fd" / "0")
    assert rc.read_proc(12, proc) == {"utime": 30, "stime": 3, "rss_kib": 120, "hwm_kib": 1200}
    assert rc.socket_inodes(11, proc) == {9001}
    (proc / "net").mkdir()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    # relay2 (inode 9002) is connected to port 8080 (0x1F90); relay1's connection to it is closing
    # (state 06, TIME_WAIT), and the relay with inode 9003 talks to another port.
    (proc / "net" / "tcp").write_text(head + "".join([
        "   0: 0100007F:A000 0100007F:1F90 06 00000000:00000000 00:00000000 00000000  0 0 9001 1\n",
        "   1: 0100007F:A001 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  0 0 9002 1\n",
        "   2: 0100007F:A002 0100007F:1F91 01 00000000:00000000 00:00000000 00000000  0 0 9003 1\n",
    ]))
    pids = {"relay1": 11, "relay2": 12, "relay3": 13}
    assert rc.connected_to(pids, 8080, proc) == ["relay2"]
    # Only established connections, as (local port, remote port); relay_profile.py's roles.
    assert procstat.established_ports(pids, proc) == {
        "relay1": set(), "relay2": {(0xA001, 8080)}, "relay3": {(0xA002, 8081)}}
    (proc / "11" / "io").write_text("rchar: 5\nwchar: 123456\nsyscr: 1\n")
    assert procstat.read_io_wchar(11, proc) == 123456
    assert rc.role_of("relay2", ["relay2"]) == "exit"
    assert rc.role_of("relay1", ["relay2"]) == "relay"
    assert rc.role_of("client", []) == "client"


# Per-iteration ns of the floor benches, chosen so the answers are round numbers.
EST = {
    "onion_layer": 498.0,        # 1 ns per data byte; 509 B in 498 ns = 1.022 GB/s
    "onion_originate": 996.0,    # 2 ns per data byte
    "client_3hop": 1494.0,       # 3 ns per data byte
    "aead_seal": 16384.0 * 498 / 514,         # 1 ns per relayed byte once scaled by 514/498
    "aead_open": 2 * 16384.0 * 498 / 514,     # 2 ns per relayed byte
    "rustls_seal_open": 5 * 16384.0 * 498 / 514,  # 5 ns per relayed byte through rustls's API
}


def test_floor_per_role():
    f = rc.floor_from_estimates(EST)
    assert f["tls_seal_ns_per_byte"] == pytest.approx(1.0)
    assert f["tls_open_ns_per_byte"] == pytest.approx(2.0)
    assert f["onion_layer_ns_per_byte"] == pytest.approx(1.0)
    assert f["relay"] == pytest.approx(4.0)   # open 2 + layer 1 + seal 1
    assert f["exit"] == pytest.approx(3.0)    # originate 2 + seal 1
    assert f["client"] == pytest.approx(5.0)  # open 2 + three layers 3
    assert f["relay_rustls"] == pytest.approx(6.0)  # rustls 5 + layer 1
    assert f["aes128ctr_GBps"] == pytest.approx(509 / 498)
    assert f["aes128gcm_seal_GBps"] == pytest.approx(514 / 498)
    assert "sha1_GBps" not in f  # only with both SHA-1 benches


def test_sha1_floor():
    # 100 ns per 64-byte block (8192 B in 12800 ns), a cell's digest in 996 ns.
    f = rc.floor_from_estimates({**EST, "sha1_cell": 996.0, "sha1_8k": 12800.0})
    assert f["sha1_digest_ns_per_byte"] == pytest.approx(2.0)
    assert f["sha1_GBps"] == pytest.approx(0.64)
    assert f["sha1_blocks_per_cell"] == pytest.approx(9.96)
    assert f["relay"] == pytest.approx(4.0)  # the other roles do not change


def test_idle_cpu_is_taken_out():
    # 1 s of CPU over a 10 s transfer of 100 MB, by a process that burns 20 ms/s when idle:
    # 0.8 s is the transfer's, 8 ns/byte instead of 10.
    assert rc.ns_per_byte(1.0, 100_000_000) == pytest.approx(10.0)
    assert rc.net_ns_per_byte(1.0, 0.02, 10.0, 100_000_000) == pytest.approx(8.0)
    assert rc.net_ns_per_byte(0.1, 0.02, 10.0, 100_000_000) == 0.0


def test_read_estimate_uses_criterion_median(tmp_path):
    p = tmp_path / "estimates.json"
    p.write_text(json.dumps({"mean": {"point_estimate": 120.0}, "median": {"point_estimate": 100.5}}))
    assert rc.read_estimate(p) == 100.5


def _run(ns: dict[str, float], goodput: float) -> dict:
    procs = {n: {"ns_per_byte": v, "role": rc.role_of(n, ["relay3"]), "user_s": 0.6 * v, "sys_s": 0.4 * v,
                 "cpu_s": v, "hwm_kib": 2048, "rss_kib": 1024} for n, v in ns.items()}
    return {"bytes": 1, "seconds": 1, "goodput_MBps": goodput, "procs": procs}


def test_summary_ratios_to_floor_and_tor():
    runs = {
        "chive": [_run({"relay1": 4.0, "relay2": 8.0, "relay3": 6.0, "client": 10.0, "httpd": 0.1}, 80),
                  _run({"relay1": 6.0, "relay2": 8.0, "relay3": 6.0, "client": 10.0, "httpd": 0.1}, 60)],
        "tor": [_run({"relay1": 12.0, "relay2": 16.0, "relay3": 20.0, "client": 20.0, "httpd": 0.1}, 8)],
    }
    rows = rc.summarize(runs, rc.floor_from_estimates(EST))
    by = {(r["impl"], r["process"]): r for r in rows}
    r1 = by[("chive", "relay1")]
    assert r1["ns_per_byte"] == 5.0 and r1["ns_per_byte_runs"] == [4.0, 6.0]
    assert r1["goodput_MBps"] == 70 and r1["peak_rss_MiB"] == 2.0
    assert r1["x_floor"] == pytest.approx(5.0 / 4.0)        # relay floor 4
    assert r1["x_tor"] == pytest.approx(5.0 / 16.0)         # tor's median relay: 16
    assert by[("chive", "relay3")]["x_floor"] == pytest.approx(2.0)   # exit floor 3
    assert by[("chive", "client")]["x_tor"] == pytest.approx(0.5)     # vs tor's client
    assert by[("chive", "httpd")]["x_floor"] is None and by[("chive", "httpd")]["x_tor"] is None
    assert r1["user_share"] == pytest.approx(0.6)
    md = rc.markdown_table(rows).splitlines()
    assert md[0].startswith("| impl | process | role | ns/byte") and len(md) == 2 + len(rows)
    assert any(line.startswith("| chive | relay1 | relay | 5.00 | 5.00 | 0.0 | 4.000 | ")
               and line.endswith(" | 0.31 | 70.0 | 2.0 |") for line in md)
    assert "relay1" in rc.text_table(rows)
    # Without tor and without a floor the ratios are absent, not zero.
    rows = rc.summarize({"chive": runs["chive"]}, None)
    assert all(r["x_tor"] is None and r["x_floor"] is None for r in rows)


def test_own_work_is_cpu_minus_io_floor_minus_crypto_floor():
    runs = {
        "chive": [_run({"relay1": 4.0, "relay2": 8.0, "relay3": 6.0, "client": 10.0, "httpd": 0.1}, 80)],
        "io": [_run({"relay1": 0.5, "relay2": 0.7, "relay3": 0.9, "client": 0.4, "httpd": 0.1}, 190)],
    }
    rows = rc.summarize(runs, rc.floor_from_estimates(EST))
    by = {(r["impl"], r["process"]): r for r in rows}
    # relay1 and relay2 are relays in both chains: the IO floor of a relay is their median.
    assert by[("chive", "relay1")]["io_floor_ns_per_byte"] == pytest.approx(0.6)
    assert by[("chive", "relay1")]["own_ns_per_byte"] == pytest.approx(4.0 - 0.6 - 4.0)
    assert by[("chive", "relay3")]["own_ns_per_byte"] == pytest.approx(6.0 - 0.9 - 3.0)   # exit floor 3
    assert by[("chive", "client")]["io_floor_ns_per_byte"] == pytest.approx(0.4)
    # The floor's own rows and the httpd have no own work; neither has a run without io.
    assert by[("io", "relay1")]["own_ns_per_byte"] is None
    assert by[("io", "relay1")]["floor_ns_per_byte"] is None and by[("io", "relay1")]["x_floor"] is None
    assert by[("chive", "httpd")]["own_ns_per_byte"] is None
    assert all(r["own_ns_per_byte"] is None for r in rc.summarize({"chive": runs["chive"]}, None))


def test_own_work_at_chives_rate_uses_the_rate_limited_forwarders():
    runs = {
        "chive": [_run({"relay1": 4.0, "relay2": 8.0, "relay3": 6.0, "client": 10.0, "httpd": 0.1}, 80)],
        "io": [_run({"relay1": 0.5, "relay2": 0.7, "relay3": 0.9, "client": 0.4, "httpd": 0.1}, 190)],
        "io-rate": [_run({"relay1": 0.8, "relay2": 1.0, "relay3": 1.3, "client": 0.6, "httpd": 0.1}, 80)],
    }
    rows = rc.summarize(runs, rc.floor_from_estimates(EST))
    by = {(r["impl"], r["process"]): r for r in rows}
    r1 = by[("chive", "relay1")]
    # Both floors side by side: full speed (median 0.6) and at chive's rate (median 0.9).
    assert r1["io_floor_ns_per_byte"] == pytest.approx(0.6)
    assert r1["io_floor_at_rate_ns_per_byte"] == pytest.approx(0.9)
    assert r1["own_at_rate_ns_per_byte"] == pytest.approx(4.0 - 0.9 - 4.0)
    assert by[("chive", "relay3")]["own_at_rate_ns_per_byte"] == pytest.approx(6.0 - 1.3 - 3.0)
    # The rate-limited forwarders are a floor too: no crypto floor, no own work of their own.
    assert by[("io-rate", "relay1")]["floor_ns_per_byte"] is None
    assert by[("io-rate", "relay1")]["own_at_rate_ns_per_byte"] is None
    # Nor a ratio to tor: a forwarder is no relay to compare (chive's rows have one).
    runs["tor"] = [_run({"relay1": 12.0, "relay2": 16.0, "relay3": 20.0, "client": 20.0, "httpd": 0.1}, 8)]
    by = {(r["impl"], r["process"]): r for r in rc.summarize(runs, rc.floor_from_estimates(EST))}
    assert by[("chive", "relay1")]["x_tor"] == pytest.approx(4.0 / 16.0)
    assert by[("io", "relay1")]["x_tor"] is None and by[("io-rate", "client")]["x_tor"] is None
    # Without an io-rate run the column is absent, not zero.
    rows = rc.summarize({k: runs[k] for k in ("chive", "io")}, rc.floor_from_estimates(EST))
    assert all(r["own_at_rate_ns_per_byte"] is None for r in rows)


def test_the_same_rate_floor_downloads_at_chives_median_goodput():
    args = rc.parse_args(["--impl", "chive,io,io-rate", "--io-limit-rate", "5000000"])
    chive = [_run({"relay1": 1.0}, g) for g in (100.0, 120.0, 90.0)]
    assert rc.forwarder_rate("io-rate", args, {"chive": chive}) == 100_000_000
    assert rc.forwarder_rate("io", args, {"chive": chive}) == 5_000_000
    assert rc.forwarder_rate("chive", args, {}) is None


def test_listening_line_of_httpd_and_forwarder():
    assert iofloor.parse_listening('{"listening": "127.0.0.1:4242"}\n') == "127.0.0.1:4242"
    for bad in ("", "listening on 1.2.3.4:5", '{"addr": "127.0.0.1:1"}', '{"listening": 7}'):
        with pytest.raises(RuntimeError):
            iofloor.parse_listening(bad)
    assert iofloor.forwarder_cmd(Path("/f"), "127.0.0.1:1", 1000, 0) == [
        "/f", "--to", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--read-size", "1000", "--write-size", "0"]


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        rc.parse_args(["--impl", "arti"])
    assert rc.parse_args([]).impl == ["chive", "io", "io-rate", "tor"]
    # The same-rate floor needs chive's goodput of the same run first.
    with pytest.raises(SystemExit):
        rc.parse_args(["--impl", "io-rate,chive"])
    with pytest.raises(SystemExit):
        rc.parse_args(["--impl", "io,io-rate"])
    assert rc.parse_args(["--impl", "chive,io-rate"]).impl == ["chive", "io-rate"]
    with pytest.raises(SystemExit):
        rc.parse_args(["--bytes", "0"])
    assert rc.parse_args(["--impl", "tor"]).impl == ["tor"]
    assert rc.parse_args(["--set", "LinkRecordLayer=own"]).sets == ["LinkRecordLayer=own"]
    with pytest.raises(SystemExit):
        rc.parse_args(["--set", "LinkRecordLayer"])
    assert rc.parse_args(["--param", "cc_alg=2"]).params == ["cc_alg=2"]
    for bad in ("cc_alg", "cc_alg=two", "=2"):
        with pytest.raises(SystemExit):
            rc.parse_args(["--param", bad])


def test_network_parameters_reach_both_networks_and_relay_options_only_chives(monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, **_kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="{}", stderr="")

    monkeypatch.setattr(rc.subprocess, "run", fake_run)
    for impl in ("chive", "tor"):
        rc.lab_up(impl, tmp_path, ["OutbufCells=64"], ["cc_alg=2", "circwindow=500"])
    chive, tor = calls
    for cmd in (chive, tor):
        assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--param"] == ["cc_alg=2", "circwindow=500"]
    assert "--set" in chive and "--set" not in tor


@pytest.mark.skipif(not rc.CHIVE.exists() or not rc.LAB.exists() or shutil.which("curl") is None,
                    reason="needs target/release/chive, .venv/bin/chive-lab and curl")
@pytest.mark.serial
def test_short_real_run(tmp_path, capsys):
    out = tmp_path / "out"
    # 20 MB, not 5: the exit is found by polling /proc for a relay connected to the httpd while
    # the body flows, and a 5 MB download (~125 ms) ended before the poller saw it once on a
    # loaded machine (session 18: no exit found).
    assert rc.main(["--impl", "chive", "--bytes", "20000000", "--runs", "1", "--circuits", "5",
                    "--settle", "0.5", "--no-floor", "--markdown", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    rows = {r["process"]: r for r in res["rows"]}
    assert set(rows) == {"relay1", "relay2", "relay3", "client", "httpd"}
    # Every relay carried the 5 MB: each must have spent some CPU on it.
    assert all(rows[f"relay{i}"]["ns_per_byte"] > 0 for i in (1, 2, 3))
    assert sum(r["role"] == "exit" for r in res["rows"]) == 1
    assert res["memory"]["chive"]["circuits"] == 5
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert (out / "results.csv").read_text().startswith("impl,process,role,ns_per_byte")
    assert "| chive | relay1 |" in capsys.readouterr().out


@pytest.mark.skipif(not rc.CHIVE.exists() or not rc.FWD.exists() or not rc.LAB.exists()
                    or shutil.which("curl") is None,
                    reason="needs target/release/chive, the tcpfwd example, chive-lab and curl")
@pytest.mark.serial
def test_short_real_io_floor_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TCPFWD_BIN", str(rc.FWD))  # built already: no cargo run from a test
    out = tmp_path / "out"
    assert rc.main(["--impl", "io", "--bytes", "100000000", "--runs", "1", "--no-floor",
                    "--idle-seconds", "0", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    rows = {r["process"]: r for r in res["rows"]}
    assert set(rows) == {"relay1", "relay2", "relay3", "client", "httpd"}
    # The forwarder next to the httpd is the exit. The bytes all arrived (main checks the
    # length); at ~0.5 ns/B a forwarder spends ~50 ms on them, a few of /proc's 10 ms ticks,
    # so only the chain's total is sure to be counted.
    assert rows["relay3"]["role"] == "exit" and rows["relay1"]["role"] == "relay"
    assert sum(rows[n]["ns_per_byte"] for n in ("relay1", "relay2", "relay3", "client")) > 0
    assert res["memory"] == {}


def test_openssl_speed_output():
    out = ("version: 3.0.15\nThe 'numbers' are in 1000s of bytes per second processed.\n"
           "type          16384 bytes\nAES-128-CTR    9392853.58k\n")
    assert rc.parse_openssl_speed(out, "aes-128-ctr") == pytest.approx(9.39285358)
    assert rc.parse_openssl_speed(out, "aes-128-gcm") is None
    assert rc.parse_openssl_speed("", "aes-128-ctr") is None
