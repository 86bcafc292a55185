"""The sniper attack (Jansen et al., NDSS 2014) on one entry relay, run the same way against
chive and against Debian's tor, with the entry's RSS sampled for the whole attack.

One run (:func:`run_attack`, one :class:`AttackConfig`): start a 3-relay loopback network
(:meth:`chive_lab.network.Network.up`, ``impl`` chive or tor, every relay with
``MaxMemInQueues``), then two clients of our own pinned to ``relay1`` as their entry
(chive: ``EntryNodes``; tor: ``EntryNodes`` with ``UseEntryGuards 1``): the *attacker* and the
*honest* client. The attacker opens ``circuits`` circuits (one SOCKS username each, so
isolation gives each its own circuit) with ``streams`` bulk downloads on each (``GET`` of a
100 MB body from the network's httpd). Once all are open the lab reads (and discards) what
arrives for ``drain_s`` seconds, so every window opens and tor's congestion control grows its
windows as a reading client's would (``read_while_opening``: from the moment each opens), then
stops the attacking client with SIGSTOP: its link to relay1 is no longer read, and whatever the
exits were allowed to send piles up at relay1. Meanwhile the
honest client downloads ``honest_bytes`` through relay1 (checked byte for byte). After
``hold_s`` seconds the attacker is killed, and relay1's RSS is sampled ``after_s`` seconds more.

relay1's VmRSS (``/proc/PID/status``) is sampled every ``sample_s`` seconds from before the
attack to the end (:class:`RssSampler`). The OOM handler's work is read from what each relay
says: chive's ``MetricsFile`` (``{"type":"oom"}`` records) and its log, tor's log (the notice
lines of ``circuits_handle_oom``) and its MetricsPort (``tor_relay_load_oom_bytes_total``).

Pure parts (parsers, :func:`summarize_series`) are tested on synthetic data in
``lab/tests/test_sniper.py``; the CLI is ``lab/scripts/sniper_rss.py``, which also writes the
figures and the manifest.
"""

from __future__ import annotations

import json
import os
import queue
import re
import selectors
import signal
import socket
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from . import config as cfg
from .content import check_body
from .errors import LabError
from .network import Network, NetworkSpec, free_ports, log_tail
from .ports import PORTS_FILE, wait_ports
from .procstat import parse_status_kib
from .process import is_running, spawn
from .socks import SocksError, fetch, parse_hostport, socks5_connect
from .state import load_state, save_state

__all__ = ["AttackConfig", "RssSampler", "parse_chive_oom_metrics", "parse_tor_oom_log",
           "parse_vmrss_kib", "run_attack", "summarize_series"]

