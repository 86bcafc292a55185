"""A chive network placed on the hosts of a running :class:`~chive_lab.netns.Testbed`:
authority, relays, clients and ``chive httpd`` web servers, each on a named host, with
configs from :mod:`chive_lab.config`'s builders (the keys the loopback lab writes) and
every listen address moved to the host's testbed address.

:class:`Overlay` is also the placing API :class:`chive_lab.tor_netns.TorOverlay` follows
for Debian's tor. Not here: the testbed itself (:mod:`.testbed`).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import config as cfg
from ..errors import LabError
from ..network import log_tail
from ..process import DownReport
from .testbed import Testbed

__all__ = ["OVERLAY_ROLES", "NetnsBackend", "Overlay", "OverlayNode", "probe_consensus"]

#: Roles a chive node can have in an :class:`Overlay`.
OVERLAY_ROLES = ("authority", "relay", "client", "httpd")
#: Bound on the consensus text a readiness probe reads.
_MAX_PROBE_BYTES = 16 << 20
_NICK_RE = re.compile(r"^[A-Za-z0-9]{1,19}$")
#: A service node's ``HiddenServiceDir``, inside its directory (chive and tor alike).
ONION_SERVICE_DIR = "onion-service"


@dataclass
class OverlayNode:
    """One chive process placed on a host of a :class:`Testbed`."""

    name: str
    role: str
    host: str
    port: int
    config: dict
    dir: Path
    proc: subprocess.Popen | None = None
    #: File name of the process's stdout+stderr in ``dir``.
    log_name: str = "chive.log"

    @property
    def config_path(self) -> Path:
        """Where the node's TOML config is written."""
        return self.dir / f"{self.name}.toml"

    @property
    def log_path(self) -> Path:
        """The node's stdout+stderr (chive logs to stderr; tor writes its own log beside it)."""
        return self.dir / self.log_name


