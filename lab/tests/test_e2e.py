"""End to end against the real chive binary: `chive-lab up --relays 3`, a 10 MiB
download with curl --socks5-hostname, two SOCKS usernames fetching through the
lab's own SOCKS client, `chive-lab down`, and no process left behind.

Runs only when target/release/chive (or $CHIVE_BIN) exists and
`chive relay --help` works; otherwise it is skipped with the reason.
(That two usernames get two *different* circuits is checked by a Rust test;
here both must simply work.)
"""

from __future__ import annotations

import json
from pathlib import Path

from labcli import chive_cli_missing, curl_file, curl_missing, e2e_marks, run_lab  # tests/ is on sys.path (conftest)

from chive_lab import socks
from chive_lab.content import check_body
from chive_lab.process import is_running
from chive_lab.state import load_state

TEN_MIB = 10 * 1024 * 1024


def _skip_reason() -> str | None:
    return chive_cli_missing("run `cargo build --release` or `make build`", "relay") or curl_missing()


pytestmark = e2e_marks(_skip_reason())


_lab = run_lab


def test_three_relay_network_end_to_end(tmp_path: Path):
    dir = tmp_path / "net"
    up = _lab("up", "--dir", str(dir), "--relays", "3", timeout=180)
    try:
        assert up.returncode == 0, f"chive-lab up failed:\n{up.stderr}"
        info = json.loads(up.stdout)
        assert set(info["pids"]) == {"authority", "relay1", "relay2", "relay3", "client", "httpd"}

        # 10 MiB with curl, the hostname resolved by the exit (--socks5-hostname).
        out = tmp_path / "10MiB.bin"
        curl_file(info, TEN_MIB, out, max_time=300, timeout=320)

        # Two SOCKS usernames (stream isolation in the client): both work.
        for user in ("alice", "bob"):
            resp = socks.fetch(f"{info['http']}/bytes/262144", proxy=info["socks"],
                               username=user, password="pw", timeout=120)
            assert resp.status == 200, f"{user}: HTTP {resp.status}"
            assert check_body(resp.body, 262144) is None, user
    finally:
        down = _lab("down", "--dir", str(dir), timeout=60)
    assert down.returncode == 0, f"chive-lab down failed:\n{down.stderr}"
    alive = [n.name for n in load_state(dir).nodes if is_running(n.pid)]
    assert alive == [], f"still running after down: {alive}"


def test_client_overrides_pin_every_circuit(tmp_path: Path):
    """A scenario's [network.client] keys reach the real client: with EntryNodes and
    MiddleNodes every circuit it builds (preemptive ones too) is relay1, relay2, relay3."""
    import re

    from chive_lab.network import Network, NetworkSpec

    dir = tmp_path / "net"
    spec = NetworkSpec(relays=3, client_overrides={"EntryNodes": ["relay1"], "MiddleNodes": ["relay2"]},
                       timeout=120)
    info = Network.up(spec, dir, progress=lambda _m: None)
    try:
        for user in ("alice", "bob"):
            resp = socks.fetch(f"{info.http}/bytes/65536", proxy=info.socks, username=user,
                               password="pw", timeout=120)
            assert resp.status == 200 and check_body(resp.body, 65536) is None, user
    finally:
        Network.down(dir)
    log = (dir / "client" / "chive.log").read_text()
    paths = re.findall(r"launching circuit .*path=(\S+)", log)
    assert paths, "the client launched no circuit"
    assert set(paths) == {"relay1,relay2,relay3"}, paths
