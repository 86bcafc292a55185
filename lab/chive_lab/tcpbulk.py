"""A tiny bulk-TCP tool measuring application throughput per second.

One TCP connection per invocation pair; either end may send, receive or both
(the paper's bidirectional case needs data in both directions on ONE
connection, which iperf3's ``--bidir`` does not do: it opens two). Bytes are
binned by whole seconds since a shared epoch ``--t0`` (all hosts are on one
machine, so they share one clock).

    python -m chive_lab.tcpbulk listen  --bind 10.77.0.2:5001 --t0 T --stop-at S [--send] --out f.json
    python -m chive_lab.tcpbulk connect --to 10.77.0.2:5001 --t0 T --start-at T0 --stop-at S [--send] --out f.json

Output (one JSON object, written on exit)::

    {"role": "listen"|"connect", "cc": "cubic", "rx": {"<sec>": bytes, ...},
     "tx": {"<sec>": bytes, ...}, "rx_total": N, "tx_total": N,
     "tcp_info": {"rtt_us": .., "total_retrans": ..}, "error": null|"..."}
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

#: Linux TCP_CONGESTION / TCP_INFO option numbers (also in the socket module on Linux).
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
TCP_INFO = getattr(socket, "TCP_INFO", 11)
CHUNK = 64 * 1024
#: Receivers give up this long after --stop-at (a stalled peer must not hang a run).
GRACE = 15.0


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected IP:PORT, got {text!r}")
    return host, int(port)


def set_cc(sock: socket.socket, cc: str | None) -> str:
    """Set the congestion control on ``sock`` (root may pick any loaded one);
    return the algorithm in force."""
    if cc:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cc.encode())
    raw = sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
    return raw.split(b"\0", 1)[0].decode()


def tcp_info(sock: socket.socket) -> dict:
    """rtt (µs), cwnd (segments) and total retransmits from TCP_INFO."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, 104)
    except OSError:
        return {}
    if len(raw) < 104:
        return {}
    u32 = struct.unpack_from("=24I", raw, 8)
    return {"rtt_us": u32[15], "snd_cwnd": u32[18], "total_retrans": u32[23]}


class Bins:
    """Byte counters per whole second since t0 (thread-safe enough: one writer each)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.bins: dict[int, int] = defaultdict(int)
        self.total = 0

    def add(self, n: int) -> None:
        """Count ``n`` bytes now."""
        self.bins[int(time.time() - self.t0)] += n
        self.total += n

    def to_json(self) -> dict[str, int]:
        """``{"<sec>": bytes}`` sorted by second."""
        return {str(k): v for k, v in sorted(self.bins.items())}


def run_connection(sock: socket.socket, *, send: bool, t0: float, stop_at: float) -> dict:
    """Send (if asked) until ``stop_at`` and receive until EOF; return the record."""
    rx, tx = Bins(t0), Bins(t0)
    errors: list[str] = []
    info: dict = {}

    def sender() -> None:
        payload = b"\xa5" * CHUNK
        try:
            while time.time() < stop_at:
                try:
                    n = sock.send(payload)
                except socket.timeout:  # the shared 1 s timeout; a stalled window is normal here
                    continue
                tx.add(n)
            info.update(tcp_info(sock))
            sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            errors.append(f"send: {e}")

    th = None
    if send:
        th = threading.Thread(target=sender, daemon=True)
        th.start()
    else:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    sock.settimeout(1.0)
    hard_end = stop_at + GRACE
    buf = bytearray(256 * 1024)
    while time.time() < hard_end:
        try:
            n = sock.recv_into(buf)
        except socket.timeout:
            continue
        except OSError as e:
            errors.append(f"recv: {e}")
            break
        if n == 0:
            break
        rx.add(n)
    if th is not None:
        th.join(timeout=max(0.0, hard_end - time.time()) + 1)
    if not info:
        info = tcp_info(sock)
    return {"rx": rx.to_json(), "tx": tx.to_json(), "rx_total": rx.total, "tx_total": tx.total,
            "tcp_info": info, "error": "; ".join(errors) or None}


def udp_echo(bind: tuple[str, int], seconds: float) -> None:
    """Echo UDP datagrams back for ``seconds`` (the far end of :func:`udp_ping`)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(bind)
    print("ready", flush=True)
    end = time.time() + seconds
    s.settimeout(0.5)
    while time.time() < end:
        try:
            data, peer = s.recvfrom(2048)
        except socket.timeout:
            continue
        s.sendto(data, peer)