class Overlay:
    """A chive network placed on the hosts of a running :class:`Testbed`.

    Configs come from :mod:`chive_lab.config`'s builders (the same keys the
    loopback lab writes), with every listen address moved to the host's
    testbed address and exit policies accepting the testbed subnet::

        ov = Overlay(tb, out_dir)
        ov.add_authority("X")
        for h in "ABC":
            ov.add_relay(h, f"relay{h}", overrides={"SplitDirection": "always"})
        ov.add_client("A", "clientA"); ov.add_httpd("C", "httpdC")
        ov.start()                        # waits until a fetch through each client works
        ov.url("httpdC", "/bytes/10", exit="relayC")   # http://10.77.0.3.relayC.exit:8080/bytes/10

    Every process is started with :meth:`Testbed.popen`, so the testbed's
    ``down()`` stops it even if :meth:`stop` is never called; :meth:`stop`
    stops them in reverse start order first (so logs end cleanly).
    """

    def __init__(self, tb: Testbed, dir: Path, *, binary: Path | None = None,  # noqa: A002
                 consensus_interval: int = 1, log: str = "info",
                 progress: Callable[[str], None] | None = None) -> None:
        self.tb = tb
        self.dir = Path(dir)
        self.binary = Path(binary) if binary is not None else tb._chive()
        self.consensus_interval = consensus_interval
        self.log = log
        self.progress = progress or tb.progress
        self.nodes: dict[str, OverlayNode] = {}
        self.authority: OverlayNode | None = None
        self.authority_identity = ""

    # ------------------------------------------------------------ placing
    def _add(self, name: str, role: str, host: str, port: int, config: dict) -> OverlayNode:
        if name in self.nodes:
            raise LabError(f"duplicate overlay node {name!r}")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", name):
            raise LabError(f"invalid node name {name!r}")
        if host not in self.tb.hosts:
            raise LabError(f"no host {host!r} in this testbed")
        if not 1 <= port <= 65535:
            raise LabError(f"port {port} out of range")
        node = OverlayNode(name, role, host, port, config, self.dir / name)
        self.nodes[name] = node
        return node

    def add_authority(self, host: str, *, port: int = 7000, params: dict | None = None,
                      all_guards: bool = True, extra: dict | None = None) -> OverlayNode:
        """Place the directory authority (one per overlay) on ``host``.
        ``all_guards=False`` lets the bandwidth median decide the Guard flags."""
        if self.authority is not None:
            raise LabError("an overlay has one authority")
        conf = cfg.authority_config(data_dir=(self.dir / "authority").resolve(), dir_port=port,
                                    consensus_interval=self.consensus_interval,
                                    params=params or {}, log=self.log)
        conf["DirPort"] = f"{self.tb.addr(host)}:{port}"
        conf["TestingAllGuards"] = all_guards
        conf.update(extra or {})
        self.authority = self._add("authority", "authority", host, port, conf)
        return self.authority

    def add_relay(self, host: str, nickname: str, *, port: int = 9001,
                  bandwidth_rate: int | None = None, overrides: dict | None = None) -> OverlayNode:
        """Place a relay on ``host``: ORPort on the host's address, an exit for the
        testbed subnet (``ExitPolicyRejectPrivate = false``: the subnet is private)."""
        if not _NICK_RE.match(nickname):
            raise LabError(f"invalid nickname {nickname!r}: 1-19 letters or digits")
        conf = cfg.relay_config(nickname=nickname, data_dir=(self.dir / nickname).resolve(),
                                or_port=port, authority="", authority_identity="",
                                bandwidth_rate=bandwidth_rate, overrides=overrides or {},
                                log=self.log)
        conf["ORPort"] = f"{self.tb.addr(host)}:{port}"
        if "ExitPolicy" not in (overrides or {}):
            conf["ExitPolicy"] = [f"accept {self.tb.subnet}:*", "reject *:*"]
        conf["ExitPolicyRejectPrivate"] = False
        return self._add(nickname, "relay", host, port, conf)

    def add_client(self, host: str, name: str, *, port: int = 9050,
                   extra: dict | None = None) -> OverlayNode:
        """Place a SOCKS client on ``host`` (SocksPort on the host's address)."""
        conf = cfg.client_config(data_dir=(self.dir / name).resolve(), socks_port=port,
                                 authority="", authority_identity="", log=self.log)
        conf["SocksPort"] = f"{self.tb.addr(host)}:{port}"
        conf.update(extra or {})
        return self._add(name, "client", host, port, conf)

    def add_onion_service(self, host: str, name: str, *, httpd: str, port: int = 9050,
                          virtual_port: int = 80, extra: dict | None = None) -> OverlayNode:
        """Place a client on ``host`` that also runs an onion service forwarding
        ``virtual_port`` to the httpd node ``httpd`` (``HiddenServiceDir`` in its directory,
        ``HiddenServicePort``); its address is :meth:`onion_address` once it started.
        ``extra``: more client options (``EntryNodes``, ``MiddleNodes``)."""
        target = self.nodes.get(httpd)
        if target is None or target.role != "httpd":
            raise LabError(f"{name}: {httpd!r} is not an httpd of this overlay")
        if not 1 <= virtual_port <= 65535:
            raise LabError(f"{name}: virtual port {virtual_port} out of range")
        node = self.add_client(host, name, port=port, extra=extra)
        node.config["HiddenServiceDir"] = str(self.onion_dir(name))
        node.config["HiddenServicePort"] = [f"{virtual_port} {self.addr(httpd)}"]
        return node

    def onion_dir(self, name: str) -> Path:
        """The ``HiddenServiceDir`` of service node ``name`` (keys, ``hostname``)."""
        return (self.dir / name / ONION_SERVICE_DIR).resolve()

    def onion_address(self, name: str) -> str:
        """The ``<base32>.onion`` address of service node ``name``, from its ``hostname``
        file (written when the service starts); LabError if there is none (yet)."""
        path = self.onion_dir(name) / "hostname"
        try:
            text = path.read_text(encoding="ascii", errors="replace").strip()
        except OSError as e:
            raise LabError(f"{name}: no onion address yet ({path}: {e.strerror})", node=name) from e
        if not re.fullmatch(r"[a-z2-7]{56}\.onion", text):
            raise LabError(f"{name}: {path} does not hold a v3 onion address: {text[:80]!r}", node=name)
        return text

    def add_httpd(self, host: str, name: str, *, port: int = 8080) -> OverlayNode:
        """Place a ``chive httpd`` on ``host``."""
        conf = cfg.httpd_config(port=port)
        conf["Listen"] = f"{self.tb.addr(host)}:{port}"
        conf["Log"] = self.log
        return self._add(name, "httpd", host, port, conf)

    # ------------------------------------------------------------ addresses
    def addr(self, name: str) -> str:
        """``IP:PORT`` of a node's listening socket."""
        n = self.nodes[name]
        return f"{self.tb.addr(n.host)}:{n.port}"

    def url(self, httpd: str, path: str, *, exit: str | None = None) -> str:  # noqa: A002
        """URL of ``path`` on an httpd node; with ``exit``, in ``.exit`` notation
        (``http://IP.NICK.exit:PORT/path``) so the client must leave through it."""
        n = self.nodes[httpd]
        host = self.tb.addr(n.host) + (f".{exit}.exit" if exit else "")
        return f"http://{host}:{n.port}{path}"

    def relays(self) -> list[OverlayNode]:
        """The relay nodes in the order they were added."""
        return [n for n in self.nodes.values() if n.role == "relay"]

    # ------------------------------------------------------------ running
    def start(self, *, timeout: float = 60.0, probe_bytes: int = 1024) -> None:
        """Write configs and start every node: the authority first (its identity goes
        into every config), then relays, then — once the consensus lists every
        relay — clients and httpds; return when a verified fetch through each client
        to the first httpd works. Raises LabError (with the node's log tail)."""
        if self.authority is None:
            raise LabError("an overlay needs an authority (add_authority)")
        deadline = time.monotonic() + timeout
        self.dir.mkdir(parents=True, exist_ok=True)
        auth = self.authority
        cfg.write_toml(auth.config_path, auth.config)
        r = self.tb.sh(auth.host, [str(self.binary), "authority", "--config",
                                   str(auth.config_path.resolve()), "--print-identity"],
                       check=False, timeout=max(1.0, deadline - time.monotonic()))
        ident = next((ln.strip().lower() for ln in reversed(r.stdout.splitlines())
                      if re.fullmatch(r"[0-9a-fA-F]{64}", ln.strip())), "")
        if r.returncode != 0 or not ident:
            raise LabError(f"`chive authority --print-identity` failed: {r.stderr.strip()[-500:]}",
                           node="authority")
        self.authority_identity = ident
        for n in self.nodes.values():
            if n.role in ("relay", "client"):
                n.config["Authority"] = self.addr("authority")
                n.config["AuthorityIdentity"] = ident
        self._spawn(auth)
        for n in self.relays():
            self._spawn(n)
        relay_names = [n.name for n in self.relays()]
        self._wait_consensus(relay_names, deadline)
        self.progress(f"overlay: consensus lists {', '.join(relay_names)}")
        for n in self.nodes.values():
            if n.role in ("client", "httpd"):
                self._spawn(n)
        httpds = [n for n in self.nodes.values() if n.role == "httpd"]
        for c in (n for n in self.nodes.values() if n.role == "client"):
            if not httpds:
                break
            self._wait_fetch(c, self.url(httpds[0].name, f"/bytes/{probe_bytes}"), deadline)
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is not None:
                raise LabError(f"{n.name} exited during start-up", node=n.name,
                               log_tail=self._log_tail(n))
        self.progress("overlay: a verified fetch through every client worked: ready")

    def _spawn(self, n: OverlayNode) -> None:
        n.dir.mkdir(parents=True, exist_ok=True)
        cfg.write_toml(n.config_path, n.config)
        self._popen_logged(n, [str(self.binary), n.role, "--config", str(n.config_path.resolve())])

    def _popen_logged(self, n: OverlayNode, argv: list[str]) -> None:
        """Start ``argv`` as node ``n`` in its host and directory, stdout and stderr appended
        to its log."""
        log = open(n.log_path, "ab")  # noqa: SIM115 - the child keeps it; closed below
        try:
            n.proc = self.tb.popen(n.host, argv, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, cwd=str(n.dir))
        finally:
            log.close()

    def _log_tail(self, n: OverlayNode) -> str:
        """The end of node ``n``'s log, for errors."""
        return log_tail(n.log_path)

    def _check_alive(self) -> None:
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is not None:
                raise LabError(f"{n.name} (on host {n.host}) exited with status {n.proc.returncode}",
                               node=n.name, log_tail=self._log_tail(n))

    def _consensus_probe(self, relays: list[str]) -> list[str]:
        """The command, run in the authority's host, that exits 0 once the consensus lists
        every one of ``relays``."""
        return [sys.executable, "-m", "chive_lab.netns", "probe-consensus",
                "--url", f"http://{self.addr('authority')}/consensus", "--relays", ",".join(relays)]

    def _try(self, host: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        """One attempt of a readiness probe in ``host``: one that outlives ``timeout`` (a loaded
        machine: a Python probe has taken over 15 s to start) counts as a failed attempt."""
        try:
            return self.tb.sh(host, argv, check=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"probe timed out after {timeout:g} s")

    def _wait_consensus(self, relays: list[str], deadline: float) -> None:
        argv = self._consensus_probe(relays)
        last = ""
        while True:
            self._check_alive()
            r = self._try(self.authority.host, argv, 15)  # type: ignore[union-attr]
            if r.returncode == 0:
                return
            last = (r.stdout + r.stderr).strip()[-300:]
            if time.monotonic() >= deadline:
                raise LabError(f"timed out waiting for a consensus listing {', '.join(relays)} ({last})",
                               node="authority")
            time.sleep(0.5)

    def wait_onion(self, client: str, url: str, deadline: float) -> None:
        """Wait (until ``deadline``, monotonic s) for a verified fetch of ``url`` (on an onion
        service of this overlay) through ``client``: the service has published its descriptor
        and answers. LabError with the last attempt's output otherwise."""
        self._wait_fetch(self.nodes[client], url, deadline, per_try=30.0)

    def _wait_fetch(self, client: OverlayNode, url: str, deadline: float, per_try: float = 10.0) -> None:
        argv = [str(self.binary), "perf", "--socks", self.addr(client.name), "--url", url,
                "--verify", "--timeout", f"{per_try:g}"]
        last = ""
        while True:
            self._check_alive()
            r = self._try(client.host, argv, per_try + 10)
            if r.returncode == 0 and '"status":200' in r.stdout.replace(" ", ""):
                return
            last = (r.stdout + r.stderr).strip()[-300:]
            if time.monotonic() >= deadline:
                raise LabError(f"timed out fetching {url} through {client.name} ({last})",
                               node=client.name)
            time.sleep(0.5)

    def stop(self, grace: float = 5.0) -> dict[str, int | None]:
        """SIGTERM every node (clients first, authority last), wait, SIGKILL
        stragglers; returns node -> exit status."""
        order = sorted(self.nodes.values(),
                       key=lambda n: {"client": 0, "httpd": 1, "relay": 2, "authority": 3}[n.role])
        for n in order:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.terminate()
        deadline = time.monotonic() + grace
        out: dict[str, int | None] = {}
        for n in order:
            if n.proc is None:
                continue
            try:
                n.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait()
            out[n.name] = n.proc.returncode
        return out


def probe_consensus(url: str, missing: Callable[[str], list[str]], *, max_bytes: int = _MAX_PROBE_BYTES,
                    listed_as: str = "") -> int:
    """The exit status of a readiness probe run inside a host: 0 once the document at ``url``
    reads and ``missing(text)`` (the relays it does not list yet) is empty, else 1 with the
    reason printed."""
    try:
        with urllib.request.urlopen(url, timeout=3.0) as resp:
            text = resp.read(max_bytes + 1).decode("utf-8", "replace")
    except OSError as e:
        print(f"{url}: {e}")
        return 1
    absent = missing(text)
    if absent:
        print(f"consensus does not list {', '.join(absent)}{listed_as} yet")
        return 1
    return 0


class NetnsBackend:
    """The runner's ``netns`` backend entry. Experiment kinds that build their
    own :class:`Testbed` (``paper002-tcp``, ``paper002-overlay``, the latter with
    an :class:`Overlay` inside it) only need it to exist; the generic
    ``overlay`` kind (clients on the runner's own host) cannot use it."""

    name = "netns"

    def start(self, spec, dir, *, impl: str = "chive", progress=None):  # noqa: A002 - runner API
        """Not for the generic overlay kind: its clients run outside namespaces."""
        raise LabError("the netns backend starts overlays only inside experiment kinds that "
                       "build their own Testbed (paper002-tcp, paper002-overlay)")

    def stop(self, dir):  # noqa: A002 - runner API
        """Nothing to stop: kinds using a Testbed remove it themselves."""
        return DownReport()
