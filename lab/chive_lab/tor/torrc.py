"""The torrc of each role (authority, relay, client) and the torrc text format.

:func:`build_torrc` gives every line of one node's torrc, configured the way Chutney
configures a test network (``TestingTorNetwork``, fast voting, ``AssumeReachable``, every
relay an exit); :func:`render_torrc` and :func:`parse_torrc` turn lines into text and back.
Not here: which relay options a scenario maps onto (:mod:`.options`), keys (:mod:`.keys`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from ..errors import LabError
from .node import TOR_INFO_LOG, TOR_LOG, TorNode
from .options import TorMapping, consensus_params_line
from .tools import OPTION_NAME

__all__ = ["CLIENT_CONFLUX", "TOKEN_BUCKET_REFILL_MS", "build_torrc", "dir_authority_line",
           "onion_service_lines", "parse_torrc", "render_torrc", "torrc_value"]

# chive's token buckets refill every <= 10 ms; Tor's default is 100 ms, which
# adds bursts of queueing under a rate limit. Under a rate limit the lab sets
# 10 ms so both are on the same footing (override with --set
# TokenBucketRefillInterval=100); without one Tor keeps its default.
TOKEN_BUCKET_REFILL_MS = 10

# Conflux (Tor 0.4.8+: a client sends an exit stream over two linked
# circuits) is off by default in the lab's client; see docs/tor-baseline.md.
CLIENT_CONFLUX = os.environ.get("CHIVE_LAB_TOR_CONFLUX", "0") == "1"


def torrc_value(value: Any) -> str:
    """One torrc value as text (a bool 1/0, a whole float without ".0"); LabError on a line
    break, which would smuggle in another option."""
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
    out = ["# Written by chive-lab (chive_lab/tor/torrc.py); one option per line."]
    for key, value in lines:
        if not OPTION_NAME.match(key):
            raise LabError(f"bad torrc option name {key!r}")
        text = torrc_value(value)
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
        if not OPTION_NAME.match(key):
            raise LabError(f"torrc line {n}: {raw[:60]!r} does not start with an option name")
        pairs.append((key, value.strip()))
    return pairs


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
        # Stable and Fast on every relay from the first vote. A pinned entry must be a
        # possible guard (Guard, Stable, Fast, Valid, V2Dir in tor's node_is_possible_guard);
        # TestingDirAuthVoteGuard forces only Guard, and without these guarantees Stable goes
        # to relays whose uptime is at least the median, so in a network whose relays started
        # within a second of each other the one that started last could lack it in every
        # consensus: its clients discard every circuit for "Failed to find node for hop #1".
        ("AuthDirVoteStableGuaranteeMinUptime", 0),
        ("AuthDirVoteStableGuaranteeMTBF", 0),
        ("AuthDirFastGuarantee", 0),
    ]
    if node.hsdir:
        # A relay earns HSDir only after 96 h of uptime; a test network with an onion
        # service gives it to every relay at once (as Chutney's hs networks do).
        lines.append(("TestingDirAuthVoteHSDir", "*"))
    if params:
        lines.append(("ConsensusParams", consensus_params_line(params)))
    return lines


def onion_service_lines(service_dir: Path, ports: list[str] | tuple[str, ...]) -> list[tuple[str, Any]]:
    """The torrc lines of a v3 onion service kept in ``service_dir`` (tor makes its keys and
    ``hostname`` there, mode 0700) forwarding each ``ports`` entry (``"VIRTPORT IP:PORT"``);
    LabError on a malformed entry. ``HiddenServicePort`` lines must follow their
    ``HiddenServiceDir``: the order of the list is kept by :func:`render_torrc`."""
    if not ports:
        raise LabError("an onion service needs at least one HiddenServicePort")
    lines: list[tuple[str, Any]] = [("HiddenServiceDir", service_dir), ("HiddenServiceVersion", 3)]
    for entry in ports:
        parts = str(entry).split()
        virt, target = (parts + [""])[:2] if len(parts) in (1, 2) else ("", "")
        ok = virt.isdigit() and 1 <= int(virt) <= 65535
        if ok and target:
            host, _, port = target.rpartition(":")
            ok = bool(host) and port.isdigit() and 1 <= int(port) <= 65535
        if not ok:
            raise LabError(f"HiddenServicePort {entry!r}: want \"VIRTPORT [IP:PORT]\"")
        lines.append(("HiddenServicePort", " ".join(parts)))
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
            # No entry guards: a loopback client takes its first hop at random among
            # equally weighted relays, as chive's client does, and a client on the netns
            # testbed pins its path anyway. With guards, a guard the client once failed to
            # use stays "down" for its retry interval (minutes) and every circuit fails
            # with "Failed to find node for hop #1". (Tor refuses this together with
            # EntryNodes: a client that pins its entry keeps guards, see tor_netns.)
            ("UseEntryGuards", 0),
        ]
        if node.onion_ports:
            lines += onion_service_lines(node.onion_dir, node.onion_ports)
        if authorities:
            # Paths use the relays only, as in a chive network, whose authority
            # is not a relay. (Directory fetches from authorities stay allowed:
            # StrictNodes is 0.)
            lines.append(("ExcludeNodes", ",".join(f"${a.fingerprint}" for a in authorities)))
    return lines
