"""Our network namespaces: listing them, deleting one with every process inside it, and
removing what a crashed run left (``chive-lab netns-clean``).

Every namespace the lab creates is named ``chv-<owner pid>-<n>-<host>`` and listed in a
record file (``RECORD_DIR/<run id>.json``) written before it is created, so clean-up
only ever touches namespaces that are ours and whose owner is dead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..errors import LabError

__all__ = ["PREFIX", "RECORD_DIR", "CleanReport", "available", "clean_leftovers", "cmd_netns_clean",
           "delete_namespace", "list_namespaces", "our_namespaces", "run_cmd"]

#: Every namespace we create starts with this prefix.
PREFIX = "chv-"
#: Where run records live (tmpfs: a reboot clears namespaces and records together).
RECORD_DIR = Path(os.environ.get("CHIVE_NETNS_RECORDS", "/run/chive-lab/netns"))
_NS_RE = re.compile(r"^chv-(\d+)-(\d+)-[A-Za-z0-9]+$")


def available() -> str | None:
    """None if this process can build testbeds, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the netns backend needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    try:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns` is unavailable: {e}"
    if r.returncode != 0:
        return f"`ip netns` is unavailable: {r.stderr.strip()}"
    return None


def run_cmd(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a system command (``ip``, ``tc`` …) and wait; LabError with its stderr if it fails
    and ``check``."""
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed: {r.stderr.strip() or r.stdout.strip()}")
    return r


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_namespaces() -> list[str]:
    """Names from ``ip netns list`` (all of them; callers filter by prefix)."""
    r = run_cmd(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def our_namespaces() -> list[str]:
    """Existing namespaces that carry our prefix."""
    return [n for n in list_namespaces() if n.startswith(PREFIX)]


def _ns_pids(ns: str) -> list[int]:
    r = run_cmd(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def _kill_ns_processes(ns: str, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL, every process inside namespace ``ns``: they are
    ours, since nothing else runs in a namespace we created."""
    me = os.getpid()
    pids = [p for p in _ns_pids(ns) if p != me]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _pid_alive(p) and p in _ns_pids(ns)]
        if pids:
            time.sleep(0.05)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def delete_namespace(ns: str) -> None:
    """Stop every process inside our namespace ``ns`` and delete it (nothing if it is gone)."""
    if not ns.startswith(PREFIX):  # defence in depth: never touch a foreign namespace
        raise LabError(f"refusing to delete namespace {ns!r} without our prefix")
    if ns not in list_namespaces():
        return
    _kill_ns_processes(ns)
    run_cmd(["ip", "netns", "delete", ns], check=False)


@dataclass
class CleanReport:
    """What :func:`clean_leftovers` did."""

    removed: list[str] = field(default_factory=list)
    kept_live: list[str] = field(default_factory=list)
    records_removed: list[str] = field(default_factory=list)


def clean_leftovers(*, record_dir: Path | None = None, force: bool = False) -> CleanReport:
    """Remove namespaces (and their processes) left by crashed runs.

    A namespace is removed when a record file names it, or it carries our
    prefix, and the owning process (pid in the record / in the name) is dead —
    or always with ``force``. Namespaces of live runs are left alone.
    """
    rd = record_dir or RECORD_DIR
    report = CleanReport()
    existing = set(list_namespaces())
    handled: set[str] = set()
    if rd.is_dir():
        for rec in sorted(rd.glob(f"{PREFIX}*.json")):
            try:
                data = json.loads(rec.read_text())
                owner = int(data["owner_pid"])
                names = [str(n) for n in data["namespaces"]]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            names = [n for n in names if n.startswith(PREFIX)]
            handled.update(names)
            if _pid_alive(owner) and not force:
                report.kept_live.extend(n for n in names if n in existing)
                continue
            for n in names:
                if n in existing:
                    delete_namespace(n)
                    report.removed.append(n)
            rec.unlink(missing_ok=True)
            report.records_removed.append(rec.name)
    for n in sorted(existing - handled):
        m = _NS_RE.match(n)
        if not m:
            continue
        owner = int(m.group(1))
        if _pid_alive(owner) and not force:
            report.kept_live.append(n)
            continue
        delete_namespace(n)
        report.removed.append(n)
    return report


def cmd_netns_clean(args) -> int:
    """``chive-lab netns-clean [--force]``: report on stderr, exit 0 unless not root."""
    import sys

    why = available()
    if why:
        print(f"chive-lab: error: {why}", file=sys.stderr)
        return 1
    rep = clean_leftovers(force=bool(getattr(args, "force", False)))
    print(f"chive-lab: removed {len(rep.removed)} namespace(s)"
          + (f": {', '.join(rep.removed)}" if rep.removed else ""), file=sys.stderr)
    if rep.kept_live:
        print(f"chive-lab: left {len(rep.kept_live)} namespace(s) of live runs alone: "
              f"{', '.join(rep.kept_live)} (use --force)", file=sys.stderr)
    return 0
