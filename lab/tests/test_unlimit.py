"""chive_lab.unlimit: a running network's relays lose their rate limits by config reload.

The rewrite tests run anywhere; the reload tests start a stand-in relay (a Python process that
logs what chive logs on SIGHUP) and are serial. The real binaries are exercised by
test_chive_vs_tor.py's end-to-end run (``goodput_network = "load"`` in --quick).
"""

from __future__ import annotations

import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

from chive_lab import config as cfg
from chive_lab import unlimit
from chive_lab.errors import LabError
from chive_lab.process import spawn
from chive_lab.rundir import stop_procs
from chive_lab.state import State, save_state


def _relay_toml(path: Path, rate: int) -> None:
    cfg.write_toml(path, {"Nickname": "relay1", "ORPort": "127.0.0.1:0", "BandwidthRate": rate,
                          "BandwidthBurst": rate, "ExitPolicy": ["accept 127.0.0.0/8:*", "reject *:*"]})


def test_chive_relay_config_is_rewritten_unlimited_and_other_roles_are_not(tmp_path):
    relay, client = tmp_path / "relay1.toml", tmp_path / "client.toml"
    _relay_toml(relay, 1_000_000)
    cfg.write_toml(client, {"Nickname": "client", "SocksPort": "127.0.0.1:0"})
    before = client.read_text()
    assert unlimit._unlimited_chive(relay) is True
    doc = tomllib.loads(relay.read_text())
    assert (doc["BandwidthRate"], doc["BandwidthBurst"]) == (0, 0)
    assert doc["ExitPolicy"] == ["accept 127.0.0.0/8:*", "reject *:*"] and doc["Nickname"] == "relay1"
    assert unlimit._unlimited_chive(client) is False and client.read_text() == before


def test_tor_torrc_loses_only_its_rate_lines(tmp_path):
    relay, auth = tmp_path / "relay", tmp_path / "auth"
    relay.write_text("ORPort 5000\nBandwidthRate 1000000 bytes\nBandwidthBurst 1000000 bytes\n"
                     "TokenBucketRefillInterval 10 msec\nExitPolicy accept 127.0.0.0/8:*\n")
    auth.write_text("ORPort 5001\nAuthoritativeDirectory 1\n")
    assert unlimit._unlimited_tor(relay) is True
    assert relay.read_text() == "ORPort 5000\nTokenBucketRefillInterval 10 msec\nExitPolicy accept 127.0.0.0/8:*\n"
    assert unlimit._unlimited_tor(auth) is False and "ORPort 5001" in auth.read_text()


# A stand-in relay: logs what chive_node's SIGHUP task logs, or its refusal.
FAKE = textwrap.dedent("""
    import signal, sys, time
    def hup(*_):
        print(sys.argv[1], flush=True)
    signal.signal(signal.SIGHUP, hup)
    print("started", flush=True)
    while True:
        time.sleep(0.05)
""")


def _network(tmp_path: Path, answer: str | None):
    """relay1 (answers SIGHUP with ``answer``, or ignores it when None) and a client."""
    relay, client = tmp_path / "relay1" / "relay1.toml", tmp_path / "client" / "client.toml"
    _relay_toml(relay, 1_000_000)
    cfg.write_toml(client, {"Nickname": "client"})
    ignoring = FAKE.replace("signal.signal(signal.SIGHUP, hup)", "signal.signal(signal.SIGHUP, signal.SIG_IGN)")
    state, procs = State(dir=str(tmp_path)), []
    for name, config, script in (("relay1", relay, FAKE if answer else ignoring), ("client", client, FAKE)):
        proc, rec = spawn(name, [sys.executable, "-c", script, answer or "-"], log_path=config.parent / "chive.log",
                          cwd=tmp_path, config=config)
        procs.append(proc)
        state.nodes.append(rec)
    save_state(tmp_path, state)
    # SIGHUP kills a process that has not installed its handler yet: wait for "started".
    deadline = time.monotonic() + 20
    while not all("started" in Path(r.log).read_text() for r in state.nodes):
        assert time.monotonic() < deadline, "stand-in relay did not start"
        time.sleep(0.05)
    return procs, relay


@pytest.mark.serial
def test_reload_of_a_running_relay_is_waited_for(tmp_path):
    procs, relay = _network(tmp_path, "INFO config reloaded rate=0 burst=0")
    try:
        assert unlimit.lift_rate_limits(tmp_path, "chive", timeout=20) == ["relay1"]
        assert tomllib.loads(relay.read_text())["BandwidthRate"] == 0
        assert procs[1].poll() is None  # the client was neither signalled nor killed
    finally:
        stop_procs(procs)


@pytest.mark.serial
@pytest.mark.parametrize("answer, match", [
    ("WARN config reload failed; keeping the old one", "refused its config"),
    (None, "no config reload logged within 1 s"),
])
def test_a_refused_or_missing_reload_is_an_error(tmp_path, answer, match):
    procs, _ = _network(tmp_path, answer)
    try:
        with pytest.raises(LabError, match=match):
            unlimit.lift_rate_limits(tmp_path, "chive", timeout=1)
    finally:
        stop_procs(procs)


def test_a_directory_without_relays_is_an_error(tmp_path):
    save_state(tmp_path, State(dir=str(tmp_path)))
    with pytest.raises(LabError, match="no relay config"):
        unlimit.lift_rate_limits(tmp_path, "chive")
    with pytest.raises(LabError, match="unknown impl"):
        unlimit.lift_rate_limits(tmp_path, "arti")
