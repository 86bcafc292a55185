"""Starting node processes and stopping them safely.

A pid alone does not identify a process: after a reboot or a long time the
kernel reuses it. So each started process is recorded with its command line
(as ``/proc/PID/cmdline`` shows it) and its start time in clock ticks since
boot (``/proc/PID/stat`` field 22); a process is only signalled when both
still match. Linux only, as the lab is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from .errors import LabError

# How long `down` waits after SIGTERM before SIGKILL, and after SIGKILL before
# reporting a process that would not stop.
TERM_GRACE_S = 5.0
KILL_WAIT_S = 2.0
_POLL_S = 0.05

# /proc files are tiny; bound reads anyway in case of a strange /proc.
_PROC_READ_MAX = 1 << 20


@dataclass
class ProcessRecord:
    """What the lab remembers about one process it started (kept in state.json)."""

    name: str
    pid: int
    argv: list[str]
    """The command the lab ran."""
    cmdline: list[str]
    """The command line as /proc showed it right after start (differs from argv for scripts)."""
    start_ticks: int | None
    """Start time in clock ticks since boot (/proc/PID/stat field 22)."""
    started_at: float
    """Wall-clock start time, UNIX seconds (for people reading state.json)."""
    log: str
    config: str | None = None

    def to_json(self) -> dict:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, obj: object) -> "ProcessRecord":
        """Parse a dict written by :meth:`to_json`; raise LabError if malformed."""
        if not isinstance(obj, dict):
            raise LabError("process record is not an object")
        try:
            rec = cls(
                name=str(obj["name"]),
                pid=int(obj["pid"]),
                argv=[str(a) for a in obj["argv"]],
                cmdline=[str(a) for a in obj["cmdline"]],
                start_ticks=None if obj.get("start_ticks") is None else int(obj["start_ticks"]),
                started_at=float(obj["started_at"]),
                log=str(obj["log"]),
                config=None if obj.get("config") is None else str(obj["config"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LabError(f"malformed process record: {e!r}") from e
        if rec.pid <= 1:
            # Never signal init or a process group (pid 0 / negative).
            raise LabError(f"process record {rec.name!r} has an invalid pid {rec.pid}")
        return rec


def _read_proc(pid: int, what: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as f:
            return f.read(_PROC_READ_MAX)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:
        return None


def proc_cmdline(pid: int) -> list[str] | None:
    """The argument list of ``pid``, or None if it does not exist (empty for zombies)."""
    raw = _read_proc(pid, "cmdline")
    if raw is None:
        return None
    parts = raw.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return [p.decode("utf-8", "surrogateescape") for p in parts]


def _proc_stat_fields(pid: int) -> list[str] | None:
    raw = _read_proc(pid, "stat")
    if raw is None:
        return None
    text = raw.decode("ascii", "replace")
    # Field 2 (comm) is in parentheses and may itself contain spaces or ')':
    # everything after the last ')' is space-separated, starting at field 3.
    close = text.rfind(")")
    if close < 0:
        return None
    return text[close + 1 :].split()


def proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it is gone."""
    fields = _proc_stat_fields(pid)
    # starttime is field 22; the list starts at field 3, so index 19.
    if fields is None or len(fields) < 20:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def _reap(pid: int) -> None:
    # If the process is our own child (library use, tests), collect its exit
    # status so it does not linger as a zombie that still "exists".
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass


def is_running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    _reap(pid)
    fields = _proc_stat_fields(pid)
    if fields is None or not fields:
        return False
    return fields[0] not in ("Z", "X", "x")