#: What each attack stream asks for: far more than any window lets through.
ATTACK_BYTES = 100_000_000
#: The entry relay under attack (the lab names relays relay1..N).
TARGET = "relay1"
IMPLS = ("chive", "tor")
MIB = 1 << 20
#: How long a started chive client may take to bind its SOCKS port (it writes its PortsFile).
CLIENT_PORTS_TIMEOUT_S = 30.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AttackConfig:
    """One attack run."""

    impl: str
    """``chive`` or ``tor``."""
    label: str = ""
    """Name of the run in tables and file names (default: ``impl``, ``tor-cc<alg>``)."""
    circuits: int = 800
    """Circuits the attacker opens through relay1."""
    streams: int = 2
    """Bulk streams per circuit (two 500-cell stream windows fill a 1000-cell circuit window)."""
    max_mem: str = "256 MB"
    """``MaxMemInQueues`` of every relay (both implementations read Tor's units)."""
    per_client_queue_cells: int | None = None
    """chive only: the relays' ``PerClientQueueCells`` (0 = off); None = chive's default (2000
    cells, which holds a single-client sniper at its entry before ``MaxMemInQueues`` is reached,
    so the OOM handler never runs: docs/security.md)."""
    cc_alg: int | None = None
    """tor only: the consensus parameter ``cc_alg`` (0 = fixed SENDME windows, 2 = Vegas, tor's
    default); None = not set (tor's default)."""
    drain_s: float = 2.0
    """Seconds the attacker's streams are read after the last one opened, before SIGSTOP."""
    hold_s: float = 20.0
    """Seconds the attacker stays stopped (from SIGSTOP to its kill)."""
    after_s: float = 5.0
    """Seconds relay1 is sampled after the attacker is killed."""
    honest_bytes: int = 10_000_000
    """Size of the honest client's download during the attack."""
    sample_s: float = 0.05
    """RSS sampling interval."""
    read_while_opening: bool = False
    """Read each attack stream from the moment it opens (True), or only for ``drain_s`` once
    all are open (False: while the others open, a stream's windows fill at the attacking
    client and its exit waits, so the attack's cells move once every circuit exists)."""
    openers: int = 16
    """Threads opening attack streams in parallel."""
    open_timeout: float = 120.0
    """Seconds one attack stream may take to open."""

    def name(self) -> str:
        if self.label:
            return self.label
        if self.impl == "tor" and self.cc_alg is not None:
            return f"tor-cc{self.cc_alg}"
        return self.impl

    def validate(self) -> None:
        """Raise LabError naming the first bad field."""
        if self.impl not in IMPLS:
            raise LabError(f"impl must be one of {', '.join(IMPLS)}, got {self.impl!r}")
        if self.cc_alg is not None and self.impl != "tor":
            raise LabError("cc_alg is a tor consensus parameter: only for impl tor")
        if self.cc_alg is not None and self.cc_alg not in (0, 2):
            raise LabError(f"cc_alg must be 0 (fixed windows) or 2 (Vegas), got {self.cc_alg}")
        for key in ("circuits", "streams", "openers", "honest_bytes"):
            if getattr(self, key) < 1:
                raise LabError(f"{key} must be at least 1")
        for key in ("drain_s", "hold_s", "after_s"):
            if getattr(self, key) < 0:
                raise LabError(f"{key} must be >= 0")
        if not 0.005 <= self.sample_s <= 1.0:
            raise LabError(f"sample_s must be 0.005..1 s, got {self.sample_s}")
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", self.name()):
            raise LabError(f"label {self.name()!r}: letters, digits and _.+- only")


# ---------------------------------------------------------------- parsers (pure) ---------------

def parse_vmrss_kib(status_text: str) -> int | None:
    """VmRSS in KiB from the text of ``/proc/PID/status`` (None: absent, e.g. a zombie)."""
    return parse_status_kib(status_text, "VmRSS")


_TOR_TIME = re.compile(r"^([A-Z][a-z]{2} +\d{1,2} \d{2}:\d{2}:\d{2}(?:\.\d+)?) ")
_TOR_LOW = re.compile(r"We're low on memory \(cell queues total alloc: (\d+) buffer total alloc: (\d+), "
                      r"tor compress total alloc: (\d+)")
_TOR_REMOVED = re.compile(
    r"Removed (\d+) bytes by killing (\d+) circuits; (\d+) circuits remain alive\. "
    r"Also killed (\d+) non-linked directory connections\. Killed (\d+) edge connections")


def tor_log_time(line: str, year: int) -> float | None:
    """UNIX time of a tor log line (``Nov 26 11:59:12.000 [notice] ...``, local time, no year)."""
    m = _TOR_TIME.match(line)
    if not m:
        return None
    stamp = m.group(1)
    fmt = "%Y %b %d %H:%M:%S.%f" if "." in stamp else "%Y %b %d %H:%M:%S"
    try:
        return datetime.strptime(f"{year} {' '.join(stamp.split())}", fmt).timestamp()
    except ValueError:
        return None


