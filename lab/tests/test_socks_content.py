"""The SOCKS5 client, the HTTP reader and the /bytes content check, against
small servers on loopback."""

from __future__ import annotations

import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import fake_chive
from chive_lab import content, socks
from chive_lab.errors import LabError


def test_expected_bytes_pattern():
    data = content.expected_bytes(1000)
    assert len(data) == 1000
    assert all(b == i % 251 for i, b in enumerate(data))
    assert content.expected_bytes(0) == b""


def test_check_body():
    good = content.expected_bytes(5000)
    assert content.check_body(good, 5000) is None
    assert "expected 5000" in content.check_body(good[:-1], 5000)
    bad = bytearray(good)
    bad[3001] ^= 0xFF
    assert content.check_body(bytes(bad), 5000).startswith("byte 3001 ")
    # A block moved by whole periods is caught too (different offset in the pattern).
    shifted = good[498:] + good[:498]
    assert content.check_body(shifted, 5000) is not None


def test_check_file_and_main(tmp_path: Path):
    size = 3 * 1024 * 1024 + 17  # spans several read chunks
    path = tmp_path / "f.bin"
    path.write_bytes(content.expected_bytes(size))
    assert content.check_file(path, size) is None
    assert content.main([str(path), str(size)]) == 0
    assert content.main([str(path), str(size + 1)]) == 1
    data = bytearray(path.read_bytes())
    data[2_500_000] = (data[2_500_000] + 1) % 256
    path.write_bytes(bytes(data))
    assert content.check_file(path, size).startswith("byte 2500000 ")
    assert content.main([str(path), str(size)]) == 1
    assert content.main(["only-one-arg"]) == 2
    assert "cannot read" in content.check_file(tmp_path / "missing", 1)


@pytest.fixture
def http_server():
    """Serves /bytes/N plainly and /chunked/N with chunked transfer encoding."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            kind, _, n = self.path.strip("/").partition("/")
            body = content.expected_bytes(int(n))
            self.send_response(200)
            if kind == "chunked":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(0, len(body), 7000):
                    part = body[i : i + 7000]
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def socks_proxy():
    server = fake_chive.ThreadingTCP(("127.0.0.1", 0), fake_chive.SocksHandler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("user", [None, "alice"])
@pytest.mark.parametrize("kind", ["bytes", "chunked"])
def test_fetch_through_socks(http_server, socks_proxy, user, kind):
    resp = socks.fetch(f"{http_server}/{kind}/70000", proxy=socks_proxy, username=user, password="pw")
    assert resp.status == 200
    assert content.check_body(resp.body, 70000) is None


def test_fetch_direct(http_server):
    resp = socks.fetch(f"{http_server}/bytes/10")
    assert resp.status == 200 and resp.body == content.expected_bytes(10)


def test_body_limit(http_server):
    with pytest.raises(LabError, match="out of range"):
        socks.fetch(f"{http_server}/bytes/5000", max_body=1000)
    with pytest.raises(LabError, match="larger than"):
        socks.fetch(f"{http_server}/chunked/20000", max_body=1000)


def _scripted_server(*steps: tuple[int, bytes]):
    """A one-connection server: for each (n, reply) step, read n bytes, then
    send reply; then close."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run():
        conn, _ = srv.accept()
        with conn:
            for expect, reply in steps:
                got = b""
                while len(got) < expect:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    got += chunk
                conn.sendall(reply)
        srv.close()

    threading.Thread(target=run, daemon=True).start()
    return f"127.0.0.1:{srv.getsockname()[1]}"


def test_socks_connect_refused_reports_reason():
    connect_len = 4 + 1 + len("example") + 2
    proxy = _scripted_server((3, b"\x05\x00"), (connect_len, b"\x05\x05\x00\x01" + bytes(6)))
    with pytest.raises(socks.SocksError, match="connection refused"):
        socks.socks5_connect(proxy, "example", 80, timeout=5)


def test_socks_rejects_non_socks5_server():
    proxy = _scripted_server((3, b"HTTP/1.1 400 Bad Request\r\n\r\n"))
    with pytest.raises(socks.SocksError, match="not a SOCKS5 proxy"):
        socks.socks5_connect(proxy, "example", 80, timeout=5)


def test_socks_auth_refused():
    proxy = _scripted_server((3, b"\x05\xff"))
    with pytest.raises(socks.SocksError, match="refused authentication"):
        socks.socks5_connect(proxy, "example", 80, username="u", password="p", timeout=5)


def test_socks_truncated_reply():
    proxy = _scripted_server((3, b"\x05"))
    with pytest.raises(socks.SocksError, match="closed the connection"):
        socks.socks5_connect(proxy, "example", 80, timeout=5)


def test_socks_sends_hostname_as_domain():
    seen: list[bytes] = []

    class Recorder(socketserver.BaseRequestHandler):
        def handle(self):
            s = self.request
            s.recv(3)
            s.sendall(b"\x05\x00")
            seen.append(s.recv(1024))
            s.sendall(b"\x05\x00\x00\x03\x04host\x00\x50")

    server = socketserver.TCPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.handle_request, daemon=True).start()
    try:
        sock = socks.socks5_connect(f"127.0.0.1:{server.server_address[1]}", "127.0.0.1", 8080, timeout=5)
        sock.close()
    finally:
        server.server_close()
    assert seen == [b"\x05\x01\x00\x03\x09127.0.0.1\x1f\x90"]


@pytest.mark.parametrize("bad", ["nocolon", "host:", ":80", "h:99999", "h:x"])
def test_parse_hostport_errors(bad):
    with pytest.raises(LabError):
        socks.parse_hostport(bad)


def test_argument_bounds():
    with pytest.raises(LabError):
        socks.socks5_connect("127.0.0.1:1", "x" * 256, 80)
    with pytest.raises(LabError):
        socks.socks5_connect("127.0.0.1:1", "host", 0)
    with pytest.raises(LabError):
        socks.socks5_connect("127.0.0.1:1", "host", 80, username="")
    with pytest.raises(LabError, match="only http"):
        socks.fetch("https://example/")


def test_bulk_download_repeats_until_stopped(http_server, socks_proxy):
    """The lab scripts' load generator: each transfer's bytes are counted, a finished transfer
    starts again, and it returns soon after ``stop``."""
    stop = threading.Event()
    got: list[int] = []

    def count(n):
        got.append(n)
        if sum(got) >= 350_000:
            stop.set()

    t = threading.Thread(target=socks.bulk_download, args=(socks_proxy, http_server, stop, count),
                         kwargs={"username": "bulk0", "size": 100_000}, daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "bulk_download did not return after stop"
    # four transfers of 100 000 bytes (each with its HTTP head) were needed to pass 350 000
    assert 350_000 <= sum(got) < 4 * 100_000 + 4 * 1000
