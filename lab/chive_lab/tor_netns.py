"""Real Tor relays and clients placed on the hosts of a netns :class:`~chive_lab.netns.Testbed`.

:class:`TorOverlay` has the placing API of :class:`~chive_lab.netns.Overlay` (authority,
relays, clients, web servers on named hosts; ``addr``, ``url``, ``start``, ``stop``), so an
experiment kind can run the same traffic over Debian's ``tor`` as over chive: the baseline
the issues ask for, on the same shaped links. The web servers stay ``chive httpd`` (the
content is verified by ``chive perf`` either way).

How a tor node differs from a chive one here:

* its keys are made before it starts (``tor-gencert`` for the authority, ``tor
  --list-fingerprint`` for every relay) in the root namespace; nothing there opens a socket;
* its torrc comes from :func:`chive_lab.tor.build_torrc` (the loopback lab's, with the
  node's host address for ORPort, DirPort and SocksPort; control and metrics ports stay on
  the host's own loopback, reached by :func:`_main` run inside the host);
* Tor has no ``.exit`` notation by default, so a client's path is pinned in its torrc
  (``EntryNodes``, ``MiddleNodes``, ``ExitNodes`` with ``StrictNodes``), and :meth:`url`
  only checks that the requested exit is the pinned one;
* relay options of chive (``SplitDirection``, ``LinkUnsentLimit`` …) have no Tor equivalent
  and are refused: Tor keeps one connection per relay pair and lets KIST bound its socket
  writes.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from . import tor as tortools
from .errors import LabError, RunFailed
from .netns import Overlay, OverlayNode, Testbed, probe_consensus

#: Options a tor client here may pin (chive's names for the first two are the same;
#: ``ExcludeNodes`` replaces the lab's own exclusion of the authority, which pinned clients drop).
PATH_OPTIONS = ("EntryNodes", "MiddleNodes", "ExitNodes", "ExcludeNodes")
#: Control and metrics ports of the n-th tor node (on the host's loopback; several tor nodes
#: can share a host).
CONTROL_PORT_BASE, METRICS_PORT_BASE = 9100, 9200
#: A fresh Tor test network needs a consensus (~5-10 s) listing every relay before a
#: client's pinned path exists; chive's take ~2 s.
DEFAULT_START_TIMEOUT = 150.0
#: Relay metrics kept in :meth:`TorOverlay.evidence` (MetricsPort names; the raw pages stay in
#: each relay's directory as ``metrics.prom``).
EVIDENCE_METRICS = ("tor_relay_congestion_control", "tor_relay_flow_control", "tor_relay_traffic_bytes",
                    "tor_relay_connections")
#: A client with no working fetch this long after it started is restarted once with an empty
#: directory cache and guard state (seen once in ~30 starts: the client took a consensus in
#: which its pinned entry was not usable, discarded every circuit for "hop #1" and did not
#: recover within minutes). Still needed although the lab's clients run without entry
#: guards (``UseEntryGuards 0``): tor refuses that together with ``EntryNodes``, so a client
#: that pins its entry, as every client the experiments place does, keeps its guard state.
CLIENT_RESTART_AFTER = 45.0
#: What a restarted client forgets (its DataDirectory has no keys worth keeping).
_CLIENT_CACHE_FILES = ("state", "cached-certs", "cached-consensus", "cached-microdesc-consensus",
                       "cached-microdescs", "cached-microdescs.new", "cached-descriptors",
                       "cached-descriptors.new")


class TorOverlay(Overlay):
    """A Tor network (one authority, relays, clients) plus ``chive httpd`` web servers on a
    running :class:`Testbed`::

        ov = TorOverlay(tb, out_dir)
        ov.add_authority("X")
        ov.add_relay("A", "relayA"); ov.add_relay("B", "relayB")
        ov.add_client("A", "clientA", extra={"EntryNodes": ["relayA"], "ExitNodes": ["relayB"]})
        ov.add_httpd("B", "httpdB")
        ov.start()     # waits until a verified fetch through every client works

    Processes are started with :meth:`Testbed.popen`, so ``tb.down()`` stops them too.
    """

    impl = "tor"

    def __init__(self, tb: Testbed, dir: Path, *, binary: Path | None = None,  # noqa: A002
                 log: str = "info", progress: Callable[[str], None] | None = None) -> None:
        super().__init__(tb, dir, binary=binary, log=log, progress=progress)
        reason = tortools.tor_unavailable_reason()
        if reason:
            raise tortools.TorUnavailable(reason)
        self.tools = tortools.find_tor_tools()
        self.tor_nodes: dict[str, tortools.TorNode] = {}
        #: client name -> {option: [node names]}
        self.client_paths: dict[str, dict[str, list[str]]] = {}
        #: node name -> extra torrc options (checked by :meth:`_check_torrc`)
        self.extra_torrc: dict[str, dict[str, Any]] = {}
        #: Clients :meth:`start` had to restart (see :data:`CLIENT_RESTART_AFTER`).
        self.restarted_clients: list[str] = []
        self._known_options: frozenset[str] | None = None
        #: :meth:`start` waits at least this long, whatever its ``timeout`` says.
        self.min_start_timeout = DEFAULT_START_TIMEOUT
        #: The authority's ConsensusParams (Tor's names), from :meth:`add_authority`'s params.
        self.consensus_params: dict[str, int] = {}

    def _check_torrc(self, name: str, options: dict[str, Any] | None) -> None:
        """Keep ``options`` as extra torrc lines of ``name`` if this tor knows each option and
        the lab does not manage it (ports, directories, authorities, the pinned path)."""
        if not options:
            return
        if self._known_options is None:
            self._known_options = tortools.known_torrc_options(self.tools.tor)
        managed = tortools.MANAGED_TOR_KEYS | set(PATH_OPTIONS) | {"StrictNodes", "ExcludeNodes", "UseEntryGuards"}
        for key, value in options.items():
            if key in managed:
                raise LabError(f"{name}: torrc option {key} is set by the lab")
            if key not in self._known_options:
                raise LabError(f"{name}: {key} is not a torrc option of tor {self.tools.version}")
            tortools.torrc_value(value)  # no line breaks
        self.extra_torrc[name] = dict(options)

    # ------------------------------------------------------------ placing
    def _tor_node(self, name: str, role: str, host: str, **ports: int) -> tortools.TorNode:
        self.nodes[name].log_name = tortools.STDOUT_LOG
        i = len(self.tor_nodes)
        node = tortools.TorNode(name=name, role=role, dir=(self.dir / name).resolve(),
                                control_port=CONTROL_PORT_BASE + i, address=self.tb.addr(host),
                                **ports)
        self.tor_nodes[name] = node
        return node

    def add_authority(self, host: str, *, port: int = 7000, params: dict | None = None,
                      all_guards: bool = True, extra: dict | None = None) -> OverlayNode:
        """Place the directory authority on ``host`` (DirPort ``port``, ORPort ``port + 1``).
        Every relay gets the Guard flag (the test network's ``TestingDirAuthVoteGuard *``)
        whatever ``all_guards`` says: tor clients here pin their paths instead. Consensus
        ``params`` (chive's names, e.g. ``{"cc_alg": 0, "circwindow": 101}``) become the
        authority's ``ConsensusParams`` through :func:`chive_lab.tor.options.map_params`
        (a chive-only parameter is refused); ``extra`` options are refused."""
        if self.authority is not None:
            raise LabError("an overlay has one authority")
        if extra:
            raise LabError("the tor overlay takes no extra authority options")
        mapping = tortools.map_params(params or {})
        if mapping.unmapped:
            raise LabError(f"consensus parameter {mapping.unmapped[0].key} has no Tor equivalent: "
                           f"{mapping.unmapped[0].reason}")
        self.consensus_params = dict(mapping.consensus_params)
        self.authority = self._add("authority", "authority", host, port, {})
        self._tor_node("authority", "authority", host, dir_port=port, or_port=port + 1)
        return self.authority

    def add_relay(self, host: str, nickname: str, *, port: int = 9001,
                  bandwidth_rate: int | None = None, overrides: dict | None = None,
                  torrc: dict[str, Any] | None = None) -> OverlayNode:
        """Place a tor relay (an exit) with its ORPort on ``host``; ``torrc``: more torrc
        options (``{"KISTSockBufSizeFactor": 0}``). chive relay options have no Tor equivalent
        here and are refused; so is ``bandwidth_rate`` (not needed yet)."""
        if overrides:
            raise LabError(f"tor relays take no chive relay options (got {sorted(overrides)})")
        if bandwidth_rate is not None:
            raise LabError("the tor overlay does not rate-limit relays")
        if not re.fullmatch(r"[A-Za-z0-9]{1,19}", nickname):
            raise LabError(f"invalid nickname {nickname!r}: 1-19 letters or digits")
        self._check_torrc(nickname, torrc)
        node = self._add(nickname, "relay", host, port, {})
        self._tor_node(nickname, "relay", host, or_port=port,
                       metrics_port=METRICS_PORT_BASE + len(self.tor_nodes))
        return node

    def add_client(self, host: str, name: str, *, port: int = 9050,
                   extra: dict | None = None, torrc: dict[str, Any] | None = None) -> OverlayNode:
        """Place a tor client with its SocksPort on ``host``. ``extra`` may pin the path with
        ``EntryNodes``, ``MiddleNodes`` and ``ExitNodes`` (lists of relay nicknames of this
        overlay; ``StrictNodes`` is then on); ``torrc``: more torrc options."""
        paths: dict[str, list[str]] = {}
        for key, value in (extra or {}).items():
            if key not in PATH_OPTIONS:
                raise LabError(f"tor client option {key!r} is not supported here "
                               f"(only {', '.join(PATH_OPTIONS)})")
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise LabError(f"{key} must be a non-empty list of relay nicknames")
            paths[key] = list(value)
        self._check_torrc(name, torrc)
        node = self._add(name, "client", host, port, {})
        self._tor_node(name, "client", host, socks_port=port)
        self.client_paths[name] = paths
        return node

    def add_onion_service(self, host: str, name: str, *, httpd: str, port: int = 9050,
                          virtual_port: int = 80, extra: dict | None = None,
                          torrc: dict[str, Any] | None = None) -> OverlayNode:
        """Place a tor client on ``host`` that also runs a v3 onion service forwarding
        ``virtual_port`` to the httpd node ``httpd`` (``HiddenServiceDir`` in its
        DataDirectory, :func:`chive_lab.tor.onion_service_lines`); the authority then gives
        every relay the HSDir flag. ``extra`` pins paths as for :meth:`add_client`."""
        target = self.nodes.get(httpd)
        if target is None or target.role != "httpd":
            raise LabError(f"{name}: {httpd!r} is not an httpd of this overlay")
        if self.authority is None:
            raise LabError("add the authority before an onion service")
        if not 1 <= virtual_port <= 65535:
            raise LabError(f"{name}: virtual port {virtual_port} out of range")
        node = self.add_client(host, name, port=port, extra=extra, torrc=torrc)
        self.tor_nodes[name].onion_ports = (f"{virtual_port} {self.addr(httpd)}",)
        self.tor_nodes["authority"].hsdir = True
        return node

    def onion_dir(self, name: str) -> Path:
        """The ``HiddenServiceDir`` of service node ``name`` (tor makes it, 0700)."""
        return self.tor_nodes[name].onion_dir

    # ------------------------------------------------------------ addresses
    def url(self, httpd: str, path: str, *, exit: str | None = None) -> str:  # noqa: A002
        """URL of ``path`` on an httpd node. Tor clients have no ``.exit`` notation: with
        ``exit``, every client must have pinned ``ExitNodes = [exit]``."""
        if exit is not None:
            for client, paths in self.client_paths.items():
                if paths.get("ExitNodes") != [exit]:
                    raise LabError(f"{client} does not pin ExitNodes = [{exit!r}]; tor has no "
                                   ".exit notation, pin the exit in the client")
        return super().url(httpd, path)

    # ------------------------------------------------------------ running
    def torrc_lines(self, name: str) -> list[tuple[str, Any]]:
        """Every torrc line of node ``name`` (keys must exist: :meth:`start` makes them)."""
        node = self.tor_nodes[name]
        authorities = [n for n in self.tor_nodes.values() if n.role == "authority"]
        mapping = tortools.map_relay_options({}, None, None)
        lines = tortools.build_torrc(node, authorities, mapping, self.consensus_params,
                                     self.dir / tortools.BANDWIDTH_FILE,
                                     verbose=any(w in self.log for w in ("debug", "trace")))
        if node.role == "client":
            paths = self.client_paths.get(name, {})
            if paths:
                # StrictNodes would apply ExcludeNodes (the authority, kept off paths in the
                # loopback lab) to directory fetches too, leaving the client no directory
                # server at all; with the whole path pinned the exclusion is not needed.
                lines = [kv for kv in lines if kv[0] != "ExcludeNodes"]
            for key, names in paths.items():
                fps = []
                for n in names:
                    relay = self.tor_nodes.get(n)
                    if relay is None or relay.role != "relay":
                        raise LabError(f"{name}: {key} names {n!r}, which is not a relay here")
                    fps.append(f"${relay.fingerprint}")
                lines.append((key, ",".join(fps)))
            if paths:
                lines.append(("StrictNodes", 1))
            if "EntryNodes" in paths:
                # Tor refuses EntryNodes without guards ("If EntryNodes is set, UseEntryGuards
                # must be enabled"): the pinned entry is the client's only guard, and the
                # restart in _wait_client covers the case where it is marked down.
                lines = [("UseEntryGuards", 1) if k == "UseEntryGuards" else (k, v) for k, v in lines]
        return lines + list(self.extra_torrc.get(name, {}).items())

    def start(self, *, timeout: float = DEFAULT_START_TIMEOUT, probe_bytes: int = 1024) -> None:
        """Make keys, write torrcs, start the authority, relays, clients and httpds; return
        when a verified fetch through each client to the first httpd works.

        A node that exits, or a consensus or fetch that does not come in time, raises
        :class:`~chive_lab.errors.RunFailed` naming the node and quoting its log, after
        stopping every process started here (the testbed's owner removes the namespaces):
        this run failed, another may not. Errors before any tor starts stay LabError."""
        if self.authority is None:
            raise LabError("an overlay needs an authority (add_authority)")
        timeout = max(timeout, self.min_start_timeout)
        deadline = time.monotonic() + timeout
        self.dir.mkdir(parents=True, exist_ok=True)
        self.progress(f"tor overlay: {self.tools.version}: making keys")
        tortools.prepare_keys(self.tools, list(self.tor_nodes.values()), self.dir, deadline)
        for name, node in self.tor_nodes.items():
            (node.dir / tortools.TORRC).write_text(tortools.render_torrc(self.torrc_lines(name)),
                                                   encoding="utf-8")
        try:
            self._start_and_wait(timeout, deadline, probe_bytes)
        except BaseException as e:
            self.stop()  # no tor outlives a failed start, whoever catches this
            if isinstance(e, LabError) and not isinstance(e, RunFailed):
                raise self._start_failed(e) from e
            raise
        self.progress("tor overlay: a verified fetch through every client worked: ready")

    def _start_and_wait(self, timeout: float, deadline: float, probe_bytes: int) -> None:
        assert self.authority is not None
        self._spawn(self.authority)
        for n in self.relays():
            self._spawn(n)
        relay_names = [n.name for n in self.relays()]
        self.progress(f"tor overlay: waiting up to {timeout:.0f} s for a consensus listing "
                      f"{', '.join(relay_names)} as usable at every hop")
        self._wait_consensus(relay_names, deadline)
        # Clients only now: a tor client that finds its only authority without a consensus
        # marks it down and retries minutes later.
        for n in self.nodes.values():
            if n.role in ("client", "httpd"):
                self._spawn(n)
        httpds = [n for n in self.nodes.values() if n.role == "httpd"]
        for c in (n for n in self.nodes.values() if n.role == "client"):
            if httpds:
                self._wait_client(c, self.url(httpds[0].name, f"/bytes/{probe_bytes}"), deadline)
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is not None:
                raise LabError(f"{n.name} exited during start-up", node=n.name,
                               log_tail=self._log_tail(n))

    def _start_failed(self, e: LabError) -> RunFailed:
        """``e`` (a node exited, a wait timed out) as the RunFailed of the node it names (the
        authority when it names none: a consensus is what the others wait for)."""
        name = e.node if e.node in self.nodes else "authority"
        n = self.nodes[name]
        tail = e.log_tail or self._log_tail(n)
        return tortools.start_failed(name, str(e), n.dir, tail)

    def _wait_client(self, c: OverlayNode, url: str, deadline: float) -> None:
        """Wait for a verified fetch through client ``c``; restart it once (empty cache and
        guard state) if none works within :data:`CLIENT_RESTART_AFTER` s."""
        first = min(deadline, time.monotonic() + CLIENT_RESTART_AFTER)
        try:
            return self._wait_fetch(c, url, first)
        except LabError:
            if time.monotonic() >= deadline or c.proc is None or c.proc.poll() is not None:
                raise
        node = self.tor_nodes[c.name]
        last = tortools.log_tails(node.dir).strip().splitlines()[-1:]
        self.progress(f"tor overlay: no fetch through {c.name} after {CLIENT_RESTART_AFTER:.0f} s "
                      f"({last[0][:160] if last else 'no log'}); restarting it without its caches")
        c.proc.terminate()
        try:
            c.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()
        for name in _CLIENT_CACHE_FILES:
            (node.dir / name).unlink(missing_ok=True)
        self.restarted_clients.append(c.name)
        self._spawn(c)
        self._wait_fetch(c, url, deadline)

    def _spawn(self, n: OverlayNode) -> None:
        if n.name not in self.tor_nodes:
            super()._spawn(n)  # a chive httpd
            return
        node = self.tor_nodes[n.name]
        self._popen_logged(n, [self.tools.tor, "-f", str(node.dir / tortools.TORRC),
                               "--defaults-torrc", str(self.dir / "empty-torrc")])

    def _log_tail(self, n: OverlayNode) -> str:
        if n.name in self.tor_nodes:
            return tortools.log_tails(self.tor_nodes[n.name].dir)  # tor.log, then stdout
        return super()._log_tail(n)

    def _consensus_probe(self, relays: list[str]) -> list[str]:
        # Running exits: a client's pinned exit must carry the Exit flag.
        return [sys.executable, "-m", "chive_lab.tor_netns", "consensus",
                "--url", f"http://{self.addr('authority')}/tor/status-vote/current/consensus",
                "--relays", ",".join(relays)]

    # ------------------------------------------------------------ evidence
    def _in_host(self, name: str, what: str) -> str:
        node = self.tor_nodes[name]
        argv = [sys.executable, "-m", "chive_lab.tor_netns", what, "--dir", str(node.dir),
                "--control-port", str(node.control_port), "--metrics-port", str(node.metrics_port)]
        try:
            r = self.tb.sh(self.nodes[name].host, argv, check=False, timeout=20)
        except subprocess.TimeoutExpired as e:
            raise LabError(f"{what} of {name} took over {e.timeout:g} s (a loaded machine?)", node=name) from e
        if r.returncode != 0:
            raise LabError(f"{what} of {name} failed: {(r.stdout + r.stderr).strip()[-300:]}",
                           node=name)
        return r.stdout

    def circuits(self, client: str) -> list[dict[str, Any]]:
        """The client's circuits from its control port (``GETINFO circuit-status``), each
        with ``path`` as relay nicknames; the raw text is kept in its directory."""
        text = self._in_host(client, "circuit-status")
        (self.tor_nodes[client].dir / "circuit-status.txt").write_text(text, encoding="utf-8")
        return tortools.parse_circuit_status(text)

    def relay_metrics(self, relay: str) -> dict[str, float]:
        """The relay's MetricsPort page, parsed (raw text kept as ``metrics.prom``)."""
        text = self._in_host(relay, "metrics")
        (self.tor_nodes[relay].dir / "metrics.prom").write_text(text, encoding="utf-8")
        return tortools.parse_prometheus(text)

    def stream_circuits(self, client: str) -> dict[str, list[str]]:
        """SOCKS user -> hops of the circuits the client's streams used (Tor isolates each
        SOCKS user on circuits of its own and names the user in ``circuit-status``; circuits
        Tor builds for itself, such as preemptive or HS-vanguard ones, carry no user)."""
        out: dict[str, list[str]] = {}
        for c in self.circuits(client):
            user = c.get("socks_username", "").strip('"')
            if user and c.get("status") == "BUILT":
                out.setdefault(user, []).append(",".join(c.get("path", [])))
        return out

    def evidence(self) -> dict[str, Any]:
        """After a run's transfers: the circuits the clients' streams used (pinned paths
        checked), clients :meth:`start` restarted, and each relay's congestion-control,
        flow-control, traffic and connection counters (the run's ``tor.json``)."""
        ev: dict[str, Any] = {"version": self.tools.version, "path_violations": [], "paths": {},
                              "relay_metrics": {}, "restarted_clients": self.restarted_clients}
        try:
            ev["path_violations"] = self.path_violations()
            for c in self.client_paths:
                users = self.stream_circuits(c)
                ev["paths"][c] = sorted({p for ps in users.values() for p in ps})
                ev.setdefault("stream_circuits", {})[c] = users
        except LabError as e:
            ev["error"] = str(e)
        for r in self.relays():
            try:
                m = self.relay_metrics(r.name)
            except LabError as e:
                ev["relay_metrics"][r.name] = {"error": str(e)}
                continue
            ev["relay_metrics"][r.name] = {k: x for k, x in m.items() if k.startswith(EVIDENCE_METRICS)}
        return ev

    def path_violations(self) -> list[str]:
        """Stream circuits of pinned clients whose hops are not the pinned relays (empty:
        every stream's circuit followed its pins)."""
        bad = []
        for client, paths in self.client_paths.items():
            if not paths:
                continue
            for user, circs in self.stream_circuits(client).items():
                for path in circs:
                    hops = path.split(",")
                    want = [paths.get("EntryNodes"), *([paths.get("MiddleNodes")] * max(0, len(hops) - 2)),
                            paths.get("ExitNodes")]
                    if len(hops) < 2 or any(w is not None and h not in w for h, w in zip(hops, want)):
                        bad.append(f"{client} user {user}: {path}")
        return bad


def check_tor_variants(kind: str, chosen: list[str], tor_variants: list[str]) -> None:
    """Refuse, before a run starts, chosen variants that need tor when it is not installed."""
    need = [v for v in chosen if v in tor_variants]
    if not need:
        return
    reason = tortools.tor_unavailable_reason()
    if reason:
        rest = [v for v in chosen if v not in need]
        raise LabError(f"{kind}: variant(s) {', '.join(need)} run Debian's tor, which is not "
                       f"available ({reason}); install it (`make deps`) or choose the others"
                       + (f" with --variants {','.join(rest)}" if rest else ""))


def standalone_variants(kind: str, chosen: list[str], tor_variants: list[str], *, explicit: bool,
                        say: Callable[[str], None]) -> list[str]:
    """The variants a standalone run goes ahead with: without tor, a default list loses its
    tor variants (with a note), an explicit one is refused (LabError, see
    :func:`check_tor_variants`)."""
    if explicit or tortools.tor_unavailable_reason() is None:
        check_tor_variants(kind, chosen, tor_variants)
        return chosen
    rest = [v for v in chosen if v not in tor_variants]
    say(f"{kind}: tor is not available ({tortools.tor_unavailable_reason()}): leaving out "
        f"{', '.join(v for v in chosen if v in tor_variants)}")
    return rest


def _main(argv: list[str] | None = None) -> int:
    """``python -m chive_lab.tor_netns circuit-status|metrics|consensus …``: read a tor
    node's control or metrics port, or probe the authority's consensus, from inside a host."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m chive_lab.tor_netns",
                                 description="Read a tor node's control or metrics port (run "
                                             "inside the node's namespace).")
    ap.add_argument("what", choices=["circuit-status", "metrics", "consensus"])
    ap.add_argument("--dir", type=Path, help="the node's DataDirectory (circuit-status)")
    ap.add_argument("--control-port", type=int, default=0)
    ap.add_argument("--metrics-port", type=int, default=0)
    ap.add_argument("--url", help="consensus: the authority's consensus URL")
    ap.add_argument("--relays", default="", help="consensus: nicknames that must be usable at every hop")
    a = ap.parse_args(argv)
    try:
        if a.what == "consensus":
            relays = [r for r in a.relays.split(",") if r]

            def not_running_exits(text: str) -> list[str]:
                # A client's pinned exit must carry the Exit flag, not only Running.
                running = tortools.consensus_relays(text)
                return [r for r in relays if r not in running]

            return probe_consensus(a.url or "", not_running_exits, max_bytes=tortools.MAX_CONTROL_REPLY,
                                   listed_as=" as usable at every hop")
        if a.what == "metrics":
            if not a.metrics_port:
                raise LabError("this node has no metrics port")
            sys.stdout.write(tortools.fetch_metrics(a.metrics_port))
        else:
            if not a.control_port or a.dir is None:
                raise LabError("circuit-status needs --dir and --control-port")
            with tortools.control_for({"control_port": a.control_port, "dir": str(a.dir)}) as ctl:
                sys.stdout.write(ctl.getinfo("circuit-status").get("circuit-status", "") + "\n")
    except (OSError, LabError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