def parse_tor_oom_log(text: str, year: int | None = None) -> dict[str, Any]:
    """What tor's OOM handler did, from its notice log: each ``We're low on memory`` line
    (cell-queue and buffer bytes when it ran) and each ``Removed N bytes by killing M
    circuits`` line (``circuits_handle_oom``), summed; each run with its UNIX time
    (``unix``, from the line's time stamp in ``year``, default this year)."""
    year = year or datetime.now().year
    runs = []
    low = None
    for line in text.splitlines():
        m = _TOR_LOW.search(line)
        if m:
            low = {"cell_queues_bytes": int(m.group(1)), "buffers_bytes": int(m.group(2)),
                   "compress_bytes": int(m.group(3))}
            continue
        m = _TOR_REMOVED.search(line)
        if m:
            run = {"unix": tor_log_time(line, year),
                   "bytes_removed": int(m.group(1)), "circuits_killed": int(m.group(2)),
                   "circuits_alive": int(m.group(3)), "dirconns_killed": int(m.group(4)),
                   "edgeconns_killed": int(m.group(5))}
            if low is not None:
                run.update(low)
            runs.append(run)
            low = None
    return {
        "runs": len(runs),
        "circuits_killed": sum(r["circuits_killed"] for r in runs),
        "bytes_freed": sum(r["bytes_removed"] for r in runs),
        "edgeconns_killed": sum(r["edgeconns_killed"] for r in runs),
        "max_cell_queues_bytes": max((r.get("cell_queues_bytes", 0) for r in runs), default=None),
        # tor counts its compression states (lzma encoders: an estimate of ~93 MiB each) in
        # the same total as the cells: what was left for cell queues when the handler ran.
        "max_compress_bytes": max((r.get("compress_bytes", 0) for r in runs), default=None),
        "events": runs,
    }


def parse_chive_oom_metrics(text: str) -> dict[str, Any]:
    """What chive's OOM handler did, from a relay's ``MetricsFile`` (JSON lines): the
    ``{"type":"oom"}`` records (one per second in which it ran) summed, and the largest
    ``mem_in_queues`` of the per-second ``relay`` records. Lines that are not JSON objects
    (a line cut by a kill) are skipped."""
    runs = killed = closed = freed = 0
    peak_mem = None
    events = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        kind = rec.get("type")
        if kind == "oom":
            runs += 1
            killed += int(rec.get("circuits_killed", 0))
            closed += int(rec.get("channels_closed", 0))
            freed += int(rec.get("bytes_freed", 0))
            events.append({"unix": rec.get("t"), "circuits_killed": rec.get("circuits_killed"),
                           "bytes_freed": rec.get("bytes_freed")})
        if kind in ("relay", "oom") and isinstance(rec.get("mem_in_queues"), (int, float)):
            peak_mem = max(peak_mem or 0, int(rec["mem_in_queues"]))
    return {"runs": runs, "circuits_killed": killed, "channels_closed": closed, "bytes_freed": freed,
            "peak_mem_in_queues": peak_mem, "events": events}


def tor_oom_metric(samples: dict[str, float]) -> float | None:
    """``tor_relay_load_oom_bytes_total{subsys="cell"}`` from a parsed MetricsPort page."""
    for key, value in samples.items():
        if key.startswith("tor_relay_load_oom_bytes_total") and 'subsys="cell"' in key:
            return value
    return None


def summarize_series(samples: list[tuple[float, int]], marks: dict[str, float]) -> dict[str, Any]:
    """RSS figures (MiB) of one run from its samples ``(t, rss_kib)`` and phase marks
    (``attack``: the first attack stream is opened; ``stop``: SIGSTOP; ``release``: the
    attacker is killed; times on the samples' clock):

    - ``before``: median of the samples before ``attack``;
    - ``peak`` (and ``peak_t``, seconds after ``attack``): the largest sample;
    - ``end_of_attack``: the last sample before ``release``;
    - ``after``: the last sample (``after_s`` after the release);
    - ``peak_over_before``: peak - before.
    """
    if not samples:
        raise LabError("no RSS samples")
    t_attack = marks.get("attack", samples[0][0])
    pre = [r for t, r in samples if t < t_attack] or [samples[0][1]]
    before = statistics.median(pre)
    t_peak, peak = max(samples, key=lambda s: s[1])
    release = marks.get("release")
    held = [r for t, r in samples if release is None or t < release]
    end = held[-1] if held else samples[-1][1]
    out = {
        "before_mib": before / 1024,
        "peak_mib": peak / 1024,
        "peak_t_s": t_peak - t_attack,
        "end_of_attack_mib": end / 1024,
        "after_mib": samples[-1][1] / 1024,
        "samples": len(samples),
    }
    out["peak_over_before_mib"] = out["peak_mib"] - out["before_mib"]
    return out


