"""End to end against the real chive binary: `chive-lab up --onion-service` starts one more
chive client running an onion service in front of the httpd, prints
"onion": "http://<addr>.onion", and curl --socks5-hostname fetches a file through it byte for
byte; `down` stops the service too.

Skipped (with the reason) when target/release/chive (or $CHIVE_BIN) or curl is missing.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from labcli import chive_cli_missing, curl_missing, e2e_marks, run_lab  # tests/ is on sys.path (conftest)

from chive_lab.content import check_file
from chive_lab.process import is_running
from chive_lab.state import load_state


def _skip_reason() -> str | None:
    return chive_cli_missing("run `cargo build --release` or `make build`", "client") or curl_missing()


pytestmark = e2e_marks(_skip_reason())

SIZE = 2 * 1024 * 1024


def test_up_with_an_onion_service(tmp_path: Path):
    dir = tmp_path / "net"
    up = run_lab("up", "--dir", str(dir), "--relays", "3", "--onion-service", timeout=180)
    try:
        assert up.returncode == 0, f"chive-lab up failed:\n{up.stderr}"
        info = json.loads(up.stdout)
        assert set(info["pids"]) == {"authority", "relay1", "relay2", "relay3", "client", "httpd",
                                     "service"}
        assert re.fullmatch(r"http://[a-z2-7]{56}\.onion", info["onion"]), info["onion"]
        hostname = (dir / "service" / "hs" / "hostname").read_text().strip()
        assert info["onion"] == f"http://{hostname}"
        out = tmp_path / "file.bin"
        curl = subprocess.run(
            ["curl", "--silent", "--show-error", "--fail", "--max-time", "60",
             "--socks5-hostname", info["socks"], "-o", str(out), f"{info['onion']}/bytes/{SIZE}"],
            capture_output=True, text=True, timeout=90,
        )
        assert curl.returncode == 0, f"curl failed ({curl.returncode}): {curl.stderr}"
        assert out.stat().st_size == SIZE
        assert check_file(out, SIZE) is None
    finally:
        down = run_lab("down", "--dir", str(dir), timeout=60)
    assert down.returncode == 0, f"chive-lab down failed:\n{down.stderr}"
    alive = [n.name for n in load_state(dir).nodes if is_running(n.pid)]
    assert alive == [], f"still running after down: {alive}"
