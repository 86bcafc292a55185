"""The real Tor as the baseline peer: a private Tor network on loopback,
configured the way Chutney does it, behind the same ``up``/``down`` contract
as a chive network.

``Network.up`` with ``NetworkSpec(impl="tor")`` calls
:func:`start_tor_network`, which

1. makes the directory-authority keys with ``tor-gencert`` and every node's
   relay identity (fingerprint) with ``tor --list-fingerprint``;
2. writes one torrc per node (``DIR/<node>/torrc``): ``TestingTorNetwork 1``,
   fast voting intervals, ``AssumeReachable 1``, ``DirAuthority`` lines with
   the v3ident, every relay an exit allowing 127.0.0.0/8 only, a client with a
   SOCKS port, a ControlPort with cookie authentication on every node and a
   MetricsPort on every relay; the authorities give every relay the same
   measured weight through a bandwidth file;
3. starts 3 directory authorities (``auth1``..; kept out of the data path,
   as a chive network's authority is), the relays ``relay1``.., the client
   and ``chive httpd``, recording each in ``DIR/state.json`` before waiting
   on anything (so ``chive-lab down`` works through the same pid + cmdline +
   start-time checks);
4. waits, printing progress, until the client is bootstrapped, its
   consensus lists every relay, and a real HTTP fetch through its SOCKS port
   returns the expected bytes.

The relay options of a scenario (chive's config keys) are mapped onto torrc
by :func:`map_relay_options` and the consensus parameters by
:func:`map_params`; what has no Tor equivalent is listed, with the reason, by
:func:`unmapped_options`. After (or during) a run :func:`collect_tor_metrics`
gathers Tor's own view: relay traffic from the MetricsPort and the control
port, and the client's circuits and circuit-build-time histogram.

Standard library only; Linux only, like the rest of the lab.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from . import config as cfg
from .errors import LabError
from .process import is_running, spawn
from .state import State, load_state, save_state

if TYPE_CHECKING:  # only for type hints: network imports this module lazily
    from .network import Network, NetworkInfo, NetworkSpec

__all__ = [
    "DEFAULT_AUTHORITIES",
    "MIN_BANDWIDTH_RATE",
    "TOR_MIN_TIMEOUT",
    "ControlClient",
    "TorMapping",
    "TorTools",
    "TorUnavailable",
    "Unmapped",
    "collect_tor_metrics",
    "find_tor_tools",
    "map_params",
    "map_relay_options",
    "parse_torrc",
    "render_torrc",
    "start_tor_network",
    "tor_unavailable_reason",
    "unmapped_options",
]

# How many directory authorities a network gets, besides its relays. Three:
# Chutney's minimum for a healthy vote, and the minimum for which a consensus
# takes relay weights from the authorities' bandwidth files (Tor uses measured
# bandwidths only when more than two authorities measured a relay, and never
# counts an authority's measurement of itself; see docs/tor-baseline.md).
DEFAULT_AUTHORITIES = 3
MAX_AUTHORITIES = 9

# Tor refuses a relay whose BandwidthRate is below 75 KBytes/s
# (RELAY_REQUIRED_MIN_BANDWIDTH; "For servers, it must be at least 76800").
MIN_BANDWIDTH_RATE = 76800

# Tor test networks take 20-60 s to bootstrap (more on a loaded machine): the
# tor backend waits at least this long whatever NetworkSpec.timeout says.
TOR_MIN_TIMEOUT = 180.0

# chive's token buckets refill every <= 10 ms; Tor's default is 100 ms, which
# adds bursts of queueing under a rate limit. Under a rate limit the lab sets
# 10 ms so both are on the same footing (override with --set
# TokenBucketRefillInterval=100); without one Tor keeps its default.
TOKEN_BUCKET_REFILL_MS = 10

# Conflux (Tor 0.4.8+: a client sends an exit stream over two linked
# circuits) is off by default in the lab's client; see docs/tor-baseline.md.
CLIENT_CONFLUX = os.environ.get("CHIVE_LAB_TOR_CONFLUX", "0") == "1"

# The web server listens on another loopback address than the relays. A Tor
# client sends a stream to an address where a relay runs out of that relay
# ("exit enclave", with a 4th hop added before it): with every relay on
# 127.0.0.1 a 3-relay network has no 4-hop path, and streams to 127.0.0.1
# stall for ~20 s until Tor gives up on the enclave.
HTTPD_ADDRESS = "127.0.0.2"

TORRC = "torrc"
BANDWIDTH_FILE = "bandwidth-file"
TOR_LOG = "tor.log"
TOR_INFO_LOG = "tor-info.log"
STDOUT_LOG = "stdout.log"
METRICS_FILE = "tor-metrics.json"
PROBE_BYTES = 1024
_POLL_S = 0.5
_PROGRESS_EVERY_S = 5.0
# Bounds on what the lab reads from Tor (control replies, metrics pages).
MAX_CONTROL_REPLY = 8 << 20
MAX_METRICS_BYTES = 8 << 20
MAX_STATE_FILE = 4 << 20

_OPTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_HEX40 = re.compile(r"^[0-9A-F]{40}$")


class TorUnavailable(LabError):
    """tor or tor-gencert is missing or does not run."""


# ---------------------------------------------------------------------------
# Finding tor


@dataclass(frozen=True)
class TorTools:
    """The tor binaries the lab runs."""

    tor: str
    gencert: str
    version: str
    """E.g. ``0.4.9.11``."""


def _which(env: str, name: str, extra: tuple[str, ...]) -> str | None:
    given = os.environ.get(env)
    if given:
        return given if os.access(given, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    # /usr/sbin is not on every user's PATH, and Debian puts tor there.
    for path in extra:
        if os.access(path, os.X_OK):
            return path
    return None


@functools.lru_cache(maxsize=4)
def _find_tools(tor_env: str | None, gencert_env: str | None) -> TorTools | str:
    # Arguments only key the cache on the environment; the lookup reads os.environ.
    del tor_env, gencert_env
    tor = _which("TOR_BIN", "tor", ("/usr/sbin/tor", "/usr/bin/tor"))
    if tor is None:
        return (
            "tor is not installed (Debian: `apt-get install tor`, which `make deps` does; "
            "or set TOR_BIN to a tor binary)"
        )
    gencert = _which("TOR_GENCERT", "tor-gencert", ("/usr/bin/tor-gencert", "/usr/sbin/tor-gencert"))
    if gencert is None:
        return "tor-gencert is not installed (Debian package `tor`; or set TOR_GENCERT)"
    try:
        out = subprocess.run([tor, "--version"], capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`{tor} --version` failed: {e}"
    text = out.stdout.decode("utf-8", "replace")
    m = re.search(r"Tor version (\d+\.\d+\.\d+(?:\.\d+)?)", text)
    if out.returncode != 0 or m is None:
        return f"`{tor} --version` did not report a Tor version (exit {out.returncode})"
    return TorTools(tor=tor, gencert=gencert, version=m.group(1))


def find_tor_tools() -> TorTools:
    """tor and tor-gencert (``$TOR_BIN`` / ``$TOR_GENCERT`` or PATH), checked to
    run; raise :class:`TorUnavailable` with what to do otherwise."""
    found = _find_tools(os.environ.get("TOR_BIN"), os.environ.get("TOR_GENCERT"))
    if isinstance(found, str):
        raise TorUnavailable(f"--impl tor needs the real Tor: {found}")
    return found


def tor_unavailable_reason() -> str | None:
    """None if the tor backend can run here, else why not (for skips)."""
    try:
        find_tor_tools()
    except TorUnavailable as e:
        return str(e)
    return None


@functools.lru_cache(maxsize=4)
def known_torrc_options(tor: str | None = None) -> frozenset[str]:
    """Option names this tor accepts (``tor --list-torrc-options``); a built-in
    list of the options the lab writes when tor cannot be asked."""
    if tor:
        try:
            out = subprocess.run(
                [tor, "--list-torrc-options"], capture_output=True, timeout=30, stdin=subprocess.DEVNULL
            )
            names = {
                line.strip()
                for line in out.stdout.decode("utf-8", "replace").splitlines()
                if _OPTION_NAME.match(line.strip())
            }
            if out.returncode == 0 and len(names) > 50:
                return frozenset(names)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return _BUILTIN_OPTIONS


# The options the lab itself writes, plus the ones the mapping produces: enough
# to check generated torrcs when tor is not installed.
_BUILTIN_OPTIONS = frozenset(
    """TestingTorNetwork DataDirectory Nickname RunAsDaemon ShutdownWaitLength Log SafeLogging
    ControlPort CookieAuthentication AssumeReachable PathsNeededToBuildCircuits TestingDirAuthVoteExit
    TestingDirAuthVoteGuard TestingDirAuthVoteHSDir TestingMinExitFlagThreshold V3AuthNIntervalsValid
    DirAuthority AuthoritativeDirectory V3AuthoritativeDirectory ContactInfo DirPort
    TestingV3AuthInitialVotingInterval V3AuthVotingInterval TestingV3AuthInitialVoteDelay V3AuthVoteDelay
    TestingV3AuthInitialDistDelay V3AuthDistDelay ConsensusParams ORPort Address ExitRelay ExitPolicy
    ExitPolicyRejectPrivate ServerDNSDetectHijacking ServerDNSTestAddresses ServerDNSResolvConfFile
    MetricsPort MetricsPortPolicy SocksPort UseMicrodescriptors BandwidthRate BandwidthBurst
    CircuitPriorityHalflife Schedulers TokenBucketRefillInterval KISTSchedRunInterval
    MaxCircuitDirtiness SocksPolicy ClientOnly ConfluxEnabled V3BandwidthsFile""".split()
)


# ---------------------------------------------------------------------------
# torrc text


def _torrc_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise LabError(f"torrc value {text[:40]!r} contains a line break")
    return text


def render_torrc(lines: list[tuple[str, Any]]) -> str:
    """torrc text from (option, value) pairs, one ``Option value`` per line
    (repeated options stay repeated: Tor appends them, e.g. ExitPolicy)."""
    out = ["# Written by chive-lab (chive_lab/tor.py); one option per line."]
    for key, value in lines:
        if not _OPTION_NAME.match(key):
            raise LabError(f"bad torrc option name {key!r}")
        text = _torrc_value(value)
        out.append(f"{key} {text}" if text else key)
    return "\n".join(out) + "\n"


def parse_torrc(text: str) -> list[tuple[str, str]]:
    """(option, value) pairs of a torrc (comments and blank lines skipped).
    Raise LabError on a line that is not ``Option [value]``."""
    pairs = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        if not _OPTION_NAME.match(key):
            raise LabError(f"torrc line {n}: {raw[:60]!r} does not start with an option name")
        pairs.append((key, value.strip()))
    return pairs


# ---------------------------------------------------------------------------
# Mapping chive's options onto Tor


@dataclass(frozen=True)
class Unmapped:
    """An option that has no Tor equivalent, and why."""

    key: str
    value: Any
    kind: str
    """``relay`` (a --set key), ``param`` (a consensus parameter) or ``client``
    (a ``[network.client]`` key)."""
    reason: str

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"key": self.key, "value": self.value, "kind": self.kind, "reason": self.reason}


@dataclass
class TorMapping:
    """Relay torrc lines and consensus parameters derived from a spec."""

    relay_lines: list[tuple[str, Any]] = field(default_factory=list)
    consensus_params: dict[str, int] = field(default_factory=dict)
    unmapped: list[Unmapped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the mapping did beyond a 1:1 copy (for the report)."""


