"""End to end against the real Tor: `chive-lab up --impl tor --relays 3`, a
10 MiB download with curl --socks5-hostname checked byte for byte, Tor's own
metrics collected, `chive-lab down`, and no process left behind.

Skipped, with the reason (see `pytest -rs`), when tor or tor-gencert is not
installed (`make deps` installs them with apt), when the chive binary (needed
for `chive httpd`) is not built, or when curl is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

from labcli import chive_cli_missing, curl_file, curl_missing, e2e_marks, run_lab  # tests/ is on sys.path (conftest)

from chive_lab.process import is_running
from chive_lab.state import load_state
from chive_lab.tor import collect_tor_metrics, tor_unavailable_reason

TEN_MIB = 10 * 1024 * 1024


def _skip_reason() -> str | None:
    reason = tor_unavailable_reason()
    if reason is not None:
        return reason
    return chive_cli_missing("chive httpd serves the test files; run `make build`") or curl_missing()


pytestmark = e2e_marks(_skip_reason())


_lab = run_lab


def test_tor_network_end_to_end(tmp_path: Path):
    dir = tmp_path / "tor-net"
    # Bootstrap takes 10-60 s; `up` itself gives up after 180 s.
    up = _lab("up", "--impl", "tor", "--dir", str(dir), "--relays", "3", timeout=240)
    try:
        assert up.returncode == 0, f"chive-lab up --impl tor failed:\n{up.stderr}"
        info = json.loads(up.stdout)
        assert set(info) == {"socks", "http", "dir", "pids"}
        assert set(info["pids"]) == {"auth1", "auth2", "auth3", "relay1", "relay2", "relay3", "client", "httpd"}
        state = load_state(dir)
        assert state.status == "ready" and state.endpoints["impl"] == "tor"
        # Every relay really is tor, with the torrc the lab wrote.
        for rec in state.nodes:
            if rec.name != "httpd":
                assert Path(rec.argv[0]).name == "tor" and rec.config.endswith("/torrc")

        out = tmp_path / "10MiB.bin"
        curl_file(info, TEN_MIB, out, max_time=120, timeout=150)

        # Tor's own view: the 10 MiB crossed the relays (counted by the
        # MetricsPort and the control port), and the client lists its circuits.
        live = collect_tor_metrics(dir)
        relays = [live["nodes"][f"relay{i}"]["live"] for i in (1, 2, 3)]
        assert all("metrics_error" not in r and "control_error" not in r for r in relays), relays
        assert max(r["traffic_written_bytes"] for r in relays) > TEN_MIB
        assert sum(r["metrics"]['tor_relay_traffic_bytes{direction="written"}'] for r in relays) > 2 * TEN_MIB
        circuits = live["nodes"]["client"]["live"]["circuits"]
        assert any(c["status"] == "BUILT" and len(c["path"]) == 3 for c in circuits), circuits
        assert (dir / "relay2" / "metrics.prom").is_file()
    finally:
        down = _lab("down", "--dir", str(dir), timeout=60)
    assert down.returncode == 0, down.stderr
    for rec in load_state(dir).nodes:
        assert not is_running(rec.pid), f"{rec.name} (pid {rec.pid}) still running"
    # After `down` the client has written its circuit-build-time histogram.
    after = collect_tor_metrics(dir)
    cbt = after["circuit_build_times"]
    assert cbt is not None and cbt["count"] > 0 and cbt["median_ms"] is not None
    assert after["nodes"]["relay1"]["running"] is False and after["nodes"]["auth1"]["role"] == "authority"
    assert after["nodes"]["relay1"]["live"]["traffic_written_bytes"] > 0  # kept from the live call