def max_mem_bytes(text: str) -> int:
    """Bytes of a ``MaxMemInQueues`` value in Tor's units (``"256 MB"``; MB = MiB in tor)."""
    m = re.fullmatch(r"\s*(\d+)\s*(bytes?|KB|KBytes|MB|MBytes|GB|GBytes)?\s*", text, re.I)
    if not m:
        raise LabError(f"MaxMemInQueues {text!r}: want a number and bytes/KB/MB/GB")
    unit = (m.group(2) or "bytes").lower()
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(unit[0], 1)
    return int(m.group(1)) * scale


# ---------------------------------------------------------------- measuring --------------------

def read_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            return parse_vmrss_kib(f.read(1 << 16))
    except OSError:
        return None


class RssSampler(threading.Thread):
    """Samples one process's VmRSS every ``interval`` seconds until :meth:`stop`; ``samples``
    holds ``(monotonic time, rss_kib)``."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True, name=f"rss-{pid}")
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        next_t = time.monotonic()
        while not self._halt.is_set():
            r = read_rss_kib(self.pid)
            if r is not None:
                self.samples.append((time.monotonic(), r))
            next_t += self.interval
            self._halt.wait(max(0.0, next_t - time.monotonic()))

    def stop(self) -> list[tuple[float, int]]:
        self._halt.set()
        self.join(timeout=5)
        return list(self.samples)


class Drainer(threading.Thread):
    """Reads (and discards) every attack socket handed to :meth:`add` until :meth:`stop`, as a
    client that reads its streams would; counts the bytes."""

    def __init__(self):
        super().__init__(daemon=True, name="drainer")
        self._new: queue.Queue[socket.socket] = queue.Queue()
        self._halt = threading.Event()
        self.bytes = 0

    def add(self, sock: socket.socket) -> None:
        self._new.put(sock)

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            while not self._halt.is_set():
                while True:
                    try:
                        s = self._new.get_nowait()
                    except queue.Empty:
                        break
                    s.setblocking(False)
                    sel.register(s, selectors.EVENT_READ)
                if not sel.get_map():
                    self._halt.wait(0.05)
                    continue
                for key, _ in sel.select(timeout=0.05):
                    try:
                        data = key.fileobj.recv(1 << 16)  # type: ignore[union-attr]
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fileobj)
                    self.bytes += len(data)
        finally:
            sel.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)


def _http_hostport(http: str) -> tuple[str, int]:
    return parse_hostport(http.removeprefix("http://"))


def open_attack_streams(socks_addr: str, http: str, cfg_: AttackConfig, on_open: Callable[[socket.socket], None],
                        progress: Progress) -> tuple[list[socket.socket], list[str]]:
    """Open ``circuits`` x ``streams`` attack streams (SOCKS user ``sniperN`` per circuit),
    each with its ``GET`` sent, from ``openers`` threads; ``on_open`` gets each socket as it
    opens. Returns the open sockets and the errors of the streams that failed."""
    host, port = _http_hostport(http)
    held: list[socket.socket] = []
    errors: list[str] = []
    lock = threading.Lock()
    request = f"GET /bytes/{ATTACK_BYTES} HTTP/1.0\r\n\r\n".encode()

    def opener(first: int) -> None:
        for c in range(first, cfg_.circuits, cfg_.openers):
            for _ in range(cfg_.streams):
                try:
                    s = socks5_connect(socks_addr, host, port, username=f"sniper{c}", password="x",
                                       timeout=cfg_.open_timeout)
                    s.sendall(request)
                except (OSError, SocksError, LabError) as e:
                    with lock:
                        errors.append(f"circuit {c}: {e}")
                    continue
                with lock:
                    held.append(s)
                on_open(s)

    threads = [threading.Thread(target=opener, args=(i,), daemon=True) for i in range(cfg_.openers)]
    for t in threads:
        t.start()
    total = cfg_.circuits * cfg_.streams
    while True:
        alive = [t for t in threads if t.is_alive()]
        if not alive:
            break
        alive[0].join(timeout=5)
        progress(f"attack: {len(held)}/{total} streams open, {len(errors)} failed")
    return held, errors


def honest_download(socks_addr: str, http: str, nbytes: int, timeout: float) -> dict[str, Any]:
    """One download of ``nbytes`` through ``socks_addr``, checked byte for byte."""
    t0 = time.monotonic()
    try:
        resp = fetch(f"{http}/bytes/{nbytes}", proxy=socks_addr, username="honest", password="x",
                     timeout=timeout, max_body=nbytes + 1)
    except (OSError, LabError) as e:
        return {"bytes": 0, "seconds": time.monotonic() - t0, "byte_exact": False, "error": str(e)}
    secs = time.monotonic() - t0
    problem = check_body(resp.body, nbytes) if resp.status == 200 else f"HTTP {resp.status}"
    return {"bytes": len(resp.body), "seconds": secs, "byte_exact": problem is None, "error": problem}


# ---------------------------------------------------------------- clients of our own -----------

def _record(netdir: Path, proc_rec: Any) -> None:
    """Add a process we started to the network's state, so ``down`` stops it too."""
    state = load_state(netdir)
    state.nodes.append(proc_rec)
    save_state(netdir, state)


