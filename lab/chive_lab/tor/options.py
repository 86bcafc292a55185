"""chive's options mapped onto Tor's: a scenario's relay options (``--set``) become torrc
lines of every relay, its network parameters (``--param``) the authorities'
``ConsensusParams``; what has no Tor equivalent is listed with the reason, so a report can
say so next to it.

Pure functions of the spec: nothing here runs tor. The option names this tor accepts come
from :func:`.tools.known_torrc_options`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import LabError
from .tools import BUILTIN_OPTIONS

__all__ = ["MANAGED_TOR_KEYS", "MIN_BANDWIDTH_RATE", "TorMapping", "Unmapped", "client_unmapped",
           "consensus_params_line", "map_params", "map_relay_options", "unmapped_options"]

# Tor refuses a relay whose BandwidthRate is below 75 KBytes/s
# (RELAY_REQUIRED_MIN_BANDWIDTH; "For servers, it must be at least 76800").
MIN_BANDWIDTH_RATE = 76800


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
    "OutbufMaxMsec": "how far chive's output bound may grow for late wake-ups under a "
    "BandwidthRate; Tor's KIST leaves one congestion window of slack per socket for the same "
    "reason (KISTSockBufSizeFactor), sized from the network, not from the scheduler's latency",
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
    "LinkRecordLayer": "who seals chive's TLS records after the handshake (rustls or chive's own "
    "record layer); Tor's links use OpenSSL's record layer, nothing to choose",
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
    known = tor_options if tor_options is not None else BUILTIN_OPTIONS
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
