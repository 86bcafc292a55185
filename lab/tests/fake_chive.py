"""A stand-in for the chive binary, for testing the lab's orchestration
without the Rust build: same subcommands, same config files, same endpoints,
no onion routing.

- ``authority --config F --print-identity``: creates DataDirectory/keys/identity.key, prints it.
- ``authority --config F``: HTTP on DirPort; relays POST /descriptor with their
  nickname; GET /consensus lists them (after a consensus interval, like the real one).
- ``relay --config F``: posts its nickname to the authority, then idles.
- ``client --config F``: a SOCKS5 proxy (no auth or username/password) that
  connects directly to the target.
- ``httpd --config F``: serves /bytes/<N> with byte i = i % 251.

Fault injection through the environment: FAKE_CHIVE_FAIL=<nickname or role>
makes that node exit at start with an error; FAKE_CHIVE_IGNORE_TERM=<role>
makes that node ignore SIGTERM; FAKE_CHIVE_NO_PUBLISH=<nickname> makes that
relay never publish a descriptor; FAKE_CHIVE_BAD_PORTS=<nickname or role> makes that
node write a malformed PortsFile.

Like the real one, every node writes ``PortsFile`` (relative: in its DataDirectory) once its
listener is bound: ``{"<option>": "IP:PORT"}`` with the port the kernel gave it for port 0;
httpd prints ``{"listening": "IP:PORT"}`` on stdout instead.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import socketserver
import sys
import threading
import time
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def log(msg: str) -> None:
    print(f"fake-chive: {msg}", file=sys.stderr, flush=True)


def serve(server: socketserver.BaseServer, conf: dict, name: str, option: str, what: str) -> int:
    """Write ``server``'s address to the PortsFile as ``option``, log it, serve until killed."""
    write_ports(conf, name, option, server.server_address[:2])
    log(f"{what} {server.server_address}")
    server.serve_forever()
    return 0


def write_ports(conf: dict, name: str, option: str, addr: tuple[str, int]) -> None:
    """The PortsFile, written whole (tmp + rename) as chive does."""
    if not conf.get("PortsFile"):
        return
    path = Path(conf.get("DataDirectory", ".")) / conf["PortsFile"]
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f'{{"{option}": "{addr[0]}:{addr[1]}"}}\n'
    if os.environ.get("FAKE_CHIVE_BAD_PORTS") == name:
        text = f'{{"{option}": "{addr[0]}"}}\n'  # no port
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def authority(conf: dict, print_identity: bool) -> int:
    keys = Path(conf["DataDirectory"]) / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    key = keys / "identity.key"
    if not key.exists():
        key.write_text(secrets.token_hex(32))
    if print_identity:
        print(key.read_text().strip())
        return 0
    registered: set[str] = set()
    published: list[str] = []
    interval = float(conf["ConsensusInterval"])
    lock = threading.Lock()

    def publish_loop() -> None:
        while True:
            time.sleep(interval)
            with lock:
                published[:] = sorted(registered)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            if self.path != "/consensus" or not published:
                self.send_error(404)
                return
            with lock:
                body = "".join(f"r {n} 127.0.0.1\n" for n in published).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            nick = self.rfile.read(length).decode().strip()
            with lock:
                registered.add(nick)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    threading.Thread(target=publish_loop, daemon=True).start()
    return serve(ThreadingHTTPServer(hostport(conf["DirPort"]), Handler), conf, "authority", "DirPort",
                 "authority listening on")


def relay(conf: dict) -> int:
    import urllib.request

    host, port = hostport(conf["Authority"])
    listener = socket.create_server(hostport(conf["ORPort"]))  # held, never accepted
    write_ports(conf, conf["Nickname"], "ORPort", listener.getsockname()[:2])
    if os.environ.get("FAKE_CHIVE_NO_PUBLISH") == conf["Nickname"]:
        log(f"{conf['Nickname']}: not publishing (test)")
        while True:
            time.sleep(3600)
    while True:
        try:
            req = urllib.request.Request(
                f"http://{host}:{port}/descriptor", data=conf["Nickname"].encode(), method="POST"
            )
            urllib.request.urlopen(req, timeout=2).read()
            break
        except OSError:
            time.sleep(0.1)
    log(f"{conf['Nickname']} published its descriptor")
    while True:
        time.sleep(3600)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("eof")
        buf += chunk
    return buf


class SocksHandler(socketserver.BaseRequestHandler):
    def handle(self):
        s = self.request
        ver, nmethods = recv_exact(s, 2)
        methods = recv_exact(s, nmethods)
        if 2 in methods:
            s.sendall(b"\x05\x02")
            _, ulen = recv_exact(s, 2)
            user = recv_exact(s, ulen)
            (plen,) = recv_exact(s, 1)
            recv_exact(s, plen)
            log(f"socks user {user.decode()!r}")
            s.sendall(b"\x01\x00")
        else:
            s.sendall(b"\x05\x00")
        _, cmd, _, atyp = recv_exact(s, 4)
        if atyp == 3:
            (n,) = recv_exact(s, 1)
            host = recv_exact(s, n).decode()
        elif atyp == 1:
            host = socket.inet_ntoa(recv_exact(s, 4))
        else:
            s.sendall(b"\x05\x08\x00\x01" + bytes(6))
            return
        port = int.from_bytes(recv_exact(s, 2), "big")
        try:
            up = socket.create_connection((host, port), timeout=5)
        except OSError:
            s.sendall(b"\x05\x05\x00\x01" + bytes(6))
            return
        s.sendall(b"\x05\x00\x00\x01" + bytes(6))

        def pump(a, b):
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    b.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    b.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        t = threading.Thread(target=pump, args=(up, s), daemon=True)
        t.start()
        pump(s, up)
        t.join()
        up.close()


class ThreadingTCP(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def client(conf: dict) -> int:
    return serve(ThreadingTCP(hostport(conf["SocksPort"]), SocksHandler), conf, "client", "SocksPort", "socks on")


def httpd(conf: dict) -> int:
    pattern = bytes(range(251))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if not self.path.startswith("/bytes/"):
                self.send_error(404)
                return
            n = int(self.path[len("/bytes/"):])
            body = (pattern * (n // 251 + 1))[:n]
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(hostport(conf["Listen"]), Handler)
    host, port = server.server_address[:2]
    print(f'{{"listening": "{host}:{port}"}}', flush=True)  # as chive httpd: first stdout line
    log(f"httpd on {server.server_address}")
    server.serve_forever()
    return 0


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0] not in ("authority", "relay", "client", "httpd"):
        print("usage: fake_chive ROLE --config FILE", file=sys.stderr)
        return 2
    role = args[0]
    if "--help" in args:
        print(f"fake chive {role}: --config <CONFIG>")
        return 0
    conf_path = Path(args[args.index("--config") + 1])
    conf = tomllib.loads(conf_path.read_text())
    name = conf.get("Nickname", role)
    if role == "authority":
        name = "authority"
    if os.environ.get("FAKE_CHIVE_FAIL") in (name, role) and "--print-identity" not in args:
        log(f"{name}: simulated failure: bad option FakeOption")
        return 1
    if os.environ.get("FAKE_CHIVE_IGNORE_TERM") in (name, role):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if role == "authority":
        return authority(conf, "--print-identity" in args)
    if role == "relay":
        return relay(conf)
    if role == "client":
        return client(conf)
    return httpd(conf)


if __name__ == "__main__":
    raise SystemExit(main())
