"""One tor process of a lab network: its role, ports, identity and files.

A :class:`TorNode` is what the torrc (:mod:`.torrc`), the keys (:mod:`.keys`) and the
control-port readers (:mod:`.control`, :mod:`.metrics`) are built from; its
``DataDirectory`` holds the files named here. Not here: starting it (:mod:`.launch`, or
:mod:`chive_lab.tor_netns` on a netns testbed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RunFailed

__all__ = ["BANDWIDTH_FILE", "METRICS_FILE", "ONION_SERVICE_DIR", "STDOUT_LOG", "TORRC", "TOR_INFO_LOG", "TOR_LOG", "TorNode",
           "log_tails", "start_failed"]

# Files in a node's directory (and, for the bandwidth file, the network's).
TORRC = "torrc"
BANDWIDTH_FILE = "bandwidth-file"
TOR_LOG = "tor.log"
TOR_INFO_LOG = "tor-info.log"
STDOUT_LOG = "stdout.log"
METRICS_FILE = "tor-metrics.json"
#: A client's onion service directory (keys, ``hostname``), inside its DataDirectory.
ONION_SERVICE_DIR = "onion-service"
#: How many log lines the message of a failed start quotes (``log_tail`` has more).
FAILED_START_LINES = 8


@dataclass
class TorNode:
    """One tor process of the network."""

    name: str
    role: str
    """``authority`` (also a relay), ``relay`` or ``client``."""
    dir: Path
    control_port: int
    or_port: int = 0
    dir_port: int = 0
    metrics_port: int = 0
    socks_port: int = 0
    fingerprint: str = ""
    v3ident: str = ""
    address: str = "127.0.0.1"
    """Where the node's ORPort, DirPort and SocksPort listen (its host's address on a
    netns testbed); the control and metrics ports stay on the host's loopback."""
    onion_ports: tuple[str, ...] = ()
    """A client that also runs an onion service: its ``HiddenServicePort`` values
    (``"80 10.77.0.3:8080"``); its keys and ``hostname`` are in :data:`ONION_SERVICE_DIR`."""
    hsdir: bool = False
    """An authority that gives every relay the HSDir flag (a network with an onion service)."""

    @property
    def onion_dir(self) -> Path:
        """The onion service's ``HiddenServiceDir`` (inside the DataDirectory)."""
        return self.dir / ONION_SERVICE_DIR

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (kept in state.json)."""
        return {
            "name": self.name,
            "role": self.role,
            "dir": str(self.dir),
            "control_port": self.control_port,
            "or_port": self.or_port,
            "dir_port": self.dir_port,
            "metrics_port": self.metrics_port,
            "socks_port": self.socks_port,
            "fingerprint": self.fingerprint,
            "v3ident": self.v3ident,
            "address": self.address,
            "onion_ports": list(self.onion_ports),
            "hsdir": self.hsdir,
        }


def log_tails(node_dir: Path) -> str:
    """The last lines of a node's Tor log and of its stdout (start-up errors land there), for
    error messages; ``(no log)`` when neither has anything."""
    from ..network import log_tail

    parts = []
    for name in (TOR_LOG, STDOUT_LOG):
        p = node_dir / name
        if p.exists() and p.stat().st_size:
            parts.append(f"[{name}]\n{log_tail(p, 20)}")
    return "\n".join(parts) or "(no log)"


def start_failed(name: str, why: str, node_dir: Path, log_tail: str | None = None) -> RunFailed:
    """The error for node ``name``, which did not start (it exited, or the network around it
    did not come up in time): ``why`` and the last lines of its log in the message, the
    longer tails (``log_tail``, else :func:`log_tails` of ``node_dir``) beside it. A
    :class:`RunFailed`, so a batch goes on with its next repetition."""
    tail = log_tail or log_tails(node_dir)
    # log_tails gives "[tor.log]" first: where tor says why; a chive node's tail has no header.
    sections = [part for part in re.split(r"^\[(?:tor|stdout)\.log\]\n", tail, flags=re.M) if part.strip()]
    last = sections[0].strip("\n").splitlines()[-FAILED_START_LINES:] if sections else []
    quoted = "\n".join(f"  {line}" for line in last) if last else "  (no log)"
    return RunFailed(f"{name} failed to start: {why}\nlast lines of its log:\n{quoted}", node=name, log_tail=tail)
