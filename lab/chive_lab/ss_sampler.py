"""``ss`` samplers that run inside a testbed host (started by
:func:`chive_lab.experiments.netns_overlay.start_sampler` as
``python -m chive_lab.ss_sampler ss-sample|link-sample ...``, like
:mod:`chive_lab.tcpbulk`): bytes received per connection of a web server, and
the unsent bytes, RTT and counters of the relay-to-relay sockets. Internal to
the netns kinds; not a user command."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["WIRE_HEADER_BYTES", "link_sample", "parse_link_sockets", "ss_sample"]


_SS_PAIR = re.compile(r"(\d+\.\d+\.\d+\.\d+):(\d+)\s+(\d+\.\d+\.\d+\.\d+):(\d+)")


def ss_sample(port: int, stop_at: float, out: Path, interval: float = 0.25) -> None:
    """Inside a host: every ``interval`` s, ``bytes_received`` of each established
    TCP socket with local port ``port`` (the httpd's), one JSON line per sample:
    ``{"t": UNIX s, "rx": {"peer_ip:port": bytes}}``."""
    with out.open("w") as fh:
        while time.time() < stop_at:
            t = time.time()
            r = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                               capture_output=True, text=True, timeout=5, check=False)
            rx: dict[str, int] = {}
            key = None
            for line in r.stdout.splitlines():
                m = _SS_PAIR.search(line)
                if m:
                    key = f"{m.group(3)}:{m.group(4)}"
                    continue
                b = re.search(r"bytes_received:(\d+)", line)
                if key is not None and b:
                    rx[key] = int(b.group(1))
                    key = None
            fh.write(json.dumps({"t": t, "rx": rx}) + "\n")
            fh.flush()
            time.sleep(max(0.0, interval - (time.time() - t)))


_SS_INFO = {"notsent": re.compile(r"\bnotsent:(\d+)"), "rtt_ms": re.compile(r"\brtt:([\d.]+)/"),
            "cwnd": re.compile(r"\bcwnd:(\d+)"), "unacked": re.compile(r"\bunacked:(\d+)"),
            # Retransmissions included: what the socket put on the link.
            "bytes_sent": re.compile(r"\bbytes_sent:(\d+)"),
            "data_segs_out": re.compile(r"\bdata_segs_out:(\d+)")}
#: Bytes a data segment adds on the wire as HTB counts it: Ethernet 14, IPv4 20, TCP with
#: timestamps 32.
WIRE_HEADER_BYTES = 66


def parse_link_sockets(ss_text: str, ports: set[int]) -> dict[str, dict[str, float]]:
    """``ss -tinH`` output -> ``{"local_ip:port>peer_ip:port": {notsent, rtt_ms, cwnd,
    unacked}}`` for sockets between two hosts with a relay port at either end (connections
    inside one host, such as a client and its guard, are left out). ``notsent`` is what the
    application wrote and the kernel has not sent yet: the queue no scheduler can reorder."""
    out: dict[str, dict[str, float]] = {}
    key = None
    for line in ss_text.splitlines():
        m = _SS_PAIR.search(line)
        if m:
            lip, lport, rip, rport = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
            key = (f"{lip}:{lport}>{rip}:{rport}"
                   if lip != rip and (lport in ports or rport in ports) else None)
        if key is None:
            continue
        info: dict[str, float] = {}
        for name, pattern in _SS_INFO.items():
            found = pattern.search(line)
            if found:
                info[name] = float(found.group(1))
        if "rtt_ms" in info or "cwnd" in info:  # the info line (ss prints it after the pair)
            info.setdefault("notsent", 0.0)
            info.setdefault("unacked", 0.0)
            out[key] = info
            key = None
    return out


def link_sample(ports: list[int], stop_at: float, out: Path, interval: float = 1.0) -> None:
    """Inside a host: every ``interval`` s, :func:`parse_link_sockets` of the relay-to-relay
    sockets, one JSON line per sample: ``{"t": UNIX s, "socks": {key: {...}}}``."""
    filt = "( " + " or ".join(f"sport = :{p} or dport = :{p}" for p in ports) + " )"
    with out.open("w") as fh:
        while time.time() < stop_at:
            t = time.time()
            r = subprocess.run(["ss", "-tinH", "state", "established", filt],
                               capture_output=True, text=True, timeout=5, check=False)
            fh.write(json.dumps({"t": t, "socks": parse_link_sockets(r.stdout, set(ports))}) + "\n")
            fh.flush()
            time.sleep(max(0.0, interval - (time.time() - t)))




def main(argv: list[str] | None = None) -> int:
    """Entry point inside a host: ``ss-sample --port P`` or ``link-sample --ports P,Q``,
    both with ``--stop-at UNIX_S --out FILE``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ss-sample"]:
        sp = argparse.ArgumentParser(prog="chive_lab.ss_sampler ss-sample")
        sp.add_argument("--port", type=int, required=True)
        sp.add_argument("--stop-at", type=float, required=True)
        sp.add_argument("--out", type=Path, required=True)
        b = sp.parse_args(argv[1:])
        ss_sample(b.port, min(b.stop_at, time.time() + 4 * 3600), b.out)
        return 0
    if argv[:1] == ["link-sample"]:
        sp = argparse.ArgumentParser(prog="chive_lab.ss_sampler link-sample")
        sp.add_argument("--ports", required=True, help="comma-separated relay ports")
        sp.add_argument("--stop-at", type=float, required=True)
        sp.add_argument("--out", type=Path, required=True)
        b = sp.parse_args(argv[1:])
        ports = [int(x) for x in b.ports.split(",") if x]
        link_sample(ports, min(b.stop_at, time.time() + 4 * 3600), b.out)
        return 0
    print("usage: python -m chive_lab.ss_sampler ss-sample|link-sample ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
