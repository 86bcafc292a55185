"""Run the `chive-lab` CLI as a subprocess, as a user would (shared by the tests)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chive_lab.content import check_file

LAB_DIR = Path(__file__).resolve().parents[1]


def run_lab(*args: str, env: dict | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    """`python -m chive_lab ARGS...` from the lab directory, output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "chive_lab", *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=LAB_DIR,
    )


def chive_cli_missing(hint: str, subcommand: str | None = None) -> str | None:
    """Why the chive binary cannot serve a test: it does not exist (`hint` says how to build
    it) or, with `subcommand`, `chive SUBCOMMAND --help` fails; None when it can."""
    from chive_lab.network import default_binary

    binary = default_binary()
    if not binary.is_file():
        return f"{binary} does not exist ({hint})"
    if subcommand is None:
        return None
    try:
        out = subprocess.run([str(binary), subcommand, "--help"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`{binary} {subcommand} --help` failed: {e}"
    if out.returncode != 0:
        return f"`{binary} {subcommand} --help` exited with {out.returncode}"
    return None


def curl_missing() -> str | None:
    """Why curl cannot be used; None when it is installed."""
    return None if shutil.which("curl") else "curl is not installed (make deps installs it)"


def e2e_marks(reason: str | None) -> list:
    """An end-to-end module's `pytestmark`: marked e2e, skipped with `reason` when it is set."""
    return [pytest.mark.e2e, pytest.mark.skipif(reason is not None, reason=reason or "")]


def curl_file(info: dict, size: int, out: Path, max_time: int, timeout: int) -> None:
    """Download `size` bytes from the network's httpd through its SOCKS port with curl
    (--socks5-hostname: the exit resolves the name) into `out`, and check the content."""
    curl = subprocess.run(
        ["curl", "--silent", "--show-error", "--fail", "--max-time", str(max_time),
         "--socks5-hostname", info["socks"], "-o", str(out), f"{info['http']}/bytes/{size}"],
        capture_output=True, text=True, timeout=timeout,
    )
    assert curl.returncode == 0, f"curl failed ({curl.returncode}): {curl.stderr}"
    assert out.stat().st_size == size
    assert check_file(out, size) is None
