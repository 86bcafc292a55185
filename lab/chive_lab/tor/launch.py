"""Starting a private Tor network on loopback and waiting until it carries traffic.

:func:`start_tor_network` (called by :meth:`chive_lab.network.Network.up` for
``NetworkSpec(impl="tor")``) makes the keys (:mod:`.keys`), writes one torrc per node
(:mod:`.torrc`), starts 3 directory authorities, the relays, a client and ``chive httpd``,
recording each in ``DIR/state.json`` before waiting on anything, and waits until the client
is bootstrapped, its consensus lists every relay as usable at every hop, and a real HTTP fetch
through its SOCKS port returns the expected bytes.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import config as cfg
from ..errors import LabError, RunFailed
from ..ports import any_port
from ..process import is_running, spawn
from ..state import State, save_state
from .control import control_for
from .keys import prepare_keys
from .metrics import consensus_relays
from .node import BANDWIDTH_FILE, STDOUT_LOG, TOR_LOG, TORRC, TorNode, log_tails, start_failed
from .options import client_unmapped, map_params, map_relay_options
from .tools import find_tor_tools, known_torrc_options
from .torrc import build_torrc, render_torrc, torrc_value

if TYPE_CHECKING:  # only for type hints: network imports this package lazily
    from ..network import Network, NetworkInfo, NetworkSpec

__all__ = ["DEFAULT_AUTHORITIES", "HTTPD_ADDRESS", "TOR_MIN_TIMEOUT", "start_tor_network"]

# How many directory authorities a network gets, besides its relays. Three:
# Chutney's minimum for a healthy vote, and the minimum for which a consensus
# takes relay weights from the authorities' bandwidth files (Tor uses measured
# bandwidths only when more than two authorities measured a relay, and never
# counts an authority's measurement of itself; see docs/tor-baseline.md).
DEFAULT_AUTHORITIES = 3
MAX_AUTHORITIES = 9

# Tor test networks take 20-60 s to bootstrap (more on a loaded machine): the
# tor backend waits at least this long whatever NetworkSpec.timeout says.
TOR_MIN_TIMEOUT = 180.0

# The web server listens on another loopback address than the relays. A Tor
# client sends a stream to an address where a relay runs out of that relay
# ("exit enclave", with a 4th hop added before it): with every relay on
# 127.0.0.1 a 3-relay network has no 4-hop path, and streams to 127.0.0.1
# stall for ~20 s until Tor gives up on the enclave.
HTTPD_ADDRESS = "127.0.0.2"

PROBE_BYTES = 1024
_POLL_S = 0.5
_PROGRESS_EVERY_S = 5.0


def start_tor_network(
    net: "Network",
    spec: "NetworkSpec",
    binary: Path,
    dir: Path,
    state: State,
    procs: dict[str, subprocess.Popen],
) -> "NetworkInfo":
    """Start a private Tor network + ``chive httpd`` in ``dir`` and wait until
    it carries traffic. Called by :meth:`Network.up` (which created the state
    file and stops everything recorded in it if this raises).

    A node that exits during start-up, or a network that does not carry a fetch in time,
    raises :class:`~chive_lab.errors.RunFailed` naming the node and quoting its log: that
    run failed, another may not. Bad options and failed key generation stay LabError."""
    from ..network import NetworkInfo, free_ports

    progress = net._progress
    tools = find_tor_tools()
    timeout = max(spec.timeout, TOR_MIN_TIMEOUT)
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    tor_options = known_torrc_options(tools.tor)
    relay_map = map_relay_options(spec.relay_overrides, spec.bandwidth_rate, tor_options)
    param_map = map_params(spec.authority_params)
    unmapped = [u.to_json() for u in relay_map.unmapped + param_map.unmapped
                + client_unmapped(getattr(spec, "client_overrides", {}))]
    for u in unmapped:
        progress(f"tor: {u['kind']} option {u['key']}={u['value']!r} has no Tor equivalent: {u['reason']}")
    for note in relay_map.notes + param_map.notes:
        progress(f"tor: {note}")

    n_auth = getattr(spec, "tor_authorities", DEFAULT_AUTHORITIES)
    # chive's --log-level debug/trace: Tor's info level too (notice is always on).
    verbose = any(w in spec.log_level.lower() for w in ("debug", "trace"))
    relay_names = [f"relay{i}" for i in range(1, spec.relays + 1)]
    # Authority: ORPort, DirPort, ControlPort. Relay: ORPort, ControlPort,
    # MetricsPort. Client: SocksPort, ControlPort. (Tor cannot report the ports it bound, so
    # they are probed; chive httpd gets port 0 and prints the address it bound.)
    ports = iter(free_ports(3 * n_auth + 3 * spec.relays + 2))
    authorities = [
        TorNode(name=f"auth{i}", role="authority", dir=dir / f"auth{i}", control_port=next(ports),
                or_port=next(ports), dir_port=next(ports))
        for i in range(1, n_auth + 1)
    ]
    relays = [
        TorNode(name=name, role="relay", dir=dir / name, control_port=next(ports), or_port=next(ports),
                metrics_port=next(ports))
        for name in relay_names
    ]
    nodes = [*authorities, *relays]
    client = TorNode(name="client", role="client", dir=dir / "client", control_port=next(ports),
                     socks_port=next(ports))

    state.endpoints = {
        "impl": "tor",
        "authority": f"127.0.0.1:{authorities[0].dir_port}",
        "socks": f"127.0.0.1:{client.socks_port}",
        "http": "",  # once httpd reported the port it bound
        "tor": {
            "version": tools.version,
            "binary": tools.tor,
            "authorities": [a.name for a in authorities],
            "nodes": [],
            "consensus_params": param_map.consensus_params,
            "relay_torrc": [[k, torrc_value(v)] for k, v in relay_map.relay_lines],
            "unmapped": unmapped,
            "notes": relay_map.notes + param_map.notes,
        },
    }
    save_state(dir, state)

    progress(f"tor {tools.version}: generating keys for {len(authorities)} directory authorit"
             f"{'y' if len(authorities) == 1 else 'ies'}")
    empty = prepare_keys(tools, [*nodes, client], dir, deadline)
    state.endpoints["authority_identity"] = authorities[0].v3ident
    bwfile = dir / BANDWIDTH_FILE

    for node in [*nodes, client]:
        lines = build_torrc(node, authorities, relay_map, param_map.consensus_params, bwfile, verbose)
        path = node.dir / TORRC
        path.write_text(render_torrc(lines), encoding="utf-8")
        argv = [tools.tor, "-f", str(path), "--defaults-torrc", str(empty)]
        proc, rec = spawn(node.name, argv, log_path=node.dir / STDOUT_LOG, cwd=node.dir, config=path)
        rec.log = str(node.dir / TOR_LOG)  # Tor's own log; stdout.log only has start-up lines
        procs[node.name] = proc
        state.nodes.append(rec)
        state.endpoints["tor"]["nodes"].append(node.to_json())
        save_state(dir, state)  # record before waiting on anything

    httpd_toml = dir / "httpd" / "httpd.toml"
    httpd_cfg = cfg.httpd_config()
    httpd_cfg["Listen"] = any_port(HTTPD_ADDRESS)
    cfg.write_toml(httpd_toml, httpd_cfg)
    net._start("httpd", binary, httpd_toml, state, procs)
    progress(
        f"started {len(authorities)} directory authorit{'y' if len(authorities) == 1 else 'ies'}, "
        f"{spec.relays} relays, a tor client and httpd in {dir}; "
        f"waiting up to {timeout:.0f} s for bootstrap"
    )

    try:
        state.endpoints["http"] = f"http://{net._httpd_address(state, deadline)}"
        save_state(dir, state)
        http = state.endpoints["http"]
        _wait_bootstrap(net, client, relay_names, state, deadline, started)
        net._wait_fetch(f"{http}/bytes/{PROBE_BYTES}", None, "httpd", state, deadline)
        net._wait_fetch(f"{http}/bytes/{PROBE_BYTES}", state.endpoints["socks"], "client", state, deadline)
    except RunFailed:
        raise
    except LabError as e:
        # A fetch that timed out, or a node that exited while one was tried: this
        # network did not come up (Network.up stops what started), another may.
        name = e.node or "client"
        raise start_failed(name, str(e), dir / name, e.log_tail) from e
    progress(f"tor network works: a fetch through {state.endpoints['socks']} returned the expected "
             f"bytes ({time.monotonic() - started:.0f} s after start)")
    return NetworkInfo(
        socks=state.endpoints["socks"],
        http=http,
        dir=str(dir),
        pids=state.pids(),
        authority=state.endpoints["authority"],
        authority_identity=state.endpoints["authority_identity"],
    )


def _check_alive(state: State) -> None:
    """Raise :class:`RunFailed` naming the first node (tor or httpd) that has exited."""
    from ..network import log_tail

    for rec in state.nodes:
        if not is_running(rec.pid):
            log = Path(rec.log)
            # A tor node: its Tor log and stdout; chive httpd: its one log.
            tail = log_tails(log.parent) if log.name == TOR_LOG else log_tail(log, 20)
            raise start_failed(rec.name, f"pid {rec.pid} exited during start-up", log.parent, tail)


def _wait_bootstrap(
    net: "Network", client: TorNode, relays: list[str], state: State, deadline: float, started: float
) -> None:
    """Wait until the client reports 100% bootstrapped and its consensus lists
    every relay as usable at every hop, printing progress every few seconds."""
    last_print = 0.0
    last = "no answer from the client's control port yet"
    while True:
        _check_alive(state)
        now = time.monotonic()
        try:
            with control_for(client.to_json(), timeout=3.0) as ctl:
                phase = ctl.getinfo("status/bootstrap-phase").get("status/bootstrap-phase", "")
                m = re.search(r"PROGRESS=(\d+)", phase)
                pct = int(m.group(1)) if m else 0
                s = re.search(r'SUMMARY="([^"]*)"', phase)
                summary = s.group(1) if s else "?"
                try:
                    ns = ctl.getinfo("ns/all").get("ns/all", "")
                except LabError:
                    ns = ""  # no consensus yet
                known = consensus_relays(ns)
                missing = [r for r in relays if r not in known]
                last = (f"bootstrapped {pct}% ({summary}); consensus lists "
                        f"{len(relays) - len(missing)}/{len(relays)} relays as usable at every hop")
                if pct >= 100 and not missing:
                    net._progress(f"tor: {last} after {now - started:.0f} s")
                    return
        except (OSError, LabError) as e:
            last = f"client control port: {e}"
        if now - last_print >= _PROGRESS_EVERY_S:
            net._progress(f"tor: {last} ({now - started:.0f} s)")
            last_print = now
        if now >= deadline:
            raise start_failed("client", f"tor network did not bootstrap in time: {last}", client.dir)
        time.sleep(_POLL_S)