def is_same_process(rec: ProcessRecord) -> bool:
    """True if ``rec.pid`` is still running the process the lab started."""
    if not is_running(rec.pid):
        return False
    if rec.start_ticks is not None and proc_start_ticks(rec.pid) != rec.start_ticks:
        return False
    current = proc_cmdline(rec.pid)
    return current is not None and current in (rec.cmdline, rec.argv)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    cwd: Path,
    config: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, ProcessRecord]:
    """Start ``argv`` with stdout and stderr appended to ``log_path``.

    The process gets its own session, so a Ctrl-C meant for the lab's terminal
    does not reach the nodes (``chive-lab down`` stops them).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            raise LabError(f"cannot start {name} ({argv[0]}): {e}", node=name) from e
    cmdline = _settled_cmdline(proc.pid)
    rec = ProcessRecord(
        name=name,
        pid=proc.pid,
        argv=list(argv),
        cmdline=list(argv) if cmdline is None else cmdline,
        start_ticks=proc_start_ticks(proc.pid),
        started_at=time.time(),
        log=str(log_path),
        config=None if config is None else str(config),
    )
    return proc, rec


def _settled_cmdline(pid: int, timeout_s: float = 2.0) -> list[str] | None:
    """The command line of a process that has just been started.

    Popen returns once exec has begun, but the kernel fills in the new
    program's arguments a moment later: until then /proc shows an empty
    command line. Wait (briefly, bounded) until it is there.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        cmdline = proc_cmdline(pid)
        if cmdline or cmdline is None or time.monotonic() >= deadline:
            return cmdline or None
        fields = _proc_stat_fields(pid)
        if not fields or fields[0] in ("Z", "X", "x"):
            return None  # exited at once; the caller records argv
        time.sleep(0.001)


@dataclass
class DownReport:
    """What stopping a set of processes did, by node name."""

    stopped: list[str] = field(default_factory=list)
    """Ended after SIGTERM."""
    killed: list[str] = field(default_factory=list)
    """Needed SIGKILL."""
    not_running: list[str] = field(default_factory=list)
    """Already gone."""
    not_ours: list[str] = field(default_factory=list)
    """Pid alive but running something else now (pid reused): left alone."""
    failed: dict[str, str] = field(default_factory=dict)
    """Would not stop (or could not be signalled), with the reason."""

    @property
    def ok(self) -> bool:
        """True when nothing the lab started is left running."""
        return not self.failed


def stop_processes(
    records: Iterable[ProcessRecord],
    *,
    grace_s: float = TERM_GRACE_S,
    kill_wait_s: float = KILL_WAIT_S,
) -> DownReport:
    """SIGTERM every recorded process that is still the same process, wait up
    to ``grace_s``, SIGKILL the stragglers, and report."""
    report = DownReport()
    pending: list[ProcessRecord] = []
    for rec in records:
        if not is_running(rec.pid):
            report.not_running.append(rec.name)
            continue
        if not is_same_process(rec):
            report.not_ours.append(rec.name)
            continue
        if _signal(rec, signal.SIGTERM, "signal", gone=report.not_running, report=report):
            pending.append(rec)

    left = _wait_gone(pending, grace_s)
    report.stopped.extend(r.name for r in pending if r not in left)

    stragglers: list[ProcessRecord] = []
    for rec in left:
        # Gone between the wait and the kill: it stopped on SIGTERM after all.
        if _signal(rec, signal.SIGKILL, "SIGKILL", gone=report.stopped, report=report):
            stragglers.append(rec)
    remaining = _wait_gone(stragglers, kill_wait_s)
    for rec in stragglers:
        if rec in remaining:
            report.failed[rec.name] = f"pid {rec.pid} still running after SIGKILL"
        else:
            report.killed.append(rec.name)
    return report


def _signal(rec: ProcessRecord, sig: int, verb: str, *, gone: list[str], report: DownReport) -> bool:
    """Send ``sig`` to ``rec``; if it cannot be sent, note why (the name in ``gone`` when
    the process no longer exists, else in ``report.failed``) and return False."""
    try:
        os.kill(rec.pid, sig)
    except ProcessLookupError:
        gone.append(rec.name)
        return False
    except PermissionError as e:
        report.failed[rec.name] = f"cannot {verb} pid {rec.pid}: {e}"
        return False
    return True


def _wait_gone(recs: list[ProcessRecord], timeout_s: float) -> list[ProcessRecord]:
    """Wait until every process in ``recs`` is gone; return those still there."""
    deadline = time.monotonic() + timeout_s
    left = [r for r in recs if _still_there(r)]
    while left and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        left = [r for r in left if _still_there(r)]
    return left


def _still_there(rec: ProcessRecord) -> bool:
    # Not is_same_process: a process that is exiting shows an empty cmdline
    # before it becomes a zombie, and it is not gone yet. Once we have
    # signalled it, only the pid and its start time identify it.
    if not is_running(rec.pid):
        return False
    return rec.start_ticks is None or proc_start_ticks(rec.pid) == rec.start_ticks