# chive relay keys with no Tor counterpart, and why.
_CHIVE_ONLY_RELAY_KEYS = {
    "OutbufCells": "chive's bounded per-connection output buffer (cells handed to a connection "
    "before they are written); Tor has no such cap: its KIST scheduler limits writes by the "
    "socket's state instead",
    "CrossChannelPriority": "chive's cross-channel budget under a shared write rate; Tor's KIST "
    "scheduler orders channels by their best circuit in the same way, always on",
    "ReadRateMargin": "Tor applies BandwidthRate to reading and writing alike; chive lets "
    "reading go this fraction faster so that queues form in circuit queues, where the scheduler "
    "acts, rather than in kernel buffers",
    "QuietReserve": "chive keeps this much of the write bucket for circuits with a low EWMA "
    "count, so their bursts need not wait for tokens behind bulk; Tor's token buckets serve "
    "every circuit alike",
    "LinkUnsentLimit": "chive sets TCP_NOTSENT_LOWAT on link sockets so the backlog waits in "
    "circuit queues; Tor's KIST scheduler gets the same effect by writing only what the socket's "
    "congestion window can send soon",
    "LinkCongestionControl": "Tor's connections use the system's TCP congestion control; the "
    "lab sets that per host (scenario key cc)",
    "PublishInterval": "Tor relays choose when to upload descriptors themselves "
    "(at start and when they change; about every 18 h otherwise)",
    "Log": "the lab sets Tor's logging itself (notice level to DIR/<node>/tor.log)",
}

