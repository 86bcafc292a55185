"""The IO floor of a 3-hop download (issue 20): the same download through plain TCP forwarders.

`relay_cpu.py --impl io` puts a chain of `tcpfwd` processes (crates/tools/examples/tcpfwd.rs:
read at most the node's read batch, write it on, tokio current-thread, the link sockets'
options) where chive has its client and three relays, in front of the same `chive httpd`:

    curl -> client -> relay1 -> relay2 -> relay3 -> httpd

Same number of processes on the same cores, same loopback hops, no crypto and no cells, so a
forwarder's CPU per byte is what the kernel, the wake-ups and the scheduling cost on this
machine; a relay's CPU per byte minus this and minus the crypto floor is chive's own work.
curl talks HTTP to the first forwarder directly (no SOCKS: a forwarder only copies bytes).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

# The chain from the httpd back to the entry: each forwards to the one before it in this list.
CHAIN = ("relay3", "relay2", "relay1", "client")


def parse_listening(line: str) -> str:
    """The address of a `{"listening": "ADDR"}` line (what `chive httpd` and `tcpfwd` print)."""
    try:
        addr = json.loads(line)["listening"]
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"expected a {{\"listening\": ADDR}} line, got {line!r}") from e
    if not isinstance(addr, str) or ":" not in addr:
        raise RuntimeError(f"not an address: {addr!r}")
    return addr


def forwarder_cmd(fwd_bin: Path, to: str, read_size: int | None = None,
                  write_size: int | None = None) -> list[str]:
    cmd = [str(fwd_bin), "--to", to, "--listen", "127.0.0.1:0"]
    if read_size is not None:
        cmd += ["--read-size", str(read_size)]
    if write_size is not None:
        cmd += ["--write-size", str(write_size)]
    return cmd


class IoChain:
    """The httpd and the forwarders, started in order; `info` has the shape `chive-lab up`
    prints (`pids`, `http`) plus `entry`, the first forwarder's address, for the URL."""

    def __init__(self, chive_bin: Path, fwd_bin: Path, logdir: Path,
                 read_size: int | None = None, write_size: int | None = None):
        self.procs: list[subprocess.Popen] = []
        logdir.mkdir(parents=True, exist_ok=True)
        pids: dict[str, int] = {}
        try:
            http = self._start("httpd", [str(chive_bin), "httpd", "--listen", "127.0.0.1:0"], logdir)
            pids["httpd"] = self.procs[-1].pid
            to = http
            for name in CHAIN:
                to = self._start(name, forwarder_cmd(fwd_bin, to, read_size, write_size), logdir)
                pids[name] = self.procs[-1].pid
        except BaseException:
            self.close()
            raise
        self.info = {"pids": pids, "http": f"http://{http}", "entry": f"http://{to}", "socks": None}

    def _start(self, name: str, cmd: list[str], logdir: Path) -> str:
        with open(logdir / f"{name}.log", "wb") as err:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        self.procs.append(p)
        line = p.stdout.readline()  # the process prints its address once bound, or exits
        if not line:
            raise RuntimeError(f"{name} ({' '.join(cmd)}) exited before listening: see {logdir}/{name}.log")
        return parse_listening(line)

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()
        self.procs = []

    def __enter__(self) -> "IoChain":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