def start_chive_client(netdir: Path, binary: Path, name: str) -> tuple[int, str]:
    """A ``chive client`` pinned to relay1 (``EntryNodes``); (pid, SOCKS address)."""
    ep = load_state(netdir).endpoints
    d = netdir / name
    conf = cfg.client_config(data_dir=d, authority=ep["authority"],
                             authority_identity=ep["authority_identity"], log="info",
                             overrides={"EntryNodes": [TARGET], "CircuitBuildTimeout": 30})
    path = d / f"{name}.toml"
    cfg.write_toml(path, conf)
    proc, rec = spawn(name, [str(binary), "client", "--config", str(path)], log_path=d / "chive.log",
                      cwd=d, config=path)
    _record(netdir, rec)

    def exited() -> None:
        if proc.poll() is not None:
            raise LabError(f"{name} exited during start-up ({proc.returncode})", node=name,
                           log_tail=log_tail(d / "chive.log"))

    ports = wait_ports(d / PORTS_FILE, want=["SocksPort"], check=exited, node=name,
                       deadline=time.monotonic() + CLIENT_PORTS_TIMEOUT_S)
    return proc.pid, ports["SocksPort"]


def start_tor_client(netdir: Path, name: str) -> tuple[int, str]:
    """A tor client pinned to relay1 (``EntryNodes`` with ``UseEntryGuards 1``, which tor
    requires with it), torrc as the lab's tor client otherwise; (pid, SOCKS address)."""
    from . import tor

    ep = load_state(netdir).endpoints
    nodes = [n for n in ep["tor"]["nodes"] if isinstance(n, dict)]
    fields = {f for f in tor.TorNode.__dataclass_fields__}

    def node_of(obj: dict[str, Any]) -> tor.TorNode:
        kw = {k: v for k, v in obj.items() if k in fields}
        kw["dir"] = Path(kw["dir"])
        kw["onion_ports"] = tuple(kw.get("onion_ports", ()))
        return tor.TorNode(**kw)

    authorities = [node_of(n) for n in nodes if n.get("role") == "authority"]
    entry = next((n for n in nodes if n.get("name") == TARGET), None)
    if entry is None or not entry.get("fingerprint"):
        raise LabError(f"{netdir}: no fingerprint for {TARGET} in state.json")
    control, socks_port = free_ports(2)
    node = tor.TorNode(name=name, role="client", dir=netdir / name, control_port=control,
                       socks_port=socks_port)
    node.dir.mkdir(parents=True, exist_ok=True)
    os.chmod(node.dir, 0o700)
    lines = tor.build_torrc(node, authorities, tor.TorMapping(), {})
    lines = [("UseEntryGuards", 1) if k == "UseEntryGuards" else (k, v) for k, v in lines]
    lines.append(("EntryNodes", f"${entry['fingerprint']}"))
    path = node.dir / tor.TORRC
    path.write_text(tor.render_torrc(lines), encoding="utf-8")
    empty = netdir / "empty-torrc"
    if not empty.exists():
        empty.write_text("", encoding="utf-8")
    tools = tor.find_tor_tools()
    proc, rec = spawn(name, [tools.tor, "-f", str(path), "--defaults-torrc", str(empty)],
                      log_path=node.dir / tor.STDOUT_LOG, cwd=node.dir, config=path)
    rec.log = str(node.dir / tor.TOR_LOG)
    _record(netdir, rec)
    return proc.pid, f"127.0.0.1:{socks_port}"


