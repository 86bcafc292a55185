"""Keys a Tor test network needs before any of its tor processes starts: every
authority's v3 keys and certificate (``tor-gencert``), every relay's identity and
fingerprint (``tor --list-fingerprint``), and the bandwidth file that gives the relays
equal weights. Each is a short command run to completion; nothing here opens a socket.

Making them is most of a small network's start on a loaded machine (20-30 s: three
3072-bit RSA authority identities). With ``$CHIVE_LAB_TOR_KEY_CACHE`` naming a directory,
every node's long-term identity is kept there by tor version and node name and reused by the
next network that has a node of that name (the lab's tests set it once per pytest session:
docs/testing.md). An authority then gets a fresh signing key and certificate for its new
address from its kept identity; nothing else of a network is shared.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import LabError
from .node import BANDWIDTH_FILE, TorNode, log_tails
from .tools import TorTools

__all__ = ["KEY_CACHE_ENV", "bandwidth_file", "prepare_keys"]

_HEX40 = re.compile(r"^[0-9A-F]{40}$")

#: The longest one key-making command may take (also bounded by the network's deadline). A
#: 3072-bit RSA key is a second on a quiet machine; at load 25-35 with the tests niced, one
#: ``tor-gencert`` took over 60 s (session 16), which is slow, not broken.
KEYGEN_TIMEOUT = 180.0
#: Names a directory where nodes' identities are kept and reused (module docstring).
KEY_CACHE_ENV = "CHIVE_LAB_TOR_KEY_CACHE"
#: The authority's v3 identity key in its ``keys/`` (the one slow key to make).
_AUTHORITY_IDENTITY = "authority_identity_key"
#: Files of ``keys/`` that belong to the authority's v3 keys, not to its relay identity.
_AUTHORITY_PREFIX = "authority_"


def _cache_dir(tools: TorTools, node: TorNode, what: str) -> Path | None:
    """Where ``what`` (``relay`` or ``authority``) of ``node`` is kept, or None without a cache."""
    root = os.environ.get(KEY_CACHE_ENV)
    if not root:
        return None
    return Path(root) / re.sub(r"[^A-Za-z0-9._-]", "_", tools.version) / node.name / what


def _keep(files: list[Path], into: Path) -> None:
    """Copy ``files`` to ``into`` as one step: a directory renamed into place, so a reader
    sees all of them or none (another process may keep the same node's at the same time:
    the first one wins, both are valid)."""
    into.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".keep-", dir=into.parent))
    for f in files:
        shutil.copy2(f, tmp / f.name)
    try:
        tmp.rename(into)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


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
    """tor-gencert: the authority's v3 identity key (or the kept one), signing key and
    certificate."""
    keys = node.dir / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    log = node.dir / "keygen.log"
    left = max(5.0, deadline - time.monotonic())
    cache = _cache_dir(tools, node, "authority")
    kept = cache is not None and (cache / _AUTHORITY_IDENTITY).is_file()
    if kept:
        shutil.copy2(cache / _AUTHORITY_IDENTITY, keys / _AUTHORITY_IDENTITY)
    # The identity key is encrypted with an empty passphrase read from fd 0:
    # nothing to type, nothing stored beside the key.
    _run(
        [tools.gencert, *([] if kept else ["--create-identity-key"]), "-m", "12",
         "-a", f"{node.address}:{node.dir_port}",
         "-i", str(keys / _AUTHORITY_IDENTITY), "-s", str(keys / "authority_signing_key"),
         "-c", str(keys / "authority_certificate"), "--passphrase-fd", "0"],
        cwd=node.dir, log=log, stdin=b"\n", timeout=min(KEYGEN_TIMEOUT, left),
    )
    if cache is not None and not kept:
        _keep([keys / _AUTHORITY_IDENTITY], cache)
    cert = (keys / "authority_certificate").read_text(encoding="ascii", errors="replace")
    m = re.search(r"^fingerprint ([0-9A-F]{40})$", cert, re.M)
    if m is None:
        raise LabError(f"{keys / 'authority_certificate'} has no fingerprint line", node=node.name)
    node.v3ident = m.group(1)


def _make_relay_identity(tools: TorTools, node: TorNode, empty: Path, deadline: float) -> None:
    """tor --list-fingerprint: creates the relay's identity keys in its
    DataDirectory (the started tor reuses them) and tells us its fingerprint; or copies the
    kept ones there."""
    keys = node.dir / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    cache = _cache_dir(tools, node, "relay")
    if cache is not None and cache.is_dir():
        for f in cache.iterdir():
            shutil.copy2(f, node.dir / "fingerprint" if f.name == "fingerprint" else keys / f.name)
        node.fingerprint = _read_fingerprint(node)
        return
    log = node.dir / "keygen.log"
    _run(
        [tools.tor, "-f", str(empty), "--defaults-torrc", str(empty), "--list-fingerprint",
         "--DataDirectory", str(node.dir), "--ORPort", f"{node.address}:{node.or_port}",
         "--Address", node.address, "--Nickname", node.name],
        cwd=node.dir, log=log, stdin=None, timeout=min(KEYGEN_TIMEOUT, max(5.0, deadline - time.monotonic())),
    )
    node.fingerprint = _read_fingerprint(node)
    if cache is not None:
        # The relay identity only: an authority's v3 keys are made beside it at the same time.
        ident = [f for f in keys.iterdir() if f.is_file() and not f.name.startswith(_AUTHORITY_PREFIX)]
        _keep([*ident, node.dir / "fingerprint"], cache)


def _read_fingerprint(node: TorNode) -> str:
    """The 40-hex fingerprint in the node's ``fingerprint`` file."""
    try:
        text = (node.dir / "fingerprint").read_text(encoding="ascii", errors="replace").split()
    except OSError as e:
        raise LabError(f"tor --list-fingerprint wrote no fingerprint for {node.name}: {e}") from e
    fp = "".join(text[1:]).upper()
    if len(text) < 2 or not _HEX40.match(fp):
        raise LabError(f"{node.dir / 'fingerprint'} does not hold a 40-hex fingerprint", node=node.name)
    return fp


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
        return LabError(str(e), node=node.name, log_tail=e.log_tail or log_tails(node.dir))

    # Every authority's v3 keys (tor-gencert: a 3072-bit RSA key, the slowest step) and every
    # server's identity (for the DirAuthority lines and the bandwidth file), a few at a time:
    # each is one short command, independent of the others (an authority's v3 keys and its
    # relay identity are different files).
    jobs = [(a, _make_authority_keys, (tools, a, deadline)) for a in nodes if a.role == "authority"]
    jobs += [(n, _make_relay_identity, (tools, n, empty, deadline)) for n in nodes if n.role != "client"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [(node, pool.submit(fn, *args)) for node, fn, args in jobs]
        for node, future in futures:
            try:
                future.result()
            except LabError as e:
                raise named(node, e) from e
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
