"""lab/scripts/rate_late_wakeups.py: config parsing and the busy loops' lifecycle (no network)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "rate_late_wakeups.py"
spec = importlib.util.spec_from_file_location("rate_late_wakeups", SCRIPT)
rl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rl)


def test_configs_parse_label_and_options():
    assert rl.parse_config("fixed:OutbufMaxMsec=0") == ("fixed", ["OutbufMaxMsec=0"])
    assert rl.parse_config("stretched:") == ("stretched", [])
    assert rl.parse_config("both:A=1,B=2") == ("both", ["A=1", "B=2"])
    with pytest.raises(argparse.ArgumentTypeError):
        rl.parse_config(":A=1")
    with pytest.raises(argparse.ArgumentTypeError):
        rl.parse_config("x:A")


def test_busy_loops_are_started_and_killed_by_pid():
    procs = rl.start_busy(2)
    pids = [p.pid for p in procs]
    assert len(set(pids)) == 2 and all(p.poll() is None for p in procs)
    rl.stop_busy(procs)
    # Killed (SIGKILL) and reaped, each by its own pid.
    assert [p.returncode for p in procs] == [-9, -9]
