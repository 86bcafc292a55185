"""Run the `chive-lab` CLI as a subprocess, as a user would (shared by the tests)."""

import subprocess
import sys
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parents[1]


def run_lab(*args: str, env: dict | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
    """`python -m chive_lab ARGS...` from the lab directory, output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "chive_lab", *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=LAB_DIR,
    )
