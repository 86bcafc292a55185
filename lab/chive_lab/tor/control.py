"""A minimal Tor control-port client: cookie authentication and ``GETINFO``, every read
bounded. Tor nodes of the lab listen on ``127.0.0.1:<control_port>`` with
``CookieAuthentication 1`` (see :mod:`.torrc`); :func:`control_for` connects to one.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Mapping

from ..errors import LabError

__all__ = ["MAX_CONTROL_REPLY", "ControlClient", "control_for"]

# Bound on what the lab reads from one control reply (and from a consensus it fetches).
MAX_CONTROL_REPLY = 8 << 20


class ControlClient:
    """A minimal Tor control-port client (cookie authentication, GETINFO).

    Every read is bounded; replies are parsed per control-spec section 2.3
    (``250-key=value``, ``250+key=`` data blocks ended by ``.``).
    """

    def __init__(self, port: int, cookie_path: Path, timeout: float = 5.0):
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._buf = bytearray()
        try:
            try:
                with open(cookie_path, "rb") as f:
                    cookie = f.read(64)
            except OSError as e:
                raise LabError(f"cannot read the control cookie {cookie_path}: {e}") from e
            if len(cookie) != 32:
                raise LabError(f"control cookie {cookie_path} is {len(cookie)} bytes, expected 32")
            status, lines = self.command(f"AUTHENTICATE {cookie.hex()}")
            if status != 250:
                raise LabError(f"control port {port} refused authentication: {' '.join(lines)[:200]}")
        except BaseException:
            self._sock.close()
            raise

    def close(self) -> None:
        """Close the connection."""
        try:
            self._sock.sendall(b"QUIT\r\n")
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> "ControlClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _readline(self) -> str:
        while True:
            i = self._buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[: i + 2]
                return line.decode("utf-8", "replace")
            if len(self._buf) > MAX_CONTROL_REPLY:
                raise LabError("control reply line too long")
            chunk = self._sock.recv(65536)
            if not chunk:
                raise LabError("control connection closed")
            self._buf += chunk

    def command(self, line: str) -> tuple[int, list[str]]:
        """Send one command; return the final status code and the reply lines
        (data blocks joined into their line with ``\\n``)."""
        if "\r" in line or "\n" in line:
            raise LabError("control command must be one line")
        self._sock.sendall(line.encode() + b"\r\n")
        out: list[str] = []
        total = 0
        while True:
            raw = self._readline()
            total += len(raw)
            if total > MAX_CONTROL_REPLY:
                raise LabError("control reply too large")
            if len(raw) < 4 or not raw[:3].isdigit():
                raise LabError(f"malformed control reply line {raw[:60]!r}")
            code, sep, rest = int(raw[:3]), raw[3], raw[4:]
            if sep == "+":
                data = []
                while True:
                    d = self._readline()
                    total += len(d)
                    if total > MAX_CONTROL_REPLY:
                        raise LabError("control reply too large")
                    if d == ".":
                        break
                    data.append(d[1:] if d.startswith("..") else d)
                # "250+key=" then the data lines: keep "key=" + the data.
                out.append(rest + "\n".join(data))
            else:
                out.append(rest)
            if sep == " ":
                return code, out

    def getinfo(self, *keys: str) -> dict[str, str]:
        """``GETINFO keys``; raise LabError unless Tor answers 250."""
        status, lines = self.command("GETINFO " + " ".join(keys))
        if status != 250:
            raise LabError(f"GETINFO {' '.join(keys)} failed: {status} {' '.join(lines)[:200]}")
        result = {}
        for line in lines:
            key, sep, value = line.partition("=")
            if sep:
                result[key] = value
        return result


def control_for(node: Mapping[str, Any], timeout: float = 5.0) -> ControlClient:
    """An authenticated connection to the control port of ``node`` (a :meth:`TorNode.to_json`
    dict: ``control_port`` and ``dir``, where Tor writes its cookie)."""
    return ControlClient(int(node["control_port"]), Path(node["dir"]) / "control_auth_cookie", timeout)
