"""Node configuration: typed values from the command line, TOML writing, and
the config of each node role (authority, relay, client, httpd).

The standard library reads TOML (``tomllib``) but does not write it, so this
module has a small writer for the subset chive's configs use: scalars, lists of
scalars (possibly nested) and one level of tables.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

from .errors import LabError
from .ports import ANY, PORTS_FILE

# A TOML bare key. Restricting --set keys to these keeps the writer simple and
# catches typos such as "Bandwidth Rate".
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_INT = re.compile(r"^[+-]?[0-9]+$")
_FLOAT = re.compile(r"^[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?$")

# Longest value accepted from --set/--param: configs are small, and a bound
# keeps a mistaken shell expansion from producing a huge file.
MAX_VALUE_CHARS = 4096

# Keys the lab manages itself in every relay config: overriding them would
# break the network the lab is building, so --set refuses them.
MANAGED_RELAY_KEYS = frozenset(
    {"Nickname", "DataDirectory", "ORPort", "Authority", "AuthorityIdentity", "PortsFile"}
)
#: Client config keys the lab writes itself; a scenario's ``[network.client]`` cannot set them.
MANAGED_CLIENT_KEYS = frozenset(
    {"DataDirectory", "SocksPort", "Authority", "AuthorityIdentity", "Log", "PortsFile"}
)


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid bare TOML key, else raise LabError."""
    if not _BARE_KEY.match(key):
        raise LabError(
            f"bad config key {key!r}: use letters, digits, '_' or '-' (at most 64)"
        )
    return key


def parse_value(text: str) -> Any:
    """Type a command-line value the way ``--set`` documents it.

    int (``12``), float (``1.5``, ``1e3``), bool (``true``/``false``), a JSON list
    when the text starts with ``[`` (``["accept *:*"]``), else the string as is.
    """
    if len(text) > MAX_VALUE_CHARS:
        raise LabError(f"value too long ({len(text)} > {MAX_VALUE_CHARS} characters)")
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if text == "true":
        return True
    if text == "false":
        return False
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise LabError(f"value {text!r} starts with '[' but is not a JSON list: {e}") from e
        if not isinstance(value, list):
            raise LabError(f"value {text!r} is not a JSON list")
        _check_toml_value(value, where=text)
        return value
    return text


def parse_assignment(text: str) -> tuple[str, Any]:
    """Split ``KEY=VALUE`` and type the value with :func:`parse_value`."""
    key, sep, value = text.partition("=")
    if not sep:
        raise LabError(f"expected KEY=VALUE, got {text!r}")
    return check_key(key.strip()), parse_value(value.strip())


