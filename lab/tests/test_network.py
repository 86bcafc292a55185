"""`up` / `down` orchestration, driven against fake_chive.py (no Rust build
needed): config files, start order, state.json, readiness, failure clean-up,
and the CLI's stdout/stderr contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from labcli import LAB_DIR, run_lab  # tests/ is on sys.path (conftest)

from chive_lab import socks
from chive_lab.content import check_body
from chive_lab.errors import LabError
from chive_lab.network import Network, NetworkSpec, consensus_lists, free_ports
from chive_lab.process import is_running
from chive_lab.state import load_state



def _quiet(_msg: str) -> None:
    pass


def _all_gone(dir: Path) -> bool:
    return not any(is_running(n.pid) for n in load_state(dir).nodes)


@pytest.fixture
def env_clean(monkeypatch):
    for var in ("FAKE_CHIVE_FAIL", "FAKE_CHIVE_IGNORE_TERM", "FAKE_CHIVE_NO_PUBLISH", "FAKE_CHIVE_BAD_PORTS",
                "CHIVE_BIN"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_free_ports_are_distinct():
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(1024 <= p < 65536 for p in ports)


def test_consensus_lists_matches_whole_nicknames():
    text = "r relay10 127.0.0.1\nr relay2 127.0.0.1\n"
    assert consensus_lists(text, ["relay1", "relay2", "relay10"]) == ["relay1"]
    assert consensus_lists("relay1\n", ["relay1"]) == []


def test_onion_service_is_chive_only():
    NetworkSpec(onion_service=True).validate()
    with pytest.raises(LabError, match="impl chive only"):
        NetworkSpec(onion_service=True, impl="tor").validate()
    assert NetworkSpec(onion_service=True).to_json()["onion_service"] is True


def test_spec_validation():
    with pytest.raises(LabError, match="between 3"):
        NetworkSpec(relays=2).validate()
    with pytest.raises(LabError, match="non-negative"):
        NetworkSpec(bandwidth_rate=-1).validate()
    with pytest.raises(LabError, match="managed"):
        NetworkSpec(relay_overrides={"ORPort": "x"}).validate()
    with pytest.raises(LabError, match="integer"):
        NetworkSpec(authority_params={"circwindow": "101"}).validate()
    NetworkSpec(relays=5, bandwidth_rate=0, authority_params={"circwindow": 101}).validate()


def test_up_and_down(tmp_path: Path, fake_chive: Path, env_clean):
    dir = tmp_path / "net"
    spec = NetworkSpec(
        relays=4,
        bandwidth_rate=250_000,
        relay_overrides={"CircuitPriorityHalflife": 0, "Scheduler": "rr"},
        authority_params={"circwindow": 101},
        binary=fake_chive,
        timeout=30,
        consensus_interval=1,
    )
    try:
        info = Network.up(spec, dir, progress=_quiet)
        # The printed object has exactly the documented keys.
        assert set(info.to_json()) == {"socks", "http", "dir", "pids"}
        assert info.dir == str(dir.resolve())
        assert list(info.pids) == ["authority", "relay1", "relay2", "relay3", "relay4", "client", "httpd"]
        assert all(is_running(pid) for pid in info.pids.values())
        assert info.socks.startswith("127.0.0.1:") and info.http.startswith("http://127.0.0.1:")

        # Configs where documented, with the lab's settings: every listener on port 0, and the
        # addresses the lab hands out are those each node wrote to its PortsFile.
        auth = tomllib.loads((dir / "authority" / "authority.toml").read_text())
        assert auth["NetworkParameters"] == {"circwindow": 101}
        assert auth["DirPort"] == "127.0.0.1:0" and auth["PortsFile"] == "ports.json"
        assert json.loads((dir / "authority" / "ports.json").read_text()) == {"DirPort": info.authority}
        assert auth["DataDirectory"] == str(dir.resolve() / "authority")
        identity = (dir / "authority" / "keys" / "identity.key").read_text().strip()
        assert info.authority_identity == identity
        bound = {info.authority, info.socks, info.http.removeprefix("http://")}
        for i in range(1, 5):
            relay = tomllib.loads((dir / f"relay{i}" / f"relay{i}.toml").read_text())
            assert relay["Nickname"] == f"relay{i}"
            assert relay["Authority"] == info.authority and relay["AuthorityIdentity"] == identity
            assert relay["ORPort"] == "127.0.0.1:0" and relay["PortsFile"] == "ports.json"
            assert relay["BandwidthRate"] == relay["BandwidthBurst"] == 250_000
            assert relay["CircuitPriorityHalflife"] == 0 and relay["Scheduler"] == "rr"
            assert (dir / f"relay{i}" / "chive.log").exists()
            bound.add(json.loads((dir / f"relay{i}" / "ports.json").read_text())["ORPort"])
        client = tomllib.loads((dir / "client" / "client.toml").read_text())
        assert client["SocksPort"] == "127.0.0.1:0"
        assert json.loads((dir / "client" / "ports.json").read_text()) == {"SocksPort": info.socks}
        httpd = tomllib.loads((dir / "httpd" / "httpd.toml").read_text())
        assert httpd["Listen"] == "127.0.0.1:0"
        listening = json.loads((dir / "httpd" / "chive.log").read_text().splitlines()[0])["listening"]
        assert info.http == f"http://{listening}"
        assert len(bound) == 7 and not any(a.endswith(":0") for a in bound), bound

        state = load_state(dir)
        assert state.status == "ready"
        assert state.pids() == info.pids
        assert Network.info(dir) == info

        # The network carries traffic, with and without SOCKS credentials.
        for user in (None, "alice", "bob"):
            resp = socks.fetch(f"{info.http}/bytes/100000", proxy=info.socks, username=user, password="x")
            assert resp.status == 200
            assert check_body(resp.body, 100000) is None
    finally:
        report = Network.down(dir)
    assert report.ok
    assert sorted(report.stopped) == sorted(info.pids)
    assert _all_gone(dir)


def test_up_refuses_used_directory(tmp_path: Path, fake_chive: Path, env_clean):
    dir = tmp_path / "net"
    dir.mkdir()
    (dir / "state.json").write_text("{}")
    with pytest.raises(LabError, match="already holds a network"):
        Network.up(NetworkSpec(binary=fake_chive), dir, progress=_quiet)


def test_up_missing_binary(tmp_path: Path, env_clean):
    with pytest.raises(LabError, match="not found"):
        Network.up(NetworkSpec(binary=tmp_path / "nope"), tmp_path / "net", progress=_quiet)
    assert not (tmp_path / "net" / "state.json").exists()


def test_chive_bin_env(tmp_path: Path, fake_chive: Path, env_clean):
    from chive_lab.network import default_binary

    env_clean.setenv("CHIVE_BIN", str(fake_chive))
    assert default_binary() == fake_chive


def test_failing_node_is_reported_and_everything_stopped(tmp_path: Path, fake_chive: Path, env_clean):
    env_clean.setenv("FAKE_CHIVE_FAIL", "relay2")
    dir = tmp_path / "net"
    with pytest.raises(LabError) as exc:
        Network.up(NetworkSpec(binary=fake_chive, timeout=30, consensus_interval=1), dir, progress=_quiet)
    err = exc.value
    assert err.node == "relay2"
    assert "exited" in str(err)
    assert "simulated failure" in (err.log_tail or "")
    state = load_state(dir)
    assert state.status.startswith("failed")
    assert "relay2" in state.pids()
    assert _all_gone(dir)


def test_malformed_ports_file_fails_that_node_and_stops_everything(tmp_path: Path, fake_chive: Path,
                                                                   env_clean):
    env_clean.setenv("FAKE_CHIVE_BAD_PORTS", "relay2")
    dir = tmp_path / "net"
    with pytest.raises(LabError, match=r"PortsFile .*relay2/ports.json: ORPort = '127.0.0.1' is not") as exc:
        Network.up(NetworkSpec(binary=fake_chive, timeout=30, consensus_interval=1), dir, progress=_quiet)
    assert exc.value.node == "relay2" and exc.value.log_tail is not None
    assert load_state(dir).status.startswith("failed")
    assert _all_gone(dir)


def test_timeout_names_missing_relay(tmp_path: Path, fake_chive: Path, env_clean):
    env_clean.setenv("FAKE_CHIVE_NO_PUBLISH", "relay3")
    dir = tmp_path / "net"
    # The deadline covers every node binding its ports too: room for slow interpreter starts.
    with pytest.raises(LabError, match="relay3") as exc:
        Network.up(NetworkSpec(binary=fake_chive, timeout=8, consensus_interval=1), dir, progress=_quiet)
    assert "timed out" in str(exc.value)
    assert exc.value.node == "authority"
    assert _all_gone(dir)


_lab = run_lab


def test_cli_up_prints_one_json_object_and_down_stops_all(tmp_path: Path, fake_chive: Path, env_clean):
    dir = tmp_path / "net"
    up = _lab("up", "--dir", str(dir), "--relays", "3", "--chive-bin", str(fake_chive),
              "--consensus-interval", "1", "--set", "Foo=[\"a\", 2]", "--param", "circwindow=101")
    try:
        assert up.returncode == 0, up.stderr
        lines = up.stdout.splitlines()
        assert len(lines) == 1, up.stdout
        obj = json.loads(lines[0])
        assert set(obj) == {"socks", "http", "dir", "pids"}
        assert set(obj["pids"]) == {"authority", "relay1", "relay2", "relay3", "client", "httpd"}
        assert "ready" in up.stderr  # progress goes to stderr
        relay = tomllib.loads((dir / "relay1" / "relay1.toml").read_text())
        assert relay["Foo"] == ["a", 2]
    finally:
        down = _lab("down", "--dir", str(dir))
    assert down.returncode == 0, down.stderr
    assert down.stdout == ""
    assert _all_gone(dir)


def test_cli_up_failure_exit_code_and_log_tail(tmp_path: Path, fake_chive: Path, env_clean):
    env = dict(os.environ, FAKE_CHIVE_FAIL="client")
    dir = tmp_path / "net"
    up = _lab("up", "--dir", str(dir), "--chive-bin", str(fake_chive), "--consensus-interval", "1", env=env)
    assert up.returncode == 1
    assert up.stdout == ""
    assert "client" in up.stderr and "exited" in up.stderr
    assert "last lines of the client log" in up.stderr
    assert "simulated failure" in up.stderr
    assert _all_gone(dir)


def test_cli_down_reports_process_that_would_not_stop(tmp_path: Path, fake_chive: Path, env_clean):
    """A node that ignores SIGTERM is SIGKILLed after the grace period."""
    env = dict(os.environ, FAKE_CHIVE_IGNORE_TERM="httpd")
    dir = tmp_path / "net"
    up = _lab("up", "--dir", str(dir), "--chive-bin", str(fake_chive), "--consensus-interval", "1", env=env)
    try:
        assert up.returncode == 0, up.stderr
    finally:
        down = _lab("down", "--dir", str(dir))
    assert down.returncode == 0, down.stderr
    assert "killed (SIGKILL) httpd" in down.stderr
    assert _all_gone(dir)


def test_cli_down_without_network(tmp_path: Path):
    down = _lab("down", "--dir", str(tmp_path))
    assert down.returncode == 1
    assert "no network was started" in down.stderr


def test_cli_help_explains_every_option():
    for cmd in ("up", "down"):
        out = _lab(cmd, "--help")
        assert out.returncode == 0
        for opt in (["--dir", "--relays", "--bandwidth-rate", "--set", "--param", "--timeout",
                     "--chive-bin"] if cmd == "up" else ["--dir"]):
            assert opt in out.stdout


def test_cli_up_stops_everything_on_sigterm(tmp_path: Path, fake_chive: Path, env_clean):
    """SIGTERM while `up` waits (relay3 never shows up in the consensus): the
    lab stops what it started and exits 130."""
    import signal
    import time

    env = dict(os.environ, FAKE_CHIVE_NO_PUBLISH="relay3")
    dir = tmp_path / "net"
    lab = subprocess.Popen(
        [sys.executable, "-m", "chive_lab", "up", "--dir", str(dir), "--chive-bin", str(fake_chive),
         "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=LAB_DIR,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # wait until all six nodes are recorded
            assert time.monotonic() < deadline, "up did not start the nodes"
            try:
                if len(load_state(dir).nodes) == 6:
                    break
            except LabError:
                pass
            time.sleep(0.05)
        lab.send_signal(signal.SIGTERM)
        out, err = lab.communicate(timeout=30)
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
    assert lab.returncode == 130, err
    assert out == ""
    assert _all_gone(dir)
    assert load_state(dir).status.startswith("failed")
