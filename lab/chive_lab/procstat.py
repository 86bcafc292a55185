"""Reading a process's CPU time, memory and TCP connections from ``/proc``.

Pure parsers of the ``/proc`` texts (``PID/stat``, ``PID/status``, ``net/tcp``) and small readers
around them that take the ``/proc`` root as an argument, so tests run them on a fake tree.
Used by ``lab/scripts/relay_cpu.py`` (CPU per relayed byte, which relay is the exit) and by
:mod:`chive_lab.sniper` (RSS samples).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["connected_to", "cpu_delta", "parse_net_tcp", "parse_stat", "parse_status_kib",
           "read_proc", "socket_inodes"]


def parse_stat(text: str) -> tuple[int, int]:
    """(utime, stime) in clock ticks from the text of /proc/PID/stat.

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so
    the fields are counted from the last ')'.
    """
    end = text.rfind(")")
    if end < 0:
        raise ValueError("no ')' in /proc/PID/stat")
    rest = text[end + 1:].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    if len(rest) < 13:
        raise ValueError(f"/proc/PID/stat has {len(rest) + 2} fields, expected at least 15")
    return int(rest[11]), int(rest[12])


def parse_status_kib(text: str, key: str) -> int | None:
    """A `Key:   N kB` line of /proc/PID/status, in KiB (None if absent, e.g. a zombie)."""
    for line in text.splitlines():
        if line.startswith(key + ":"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


def read_proc(pid: int, proc: Path = Path("/proc")) -> dict:
    """CPU ticks and memory of one process: utime, stime, rss_kib, hwm_kib."""
    utime, stime = parse_stat((proc / str(pid) / "stat").read_text())
    status = (proc / str(pid) / "status").read_text()
    return {"utime": utime, "stime": stime, "rss_kib": parse_status_kib(status, "VmRSS"),
            "hwm_kib": parse_status_kib(status, "VmHWM")}


def cpu_delta(before: dict, after: dict, hz: int) -> dict:
    """CPU seconds (user, system, total) between two read_proc samples."""
    user = (after["utime"] - before["utime"]) / hz
    system = (after["stime"] - before["stime"]) / hz
    if user < 0 or system < 0:
        raise ValueError("CPU time went backwards: not the same process")
    return {"user_s": user, "sys_s": system, "cpu_s": user + system}


def socket_inodes(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """Inodes of the sockets `pid` holds open (from the /proc/PID/fd links)."""
    out = set()
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            out.add(int(target[8:-1]))
    return out


def parse_net_tcp(text: str) -> list[dict]:
    """Rows of /proc/net/tcp or tcp6: local and remote port, state (hex code), inode."""
    rows = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        rows.append({"local_port": int(f[1].rsplit(":", 1)[1], 16),
                     "remote_port": int(f[2].rsplit(":", 1)[1], 16),
                     "state": f[3], "inode": int(f[9])})
    return rows


def tcp_rows(proc: Path = Path("/proc")) -> list[dict]:
    """Every row of /proc/net/tcp and tcp6 (`parse_net_tcp`); a table that cannot be read is
    left out."""
    rows = []
    for name in ("tcp", "tcp6"):
        try:
            rows += parse_net_tcp((proc / "net" / name).read_text())
        except OSError:
            pass
    return rows


def connected_to(pids: dict[str, int], port: int, proc: Path = Path("/proc")) -> list[str]:
    """Names of the processes holding an established TCP connection to `port`."""
    rows = tcp_rows(proc)
    inodes = {r["inode"] for r in rows if r["remote_port"] == port and r["state"] == "01"}
    return [name for name, pid in pids.items() if socket_inodes(pid, proc) & inodes]


def established_ports(pids: dict[str, int], proc: Path = Path("/proc")) -> dict[str, set[tuple[int, int]]]:
    """(local port, remote port) of every established TCP connection each process holds."""
    rows = tcp_rows(proc)
    by_inode = {r["inode"]: (r["local_port"], r["remote_port"]) for r in rows if r["state"] == "01"}
    return {name: {by_inode[i] for i in socket_inodes(pid, proc) if i in by_inode}
            for name, pid in pids.items()}


def read_io_wchar(pid: int, proc: Path = Path("/proc")) -> int:
    """Bytes the process has passed to write-like system calls (`wchar` of /proc/PID/io)."""
    for line in (proc / str(pid) / "io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise ValueError(f"no wchar in /proc/{pid}/io")