def parse_param(text: str) -> tuple[str, int]:
    """Parse an authority network parameter ``KEY=INT`` (consensus params are integers)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise LabError(f"expected KEY=INT, got {text!r}")
    value = value.strip()
    if not _INT.match(value):
        raise LabError(f"network parameter {key.strip()!r} must be an integer, got {value!r}")
    return check_key(key.strip()), int(value)


def _check_toml_value(value: Any, where: str) -> None:
    """Raise LabError unless ``value`` is something :func:`toml_dumps` can write."""
    if isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        return
    if isinstance(value, list):
        for item in value:
            _check_toml_value(item, where)
        return
    raise LabError(f"{where}: {type(value).__name__} values cannot go into a config")


def _toml_string(s: str) -> str:
    # TOML basic string: escape quote, backslash and control characters. Other
    # Unicode is written as is (the file is UTF-8). json.dumps is not used
    # because it escapes astral characters as surrogate pairs, which TOML forbids.
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(value: Any) -> str:
    """One TOML value (scalar or array) as text."""
    if isinstance(value, bool):  # before int: bool is a subclass of int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # always has '.' or 'e', so it stays a float
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise LabError(f"cannot write a {type(value).__name__} value to TOML")


def toml_dumps(doc: Mapping[str, Any]) -> str:
    """Write a document: top-level keys first, then one ``[table]`` per dict value."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    for key, value in doc.items():
        check_key(key)
        if isinstance(value, Mapping):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {toml_value(value)}")
    for name, table in tables:
        lines.append("")
        lines.append(f"[{name}]")
        for key, value in table.items():
            check_key(key)
            if isinstance(value, Mapping):
                raise LabError(f"nested table {name}.{key} is not supported")
            lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def write_toml(path: Path, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` to ``path`` as TOML (creating the parent directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(toml_dumps(doc), encoding="utf-8")


# ---------------------------------------------------------------------------
# The config of each role. Keys are exactly those the chive binary reads (its
# config structs reject unknown keys). Every listener's port defaults to 0 (the kernel picks
# one) and every node writes the addresses it bound to its PortsFile (chive_lab/ports.py).


def authority_config(
    *,
    data_dir: Path,
    dir_port: int = ANY,
    consensus_interval: int,
    params: Mapping[str, int],
    log: str,
    nickname: str = "auth",
) -> dict[str, Any]:
    """Config of the directory authority."""
    return {
        "Nickname": nickname,
        "DataDirectory": str(data_dir),
        "DirPort": f"127.0.0.1:{dir_port}",
        "PortsFile": PORTS_FILE,
        "ConsensusInterval": consensus_interval,
        # With a handful of relays every relay must be usable as a guard.
        "TestingAllGuards": True,
        "Log": log,
        "NetworkParameters": dict(params),
    }


def relay_config(
    *,
    nickname: str,
    data_dir: Path,
    or_port: int = ANY,
    authority: str,
    authority_identity: str,
    bandwidth_rate: int | None,
    overrides: Mapping[str, Any],
    log: str,
) -> dict[str, Any]:
    """Config of one relay: every relay is an exit allowing loopback only."""
    rate = 0 if bandwidth_rate is None else bandwidth_rate
    cfg: dict[str, Any] = {
        "Nickname": nickname,
        "DataDirectory": str(data_dir),
        "ORPort": f"127.0.0.1:{or_port}",
        "PortsFile": PORTS_FILE,
        "Authority": authority,
        "AuthorityIdentity": authority_identity,
        "BandwidthRate": rate,
        "BandwidthBurst": rate,
        "ExitPolicy": ["accept 127.0.0.0/8:*", "reject *:*"],
        # The lab's targets are on loopback, which a default exit refuses.
        "ExitPolicyRejectPrivate": False,
        # Per-cell queue timing and per-second relay stats, for the analysis (relative paths
        # live in the DataDirectory); override with --set MetricsFile=... .
        "MetricsFile": "metrics.jsonl",
        "Log": log,
    }
    for key, value in overrides.items():
        if key in MANAGED_RELAY_KEYS:
            raise LabError(f"--set {key} is managed by the lab and cannot be overridden")
        cfg[check_key(key)] = value
    return cfg


def client_config(
    *,
    data_dir: Path,
    socks_port: int = ANY,
    authority: str,
    authority_identity: str,
    log: str,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Config of the SOCKS client, with ``overrides`` (e.g. ``EntryNodes``) added."""
    config: dict[str, Any] = {
        "DataDirectory": str(data_dir),
        "SocksPort": f"127.0.0.1:{socks_port}",
        "PortsFile": PORTS_FILE,
        "Authority": authority,
        "AuthorityIdentity": authority_identity,
        "Log": log,
    }
    for key, value in (overrides or {}).items():
        if key in MANAGED_CLIENT_KEYS:
            raise LabError(f"client key {key} is managed by the lab and cannot be overridden")
        config[check_key(key)] = value
    return config


def httpd_config(*, port: int = ANY) -> dict[str, Any]:
    """Config of the measurement HTTP server. With port 0 it prints the address it bound as
    its first stdout line (chive_lab.ports.wait_listening)."""
    return {"Listen": f"127.0.0.1:{port}"}