def wait_ready(name: str, pid: int, socks_addr: str, http: str, timeout: float) -> float:
    """Until a 1 KiB fetch through ``socks_addr`` returns the right bytes; seconds taken."""
    t0 = time.monotonic()
    last = "no attempt yet"
    while time.monotonic() - t0 < timeout:
        if not is_running(pid):
            raise LabError(f"{name} (pid {pid}) exited before it could fetch", node=name)
        try:
            resp = fetch(f"{http}/bytes/1024", proxy=socks_addr, username="probe", password="x",
                         timeout=15)
            last = check_body(resp.body, 1024) or ""
            if resp.status == 200 and not last:
                return time.monotonic() - t0
        except (OSError, LabError) as e:
            last = str(e)
        time.sleep(0.5)
    raise LabError(f"{name} at {socks_addr} could not fetch within {timeout:.0f} s: {last}", node=name)


# ---------------------------------------------------------------- one run ----------------------

@dataclass
class AttackResult:
    """Everything one run measured (``summary`` is what the table shows)."""

    config: dict[str, Any]
    samples: list[tuple[float, int]] = field(default_factory=list)
    """``(seconds since the attack began, rss_kib)``."""
    marks: dict[str, float] = field(default_factory=dict)
    """Phase times, seconds since the attack began (``attack`` = 0)."""
    summary: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def run_attack(c: AttackConfig, netdir: Path, binary: Path, progress: Progress) -> AttackResult:
    """One run of the attack (see the module doc) in the new network directory ``netdir``;
    the network is stopped before this returns, whatever happens."""
    c.validate()
    params: dict[str, int] = {}
    if c.cc_alg is not None:
        params["cc_alg"] = c.cc_alg
    overrides: dict[str, object] = {"MaxMemInQueues": c.max_mem}
    if c.per_client_queue_cells is not None and c.impl == "chive":
        overrides["PerClientQueueCells"] = c.per_client_queue_cells
    spec = NetworkSpec(relays=3, impl=c.impl, binary=binary, relay_overrides=overrides,
                       authority_params=params, timeout=120.0)
    progress(f"{c.name()}: starting a 3-relay {c.impl} network in {netdir}")
    info = Network.up(spec, netdir, progress=None)
    try:
        return _attack(c, netdir, binary, info, progress)
    finally:
        Network.down(netdir)


