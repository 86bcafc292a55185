"""The addresses a chive node is listening on, from the ``PortsFile`` it writes.

The lab gives every chive listener port 0 (:data:`ANY`), so the kernel picks a free port when
the node binds it, and sets ``PortsFile`` (:data:`PORTS_FILE`, in the node's directory): once
every listener is bound the node writes ``{"<option>": "<ip>:<port>", ...}`` there (to
``<file>.tmp``, then renamed, so the file is never seen half written). :func:`wait_ports`
waits for that file and returns its addresses. A port probed free by the lab and handed to the
node could be taken in between by another test's node or any outgoing connection (the race
``network.free_ports`` has); port 0 cannot be. The real Tor writes no such file: the Tor
networks' ports stay probed (:func:`chive_lab.network.free_ports`).

Options a node lists: authority ``DirPort``; relay ``ORPort`` (+ ``MetricsPort``); client
``SocksPort`` (+ ``MetricsPort``). ``chive httpd`` has no PortsFile: given port 0 it prints
``{"listening": "IP:PORT"}`` as its first stdout line, which the lab sends to its log;
:func:`wait_listening` reads it (as the Rust e2e harness's ``spawn_httpd`` does).
"""

from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path
from typing import Callable, Iterable

from .errors import LabError
from .files import read_capped

__all__ = ["ANY", "PORTS_FILE", "any_port", "parse_ports", "read_ports", "wait_listening", "wait_ports"]

#: The port every chive listener the lab starts is given: the kernel picks one.
ANY = 0
#: The ``PortsFile`` of every chive node the lab starts, relative to its directory.
PORTS_FILE = "ports.json"
#: Largest PortsFile the lab reads (a few short lines; a bound keeps a wrong file cheap).
MAX_PORTS_FILE_BYTES = 64 * 1024
_POLL_S = 0.05


def any_port(ip: str = "127.0.0.1") -> str:
    """The listen address of a chive option on ``ip`` with the port left to the kernel."""
    return f"[{ip}]:{ANY}" if ":" in ip else f"{ip}:{ANY}"


def _check_addr(option: str, value: object, where: str) -> str:
    if not isinstance(value, str):
        raise LabError(f"{where}: {option} is {value!r}, not an \"IP:PORT\" string")
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)
        ok = bool(sep) and port.isdigit() and 1 <= int(port) <= 65535
    except ValueError:
        ok = False
    if not ok:
        raise LabError(f"{where}: {option} = {value!r} is not a bound \"IP:PORT\" address")
    return value


def parse_ports(text: str, where: str = "PortsFile") -> dict[str, str]:
    """The ``option -> "IP:PORT"`` map of a PortsFile's text; LabError naming ``where`` and
    what is wrong (not JSON, not an object, a value that is not a bound address)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise LabError(f"{where}: not JSON ({e}): {text[:120]!r}") from e
    if not isinstance(doc, dict) or not doc:
        raise LabError(f"{where}: want a non-empty JSON object of option -> \"IP:PORT\", "
                       f"got {text[:120]!r}")
    return {str(k): _check_addr(str(k), v, where) for k, v in doc.items()}


def read_ports(path: Path | str) -> dict[str, str] | None:
    """The addresses in the PortsFile ``path``; None while it does not exist; LabError if it
    is malformed or cannot be read."""
    path = Path(path)
    data = read_capped(path, MAX_PORTS_FILE_BYTES, "PortsFile")
    if data is None:
        return None
    return parse_ports(data.decode("utf-8", "replace"), f"PortsFile {path}")


def wait_ports(
    path: Path | str,
    *,
    want: Iterable[str],
    deadline: float,
    check: Callable[[], None] = lambda: None,
    node: str | None = None,
) -> dict[str, str]:
    """Wait until the PortsFile ``path`` exists and return its addresses.

    ``want``: the options it must list (LabError naming the missing ones; the node writes the
    file once, after every listener is bound, so a missing option will not come later).
    ``check`` is called while waiting and raises if the node has exited (the caller knows
    how to name it and quote its log). LabError (``node`` set) when ``deadline``
    (``time.monotonic()``) passes first or the file is malformed."""
    path = Path(path)
    want = list(want)
    while True:
        try:
            ports = read_ports(path)
        except LabError as e:
            raise LabError(str(e), node=node) from e
        if ports is not None:
            missing = [w for w in want if w not in ports]
            if missing:
                raise LabError(f"PortsFile {path} lists no {', '.join(missing)} "
                               f"(it has {', '.join(sorted(ports)) or 'nothing'})", node=node)
            return ports
        check()
        if time.monotonic() >= deadline:
            raise LabError(f"{node or 'the node'} wrote no PortsFile {path} in time "
                           "(it writes it once every listener is bound)", node=node)
        time.sleep(_POLL_S)


#: How much of an httpd log :func:`wait_listening` reads: the line comes first.
MAX_LISTENING_LOG_BYTES = 64 * 1024


def wait_listening(
    log: Path | str,
    *,
    deadline: float,
    check: Callable[[], None] = lambda: None,
    node: str | None = None,
) -> str:
    """The address ``chive httpd`` bound, from the ``{"listening": "IP:PORT"}`` line it prints
    on stdout once bound (the lab sends stdout and stderr to ``log``). ``check``,
    ``deadline`` and errors as :func:`wait_ports`; a malformed line is a LabError."""
    log = Path(log)
    while True:
        try:
            with open(log, "rb") as f:
                data = f.read(MAX_LISTENING_LOG_BYTES)
        except FileNotFoundError:
            data = b""
        except OSError as e:
            raise LabError(f"cannot read {log}: {e.strerror or e}", node=node) from e
        for line in data.decode("utf-8", "replace").splitlines():
            if line.startswith('{"listening"'):
                try:
                    addr = json.loads(line)["listening"]
                except (ValueError, KeyError, TypeError) as e:
                    raise LabError(f"{log}: malformed address line {line[:120]!r}", node=node) from e
                try:
                    return _check_addr("listening", addr, str(log))
                except LabError as e:
                    raise LabError(str(e), node=node) from e
        check()
        if time.monotonic() >= deadline:
            raise LabError(f"{node or 'httpd'} printed no listening address to {log} in time",
                           node=node)
        time.sleep(_POLL_S)
