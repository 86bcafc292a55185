"""A tiny SOCKS5 client (RFC 1928, username/password per RFC 1929) and an
HTTP/1.1 GET over it, enough to prove a network carries traffic.

The destination host is always sent as a domain name (address type 3), the
way ``curl --socks5-hostname`` does, so the exit resolves it. A username and
password select stream isolation in chive's client (distinct credentials,
distinct circuits).
"""

from __future__ import annotations

import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urlsplit

from .errors import LabError

# Every read is bounded; a lab fetch is at most a few hundred MiB.
MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_BODY = 256 * 1024 * 1024

_REPLIES = {
    1: "general SOCKS server failure",
    2: "connection not allowed by ruleset",
    3: "network unreachable",
    4: "host unreachable",
    5: "connection refused",
    6: "TTL expired",
    7: "command not supported",
    8: "address type not supported",
}


class SocksError(LabError):
    """The SOCKS proxy refused or broke the request."""


def parse_hostport(text: str) -> tuple[str, int]:
    """Split ``"127.0.0.1:9050"`` into host and port."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LabError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise SocksError(f"SOCKS proxy closed the connection ({len(buf)}/{n} bytes read)")
        buf += chunk
    return bytes(buf)


def socks5_connect(
    proxy: str,
    host: str,
    port: int,
    *,
    username: str | None = None,
    password: str | None = None,
    timeout: float = 30.0,
) -> socket.socket:
    """Open a TCP stream to ``host:port`` through the SOCKS5 proxy at ``proxy``.

    Returns the connected socket (caller closes it). Raises SocksError with the
    proxy's reason, or OSError for socket-level failures.
    """
    if not 0 < port < 65536:
        raise LabError(f"bad destination port {port}")
    name = host.encode("idna") if not host.isascii() else host.encode()
    if not 0 < len(name) < 256:
        raise LabError(f"destination host name must be 1..255 bytes: {host!r}")
    user = (username or "").encode()
    pw = (password or "").encode()
    if username is not None and (not 0 < len(user) < 256 or len(pw) > 255):
        raise LabError("SOCKS username must be 1..255 bytes and password at most 255")

    phost, pport = parse_hostport(proxy)
    sock = socket.create_connection((phost, pport), timeout=timeout)
    try:
        method = 0x02 if username is not None else 0x00
        sock.sendall(bytes([5, 1, method]))
        ver, chosen = _recv_exact(sock, 2)
        if ver != 5:
            raise SocksError(f"not a SOCKS5 proxy (version byte {ver})")
        if chosen == 0xFF or chosen != method:
            raise SocksError(f"SOCKS proxy refused authentication method {method} (chose {chosen})")
        if method == 0x02:
            sock.sendall(bytes([1, len(user)]) + user + bytes([len(pw)]) + pw)
            _, status = _recv_exact(sock, 2)
            if status != 0:
                raise SocksError(f"SOCKS proxy rejected username/password (status {status})")
        sock.sendall(bytes([5, 1, 0, 3, len(name)]) + name + port.to_bytes(2, "big"))
        ver, rep, _rsv, atyp = _recv_exact(sock, 4)
        if ver != 5:
            raise SocksError(f"bad SOCKS reply version {ver}")
        if rep != 0:
            raise SocksError(f"SOCKS CONNECT failed: {_REPLIES.get(rep, f'reply code {rep}')}")
        # Skip the bound address: its length depends on the address type.
        if atyp == 1:
            _recv_exact(sock, 4 + 2)
        elif atyp == 4:
            _recv_exact(sock, 16 + 2)
        elif atyp == 3:
            (length,) = _recv_exact(sock, 1)
            _recv_exact(sock, length + 2)
        else:
            raise SocksError(f"bad SOCKS reply address type {atyp}")
        return sock
    except BaseException:
        sock.close()
        raise


@dataclass
class HttpResponse:
    """A complete HTTP response."""

    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def _read_until_headers_end(sock: socket.socket) -> tuple[bytes, bytes]:
    buf = bytearray()
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            return bytes(buf[:end]), bytes(buf[end + 4 :])
        if len(buf) > MAX_HEADER_BYTES:
            raise LabError("HTTP response headers too large")
        chunk = sock.recv(65536)
        if not chunk:
            raise LabError("connection closed before the HTTP response headers ended")
        buf += chunk


class _Reader:
    """Buffered reads from a socket that started with some bytes already read."""

    def __init__(self, sock: socket.socket, initial: bytes):
        self.sock = sock
        self.buf = bytearray(initial)
        self.eof = False

    def _fill(self) -> bool:
        if self.eof:
            return False
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise LabError(f"connection closed {n - len(self.buf)} bytes before the body ended")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_line(self, limit: int = 4096) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return line
            if len(self.buf) > limit:
                raise LabError("HTTP chunk header too long")
            if not self._fill():
                raise LabError("connection closed inside a chunked body")

    def read_to_eof(self, limit: int) -> bytes:
        while self._fill():
            if len(self.buf) > limit:
                raise LabError(f"HTTP body larger than {limit} bytes")
        out = bytes(self.buf)
        self.buf.clear()
        return out


def http_get(
    sock: socket.socket, host: str, port: int, path: str, *, max_body: int = DEFAULT_MAX_BODY
) -> HttpResponse:
    """Send ``GET path`` on an open stream and read the whole response."""
    host_header = host if port == 80 else f"{host}:{port}"
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: chive-lab\r\n"
        "Accept: */*\r\nConnection: close\r\n\r\n"
    )
    sock.sendall(request.encode("latin-1"))
    head, rest = _read_until_headers_end(sock)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise LabError(f"bad HTTP status line {lines[0][:100]!r}")
    status = int(parts[1])
    reason = parts[2] if len(parts) > 2 else ""
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            headers[key.strip().lower()] = value.strip()

    reader = _Reader(sock, rest)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size_text = reader.read_line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as e:
                raise LabError(f"bad chunk size {size_text[:20]!r}") from e
            if size == 0:
                break
            if len(body) + size > max_body:
                raise LabError(f"HTTP body larger than {max_body} bytes")
            body += reader.read_exact(size)
            reader.read_exact(2)  # CRLF after each chunk
        return HttpResponse(status, reason, headers, bytes(body))
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError as e:
            raise LabError(f"bad Content-Length {headers['content-length'][:20]!r}") from e
        if not 0 <= length <= max_body:
            raise LabError(f"Content-Length {length} out of range")
        return HttpResponse(status, reason, headers, reader.read_exact(length))
    return HttpResponse(status, reason, headers, reader.read_to_eof(max_body))


def fetch(
    url: str,
    *,
    proxy: str | None = None,
    username: str | None = None,
    password: str | None = None,
    timeout: float = 30.0,
    max_body: int = DEFAULT_MAX_BODY,
) -> HttpResponse:
    """GET an ``http://`` URL, through the SOCKS5 ``proxy`` when given, else directly."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise LabError(f"only http:// URLs are supported: {url!r}")
    host = parts.hostname
    port = parts.port or 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    if proxy is None:
        sock = socket.create_connection((host, port), timeout=timeout)
    else:
        sock = socks5_connect(
            proxy, host, port, username=username, password=password, timeout=timeout
        )
    with sock:
        sock.settimeout(timeout)
        return http_get(sock, host, port, path, max_body=max_body)