def udp_ping(to: tuple[str, int], count: int, interval: float) -> list[float]:
    """RTTs in ms of ``count`` UDP probes to a :func:`udp_echo` (lost ones omitted);
    a ping that needs neither ICMP sockets nor iputils."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    rtts = []
    for i in range(count):
        t = time.perf_counter()
        s.sendto(struct.pack("=I", i), to)
        try:
            while True:
                data, _ = s.recvfrom(64)
                if data == struct.pack("=I", i):
                    rtts.append((time.perf_counter() - t) * 1000)
                    break
        except socket.timeout:
            pass
        time.sleep(interval)
    return rtts


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``listen`` or ``connect``; writes --out and exits 0 on success.
    ``udpecho``/``udpping`` measure RTTs (``udpping`` prints a JSON list of ms)."""
    p = argparse.ArgumentParser(prog="python -m chive_lab.tcpbulk", description=__doc__.split("\n")[0])
    p.add_argument("role", choices=["listen", "connect", "udpecho", "udpping"])
    p.add_argument("--count", type=int, default=50, help="udpping: probes")
    p.add_argument("--bind", type=_addr, help="listen: IP:PORT")
    p.add_argument("--to", type=_addr, help="connect: IP:PORT")
    p.add_argument("--t0", type=float, default=None, help="epoch of second 0 of the bins")
    p.add_argument("--start-at", type=float, default=0.0, help="connect: epoch to connect at")
    p.add_argument("--stop-at", type=float, default=None, help="epoch to stop sending at")
    p.add_argument("--send", action="store_true", help="send bulk data on the connection")
    p.add_argument("--cc", default=None, help="TCP congestion control per socket (e.g. cubic)")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    if a.role == "udpecho":
        if a.bind is None:
            p.error("udpecho needs --bind")
        udp_echo(a.bind, 60.0 if a.stop_at is None else a.stop_at - time.time())
        return 0
    if a.role == "udpping":
        if a.to is None:
            p.error("udpping needs --to")
        print(json.dumps(udp_ping(a.to, max(1, min(a.count, 100_000)), 0.01)))
        return 0
    if a.t0 is None or a.stop_at is None or a.out is None:
        p.error("listen/connect need --t0, --stop-at and --out")
    record: dict = {"role": a.role, "cc": None, "error": None}
    try:
        if a.role == "listen":
            if a.bind is None:
                p.error("listen needs --bind")
            ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            set_cc(ls, a.cc)
            ls.bind(a.bind)
            ls.listen(1)
            print("ready", flush=True)
            ls.settimeout(max(1.0, a.stop_at - time.time()))
            sock, _ = ls.accept()
            ls.close()
        else:
            if a.to is None:
                p.error("connect needs --to")
            delay = a.start_at - time.time()
            if delay > 0:
                time.sleep(delay)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            set_cc(sock, a.cc)
            sock.settimeout(10)
            sock.connect(a.to)
        sock.settimeout(None)
        record["cc"] = set_cc(sock, a.cc)
        record["connected_at"] = time.time() - a.t0
        record.update(run_connection(sock, send=a.send, t0=a.t0, stop_at=a.stop_at))
        sock.close()
    except OSError as e:
        record["error"] = str(e)
    a.out.write_text(json.dumps(record))
    return 0 if record["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
