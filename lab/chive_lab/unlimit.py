"""Lift the rate limits of a running loopback network's relays: each relay's config is rewritten
without its rate (chive: ``BandwidthRate = 0``, unlimited; Tor: the ``BandwidthRate`` and
``BandwidthBurst`` lines dropped, Tor's default 1 GB/s) and reloaded by SIGHUP, which both
implementations apply to live connections without dropping circuits. The ``idle-vs-load`` kind
uses it to measure its 3-hop goodput on the load network instead of starting a second one
(``goodput_network = "load"``).

Works on a network directory written by :class:`chive_lab.network.Network` or the Tor launcher
(``state.json`` with each node's config path and log); waits until every relay logged the reload.
"""

from __future__ import annotations

import os
import signal
import time
import tomllib
from pathlib import Path

from . import config as cfg
from .errors import LabError
from .process import ProcessRecord, is_same_process
from .state import load_state

__all__ = ["RELOAD_TIMEOUT_S", "lift_rate_limits"]

# How long a relay may take to log its reload (a loaded 2-core machine included).
RELOAD_TIMEOUT_S = 30.0
# What each implementation logs once it has reloaded its config (chive_node::relay's SIGHUP
# task; Tor's `signal_callback` → `do_hup`), and what it logs when the new config is refused.
_RELOADED = {"chive": b"config reloaded", "tor": b"Received reload signal (hup)"}
_REFUSED = {"chive": b"config reload failed", "tor": b"Reading config failed"}
_TOR_RATE_KEYS = ("BandwidthRate", "BandwidthBurst")


def _unlimited_chive(path: Path) -> bool:
    """Rewrite a chive relay config with ``BandwidthRate = 0``; False if it is no relay's."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise LabError(f"cannot read {path}: {e}") from e
    if "ORPort" not in doc:
        return False
    doc["BandwidthRate"] = 0
    doc["BandwidthBurst"] = 0
    cfg.write_toml(path, doc)
    return True


def _unlimited_tor(path: Path) -> bool:
    """Drop the rate lines of a Tor relay's torrc; False if it has none (an authority or the
    client)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LabError(f"cannot read {path}: {e}") from e
    kept = [line for line in lines if line.split(" ", 1)[0] not in _TOR_RATE_KEYS]
    if len(kept) == len(lines):
        return False
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return True


def _log_size(rec: ProcessRecord) -> int:
    try:
        return os.path.getsize(rec.log)
    except OSError:
        return 0


def _log_since(rec: ProcessRecord, offset: int) -> bytes:
    try:
        with open(rec.log, "rb") as f:
            f.seek(offset)
            return f.read(1 << 20)
    except OSError:
        return b""


def lift_rate_limits(net_dir: Path, impl: str, timeout: float = RELOAD_TIMEOUT_S) -> list[str]:
    """Lift every relay's rate limit in the running network ``net_dir`` (``impl`` "chive" or
    "tor") and wait until each has logged the reload; return the relays' names. LabError when
    the directory has no state.json with relay configs (the netns backend keeps none), a relay
    is not running, refuses the new config or does not reload within ``timeout`` s."""
    if impl not in _RELOADED:
        raise LabError(f"lift_rate_limits: unknown impl {impl!r}")
    state = load_state(Path(net_dir))
    rewrite = _unlimited_chive if impl == "chive" else _unlimited_tor
    relays: list[tuple[ProcessRecord, int]] = []
    for rec in state.nodes:
        if rec.config is None or not rewrite(Path(rec.config)):
            continue
        if not is_same_process(rec):
            raise LabError(f"{rec.name} (pid {rec.pid}) is not running: cannot reload its config")
        relays.append((rec, _log_size(rec)))
        os.kill(rec.pid, signal.SIGHUP)
    if not relays:
        raise LabError(f"{net_dir}: no relay config found in state.json to lift the rate limit of")
    deadline = time.monotonic() + timeout
    waiting = list(relays)
    while waiting:
        left = []
        for rec, offset in waiting:
            text = _log_since(rec, offset)
            if _REFUSED[impl] in text:
                raise LabError(f"{rec.name} refused its config without a rate limit (see {rec.log})")
            if _RELOADED[impl] not in text:
                left.append((rec, offset))
        waiting = left
        if waiting and time.monotonic() > deadline:
            names = ", ".join(rec.name for rec, _ in waiting)
            raise LabError(f"{names}: no config reload logged within {timeout:g} s of SIGHUP")
        if waiting:
            time.sleep(0.1)
    if impl == "tor":
        _check_tor_rates(state.endpoints, [rec.name for rec, _ in relays])
    return [rec.name for rec, _ in relays]


def _check_tor_rates(endpoints: dict, names: list[str]) -> None:
    """Ask each Tor relay's control port for its BandwidthRate after the reload (Tor logs the
    signal before it reads the torrc; its one event loop answers the control port after that)."""
    from .tor.control import control_for

    nodes = {n.get("name"): n for n in (endpoints.get("tor") or {}).get("nodes", []) if isinstance(n, dict)}
    for name in names:
        if name not in nodes:
            raise LabError(f"{name}: not in state.json's tor nodes, cannot check its BandwidthRate")
        with control_for(nodes[name]) as ctl:
            status, lines = ctl.command("GETCONF BandwidthRate")
        value = lines[0].partition("=")[2] if status == 250 and lines else None
        if value is None or (value and not (value.isdigit() and int(value) >= 1 << 30)):
            raise LabError(f"{name}: BandwidthRate after the reload is {lines!r}, not Tor's default")
