"""The real Tor as the baseline peer: a private Tor network configured the way Chutney does
it, behind the same ``up``/``down`` contract as a chive network (loopback, via
:mod:`chive_lab.network`) or placed on a netns testbed (:mod:`chive_lab.tor_netns`).

The parts, one idea each:

- :mod:`.tools`: finding ``tor`` and ``tor-gencert``, and the torrc options this tor knows;
- :mod:`.node`: one tor process (:class:`TorNode`: role, ports, identity, files);
- :mod:`.options`: chive's relay options and network parameters mapped onto torrc and
  ``ConsensusParams``, with what has no Tor equivalent and why;
- :mod:`.torrc`: every torrc line of an authority, relay or client, and the text format;
- :mod:`.keys`: authority keys, relay identities and the equal-weight bandwidth file;
- :mod:`.control`: the control-port client (cookie authentication, ``GETINFO``);
- :mod:`.launch`: starting a loopback network and waiting until it carries traffic;
- :mod:`.metrics`: Tor's own view afterwards (MetricsPort, circuits, build times).

Every public name of the parts is importable from here (``from chive_lab.tor import X``,
``tor.X``), as it was when this was one module. Standard library only; Linux only, like
the rest of the lab.
"""

from __future__ import annotations

from .control import MAX_CONTROL_REPLY, ControlClient, control_for
from .keys import KEY_CACHE_ENV, bandwidth_file, prepare_keys
from .launch import (
    DEFAULT_AUTHORITIES,
    HTTPD_ADDRESS,
    MAX_AUTHORITIES,
    PROBE_BYTES,
    TOR_MIN_TIMEOUT,
    start_tor_network,
)
from .metrics import (
    MAX_METRICS_BYTES,
    MAX_STATE_FILE,
    collect_tor_metrics,
    consensus_relays,
    fetch_metrics,
    parse_cbt_state,
    parse_circuit_status,
    parse_prometheus,
)
from .node import (
    BANDWIDTH_FILE,
    METRICS_FILE,
    ONION_SERVICE_DIR,
    STDOUT_LOG,
    TOR_INFO_LOG,
    TOR_LOG,
    TORRC,
    TorNode,
    log_tails,
    start_failed,
)
from .options import (
    MANAGED_TOR_KEYS,
    MIN_BANDWIDTH_RATE,
    TorMapping,
    Unmapped,
    client_unmapped,
    consensus_params_line,
    map_params,
    map_relay_options,
    unmapped_options,
)
from .tools import (
    BUILTIN_OPTIONS,
    TorTools,
    TorUnavailable,
    find_tor_tools,
    known_torrc_options,
    tor_unavailable_reason,
)
from .torrc import (
    CLIENT_CONFLUX,
    TOKEN_BUCKET_REFILL_MS,
    build_torrc,
    dir_authority_line,
    onion_service_lines,
    parse_torrc,
    render_torrc,
    torrc_value,
)

# The names these helpers had when tor.py was one module (private then, used by tor_netns
# and the tests); kept so code written against them still runs.
_torrc_value = torrc_value
_log_tails = log_tails
_control = control_for
_consensus_relays = consensus_relays
_parse_prometheus = parse_prometheus
_parse_circuit_status = parse_circuit_status
_fetch_metrics = fetch_metrics
_BUILTIN_OPTIONS = BUILTIN_OPTIONS

__all__ = [
    "BANDWIDTH_FILE",
    "BUILTIN_OPTIONS",
    "KEY_CACHE_ENV",
    "CLIENT_CONFLUX",
    "DEFAULT_AUTHORITIES",
    "HTTPD_ADDRESS",
    "MANAGED_TOR_KEYS",
    "MAX_AUTHORITIES",
    "MAX_CONTROL_REPLY",
    "MAX_METRICS_BYTES",
    "MAX_STATE_FILE",
    "METRICS_FILE",
    "MIN_BANDWIDTH_RATE",
    "ONION_SERVICE_DIR",
    "PROBE_BYTES",
    "STDOUT_LOG",
    "TOKEN_BUCKET_REFILL_MS",
    "TORRC",
    "TOR_INFO_LOG",
    "TOR_LOG",
    "TOR_MIN_TIMEOUT",
    "ControlClient",
    "TorMapping",
    "TorNode",
    "TorTools",
    "TorUnavailable",
    "Unmapped",
    "bandwidth_file",
    "build_torrc",
    "client_unmapped",
    "collect_tor_metrics",
    "consensus_params_line",
    "consensus_relays",
    "control_for",
    "dir_authority_line",
    "fetch_metrics",
    "find_tor_tools",
    "known_torrc_options",
    "log_tails",
    "map_params",
    "map_relay_options",
    "onion_service_lines",
    "parse_cbt_state",
    "parse_circuit_status",
    "parse_prometheus",
    "parse_torrc",
    "prepare_keys",
    "render_torrc",
    "start_failed",
    "start_tor_network",
    "tor_unavailable_reason",
    "torrc_value",
    "unmapped_options",
]
