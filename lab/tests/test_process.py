"""Starting processes and `down`'s checks that a pid is still ours."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import pytest

from chive_lab.errors import LabError
from chive_lab.network import Network
from chive_lab.process import (
    is_running,
    is_same_process,
    proc_cmdline,
    proc_start_ticks,
    spawn,
    stop_processes,
)
from chive_lab.state import State, save_state


def _spawn_sleep(tmp_path: Path, name: str = "sleeper"):
    proc, rec = spawn(name, ["sleep", "60"], log_path=tmp_path / name / "chive.log", cwd=tmp_path)
    return proc, rec


def test_spawn_records_cmdline_and_start_time(tmp_path: Path, reaper):
    proc, rec = _spawn_sleep(tmp_path)
    reaper.append(rec)
    assert rec.pid == proc.pid
    assert rec.cmdline == ["sleep", "60"] == proc_cmdline(proc.pid)
    assert rec.start_ticks is not None and rec.start_ticks == proc_start_ticks(proc.pid)
    assert abs(rec.started_at - time.time()) < 30
    assert Path(rec.log).exists()
    assert is_same_process(rec)


def test_down_kills_recorded_process(tmp_path: Path, reaper):
    _, rec = _spawn_sleep(tmp_path)
    reaper.append(rec)
    save_state(tmp_path, State(dir=str(tmp_path), nodes=[rec]))
    report = Network.down(tmp_path)
    assert report.ok
    assert report.stopped == ["sleeper"]
    assert not is_running(rec.pid)
    # Idempotent: a second down finds nothing to do.
    again = Network.down(tmp_path)
    assert again.ok and again.not_running == ["sleeper"] and not again.stopped


def test_down_leaves_pid_with_other_cmdline_alone(tmp_path: Path, reaper):
    _, rec = _spawn_sleep(tmp_path)
    reaper.append(rec)
    # The pid now (as far as the record knows) belongs to another program.
    other = dataclasses.replace(rec, argv=["chive", "relay"], cmdline=["chive", "relay"])
    save_state(tmp_path, State(dir=str(tmp_path), nodes=[other]))
    report = Network.down(tmp_path)
    assert report.not_ours == ["sleeper"]
    assert report.ok
    assert is_running(rec.pid), "a process whose cmdline differs must not be signalled"


def test_down_leaves_pid_with_other_start_time_alone(tmp_path: Path, reaper):
    _, rec = _spawn_sleep(tmp_path)
    reaper.append(rec)
    other = dataclasses.replace(rec, start_ticks=(rec.start_ticks or 0) + 12345)
    save_state(tmp_path, State(dir=str(tmp_path), nodes=[other]))
    report = Network.down(tmp_path)
    assert report.not_ours == ["sleeper"]
    assert is_running(rec.pid)


def test_stubborn_process_gets_sigkill(tmp_path: Path, reaper):
    ready = tmp_path / "ready"
    code = (
        "import signal, time, pathlib, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "pathlib.Path(sys.argv[1]).write_text('x')\n"
        "time.sleep(60)\n"
    )
    _, rec = spawn("stubborn", [sys.executable, "-c", code, str(ready)],
                   log_path=tmp_path / "stubborn.log", cwd=tmp_path)
    reaper.append(rec)
    deadline = time.monotonic() + 20
    while not ready.exists():  # the handler is installed before the file appears
        assert time.monotonic() < deadline, "helper process did not start"
        time.sleep(0.02)
    t0 = time.monotonic()
    report = stop_processes([rec], grace_s=0.5)
    assert report.killed == ["stubborn"]
    assert report.ok
    assert not is_running(rec.pid)
    assert time.monotonic() - t0 < 10


def test_mixed_records(tmp_path: Path, reaper):
    _, a = _spawn_sleep(tmp_path, "a")
    _, b = _spawn_sleep(tmp_path, "b")
    reaper.extend([a, b])
    stop_processes([b], grace_s=2)  # b already gone when down runs
    report = stop_processes([a, b])
    assert report.stopped == ["a"]
    assert report.not_running == ["b"]


def test_down_without_state(tmp_path: Path):
    with pytest.raises(LabError):
        Network.down(tmp_path / "nothing-here")


def test_spawn_missing_program(tmp_path: Path):
    with pytest.raises(LabError, match="cannot start"):
        spawn("x", [str(tmp_path / "no-such-binary")], log_path=tmp_path / "x.log", cwd=tmp_path)
