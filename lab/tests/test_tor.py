"""Unit tests of the tor backend (chive_lab/tor.py): option mapping,
consensus parameters, torrc generation (parsed back, and checked by
`tor --verify-config` when tor is installed), the control-port client against
a scripted fake, and the parsers of Tor's state file and consensus."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from chive_lab import tor
from chive_lab.cli import build_parser
from chive_lab.errors import LabError, RunFailed
from chive_lab.network import Network, NetworkSpec

FP = "A" * 40
V3 = "B" * 40
_TOOLS = None if tor.tor_unavailable_reason() else tor.find_tor_tools()
needs_tor = pytest.mark.skipif(_TOOLS is None, reason=tor.tor_unavailable_reason() or "")


def _known() -> frozenset[str]:
    return tor.known_torrc_options(_TOOLS.tor if _TOOLS else None)


# -- option mapping -----------------------------------------------------------


def test_bandwidth_rate_maps_to_rate_and_burst():
    m = tor.map_relay_options({}, bandwidth_rate=1_000_000)
    assert ("BandwidthRate", "1000000 bytes") in m.relay_lines
    assert ("BandwidthBurst", "1000000 bytes") in m.relay_lines
    assert m.unmapped == []


def test_no_rate_means_no_bandwidth_lines():
    for rate in (None, 0):
        lines = dict(tor.map_relay_options({"BandwidthRate": 0}, bandwidth_rate=rate).relay_lines)
        assert "BandwidthRate" not in lines and "BandwidthBurst" not in lines


def test_set_burst_overrides_and_zero_burst_means_rate():
    m = tor.map_relay_options({"BandwidthRate": 200_000, "BandwidthBurst": 400_000})
    assert dict(m.relay_lines) == {"BandwidthRate": "200000 bytes", "BandwidthBurst": "400000 bytes"}
    m = tor.map_relay_options({"BandwidthRate": 200_000, "BandwidthBurst": 0})
    assert dict(m.relay_lines)["BandwidthBurst"] == "200000 bytes"


def test_rate_below_tor_minimum_is_refused():
    with pytest.raises(LabError, match="76800"):
        tor.map_relay_options({}, bandwidth_rate=50_000)
    tor.map_relay_options({}, bandwidth_rate=tor.MIN_BANDWIDTH_RATE)  # the minimum itself is fine


def test_burst_below_rate_is_refused():
    with pytest.raises(LabError, match="below BandwidthRate"):
        tor.map_relay_options({"BandwidthRate": 200_000, "BandwidthBurst": 100_000})


def test_scheduler_rr_turns_ewma_off():
    m = tor.map_relay_options({"Scheduler": "rr", "CircuitPriorityHalflife": 10})
    assert dict(m.relay_lines)["CircuitPriorityHalflife"] == 0
    assert any("ignored" in n for n in m.notes)


def test_scheduler_ewma_uses_halflife_or_consensus():
    m = tor.map_relay_options({"Scheduler": "ewma", "CircuitPriorityHalflife": 3.5})
    assert dict(m.relay_lines)["CircuitPriorityHalflife"] == 3.5
    # No half-life: no line, so Tor uses the consensus value (CircuitPriorityHalflife -1).
    m = tor.map_relay_options({"Scheduler": "ewma"})
    assert "CircuitPriorityHalflife" not in dict(m.relay_lines)


def test_bad_scheduler_and_halflife_values_are_refused():
    with pytest.raises(LabError, match="Scheduler"):
        tor.map_relay_options({"Scheduler": "kist"})
    with pytest.raises(LabError, match="seconds"):
        tor.map_relay_options({"CircuitPriorityHalflife": "fast"})


def test_chive_only_keys_are_reported_unmapped():
    m = tor.map_relay_options({"OutbufCells": 32, "PublishInterval": 5, "NoSuchThing": 1})
    keys = {u.key: u.reason for u in m.unmapped}
    assert set(keys) == {"OutbufCells", "PublishInterval", "NoSuchThing"}
    assert "output buffer" in keys["OutbufCells"]
    assert m.relay_lines == []


def test_tor_options_pass_through():
    m = tor.map_relay_options({"Schedulers": "Vanilla", "KISTSchedRunInterval": 2}, tor_options=_known())
    assert ("Schedulers", "Vanilla") in m.relay_lines
    assert ("KISTSchedRunInterval", 2) in m.relay_lines
    assert m.unmapped == []


def test_exit_policy_list_becomes_one_line():
    m = tor.map_relay_options({"ExitPolicy": ["accept 127.0.0.1:80", "reject *:*"], "ExitPolicyRejectPrivate": False})
    assert ("ExitPolicy", "accept 127.0.0.1:80, reject *:*") in m.relay_lines
    assert ("ExitPolicyRejectPrivate", False) in m.relay_lines


@pytest.mark.parametrize("key", ["ORPort", "DataDirectory", "ControlPort", "DirAuthority", "Nickname"])
def test_managed_keys_cannot_be_set(key):
    with pytest.raises(LabError, match="managed by the lab"):
        tor.map_relay_options({key: "x"})


def test_unmapped_options_lists_relay_and_param_keys():
    out = tor.unmapped_options({"OutbufCells": 16, "BandwidthRate": 100_000}, {"OutbufCells": 8, "circwindow": 101})
    assert {(u["kind"], u["key"]) for u in out} == {("relay", "OutbufCells"), ("param", "OutbufCells")}
    assert all(u["reason"] for u in out)


# -- consensus parameters ---------------------------------------------------------


def test_circwindow_adds_cc_alg_zero():
    m = tor.map_params({"circwindow": 101})
    assert m.consensus_params == {"circwindow": 101, "cc_alg": 0}
    assert any("cc_alg=0" in n for n in m.notes)


def test_explicit_cc_alg_is_kept():
    m = tor.map_params({"circwindow": 1000, "cc_alg": 2})
    assert m.consensus_params == {"circwindow": 1000, "cc_alg": 2}
    assert m.notes == []


def test_params_pass_through_except_chive_only():
    m = tor.map_params({"CircuitPriorityHalflifeMsec": 30000, "OutbufCells": 32})
    assert m.consensus_params == {"CircuitPriorityHalflifeMsec": 30000}
    assert [u.key for u in m.unmapped] == ["OutbufCells"]


@pytest.mark.parametrize("params", [{"circwindow": 99}, {"circwindow": 1001}, {"x": 2**31}, {"x": True}])
def test_bad_params_are_refused(params):
    with pytest.raises(LabError):
        tor.map_params(params)


def test_consensus_params_line_is_sorted():
    assert tor.consensus_params_line({"circwindow": 101, "cc_alg": 0, "CircuitPriorityHalflifeMsec": 1}) == (
        "CircuitPriorityHalflifeMsec=1 cc_alg=0 circwindow=101"
    )


# -- torrc generation -----------------------------------------------------------------


def _nodes(tmp_path: Path):
    auth = tor.TorNode("auth1", "authority", tmp_path / "auth1", control_port=9001, or_port=9002,
                       dir_port=9004, fingerprint=FP, v3ident=V3)
    relay = tor.TorNode("relay2", "relay", tmp_path / "relay2", control_port=9011, or_port=9012,
                        metrics_port=9013)
    client = tor.TorNode("client", "client", tmp_path / "client", control_port=9021, socks_port=9022)
    return auth, relay, client


def _torrcs(tmp_path: Path, overrides=None, rate=None, params=None):
    auth, relay, client = _nodes(tmp_path)
    mapping = tor.map_relay_options(overrides or {}, rate, _known())
    cparams = tor.map_params(params or {}).consensus_params
    bwfile = tmp_path / "bandwidth-file"
    return {n.name: tor.render_torrc(tor.build_torrc(n, [auth], mapping, cparams, bwfile))
            for n in (auth, relay, client)}


def test_generated_torrcs_use_only_known_options(tmp_path: Path):
    known = _known()
    texts = _torrcs(tmp_path, {"Scheduler": "rr", "Schedulers": "Vanilla"}, 1_000_000, {"circwindow": 101})
    for name, text in texts.items():
        pairs = tor.parse_torrc(text)
        assert pairs, name
        unknown = {k for k, _ in pairs if k not in known}
        assert not unknown, f"{name}: unknown options {unknown}"


def test_torrc_contents_per_role(tmp_path: Path):
    texts = _torrcs(tmp_path, rate=1_000_000, params={"circwindow": 101})
    auth = tor.parse_torrc(texts["auth1"])
    relay = tor.parse_torrc(texts["relay2"])
    client = tor.parse_torrc(texts["client"])
    dir_auth = f"auth1 orport=9002 no-v2 v3ident={V3} 127.0.0.1:9004 {FP}"
    for pairs in (auth, relay, client):
        d = dict(pairs)
        assert d["TestingTorNetwork"] == "1"
        assert d["DirAuthority"] == dir_auth
        assert d["RunAsDaemon"] == "0"
        assert d["CookieAuthentication"] == "1"
        assert d["Log"].startswith("notice file ") and d["Log"].endswith("tor.log")
    a = dict(auth)
    assert a["V3AuthoritativeDirectory"] == "1" and a["DirPort"] == "127.0.0.1:9004"
    assert a["ConsensusParams"] == "cc_alg=0 circwindow=101"
    assert a["V3BandwidthsFile"].endswith("bandwidth-file")
    # Authorities stay out of the data path: no exit, no relay options.
    assert a["ExitRelay"] == "0" and a["ExitPolicy"] == "reject *:*"
    assert "BandwidthRate" not in a and "MetricsPort" not in a
    r = dict(relay)
    assert "V3AuthoritativeDirectory" not in r and "ConsensusParams" not in r
    assert r["AssumeReachable"] == "1" and r["ExitPolicyRejectPrivate"] == "0"
    assert r["MetricsPort"] == "127.0.0.1:9013" and r["MetricsPortPolicy"] == "accept 127.0.0.1"
    assert r["BandwidthRate"] == "1000000 bytes" and r["TokenBucketRefillInterval"] == "10"
    assert r["ExitRelay"] == "1" and r["ServerDNSResolvConfFile"] == "/dev/null"
    assert [v for k, v in relay if k == "ExitPolicy"] == ["accept 127.0.0.0/8:*", "accept *:*"]
    c = dict(client)
    assert c["SocksPort"] == "127.0.0.1:9022" and c["ConfluxEnabled"] == "0"
    assert c["ExcludeNodes"] == f"${FP}"
    assert "ORPort" not in c and "Nickname" not in c


def test_client_runs_without_entry_guards(tmp_path: Path):
    # Paths are random among equal relays (loopback) or pinned (netns): guards only add a
    # state in which a guard marked down stalls every circuit ("Failed to find node for hop #1").
    texts = _torrcs(tmp_path)
    assert dict(tor.parse_torrc(texts["client"]))["UseEntryGuards"] == "0"
    assert all("UseEntryGuards" not in dict(tor.parse_torrc(texts[n])) for n in ("auth1", "relay2"))
    assert "UseEntryGuards" in _known()


def test_refill_interval_only_under_a_rate_limit(tmp_path: Path):
    assert "TokenBucketRefillInterval" not in dict(tor.parse_torrc(_torrcs(tmp_path)["relay2"]))
    texts = _torrcs(tmp_path, {"TokenBucketRefillInterval": 100}, rate=100_000)
    assert [v for k, v in tor.parse_torrc(texts["relay2"]) if k == "TokenBucketRefillInterval"] == ["100"]


def test_exit_policy_override_replaces_default(tmp_path: Path):
    texts = _torrcs(tmp_path, {"ExitPolicy": ["accept 127.0.0.1:*", "reject *:*"]})
    policies = [v for k, v in tor.parse_torrc(texts["relay2"]) if k == "ExitPolicy"]
    assert policies == ["accept 127.0.0.1:*, reject *:*"]


def test_render_refuses_line_breaks_and_bad_names():
    with pytest.raises(LabError):
        tor.render_torrc([("Nickname", "a\nControlPort 9051")])
    with pytest.raises(LabError):
        tor.render_torrc([("Bad Name", "x")])


def test_parse_torrc_refuses_garbage():
    assert tor.parse_torrc("# c\n\nSocksPort 9050\nServerDNSTestAddresses\n") == [
        ("SocksPort", "9050"), ("ServerDNSTestAddresses", "")]
    with pytest.raises(LabError, match="line 2"):
        tor.parse_torrc("SocksPort 1\n=oops\n")


@pytest.mark.serial
@needs_tor
@pytest.mark.parametrize("name", ["auth1", "relay2", "client"])
def test_tor_verify_config_accepts_generated_torrc(tmp_path: Path, name: str):
    texts = _torrcs(tmp_path, {"Scheduler": "ewma", "CircuitPriorityHalflife": 10}, 1_000_000, {"circwindow": 101})
    node_dir = tmp_path / name
    node_dir.mkdir(mode=0o700)
    path = node_dir / "torrc"
    path.write_text(texts[name])
    empty = tmp_path / "empty"
    empty.write_text("")
    out = subprocess.run([_TOOLS.tor, "--verify-config", "-f", str(path), "--defaults-torrc", str(empty)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Configuration was valid" in out.stdout


@pytest.mark.serial
@needs_tor
def test_tor_verify_config_rejects_what_the_mapping_refuses(tmp_path: Path):
    # The mapping refuses rates below 76800 because tor does: check tor agrees.
    auth, relay, _ = _nodes(tmp_path)
    lines = tor.build_torrc(relay, [auth], tor.TorMapping(relay_lines=[("BandwidthRate", "50000 bytes")]), {})
    relay.dir.mkdir(mode=0o700)
    (relay.dir / "torrc").write_text(tor.render_torrc(lines))
    (tmp_path / "empty").write_text("")
    out = subprocess.run([_TOOLS.tor, "--verify-config", "-f", str(relay.dir / "torrc"),
                          "--defaults-torrc", str(tmp_path / "empty")], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "76800" in out.stdout


@pytest.mark.serial
@needs_tor
def test_kept_keys_are_reused_with_a_fresh_certificate_for_the_new_address(tmp_path: Path, monkeypatch):
    import time

    def network(name: str, dir_port: int) -> list[tor.TorNode]:
        d = tmp_path / name
        d.mkdir()
        return [tor.TorNode("auth1", "authority", d / "auth1", control_port=1, or_port=2, dir_port=dir_port),
                tor.TorNode("relay1", "relay", d / "relay1", control_port=3, or_port=4)]

    def ids(nodes):
        return [(n.fingerprint, n.v3ident) for n in nodes]

    # The session's cache (conftest.py), so that the keys made here serve the other tor tests.
    if not os.environ.get(tor.KEY_CACHE_ENV):
        monkeypatch.setenv(tor.KEY_CACHE_ENV, str(tmp_path / "cache"))
    first, second = network("first", 7001), network("second", 7002)
    for nodes in (first, second):
        tor.prepare_keys(_TOOLS, nodes, nodes[0].dir.parent, time.monotonic() + 120)
        assert all(len(n.fingerprint) == 40 for n in nodes) and len(nodes[0].v3ident) == 40
        bw = (nodes[0].dir.parent / tor.BANDWIDTH_FILE).read_text()
        assert f"node_id=${nodes[1].fingerprint}" in bw
    assert ids(second) == ids(first)
    assert not (second[1].dir / "keygen.log").exists(), "the relay identity was made again"
    # The authority's certificate is new and names the second network's DirPort.
    cert = (second[0].dir / "keys" / "authority_certificate").read_text()
    assert "dir-address 127.0.0.1:7002" in cert
    assert cert != (first[0].dir / "keys" / "authority_certificate").read_text()
    gencert = (second[0].dir / "keygen.log").read_text()
    assert "--create-identity-key" not in gencert and "tor-gencert" in gencert


# -- parsers ------------------------------------------------------------------------------


def test_bandwidth_file_gives_every_relay_the_same_weight():
    relays = [tor.TorNode(f"relay{i}", "relay", Path("/x"), control_port=1, fingerprint=c * 40)
              for i, c in ((1, "A"), (2, "B"))]
    text = tor.bandwidth_file(relays, now=1700000000.7, bw=500)
    lines = text.splitlines()
    assert lines[0] == "1700000000" and text.endswith("\n")
    assert lines[1:] == [f"node_id=${'A' * 40} bw=500 nick=relay1", f"node_id=${'B' * 40} bw=500 nick=relay2"]


def test_parse_cbt_state_histogram():
    text = (
        "# Tor state file\nCircuitBuildAbandonedCount 2\nCircuitBuildTimeBin 15 3\n"
        "CircuitBuildTimeBin 25 1\nCircuitBuildTimeBin 95 1\nCircuitBuildTimeBin x 9\nGuard in=default\n"
    )
    cbt = tor.parse_cbt_state(text)
    assert cbt["count"] == 5 and cbt["abandoned"] == 2
    assert cbt["bins_ms"] == {"15": 3, "25": 1, "95": 1}
    assert cbt["median_ms"] == 15
    assert cbt["mean_ms"] == pytest.approx((15 * 3 + 25 + 95) / 5)
    empty = tor.parse_cbt_state("")
    assert empty["count"] == 0 and empty["median_ms"] is None


def test_consensus_relays_needs_every_path_flag():
    full = "Exit Fast Guard Running Stable V2Dir Valid"
    ns = (
        f"r relay1 AAAA BBBB 2026-01-01 00:00:00 127.0.0.1 5000 0\ns {full}\n"
        "r relay2 AAAA BBBB 2026-01-01 00:00:00 127.0.0.1 5001 0\ns Fast Running Valid\n"
        "r relay3 AAAA BBBB 2026-01-01 00:00:00 127.0.0.1 5002 0\ns Exit Valid\n"
        # No Stable: tor will not take it as a pinned entry (not a possible guard).
        "r relay4 AAAA BBBB 2026-01-01 00:00:00 127.0.0.1 5002 0\ns Exit Fast Guard Running V2Dir Valid\n"
        f"r relay10 AAAA BBBB 2026-01-01 00:00:00 127.0.0.1 5003 0\ns {full}\n"
    )
    assert tor.consensus_relays(ns) == {"relay1", "relay10"}


def test_circuit_status_parsing():
    text = ("3 BUILT $AA~relay3,$BB~relay2,$CC~relay1 BUILD_FLAGS=NEED_CAPACITY PURPOSE=GENERAL "
            "TIME_CREATED=2026-11-21T21:15:01.787839\n4 LAUNCHED\n")
    circs = tor.parse_circuit_status(text)
    assert circs[0]["path"] == ["relay3", "relay2", "relay1"] and circs[0]["purpose"] == "GENERAL"
    assert circs[1] == {"id": 4, "status": "LAUNCHED", "path": []}


# -- control port client against a scripted fake ------------------------------------------


def _fake_control(replies: dict[str, bytes]):
    """A one-connection control port: answers each command line from ``replies``
    (by prefix); records what it received."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    received: list[str] = []

    def serve():
        try:
            conn, _ = srv.accept()
        except OSError:
            return  # the test closed the listener without connecting (e.g. a bad cookie)
        with conn:
            buf = b""
            while True:
                data = conn.recv(4096)
                if not data:
                    return
                buf += data
                while b"\r\n" in buf:
                    line, buf = buf.split(b"\r\n", 1)
                    text = line.decode()
                    received.append(text)
                    if text == "QUIT":
                        conn.sendall(b"250 closing connection\r\n")
                        return
                    for prefix, reply in replies.items():
                        if text.startswith(prefix):
                            conn.sendall(reply)
                            break
                    else:
                        conn.sendall(b"510 Unrecognized command\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, received


def test_control_client_authenticates_and_parses_getinfo(tmp_path: Path):
    cookie = tmp_path / "control_auth_cookie"
    cookie.write_bytes(bytes(range(32)))
    srv, received = _fake_control({
        "AUTHENTICATE": b"250 OK\r\n",
        "GETINFO traffic/read": b"250-traffic/read=123\r\n250-traffic/written=456\r\n250 OK\r\n",
        "GETINFO ns/all": b"250+ns/all=\r\nr relay1 x\r\n..dotted\r\ns Running Exit\r\n.\r\n250 OK\r\n",
    })
    with srv:
        port = srv.getsockname()[1]
        with tor.ControlClient(port, cookie) as ctl:
            assert ctl.getinfo("traffic/read", "traffic/written") == {"traffic/read": "123", "traffic/written": "456"}
            assert ctl.getinfo("ns/all") == {"ns/all": "r relay1 x\n.dotted\ns Running Exit"}
            with pytest.raises(LabError, match="510"):
                ctl.getinfo("nonsense")
    assert received[0] == "AUTHENTICATE " + bytes(range(32)).hex()


@pytest.mark.parametrize("cookie_bytes, replies, match", [
    (b"\x01" * 32, {"AUTHENTICATE": b"515 Authentication failed: Wrong length\r\n"}, "refused authentication"),
    (b"short", {}, "expected 32"),
    (b"\x01" * 32, {"AUTHENTICATE": b"hello there\r\n"}, "malformed"),
])
def test_control_client_reports_refused_auth_bad_cookie_and_malformed_reply(tmp_path: Path, cookie_bytes, replies,
                                                                              match):
    cookie = tmp_path / "cookie"
    cookie.write_bytes(cookie_bytes)
    srv, _ = _fake_control(replies)
    with srv, pytest.raises(LabError, match=match):
        tor.ControlClient(srv.getsockname()[1], cookie)


# -- spec, CLI and availability -----------------------------------------------------------


def test_spec_impl_is_validated():
    with pytest.raises(LabError, match="impl"):
        NetworkSpec(impl="arti").validate()
    with pytest.raises(LabError, match="tor_authorities"):
        NetworkSpec(impl="tor", tor_authorities=0).validate()
    spec = NetworkSpec(impl="tor")
    spec.validate()
    assert spec.to_json()["impl"] == "tor"


def test_cli_has_impl_option():
    args = build_parser().parse_args(["up", "--dir", "x", "--impl", "tor"])
    assert args.impl == "tor"
    assert build_parser().parse_args(["up", "--dir", "x"]).impl == "chive"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--dir", "x", "--impl", "arti"])


def test_missing_tor_fails_clearly_before_touching_dir(tmp_path: Path, monkeypatch, fake_chive):
    monkeypatch.setenv("TOR_BIN", str(tmp_path / "no-such-tor"))
    assert "tor is not installed" in (tor.tor_unavailable_reason() or "")
    with pytest.raises(tor.TorUnavailable, match="--impl tor needs the real Tor"):
        Network.up(NetworkSpec(impl="tor", binary=fake_chive), tmp_path / "net", progress=None)
    assert not (tmp_path / "net" / "state.json").exists()


def test_collect_refuses_a_chive_network(tmp_path: Path):
    from chive_lab.state import State, save_state

    save_state(tmp_path, State(dir=str(tmp_path), endpoints={"socks": "127.0.0.1:1"}))
    with pytest.raises(LabError, match="no tor network"):
        tor.collect_tor_metrics(tmp_path)


# -- a failed start ------------------------------------------------------------------------


@pytest.mark.serial
def test_a_tor_node_that_exited_fails_the_run_with_its_log(tmp_path: Path):
    from chive_lab.process import ProcessRecord
    from chive_lab.state import State
    from chive_lab.tor import launch

    node_dir = tmp_path / "relay1"
    node_dir.mkdir()
    (node_dir / "tor.log").write_text("[notice] Bootstrapped 0%\n[err] Could not bind to 127.0.0.1:9001\n")
    dead = subprocess.Popen(["true"])
    dead.wait()
    rec = ProcessRecord(name="relay1", pid=dead.pid, argv=["tor"], cmdline=["tor"], start_ticks=None,
                        started_at=0.0, log=str(node_dir / "tor.log"))
    with pytest.raises(RunFailed) as e:
        launch._check_alive(State(dir=str(tmp_path), spec={}, nodes=[rec]))
    assert e.value.node == "relay1"
    assert "relay1 failed to start" in str(e.value) and "Could not bind" in str(e.value)


@pytest.mark.serial
def test_a_network_that_does_not_bootstrap_fails_the_run(tmp_path: Path):
    from types import SimpleNamespace

    from chive_lab.network import free_ports
    from chive_lab.state import State
    from chive_lab.tor import launch

    client = tor.TorNode(name="client", role="client", dir=tmp_path / "client", control_port=free_ports(1)[0])
    client.dir.mkdir()
    (client.dir / "tor.log").write_text("[warn] Failed to find node for hop #1 of our path.\n")
    notes: list[str] = []
    with pytest.raises(RunFailed) as e:
        launch._wait_bootstrap(SimpleNamespace(_progress=notes.append), client, ["relay1"],
                               State(dir=str(tmp_path), spec={}), deadline=0.0, started=0.0)
    assert e.value.node == "client" and "did not bootstrap in time" in str(e.value)
    assert "hop #1" in str(e.value)