def _attack(c: AttackConfig, netdir: Path, binary: Path, info: Any, progress: Progress) -> AttackResult:
    http = info.http
    target_pid = info.pids[TARGET]
    start = start_chive_client if c.impl == "chive" else start_tor_client
    args = (netdir, binary) if c.impl == "chive" else (netdir,)
    attacker_pid, attacker_socks = start(*args, "attacker")  # type: ignore[operator]
    honest_pid, honest_socks = start(*args, "honest")  # type: ignore[operator]
    for name, pid, addr in (("attacker", attacker_pid, attacker_socks), ("honest", honest_pid, honest_socks)):
        secs = wait_ready(name, pid, addr, http, 180.0)
        progress(f"{c.name()}: {name} client ready through {TARGET} after {secs:.1f} s")
    # Warm the target up with an honest transfer, as the chive e2e test does.
    warm = honest_download(honest_socks, http, 2_000_000, 60.0)
    if not warm["byte_exact"]:
        raise LabError(f"{c.name()}: warm-up download failed: {warm['error']}")
    # The honest download's time without the attack, to compare with its time during it.
    idle = honest_download(honest_socks, http, c.honest_bytes, 120.0)
    progress(f"{c.name()}: honest {c.honest_bytes} bytes without the attack in {idle['seconds']:.2f} s")

    sampler = RssSampler(target_pid, c.sample_s)
    sampler.start()
    time.sleep(2.0)  # the baseline
    t0, t0_unix = time.monotonic(), time.time()
    marks = {"attack": t0}
    drainer = Drainer()
    drainer.start()
    held: list[socket.socket] = []
    try:
        held, errors = open_attack_streams(attacker_socks, http, c,
                                           drainer.add if c.read_while_opening else lambda _s: None, progress)
        marks["opened"] = time.monotonic()
        if not c.read_while_opening:
            for s in held:
                drainer.add(s)
        time.sleep(c.drain_s)
        _signal(attacker_pid, signal.SIGSTOP)
        marks["stop"] = time.monotonic()
        drainer.stop()
        progress(f"{c.name()}: {len(held)} attack streams open in {marks['opened'] - t0:.1f} s, "
                 f"{drainer.bytes / MIB:.0f} MiB read; attacker stopped (SIGSTOP)")
        marks["honest_start"] = time.monotonic()
        honest = honest_download(honest_socks, http, c.honest_bytes, max(60.0, c.hold_s * 3))
        marks["honest_end"] = time.monotonic()
        progress(f"{c.name()}: honest {c.honest_bytes} bytes in {honest['seconds']:.2f} s, "
                 f"byte-exact: {honest['byte_exact']}")
        left = marks["stop"] + c.hold_s - time.monotonic()
        if left > 0:
            time.sleep(left)
        target_alive = is_running(target_pid)
        oom_metric = _tor_oom_metric(netdir) if c.impl == "tor" else None
        _signal(attacker_pid, signal.SIGKILL)
        marks["release"] = time.monotonic()
        time.sleep(c.after_s)
    finally:
        drainer.stop()
        _signal(attacker_pid, signal.SIGKILL)
        samples = sampler.stop()
        for s in held:
            s.close()
    rel = [(t - t0, r) for t, r in samples]
    rel_marks = {k: v - t0 for k, v in marks.items()}
    summary = summarize_series(rel, rel_marks)
    summary.update({
        "label": c.name(), "impl": c.impl, "cc_alg": c.cc_alg, "max_mem": c.max_mem,
        "max_mem_mib": max_mem_bytes(c.max_mem) / MIB,
        "circuits": c.circuits, "streams_opened": len(held), "streams_failed": len(errors),
        "stream_errors": errors[:10], "open_s": rel_marks["opened"], "drained_mib": drainer.bytes / MIB,
        "honest": honest, "honest_idle": idle, "target_alive": target_alive,
        "oom": _oom(c.impl, netdir, oom_metric), "t0_unix": t0_unix,
    })
    # When the OOM handler ran, on the series' clock (tor logs whole seconds).
    summary["oom"]["times_s"] = [round(e["unix"] - t0_unix, 3) for e in summary["oom"]["events"]
                                 if isinstance(e.get("unix"), (int, float))]
    return AttackResult(config=asdict(c), samples=rel, marks=rel_marks, summary=summary)


def _tor_oom_metric(netdir: Path) -> float | None:
    from . import tor

    node = next(n for n in load_state(netdir).endpoints["tor"]["nodes"] if n.get("name") == TARGET)
    try:
        return tor_oom_metric(tor.parse_prometheus(tor.fetch_metrics(int(node["metrics_port"]))))
    except (OSError, LabError):
        return None


def _read(path: Path, limit: int = 64 << 20) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _oom(impl: str, netdir: Path, tor_metric: float | None) -> dict[str, Any]:
    """The OOM handler's work at relay1, from its own files."""
    d = netdir / TARGET
    if impl == "tor":
        out = parse_tor_oom_log(_read(d / "tor.log"))
        out["metricsport_oom_bytes_cell"] = tor_metric
        out["source"] = "tor.log (circuits_handle_oom notices) + MetricsPort"
        return out
    out = parse_chive_oom_metrics(_read(d / "metrics.jsonl"))
    out["log_lines"] = _read(d / "chive.log").count("out of memory for queues")
    out["source"] = "metrics.jsonl (oom records) + chive.log"
    return out
