"""Start and stop a private chive network on loopback.

:meth:`Network.up` writes every node's config into ``DIR/<node>/<node>.toml``,
starts 1 authority, N relays, 1 client and 1 ``chive httpd`` (logs in
``DIR/<node>/chive.log``), every listener on port 0 (each node reports the
address it bound in ``DIR/<node>/ports.json``, read by :mod:`chive_lab.ports`),
records them in ``DIR/state.json`` and waits until the network really works: the authority serves a consensus that lists every
relay, and a real HTTP fetch through the client's SOCKS port returns the
expected bytes. :meth:`Network.down` stops what ``up`` recorded.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import config as cfg
from .content import check_body
from .errors import LabError
from .ports import PORTS_FILE, wait_listening, wait_ports
from .process import DownReport, is_running, spawn, stop_processes
from .socks import fetch
from .state import State, load_state, save_state, state_path

__all__ = ["DownReport", "Network", "NetworkInfo", "NetworkSpec", "default_binary", "free_ports"]

MIN_RELAYS = 3  # a circuit has three distinct hops
MAX_RELAYS = 200  # one machine, a few processes per core: keep it sane
LOG_FILE = "chive.log"
# Size of the readiness fetch through the network: big enough to need more
# than one cell (498 data bytes), small enough to be quick.
PROBE_BYTES = 1024
# Bound on the consensus document the lab reads while waiting.
MAX_CONSENSUS_BYTES = 16 << 20
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
# The overlays `up` can start: chive, or the real Tor as the baseline (tor.py).
IMPLS = ("chive", "tor")
_POLL_S = 0.25

Progress = Callable[[str], None]


def _stderr_progress(msg: str) -> None:
    print(f"chive-lab: {msg}", file=sys.stderr, flush=True)


def repo_root() -> Path | None:
    """The chive checkout this package lives in (editable install), else the
    nearest parent of the working directory holding ``crates/chive``."""
    here = Path(__file__).resolve()
    candidates = [here.parents[2], *Path.cwd().resolve().parents]
    candidates.insert(1, Path.cwd().resolve())
    for c in candidates:
        if (c / "Cargo.toml").is_file() and (c / "crates" / "chive").is_dir():
            return c
    return None


def default_binary() -> Path:
    """``$CHIVE_BIN`` if set, else ``target/release/chive`` in the repository."""
    env = os.environ.get("CHIVE_BIN")
    if env:
        return Path(env)
    root = repo_root()
    return (root if root is not None else Path.cwd()) / "target" / "release" / "chive"


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1, found by binding port 0.

    For the real Tor only, which cannot report the ports it bound: chive nodes get port 0 and
    write a PortsFile (chive_lab/ports.py). All sockets stay open until every port is chosen
    so the kernel cannot hand out the same one twice; another program could still take one
    before the node binds it (small window; ``up`` then fails with the node's log).
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class NetworkSpec:
    """What network to start."""

    relays: int = 3
    """Number of relays (all exits allowing 127.0.0.0/8), at least 3."""
    bandwidth_rate: int | None = None
    """BandwidthRate and BandwidthBurst of every relay in bytes/s; None = unlimited."""
    relay_overrides: dict[str, Any] = field(default_factory=dict)
    """Keys added to / overriding every relay's config (``--set``)."""
    authority_params: dict[str, int] = field(default_factory=dict)
    """The authority's [NetworkParameters] (``--param``), e.g. {"circwindow": 101}."""
    client_overrides: dict[str, Any] = field(default_factory=dict)
    """Keys added to the chive client's config, e.g. ``{"EntryNodes": ["relay1"]}`` to give
    every circuit the same guard (chive only; a Tor client reports them as not applied)."""
    binary: Path | None = None
    """The chive binary; None = :func:`default_binary`."""
    timeout: float = 60.0
    """Seconds to wait for the network to work before giving up."""
    consensus_interval: int = 2
    """Seconds between consensuses (short, so a lab network is ready fast)."""
    log_level: str = "info"
    """The ``Log`` filter of every node."""
    impl: str = "chive"
    """Which overlay to start: ``chive`` or ``tor`` (the real Tor as the baseline
    peer, configured as Chutney does; see chive_lab/tor.py and docs/tor-baseline.md)."""
    tor_authorities: int = 3
    """impl="tor" only: how many directory authorities to start besides the relays (1..9;
    fewer than 3 gives up equal relay weights, see docs/tor-baseline.md)."""
    onion_service: bool = False
    """chive only: one more chive client (node ``service``) running an onion service
    (HiddenServiceDir ``DIR/service/hs``, HiddenServicePort ``80 -> the httpd``); ``up``
    waits until a fetch through ``http://<addr>.onion`` works and reports it as ``onion``.
    ``client_overrides`` apply to it too."""

    def validate(self) -> None:
        """Raise LabError naming the first bad field."""
        if isinstance(self.relays, bool) or not isinstance(self.relays, int):
            raise LabError("relays must be an integer")
        if not MIN_RELAYS <= self.relays <= MAX_RELAYS:
            raise LabError(f"relays must be between {MIN_RELAYS} and {MAX_RELAYS}, got {self.relays}")
        if self.bandwidth_rate is not None and (
            isinstance(self.bandwidth_rate, bool)
            or not isinstance(self.bandwidth_rate, int)
            or self.bandwidth_rate < 0
        ):
            raise LabError(f"bandwidth_rate must be a non-negative integer, got {self.bandwidth_rate!r}")
        for key in self.relay_overrides:
            cfg.check_key(key)
            if key in cfg.MANAGED_RELAY_KEYS:
                raise LabError(f"{key} is managed by the lab and cannot be overridden")
        for key in self.client_overrides:
            cfg.check_key(key)
            if key in cfg.MANAGED_CLIENT_KEYS:
                raise LabError(f"client key {key} is managed by the lab and cannot be overridden")
        for key, value in self.authority_params.items():
            cfg.check_key(key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise LabError(f"network parameter {key} must be an integer, got {value!r}")
        if not self.timeout > 0:
            raise LabError("timeout must be positive")
        interval = self.consensus_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise LabError("consensus_interval must be a positive integer")
        if self.impl not in IMPLS:
            raise LabError(f"impl must be one of {', '.join(IMPLS)}, got {self.impl!r}")
        n_auth = self.tor_authorities
        if isinstance(n_auth, bool) or not isinstance(n_auth, int) or not 1 <= n_auth <= 9:
            raise LabError(f"tor_authorities must be an integer 1..9, got {n_auth!r}")
        if not isinstance(self.onion_service, bool):
            raise LabError("onion_service must be true or false")
        if self.onion_service and self.impl != "chive":
            raise LabError("onion_service is built for impl chive only (a tor onion service: "
                           "HiddenServiceDir in the tor lab's torrc)")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (recorded in state.json)."""
        return {
            "relays": self.relays,
            "bandwidth_rate": self.bandwidth_rate,
            "relay_overrides": self.relay_overrides,
            "authority_params": self.authority_params,
            "binary": None if self.binary is None else str(self.binary),
            "timeout": self.timeout,
            "consensus_interval": self.consensus_interval,
            "log_level": self.log_level,
            "impl": self.impl,
            "tor_authorities": self.tor_authorities,
            "onion_service": self.onion_service,
        }


@dataclass
class NetworkInfo:
    """How to use a running network."""

    socks: str
    """The client's SOCKS5 port, ``127.0.0.1:P``."""
    http: str
    """Base URL of ``chive httpd``, ``http://127.0.0.1:P``."""
    dir: str
    """The network directory."""
    pids: dict[str, int]
    """Node name -> pid: authority, relay1..relayN, client, httpd."""
    authority: str = ""
    """The authority's DirPort, ``127.0.0.1:P``."""
    authority_identity: str = ""
    """The authority's Ed25519 identity, 64 hex characters."""
    onion: str = ""
    """With an onion service: its base URL, ``http://<addr>.onion`` (port 80 -> the httpd)."""

    def to_json(self) -> dict[str, Any]:
        """The object ``chive-lab up`` prints: socks, http, dir, pids (and onion, if any)."""
        out: dict[str, Any] = {"socks": self.socks, "http": self.http, "dir": self.dir,
                               "pids": dict(self.pids)}
        if self.onion:
            out["onion"] = self.onion
        return out

    @classmethod
    def from_state(cls, state: State) -> "NetworkInfo":
        """Rebuild the info of a network from its state file."""
        ep = state.endpoints
        return cls(
            socks=str(ep.get("socks", "")),
            http=str(ep.get("http", "")),
            dir=state.dir,
            pids=state.pids(),
            authority=str(ep.get("authority", "")),
            authority_identity=str(ep.get("authority_identity", "")),
            onion=str(ep.get("onion", "")),
        )


def log_tail(path: Path | str, lines: int = 30, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of a log file (reading at most ``max_bytes``)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError as e:
        return f"(cannot read {path}: {e})"
    text = data.decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


def consensus_lists(text: str, nicknames: list[str]) -> list[str]:
    """The nicknames that do NOT occur as whole words in ``text``."""
    missing = []
    for nick in nicknames:
        # Whole word: "relay1" must not be satisfied by "relay10".
        if not re.search(rf"(?<![A-Za-z0-9_-]){re.escape(nick)}(?![A-Za-z0-9_-])", text):
            missing.append(nick)
    return missing


class Network:
    """Starts and stops lab networks. Stateless: everything lives in DIR."""

    def __init__(self, progress: Progress | None = _stderr_progress):
        self._progress = progress or (lambda _msg: None)

    # -- up -----------------------------------------------------------------

    @classmethod
    def up(
        cls, spec: NetworkSpec, dir: Path | str, progress: Progress | None = _stderr_progress
    ) -> NetworkInfo:
        """Start a network in ``dir`` and wait until it works.

        On failure, stops everything it started and raises LabError whose
        ``node`` / ``log_tail`` point at the node that failed (if one did).
        """
        return cls(progress)._up(spec, Path(dir))

    @classmethod
    def down(cls, dir: Path | str) -> DownReport:
        """Stop every process recorded in ``dir``/state.json that is still the
        one the lab started. Removes nothing. A directory without a state file
        raises LabError."""
        state = load_state(Path(dir))
        return stop_processes(state.nodes)

    @staticmethod
    def info(dir: Path | str) -> NetworkInfo:
        """The NetworkInfo of the network recorded in ``dir``."""
        return NetworkInfo.from_state(load_state(Path(dir)))

    def _up(self, spec: NetworkSpec, dir: Path) -> NetworkInfo:
        spec.validate()
        binary = Path(spec.binary) if spec.binary is not None else default_binary()
        binary = binary.resolve() if binary.exists() else binary
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise LabError(
                f"chive binary not found or not executable: {binary} "
                "(build it with `cargo build --release`, or pass --chive-bin / set CHIVE_BIN)"
            )
        if spec.impl == "tor":
            from .tor import find_tor_tools

            find_tor_tools()  # fail with the reason before touching DIR
        dir = dir.resolve()
        if state_path(dir).exists():
            raise LabError(
                f"{dir} already holds a network (state.json exists): run `chive-lab down --dir {dir}` "
                "and use a new or empty directory (old keys and descriptors would confuse the new network)"
            )
        dir.mkdir(parents=True, exist_ok=True)

        state = State(dir=str(dir), spec=spec.to_json())
        save_state(dir, state)  # from here on `down` works
        procs: dict[str, subprocess.Popen] = {}
        try:
            if spec.impl == "tor":
                from .tor import start_tor_network

                info = start_tor_network(self, spec, binary, dir, state, procs)
            else:
                info = self._start_and_wait(spec, binary, dir, state, procs)
        except BaseException as e:
            # Includes KeyboardInterrupt: never leave half a network behind.
            reason = str(e) or type(e).__name__
            state.status = f"failed: {reason}"
            save_state(dir, state)
            if state.nodes:
                self._progress(f"stopping the {len(state.nodes)} process(es) started so far")
                report = stop_processes(state.nodes)
                for name, why in report.failed.items():
                    self._progress(f"could not stop {name}: {why}")
            _reap_all(procs)
            raise
        state.status = "ready"
        save_state(dir, state)
        return info

    def _start(
        self,
        name: str,
        binary: Path,
        config: Path,
        state: State,
        procs: dict[str, subprocess.Popen],
        role: str | None = None,
    ) -> None:
        """Start node ``name`` as ``chive <role> --config <config>`` and record it (role:
        ``relay`` for relayN, else the name unless given)."""
        dir = Path(state.dir)
        node_dir = dir / name
        role = role or ("relay" if name.startswith("relay") else name)
        argv = [str(binary), role, "--config", str(config)]
        proc, rec = spawn(name, argv, log_path=node_dir / LOG_FILE, cwd=node_dir, config=config)
        procs[name] = proc
        state.nodes.append(rec)
        save_state(dir, state)  # record before waiting on anything

    def _node_ports(self, name: str, option: str, state: State, deadline: float) -> str:
        """The address node ``name`` bound for ``option``, from its PortsFile
        (``DIR/<name>/ports.json``, :func:`chive_lab.ports.wait_ports`); LabError quoting the
        node's log if it exits first, writes a malformed file or none in time."""
        rec = next((n for n in state.nodes if n.name == name), None)
        try:
            ports = wait_ports(Path(state.dir) / name / PORTS_FILE, want=[option], deadline=deadline,
                               check=lambda: self._check_alive(state), node=name)
        except LabError as e:
            if e.log_tail is None and rec is not None:
                e.log_tail = log_tail(rec.log)
            raise
        return ports[option]

    def _httpd_address(self, state: State, deadline: float) -> str:
        """The address node ``httpd`` (started on port 0) bound: the line it prints to its log
        (:func:`chive_lab.ports.wait_listening`)."""
        rec = next(n for n in state.nodes if n.name == "httpd")
        try:
            return wait_listening(rec.log, deadline=deadline, check=lambda: self._check_alive(state),
                                  node="httpd")
        except LabError as e:
            if e.log_tail is None:
                e.log_tail = log_tail(rec.log)
            raise

    def _start_and_wait(
        self,
        spec: NetworkSpec,
        binary: Path,
        dir: Path,
        state: State,
        procs: dict[str, subprocess.Popen],
    ) -> NetworkInfo:
        deadline = time.monotonic() + spec.timeout
        relay_names = [f"relay{i}" for i in range(1, spec.relays + 1)]
        # Every listener on port 0: each node reports the address it bound in its PortsFile
        # (chive_lab/ports.py), read here before anything that needs it is configured.
        state.endpoints = {}

        # Authority first: its identity and DirPort go into every other config.
        auth_dir = dir / "authority"
        auth_toml = auth_dir / "authority.toml"
        cfg.write_toml(
            auth_toml,
            cfg.authority_config(
                data_dir=auth_dir,
                consensus_interval=spec.consensus_interval,
                params=spec.authority_params,
                log=spec.log_level,
            ),
        )
        identity = self._authority_identity(binary, auth_toml, auth_dir, deadline)
        state.endpoints["authority_identity"] = identity
        self._progress(f"authority identity {identity}")
        self._start("authority", binary, auth_toml, state, procs)
        authority = self._node_ports("authority", "DirPort", state, deadline)
        state.endpoints["authority"] = authority
        save_state(dir, state)

        for name in relay_names:
            node_dir = dir / name
            path = node_dir / f"{name}.toml"
            cfg.write_toml(
                path,
                cfg.relay_config(
                    nickname=name,
                    data_dir=node_dir,
                    authority=authority,
                    authority_identity=identity,
                    bandwidth_rate=spec.bandwidth_rate,
                    overrides=spec.relay_overrides,
                    log=spec.log_level,
                ),
            )
            self._start(name, binary, path, state, procs)

        client_dir = dir / "client"
        client_toml = client_dir / "client.toml"
        cfg.write_toml(
            client_toml,
            cfg.client_config(
                data_dir=client_dir,
                authority=authority,
                authority_identity=identity,
                log=spec.log_level,
                overrides=spec.client_overrides,
            ),
        )
        self._start("client", binary, client_toml, state, procs)

        httpd_dir = dir / "httpd"
        httpd_toml = httpd_dir / "httpd.toml"
        cfg.write_toml(httpd_toml, cfg.httpd_config())
        self._start("httpd", binary, httpd_toml, state, procs)
        self._progress(f"started authority, {spec.relays} relays, client and httpd in {dir}")
        for name in relay_names:
            self._node_ports(name, "ORPort", state, deadline)
        state.endpoints["socks"] = self._node_ports("client", "SocksPort", state, deadline)
        state.endpoints["http"] = f"http://{self._httpd_address(state, deadline)}"
        save_state(dir, state)

        self._wait_consensus(authority, relay_names, state, deadline)
        self._progress("consensus lists every relay")
        http = state.endpoints["http"]
        self._wait_fetch(f"{http}/bytes/{PROBE_BYTES}", None, "httpd", state, deadline)
        self._wait_fetch(f"{http}/bytes/{PROBE_BYTES}", state.endpoints["socks"], "client", state, deadline)
        self._progress("a fetch through the network returned the expected bytes")
        if spec.onion_service:
            self._start_onion_service(spec, binary, dir, state, procs, deadline)
        self._progress("ready")
        return NetworkInfo.from_state(state)

    def _start_onion_service(
        self,
        spec: NetworkSpec,
        binary: Path,
        dir: Path,
        state: State,
        procs: dict[str, subprocess.Popen],
        deadline: float,
    ) -> None:
        """Node ``service``: a chive client with HiddenServiceDir in front of the httpd; wait
        for its hostname file, then for a fetch through ``http://<addr>.onion`` (the
        descriptor is published once its introduction points are up)."""
        node_dir = dir / "service"
        hs_dir = node_dir / "hs"
        toml = node_dir / "service.toml"
        overrides = dict(spec.client_overrides)
        overrides["HiddenServiceDir"] = str(hs_dir)
        overrides["HiddenServicePort"] = [f"80 {state.endpoints['http'].removeprefix('http://')}"]
        cfg.write_toml(
            toml,
            cfg.client_config(
                data_dir=node_dir,
                authority=state.endpoints["authority"],
                authority_identity=state.endpoints["authority_identity"],
                log=spec.log_level,
                overrides=overrides,
            ),
        )
        self._start("service", binary, toml, state, procs, role="client")
        self._node_ports("service", "SocksPort", state, deadline)
        hostname = hs_dir / "hostname"
        while True:
            self._check_alive(state)
            try:
                addr = hostname.read_text().strip()
            except OSError:
                addr = ""
            if addr.endswith(".onion"):
                break
            if time.monotonic() >= deadline:
                rec = next((n for n in state.nodes if n.name == "service"), None)
                raise LabError(f"onion service wrote no {hostname}", node="service",
                               log_tail=log_tail(rec.log) if rec else None)
            time.sleep(_POLL_S)
        state.endpoints["onion"] = f"http://{addr}"
        save_state(dir, state)
        self._progress(f"onion service {addr}; waiting for its descriptor")
        self._wait_fetch(f"http://{addr}/bytes/{PROBE_BYTES}", state.endpoints["socks"], "service",
                         state, deadline)
        self._progress("a fetch through the onion service returned the expected bytes")

    def _authority_identity(self, binary: Path, toml: Path, auth_dir: Path, deadline: float) -> str:
        """Run ``chive authority --print-identity`` (creates the key) and return it."""
        argv = [str(binary), "authority", "--config", str(toml), "--print-identity"]
        log = auth_dir / "print-identity.log"
        try:
            out = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=max(1.0, deadline - time.monotonic()),
                cwd=auth_dir,
            )
        except subprocess.TimeoutExpired as e:
            raise LabError(f"`{' '.join(argv)}` did not finish in time", node="authority") from e
        except OSError as e:
            raise LabError(f"cannot run {binary}: {e}", node="authority") from e
        stdout = out.stdout.decode("utf-8", "replace")
        stderr = out.stderr.decode("utf-8", "replace")
        log.write_text(f"$ {' '.join(argv)}\n{stdout}{stderr}", encoding="utf-8")
        if out.returncode != 0:
            raise LabError(
                f"`chive authority --print-identity` exited with status {out.returncode}",
                node="authority",
                log_tail=log_tail(log),
            )
        for line in reversed(stdout.splitlines()):
            if _HEX64.match(line.strip()):
                return line.strip().lower()
        raise LabError(
            "`chive authority --print-identity` did not print a 64-hex-character identity",
            node="authority",
            log_tail=log_tail(log),
        )

    def _check_alive(self, state: State) -> None:
        """Raise LabError naming the first node that has exited."""
        for rec in state.nodes:
            if not is_running(rec.pid):
                raise LabError(
                    f"{rec.name} (pid {rec.pid}) exited during start-up",
                    node=rec.name,
                    log_tail=log_tail(rec.log),
                )

    def _wait_consensus(self, authority: str, relays: list[str], state: State, deadline: float) -> None:
        url = f"http://{authority}/consensus"
        last = "no answer yet"
        while True:
            self._check_alive(state)
            try:
                with urllib.request.urlopen(url, timeout=2.0) as resp:
                    text = resp.read(MAX_CONSENSUS_BYTES + 1).decode("utf-8", "replace")
                if len(text) > MAX_CONSENSUS_BYTES:
                    last = "consensus too large"
                else:
                    missing = consensus_lists(text, relays)
                    if not missing:
                        return
                    last = f"consensus does not list {', '.join(missing)} yet"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code} from {url}"
            except (urllib.error.URLError, OSError) as e:
                last = f"{url}: {getattr(e, 'reason', e)}"
            if time.monotonic() >= deadline:
                raise LabError(
                    f"timed out waiting for a consensus listing all relays ({last})",
                    node="authority",
                    log_tail=log_tail(state.nodes[0].log) if state.nodes else None,
                )
            time.sleep(_POLL_S)

    def _wait_fetch(self, url: str, proxy: str | None, blame: str, state: State, deadline: float) -> None:
        """Retry a fetch of ``url`` (through ``proxy`` if given) until it returns
        the expected bytes or the deadline passes."""
        last = "no attempt yet"
        while True:
            self._check_alive(state)
            left = deadline - time.monotonic()
            try:
                resp = fetch(url, proxy=proxy, timeout=max(1.0, min(10.0, left)), max_body=PROBE_BYTES * 2)
                if resp.status != 200:
                    last = f"HTTP {resp.status} {resp.reason}"
                else:
                    problem = check_body(resp.body, PROBE_BYTES)
                    if problem is None:
                        return
                    last = f"wrong content: {problem}"
            except (LabError, OSError) as e:
                last = str(e) or type(e).__name__
            if time.monotonic() >= deadline:
                via = f" through SOCKS {proxy}" if proxy else ""
                rec = next((n for n in state.nodes if n.name == blame), None)
                raise LabError(
                    f"timed out fetching {url}{via} ({last})",
                    node=blame,
                    log_tail=log_tail(rec.log) if rec else None,
                )
            time.sleep(_POLL_S)


def _reap_all(procs: dict[str, subprocess.Popen]) -> None:
    # Collect exit statuses of our own children so no zombies remain in a
    # long-lived process that uses the library (pytest, scenario runners).
    for proc in procs.values():
        try:
            proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
