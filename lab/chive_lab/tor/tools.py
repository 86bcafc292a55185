"""Finding the tor binaries the lab runs, and the torrc options this tor accepts.

``$TOR_BIN`` / ``$TOR_GENCERT`` name them, else PATH (plus ``/usr/sbin``, where Debian
puts tor). Not here: running tor (:mod:`.launch`, :mod:`.keys`) or writing torrcs
(:mod:`.torrc`).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import LabError

__all__ = ["BUILTIN_OPTIONS", "TorTools", "TorUnavailable", "find_tor_tools", "known_torrc_options",
           "tor_unavailable_reason"]

#: What a torrc option name looks like (also what the lab accepts as one).
OPTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class TorUnavailable(LabError):
    """tor or tor-gencert is missing or does not run."""


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
                if OPTION_NAME.match(line.strip())
            }
            if out.returncode == 0 and len(names) > 50:
                return frozenset(names)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return BUILTIN_OPTIONS


# The options the lab itself writes, plus the ones the mapping produces: enough
# to check generated torrcs when tor is not installed.
BUILTIN_OPTIONS = frozenset(
    """TestingTorNetwork DataDirectory Nickname RunAsDaemon ShutdownWaitLength Log SafeLogging
    ControlPort CookieAuthentication AssumeReachable PathsNeededToBuildCircuits TestingDirAuthVoteExit
    TestingDirAuthVoteGuard TestingDirAuthVoteHSDir TestingMinExitFlagThreshold V3AuthNIntervalsValid
    DirAuthority AuthoritativeDirectory V3AuthoritativeDirectory ContactInfo DirPort
    TestingV3AuthInitialVotingInterval V3AuthVotingInterval TestingV3AuthInitialVoteDelay V3AuthVoteDelay
    TestingV3AuthInitialDistDelay V3AuthDistDelay ConsensusParams ORPort Address ExitRelay ExitPolicy
    ExitPolicyRejectPrivate ServerDNSDetectHijacking ServerDNSTestAddresses ServerDNSResolvConfFile
    MetricsPort MetricsPortPolicy SocksPort UseMicrodescriptors BandwidthRate BandwidthBurst
    CircuitPriorityHalflife Schedulers TokenBucketRefillInterval KISTSchedRunInterval
    MaxCircuitDirtiness SocksPolicy ClientOnly ConfluxEnabled V3BandwidthsFile UseEntryGuards""".split()
)