def bulk_download(
    proxy: str,
    http: str,
    stop: threading.Event,
    on_bytes: Callable[[int], None],
    *,
    username: str,
    exit_relay: str | None = None,
    size: int = 10_000_000_000,
) -> None:
    """A continuous download through ``proxy`` until ``stop`` is set: ``GET /bytes/<size>``
    from the ``http://host:port`` server (through ``exit_relay`` by .exit notation if given),
    on the circuit of SOCKS user ``username``, again whenever a transfer ends or fails (0.5 s
    after a failure, which is logged to stderr). ``on_bytes(n)`` counts what arrives; the
    body is not checked. Returns within about a second of ``stop``."""
    host, port = parse_hostport(http.removeprefix("http://"))
    if exit_relay:
        host = f"{host}.{exit_relay}.exit"
    while not stop.is_set():
        try:
            s = socks5_connect(proxy, host, port, username=username, password="x")
            with s:
                s.settimeout(1.0)
                s.sendall(f"GET /bytes/{size} HTTP/1.0\r\n\r\n".encode())
                while not stop.is_set():
                    try:
                        data = s.recv(65536)
                    except TimeoutError:
                        continue
                    if not data:
                        break
                    on_bytes(len(data))
        except (OSError, SocksError) as e:
            print(f"{username}: {e}; retrying", file=sys.stderr)
            stop.wait(0.5)