# chive consensus parameters with no Tor counterpart.
_CHIVE_ONLY_PARAMS = {
    "OutbufCells": "chive's bounded per-connection output buffer has no Tor counterpart",
}

# torrc options the lab manages (ports, directories, authorities, logging):
# --set may not override them, or the network would not come up.
MANAGED_TOR_KEYS = frozenset(
    """Nickname DataDirectory ORPort DirPort SocksPort ControlPort MetricsPort MetricsPortPolicy
    Address DirAuthority AlternateDirAuthority RunAsDaemon CookieAuthentication CookieAuthFile
    TestingTorNetwork PidFile Authority AuthorityIdentity AuthoritativeDirectory
    V3AuthoritativeDirectory""".split()
)

_SCHEDULERS = ("rr", "ewma")


def _int_value(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LabError(f"--set {key} must be an integer number of bytes/s, got {value!r}")
    if value < 0:
        raise LabError(f"--set {key} must be >= 0, got {value}")
    return value


def _check_rate(key: str, value: int) -> None:
    if 0 < value < MIN_BANDWIDTH_RATE:
        raise LabError(
            f"{key} {value} bytes/s is below Tor's minimum for a relay ({MIN_BANDWIDTH_RATE} "
            "bytes/s = 75 KBytes/s): tor would refuse to start"
        )


def map_relay_options(
    overrides: Mapping[str, Any],
    bandwidth_rate: int | None = None,
    tor_options: frozenset[str] | None = None,
) -> TorMapping:
    """Map a spec's relay options onto torrc lines for every relay.

    - ``bandwidth_rate`` (``--bandwidth-rate``): ``BandwidthRate`` and
      ``BandwidthBurst`` (bytes/s); 0 or None = unlimited (no line).
    - ``BandwidthRate`` / ``BandwidthBurst``: the same lines (0 = unlimited;
      a burst of 0 means "same as the rate", as in chive).
    - ``CircuitPriorityHalflife`` (seconds): the same torrc option.
    - ``Scheduler = "rr"``: ``CircuitPriorityHalflife 0`` (EWMA off, Tor's
      round-robin circuitmux); ``"ewma"``: EWMA on, with the given half-life
      or else the consensus one (Tor's default ``CircuitPriorityHalflife -1``).
    - ``ExitPolicy`` (list or string) and ``ExitPolicyRejectPrivate``.
    - any other key Tor knows as a torrc option (``Schedulers``,
      ``KISTSchedRunInterval``, ``TokenBucketRefillInterval`` ...) is copied
      as is (a list becomes one line per item, a bool 1/0);
    - everything else is reported in ``unmapped`` with the reason.

    Raise LabError for values Tor would refuse (a rate below 76800 bytes/s)
    or for keys the lab manages (ports, directories, authorities).
    """
    known = tor_options if tor_options is not None else _BUILTIN_OPTIONS
    m = TorMapping()
    rate = burst = None
    if bandwidth_rate:
        rate = burst = _int_value("--bandwidth-rate", bandwidth_rate)
    halflife: Any = None
    scheduler: str | None = None
    passthrough: list[tuple[str, Any]] = []
    for key, value in overrides.items():
        if key in MANAGED_TOR_KEYS:
            raise LabError(f"--set {key} is managed by the lab and cannot be overridden")
        if key == "BandwidthRate":
            rate = _int_value(key, value)
        elif key == "BandwidthBurst":
            burst = _int_value(key, value)
        elif key == "CircuitPriorityHalflife":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise LabError(f"--set CircuitPriorityHalflife must be a number of seconds, got {value!r}")
            halflife = value
        elif key == "Scheduler":
            if value not in _SCHEDULERS:
                raise LabError(f"--set Scheduler must be one of {', '.join(_SCHEDULERS)}, got {value!r}")
            scheduler = value
        elif key == "ExitPolicy":
            rules = [value] if isinstance(value, str) else value
            if not isinstance(rules, list) or not rules or not all(isinstance(r, str) for r in rules):
                raise LabError(f"--set ExitPolicy must be a string or a list of strings, got {value!r}")
            passthrough.append(("ExitPolicy", ", ".join(rules)))
        elif key == "ExitPolicyRejectPrivate":
            passthrough.append((key, bool(value)))
        elif key in _CHIVE_ONLY_RELAY_KEYS:
            m.unmapped.append(Unmapped(key, value, "relay", _CHIVE_ONLY_RELAY_KEYS[key]))
        elif key in known:
            items = value if isinstance(value, list) else [value]
            passthrough.extend((key, item) for item in items)
            m.notes.append(f"{key} copied to every relay's torrc as a Tor option")
        else:
            m.unmapped.append(
                Unmapped(key, value, "relay", "neither a chive option with a Tor counterpart nor a torrc option")
            )

    if rate is not None and rate > 0:
        _check_rate("BandwidthRate", rate)
        if not burst:
            burst = rate  # chive: burst 0 = same as the rate
        if burst < rate:
            raise LabError(f"BandwidthBurst {burst} is below BandwidthRate {rate}: Tor refuses that")
        m.relay_lines += [("BandwidthRate", f"{rate} bytes"), ("BandwidthBurst", f"{burst} bytes")]
    elif burst:
        # A burst without a rate: Tor's default rate (1 GByte/s) is higher than
        # any burst the lab would set, and Tor refuses burst < rate.
        m.unmapped.append(
            Unmapped("BandwidthBurst", burst, "relay", "a burst without a BandwidthRate has no Tor equivalent")
        )
    if scheduler == "rr":
        m.relay_lines.append(("CircuitPriorityHalflife", 0))
        m.notes.append("Scheduler=rr: CircuitPriorityHalflife 0 (EWMA off)")
        if halflife not in (None, 0):
            m.notes.append(f"CircuitPriorityHalflife={halflife} ignored: Scheduler=rr turns EWMA off")
    elif halflife is not None:
        m.relay_lines.append(("CircuitPriorityHalflife", halflife))
    if scheduler == "ewma" and halflife == 0:
        m.notes.append("Scheduler=ewma with CircuitPriorityHalflife=0: EWMA is off (as in chive)")
    m.relay_lines += passthrough
    return m


def map_params(params: Mapping[str, int]) -> TorMapping:
    """Map ``--param`` entries onto the authorities' ``ConsensusParams``.

    Every parameter is copied (Tor keeps parameters it does not know), except
    chive-only ones, which are reported as unmapped. ``circwindow`` is Tor's
    own parameter, but Tor 0.4.9 negotiates congestion control (``cc_alg``,
    Vegas by default) with exits and then ignores the fixed window: so when
    ``circwindow`` is given and ``cc_alg`` is not, ``cc_alg=0`` (fixed SENDME
    windows, as chive has) is added, and a note says so.
    """
    m = TorMapping()
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise LabError(f"network parameter {key} must be an integer, got {value!r}")
        if not -(2**31) <= value < 2**31:
            raise LabError(f"network parameter {key}={value} does not fit Tor's 32-bit parameters")
        if key in _CHIVE_ONLY_PARAMS:
            m.unmapped.append(Unmapped(key, value, "param", _CHIVE_ONLY_PARAMS[key]))
            continue
        if key == "circwindow" and not 100 <= value <= 1000:
            raise LabError(f"circwindow must be 100..1000 (Tor's range), got {value}")
        m.consensus_params[key] = value
    if "circwindow" in m.consensus_params and "cc_alg" not in m.consensus_params:
        m.consensus_params["cc_alg"] = 0
        m.notes.append(
            "cc_alg=0 added: with congestion control (Tor's default, Vegas) the circuit window "
            "is not fixed and circwindow would have no effect"
        )
    return m


def client_unmapped(client_overrides: Mapping[str, Any]) -> list[Unmapped]:
    """A scenario's ``[network.client]`` keys: the lab does not apply them to a Tor client."""
    return [Unmapped(k, v, "client", "chive client option; the Tor client runs with its defaults")
            for k, v in client_overrides.items()]


def unmapped_options(
    relay_overrides: Mapping[str, Any],
    authority_params: Mapping[str, int] | None = None,
    tor_options: frozenset[str] | None = None,
    client_overrides: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The options of a spec that have no Tor equivalent, each as
    ``{"key", "value", "kind", "reason"}``, so a report can say "no Tor
    equivalent" next to them."""
    relay = map_relay_options(relay_overrides, None, tor_options)
    params = map_params(authority_params or {})
    client = client_unmapped(client_overrides or {})
    return [u.to_json() for u in relay.unmapped + params.unmapped + client]


def consensus_params_line(params: Mapping[str, int]) -> str:
    """The value of a ``ConsensusParams`` line: ``k=v`` sorted by name (Tor
    wants them sorted)."""
    return " ".join(f"{k}={params[k]}" for k in sorted(params))


# ---------------------------------------------------------------------------
# Node plans and torrc generation


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
        }


def _common_lines(node: TorNode, verbose: bool = False) -> list[tuple[str, Any]]:
    lines: list[tuple[str, Any]] = [
        ("TestingTorNetwork", 1),
        ("DataDirectory", node.dir),
        ("RunAsDaemon", 0),
        ("ShutdownWaitLength", 0),
        ("Log", f"notice file {node.dir / TOR_LOG}"),
        ("SafeLogging", 0),
        ("ControlPort", f"127.0.0.1:{node.control_port}"),
        ("CookieAuthentication", 1),
        # Chutney's "rapid bootstrap" options: fast, fine for a lab network.
        ("AssumeReachable", 1),
        ("PathsNeededToBuildCircuits", 0.25),
        ("TestingDirAuthVoteExit", "*"),
        ("TestingDirAuthVoteGuard", "*"),
        ("TestingMinExitFlagThreshold", 0),
        ("V3AuthNIntervalsValid", 2),
    ]
    if verbose:
        lines.append(("Log", f"info file {node.dir / TOR_INFO_LOG}"))
    if node.role != "client":
        lines.append(("Nickname", node.name))
    return lines


def _relay_lines(node: TorNode, mapping: TorMapping) -> list[tuple[str, Any]]:
    lines: list[tuple[str, Any]] = [
        ("ContactInfo", f"{node.name}@chive-lab.invalid"),
        ("ORPort", f"{node.address}:{node.or_port}"),
        ("Address", node.address),
        ("SocksPort", 0),
        ("MetricsPort", f"127.0.0.1:{node.metrics_port}"),
        ("MetricsPortPolicy", "accept 127.0.0.1"),
        ("ExitRelay", 1),
        ("ExitPolicyRejectPrivate", 0),
        # Exits reach only the lab's loopback servers by IP address: no DNS
        # (as Chutney: an empty resolv.conf means no nameservers, no probes).
        ("ServerDNSDetectHijacking", 0),
        ("ServerDNSTestAddresses", ""),
        ("ServerDNSResolvConfFile", "/dev/null"),
    ]
    overridden = {k for k, _ in mapping.relay_lines}
    if "BandwidthRate" in overridden and "TokenBucketRefillInterval" not in overridden:
        # Only under a rate limit: without one the refill interval changes
        # nothing but Tor's timer load, and the baseline stays Tor's default.
        lines.append(("TokenBucketRefillInterval", TOKEN_BUCKET_REFILL_MS))
    if "ExitPolicy" not in overridden:
        # Chutney's exit policy. With "accept 127.0.0.0/8:*, reject *:*" the
        # tor 0.4.9 client finds no exit for a loopback target ("Found 0
        # servers that might support 0/1 pending connections"; Chutney notes
        # the same for microdescriptors, Tor #11264), so every address is
        # accepted. The lab only ever asks for loopback targets, and exits
        # resolve no names (ServerDNSResolvConfFile /dev/null).
        lines += [("ExitPolicy", "accept 127.0.0.0/8:*"), ("ExitPolicy", "accept *:*")]
    if "ExitPolicyRejectPrivate" in overridden:
        lines = [kv for kv in lines if kv[0] != "ExitPolicyRejectPrivate"]
    return lines + list(mapping.relay_lines)


def _authority_lines(node: TorNode, params: Mapping[str, int]) -> list[tuple[str, Any]]:
    lines: list[tuple[str, Any]] = [
        # An authority must be a relay (ORPort) but is kept out of the data
        # path: no exit, and the client excludes it (ExcludeNodes).
        ("ContactInfo", f"{node.name}@chive-lab.invalid"),
        ("ORPort", f"{node.address}:{node.or_port}"),
        ("Address", node.address),
        ("SocksPort", 0),
        ("ExitRelay", 0),
        ("ExitPolicy", "reject *:*"),
        ("AuthoritativeDirectory", 1),
        ("V3AuthoritativeDirectory", 1),
        ("DirPort", f"{node.address}:{node.dir_port}"),
        # As fast as Tor allows (Chutney's values): the first consensus comes
        # after ~5 s, later ones every 10 s. VoteDelay + DistDelay < interval.
        ("TestingV3AuthInitialVotingInterval", 5),
        ("V3AuthVotingInterval", 10),
        ("TestingV3AuthInitialVoteDelay", 2),
        ("V3AuthVoteDelay", 2),
        ("TestingV3AuthInitialDistDelay", 2),
        ("V3AuthDistDelay", 2),
    ]
    if params:
        lines.append(("ConsensusParams", consensus_params_line(params)))
    return lines


def dir_authority_line(node: TorNode) -> str:
    """The value of the ``DirAuthority`` line naming authority ``node``."""
    return (
        f"{node.name} orport={node.or_port} no-v2 v3ident={node.v3ident} "
        f"{node.address}:{node.dir_port} {node.fingerprint}"
    )


def build_torrc(
    node: TorNode,
    authorities: list[TorNode],
    mapping: TorMapping,
    consensus_params: Mapping[str, int],
    bandwidth_file: Path | None = None,
    verbose: bool = False,
) -> list[tuple[str, Any]]:
    """Every torrc line of ``node``; authorities read relay weights from
    ``bandwidth_file`` when given (see :func:`bandwidth_file`). The relay
    options of ``mapping`` apply to relays only: authorities carry no user
    traffic. ``verbose`` adds an info-level log (``tor-info.log``)."""
    lines = _common_lines(node, verbose)
    lines += [("DirAuthority", dir_authority_line(a)) for a in authorities]
    if node.role == "relay":
        lines += _relay_lines(node, mapping)
    if node.role == "authority":
        lines += _authority_lines(node, consensus_params)
        if bandwidth_file is not None:
            lines.append(("V3BandwidthsFile", bandwidth_file))
    if node.role == "client":
        lines += [
            ("SocksPort", f"{node.address}:{node.socks_port}"),
            # One circuit per stream, as chive and the papers have: Tor 0.4.8+
            # would otherwise split exit streams over two conflux legs.
            ("ConfluxEnabled", 1 if CLIENT_CONFLUX else 0),
        ]
        if authorities:
            # Paths use the relays only, as in a chive network, whose authority
            # is not a relay. (Directory fetches from authorities stay allowed:
            # StrictNodes is 0.)
            lines.append(("ExcludeNodes", ",".join(f"${a.fingerprint}" for a in authorities)))
    return lines


# ---------------------------------------------------------------------------
# Control port


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


def _control(node: Mapping[str, Any], timeout: float = 5.0) -> ControlClient:
    return ControlClient(int(node["control_port"]), Path(node["dir"]) / "control_auth_cookie", timeout)


# ---------------------------------------------------------------------------
# Starting the network


def _run(argv: list[str], *, cwd: Path, log: Path, stdin: bytes | None, timeout: float) -> str:
    """Run a setup command; append its output to ``log``; raise LabError on failure."""
    try:
        out = subprocess.run(argv, input=stdin, capture_output=True, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise LabError(f"`{' '.join(argv)}` did not finish within {timeout:.0f} s") from e
    except OSError as e:
        raise LabError(f"cannot run {argv[0]}: {e}") from e
    text = out.stdout.decode("utf-8", "replace") + out.stderr.decode("utf-8", "replace")
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(argv)}\n{text}\n")
    if out.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` exited with status {out.returncode}", log_tail=text[-2000:])
    return out.stdout.decode("utf-8", "replace")


def _make_authority_keys(tools: TorTools, node: TorNode, deadline: float) -> None:
    """tor-gencert: the authority's v3 identity key, signing key and certificate."""
    keys = node.dir / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    log = node.dir / "keygen.log"
    left = max(5.0, deadline - time.monotonic())
    # The identity key is encrypted with an empty passphrase read from fd 0:
    # nothing to type, nothing stored beside the key.
    _run(
        [tools.gencert, "--create-identity-key", "-m", "12", "-a", f"{node.address}:{node.dir_port}",
         "-i", str(keys / "authority_identity_key"), "-s", str(keys / "authority_signing_key"),
         "-c", str(keys / "authority_certificate"), "--passphrase-fd", "0"],
        cwd=node.dir, log=log, stdin=b"\n", timeout=min(60.0, left),
    )
    cert = (keys / "authority_certificate").read_text(encoding="ascii", errors="replace")
    m = re.search(r"^fingerprint ([0-9A-F]{40})$", cert, re.M)
    if m is None:
        raise LabError(f"{keys / 'authority_certificate'} has no fingerprint line", node=node.name)
    node.v3ident = m.group(1)


def _make_relay_identity(tools: TorTools, node: TorNode, empty: Path, deadline: float) -> None:
    """tor --list-fingerprint: creates the relay's identity keys in its
    DataDirectory (the started tor reuses them) and tells us its fingerprint."""
    (node.dir / "keys").mkdir(parents=True, exist_ok=True)
    log = node.dir / "keygen.log"
    _run(
        [tools.tor, "-f", str(empty), "--defaults-torrc", str(empty), "--list-fingerprint",
         "--DataDirectory", str(node.dir), "--ORPort", f"{node.address}:{node.or_port}",
         "--Address", node.address, "--Nickname", node.name],
        cwd=node.dir, log=log, stdin=None, timeout=min(60.0, max(5.0, deadline - time.monotonic())),
    )
    try:
        text = (node.dir / "fingerprint").read_text(encoding="ascii", errors="replace").split()
    except OSError as e:
        raise LabError(f"tor --list-fingerprint wrote no fingerprint for {node.name}: {e}") from e
    fp = "".join(text[1:]).upper()
    if len(text) < 2 or not _HEX40.match(fp):
        raise LabError(f"{node.dir / 'fingerprint'} does not hold a 40-hex fingerprint", node=node.name)
    node.fingerprint = fp


def prepare_keys(tools: TorTools, nodes: list[TorNode], dir: Path, deadline: float) -> Path:  # noqa: A002
    """Before any tor of ``nodes`` starts: private DataDirectories, every authority's v3 keys,
    every authority's and relay's identity (fingerprints filled in), and ``dir/BANDWIDTH_FILE``
    giving the relays equal weights. Returns the empty torrc used as ``--defaults-torrc``.
    Errors name the node and carry its log tail."""
    empty = dir / "empty-torrc"
    empty.write_text("", encoding="utf-8")
    for node in nodes:
        node.dir.mkdir(parents=True, exist_ok=True)
        # Tor wants its DataDirectory private (0700) and says so otherwise.
        os.chmod(node.dir, 0o700)

    def named(node: TorNode, e: LabError) -> LabError:
        return LabError(str(e), node=node.name, log_tail=e.log_tail or _log_tails(node.dir))

    for a in (n for n in nodes if n.role == "authority"):
        try:
            _make_authority_keys(tools, a, deadline)
        except LabError as e:
            raise named(a, e) from e
    # Every relay's identity (for the authorities' DirAuthority lines and the
    # bandwidth file); a few at a time, each is one short tor run.
    servers = [n for n in nodes if n.role != "client"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {n.name: pool.submit(_make_relay_identity, tools, n, empty, deadline) for n in servers}
        for n in servers:
            try:
                futures[n.name].result()
            except LabError as e:
                raise named(n, e) from e
    relays = [n for n in nodes if n.role == "relay"]
    (dir / BANDWIDTH_FILE).write_text(bandwidth_file(relays, time.time()), encoding="utf-8")
    return empty


def bandwidth_file(relays: list[TorNode], now: float, bw: int = 1000) -> str:
    """A bandwidth file (bandwidth-file-spec 1.0.0: a timestamp line, then
    ``node_id=$FP bw=N`` per relay) giving every relay the same measured
    weight.

    Without it each relay's weight is its self-reported bandwidth, which in a
    fresh test network is 0 or a few KB/s and jumps after the first transfers:
    path selection then sticks to one relay, and a later consensus can leave
    the client with "no available nodes" for an exit. Equal weights give
    uniform paths, as the lab's chive relays (same config, same weight) get.
    """
    lines = [str(int(now))]
    lines += [f"node_id=${r.fingerprint} bw={bw} nick={r.name}" for r in relays]
    return "\n".join(lines) + "\n"


def _log_tails(node_dir: Path) -> str:
    from .network import log_tail

    parts = []
    for name in (TOR_LOG, STDOUT_LOG):
        p = node_dir / name
        if p.exists() and p.stat().st_size:
            parts.append(f"[{name}]\n{log_tail(p, 20)}")
    return "\n".join(parts) or "(no log)"


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
    file and stops everything recorded in it if this raises)."""
    from .network import NetworkInfo, free_ports

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
    # MetricsPort. Client: SocksPort, ControlPort. httpd: one port.
    ports = iter(free_ports(3 * n_auth + 3 * spec.relays + 3))
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
    http_port = next(ports)

    state.endpoints = {
        "impl": "tor",
        "authority": f"127.0.0.1:{authorities[0].dir_port}",
        "socks": f"127.0.0.1:{client.socks_port}",
        "http": f"http://{HTTPD_ADDRESS}:{http_port}",
        "tor": {
            "version": tools.version,
            "binary": tools.tor,
            "authorities": [a.name for a in authorities],
            "nodes": [],
            "consensus_params": param_map.consensus_params,
            "relay_torrc": [[k, _torrc_value(v)] for k, v in relay_map.relay_lines],
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
    httpd_cfg = cfg.httpd_config(port=http_port)
    httpd_cfg["Listen"] = f"{HTTPD_ADDRESS}:{http_port}"
    cfg.write_toml(httpd_toml, httpd_cfg)
    net._start("httpd", binary, httpd_toml, state, procs)
    progress(
        f"started {len(authorities)} directory authorit{'y' if len(authorities) == 1 else 'ies'}, "
        f"{spec.relays} relays, a tor client and httpd in {dir}; "
        f"waiting up to {timeout:.0f} s for bootstrap"
    )

    _wait_bootstrap(net, client, relay_names, state, deadline, started)
    http = state.endpoints["http"]
    net._wait_fetch(f"{http}/bytes/{PROBE_BYTES}", None, "httpd", state, deadline)
    net._wait_fetch(f"{http}/bytes/{PROBE_BYTES}", state.endpoints["socks"], "client", state, deadline)
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
    for rec in state.nodes:
        if not is_running(rec.pid):
            raise LabError(
                f"{rec.name} (pid {rec.pid}) exited during start-up",
                node=rec.name,
                log_tail=_log_tails(Path(rec.log).parent),
            )


def _consensus_relays(text: str) -> set[str]:
    """Nicknames of the ``r`` lines of a network-status document that carry
    the Running flag (the ``s`` line after them)."""
    running = set()
    current = None
    for line in text.splitlines():
        if line.startswith("r "):
            parts = line.split()
            current = parts[1] if len(parts) > 1 else None
        elif line.startswith("s ") and current is not None:
            if "Running" in line.split() and "Exit" in line.split():
                running.add(current)
            current = None
    return running


def _wait_bootstrap(
    net: "Network", client: TorNode, relays: list[str], state: State, deadline: float, started: float
) -> None:
    """Wait until the client reports 100% bootstrapped and its consensus lists
    every relay as a running exit, printing progress every few seconds."""
    last_print = 0.0
    last = "no answer from the client's control port yet"
    while True:
        _check_alive(state)
        now = time.monotonic()
        try:
            with _control(client.to_json(), timeout=3.0) as ctl:
                phase = ctl.getinfo("status/bootstrap-phase").get("status/bootstrap-phase", "")
                m = re.search(r"PROGRESS=(\d+)", phase)
                pct = int(m.group(1)) if m else 0
                s = re.search(r'SUMMARY="([^"]*)"', phase)
                summary = s.group(1) if s else "?"
                try:
                    ns = ctl.getinfo("ns/all").get("ns/all", "")
                except LabError:
                    ns = ""  # no consensus yet
                known = _consensus_relays(ns)
                missing = [r for r in relays if r not in known]
                last = f"bootstrapped {pct}% ({summary}); consensus lists {len(relays) - len(missing)}/{len(relays)} relays as running exits"
                if pct >= 100 and not missing:
                    net._progress(f"tor: {last} after {now - started:.0f} s")
                    return
        except (OSError, LabError) as e:
            last = f"client control port: {e}"
        if now - last_print >= _PROGRESS_EVERY_S:
            net._progress(f"tor: {last} ({now - started:.0f} s)")
            last_print = now
        if now >= deadline:
            raise LabError(
                f"tor network did not bootstrap in time: {last}",
                node="client",
                log_tail=_log_tails(client.dir),
            )
        time.sleep(_POLL_S)


# ---------------------------------------------------------------------------
# Collection


def _parse_prometheus(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def _fetch_metrics(port: int) -> str:
    """The MetricsPort page (Prometheus text). Tor answers HTTP/1.0 with a
    Content-Length but may keep the connection open, so read by length."""
    from .socks import http_get

    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as sock:
        resp = http_get(sock, "127.0.0.1", port, "/metrics", max_body=MAX_METRICS_BYTES)
    if resp.status != 200:
        raise LabError(f"MetricsPort {port} answered HTTP {resp.status} {resp.reason}")
    return resp.body.decode("utf-8", "replace")


# The MetricsPort samples kept in tor-metrics.json (the full page is in metrics.prom).
_METRIC_KEEP = ("traffic", "circuits_total", "congestion_control", "flow_control", "cell_total", "oom")


def parse_cbt_state(text: str) -> dict[str, Any]:
    """The circuit-build-time histogram Tor keeps in its ``state`` file
    (``CircuitBuildTimeBin MS COUNT`` lines; 10 ms bins) with its count,
    median and mean (from bin midpoints)."""
    bins: dict[int, int] = {}
    abandoned = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "CircuitBuildTimeBin":
            try:
                ms, n = int(parts[1]), int(parts[2])
            except ValueError:
                continue
            if ms >= 0 and n > 0:
                bins[ms] = bins.get(ms, 0) + n
        elif len(parts) == 2 and parts[0] == "CircuitBuildAbandonedCount":
            try:
                abandoned = int(parts[1])
            except ValueError:
                pass
    count = sum(bins.values())
    result: dict[str, Any] = {"bins_ms": {str(k): bins[k] for k in sorted(bins)}, "count": count,
                              "abandoned": abandoned, "median_ms": None, "mean_ms": None}
    if count:
        result["mean_ms"] = sum(k * n for k, n in bins.items()) / count
        half, seen = (count + 1) / 2, 0
        for k in sorted(bins):
            seen += bins[k]
            if seen >= half:
                result["median_ms"] = k
                break
    return result


def _parse_circuit_status(text: str) -> list[dict[str, Any]]:
    circs = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        circ: dict[str, Any] = {"id": int(parts[0]), "status": parts[1], "path": []}
        for p in parts[2:]:
            if "=" in p:
                k, _, v = p.partition("=")
                circ[k.lower()] = v
            elif p.startswith("$"):
                circ["path"] = [hop.split("~")[-1] for hop in p.split(",")]
        circs.append(circ)
    return circs


def collect_tor_metrics(dir: Path | str) -> dict[str, Any]:
    """Tor's own view of a tor network, written to ``DIR/<node>/tor-metrics.json``
    and returned as ``{"impl": "tor", "version", "nodes": {name: {...}},
    "circuit_build_times": {...}}``.

    While a node runs: the control port's ``traffic/read`` / ``traffic/written``
    (bytes since start) and ``uptime``; for relays the MetricsPort page (kept
    raw in ``DIR/<node>/metrics.prom``, plus its traffic counters); for the
    client ``circuit-status`` (each circuit's state, purpose, path). Always:
    the client's circuit-build-time histogram from its ``state`` file, which
    Tor writes when it exits, so call this once more after ``down`` for the
    complete histogram. Live values of a node that has stopped are kept from
    the previous call. A directory without a tor network raises LabError.
    """
    dir = Path(dir)
    state = load_state(dir)
    tor_info = state.endpoints.get("tor")
    if not isinstance(tor_info, dict) or not isinstance(tor_info.get("nodes"), list):
        raise LabError(f"{dir} holds no tor network (state.json has no tor nodes)")
    running = {rec.name: rec for rec in state.nodes if is_running(rec.pid)}
    result: dict[str, Any] = {"impl": "tor", "version": tor_info.get("version"), "nodes": {},
                              "circuit_build_times": None, "collected_at": time.time()}
    for node in tor_info["nodes"]:
        if not isinstance(node, dict) or "name" not in node or "dir" not in node:
            continue
        name = str(node["name"])
        node_dir = Path(str(node["dir"]))
        out_path = node_dir / METRICS_FILE
        previous: dict[str, Any] = {}
        try:
            with open(out_path, "rb") as f:
                loaded = json.loads(f.read(MAX_METRICS_BYTES))
            if isinstance(loaded, dict):
                previous = loaded
        except (OSError, ValueError):
            pass
        entry: dict[str, Any] = {"role": node.get("role"), "running": name in running}
        live: dict[str, Any] = {}
        if name in running:
            try:
                with _control(node) as ctl:
                    info = ctl.getinfo("traffic/read", "traffic/written", "uptime")
                    live["traffic_read_bytes"] = int(info.get("traffic/read", "0"))
                    live["traffic_written_bytes"] = int(info.get("traffic/written", "0"))
                    live["uptime_s"] = int(info.get("uptime", "0"))
                    if node.get("role") == "client":
                        status = ctl.getinfo("circuit-status").get("circuit-status", "")
                        live["circuits"] = _parse_circuit_status(status)
                        (node_dir / "circuit-status.txt").write_text(status + "\n", encoding="utf-8")
            except (OSError, LabError, ValueError) as e:
                live["control_error"] = str(e)
            if node.get("metrics_port"):
                try:
                    page = _fetch_metrics(int(node["metrics_port"]))
                    (node_dir / "metrics.prom").write_text(page, encoding="utf-8")
                    samples = _parse_prometheus(page)
                    live["metrics"] = {k: v for k, v in samples.items() if any(w in k for w in _METRIC_KEEP)}
                except (OSError, LabError) as e:
                    live["metrics_error"] = str(e)
            live["live_at"] = time.time()
        else:
            live = previous.get("live") or {}
        entry["live"] = live
        if node.get("role") == "client":
            try:
                with open(node_dir / "state", "rb") as f:
                    cbt = parse_cbt_state(f.read(MAX_STATE_FILE).decode("utf-8", "replace"))
                entry["circuit_build_times"] = cbt
                result["circuit_build_times"] = cbt
            except OSError:
                entry["circuit_build_times"] = None
        result["nodes"][name] = entry
        try:
            out_path.write_text(json.dumps(entry, indent=2) + "\n", encoding="utf-8")
        except OSError:
            pass
    return result
