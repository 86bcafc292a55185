"""The ``netns`` backend: hosts in Linux network namespaces behind a shaped switch.

Layout of one :class:`Testbed` (run id ``chv-<pid>-<n>``)::

    ns chv-<pid>-<n>-A            ns chv-<pid>-<n>-sw                    ns chv-<pid>-<n>-B
    eth0 10.77.0.1 ──veth── vA ─[delay line]─ vAd─vAb ─┐ br0 ┌── vB ──veth── eth0 10.77.0.2
     (HTB egress: host→switch)  (HTB egress: switch→host)

* Each link is shaped in both directions with HTB at the link rate: on the
  host's ``eth0`` egress and on the switch port's egress, so a link is full
  duplex like the paper's 10 Mbit/s Ethernet. Each HTB class has a packet FIFO
  (default 1000 packets, the txqueuelen of the paper's era).
* A link with delay, jitter or loss gets a user-space delay line
  (``chive delayline``) between the switch port and the bridge, because this
  kernel has no netem; without them the port is a plain bridge port.
* GSO/TSO is turned off on the host interfaces (``gso_max_segs 1``) so the
  queues hold Ethernet-sized frames as on real hardware.
* TCP congestion control is set per host namespace. A non-initial namespace may
  only choose an algorithm in the host's ``tcp_allowed_congestion_control``;
  when it is not allowed, ``widen_allowed_cc=True`` adds it there (a global,
  harmless, never-undone change); otherwise :attr:`Host.cc_effective` says what
  the namespace really uses and tools must set the algorithm per socket
  (``TCP_CONGESTION``, allowed for root), as :mod:`chive_lab.tcpbulk` does.

Clean-up is guaranteed on success, failure and Ctrl-C/SIGTERM: the testbed is a
context manager, installs signal handlers (main thread only) and an ``atexit``
hook, and writes a record file (``RECORD_DIR/<run id>.json``) before it
creates anything, so :func:`clean_leftovers` (``chive-lab netns-clean``) can
remove what a crashed run left: only namespaces named in our records or
carrying our prefix with a dead owner pid.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .errors import LabError

#: Every namespace we create starts with this prefix.
PREFIX = "chv-"
#: Where run records live (tmpfs: a reboot clears namespaces and records together).
RECORD_DIR = Path(os.environ.get("CHIVE_NETNS_RECORDS", "/run/chive-lab/netns"))
#: Addresses of the hosts; only ever used inside our namespaces.
DEFAULT_SUBNET = "10.77.0.0/24"
#: Host names become interface and namespace name parts: keep them short.
_HOST_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,7}$")
_NS_RE = re.compile(r"^chv-(\d+)-(\d+)-[A-Za-z0-9]+$")
_counter_lock = threading.Lock()
_counter = 0


def available() -> str | None:
    """None if this process can build testbeds, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the netns backend needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    try:
        r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns` is unavailable: {e}"
    if r.returncode != 0:
        return f"`ip netns` is unavailable: {r.stderr.strip()}"
    return None


def parse_rate(text: str | int | float) -> int:
    """A rate in bit/s from ``10mbit``, ``10M``, ``500kbit`` or a number."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmg]?)(?:bit)?\s*", text.lower())
        if not m:
            raise LabError(f"invalid rate {text!r}: expected e.g. 10mbit")
        value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    if not 8_000 <= value <= 1e12:
        raise LabError(f"rate {text!r} out of range (8 kbit/s .. 1 Tbit/s)")
    return int(round(value))


@dataclass
class LinkSpec:
    """The access link between a host and the switch (both directions alike)."""

    rate_bps: int | None = None  # None: unshaped
    delay_ms: float = 0.0  # one-way, each direction
    jitter_ms: float = 0.0
    loss: float = 0.0  # probability per frame, each direction
    queue_packets: int = 1000
    #: Where the host→switch queue lives: "host" = HTB on the host's own eth0
    #: (a modern Linux host with its NIC: TCP Small Queues keep that queue
    #: about 1 ms long and the backlog stays in the socket), or "switch" = HTB
    #: on the switch side of the link, invisible to the host's TCP (a deep NIC
    #: queue of a pre-TSQ kernel such as the paper's 2.6.26, or a DSL modem).
    queue_at: str = "host"
    #: The switch's output-port buffer towards the host (switch → host), in packets; ``None``
    #: = ``queue_packets``. A 10/100 switch holds far less per port than a host's 1000-packet
    #: txqueue, and this is the queue that flows from several hosts towards one share.
    switch_port_packets: int | None = None

    def __post_init__(self) -> None:
        if self.queue_at not in ("host", "switch"):
            raise LabError(f"queue_at must be 'host' or 'switch', got {self.queue_at!r}")
        if self.rate_bps is not None:
            self.rate_bps = parse_rate(self.rate_bps)
        for name in ("delay_ms", "jitter_ms"):
            v = getattr(self, name)
            if not 0 <= v <= 60_000:
                raise LabError(f"{name} must be within 0..60000, got {v}")
        if not 0 <= self.loss <= 1:
            raise LabError(f"loss must be within 0..1, got {self.loss}")
        if not 1 <= self.queue_packets <= 1_000_000:
            raise LabError(f"queue_packets must be within 1..1000000, got {self.queue_packets}")
        if self.switch_port_packets is not None and not 1 <= self.switch_port_packets <= 1_000_000:
            raise LabError(f"switch_port_packets must be within 1..1000000, got {self.switch_port_packets}")

    @property
    def port_queue(self) -> int:
        """Packets the switch's port towards the host holds."""
        return self.queue_packets if self.switch_port_packets is None else self.switch_port_packets

    @property
    def needs_delay_line(self) -> bool:
        """Whether the link needs the user-space delay line."""
        return self.delay_ms > 0 or self.jitter_ms > 0 or self.loss > 0


@dataclass
class HostSpec:
    """One host: a name (letters/digits, ≤ 8), its link and its TCP congestion control."""

    name: str
    link: LinkSpec = field(default_factory=LinkSpec)
    cc: str = "cubic"

    def __post_init__(self) -> None:
        if not _HOST_RE.match(self.name) or self.name == "sw":
            raise LabError(f"invalid host name {self.name!r}: 1-8 letters/digits, not 'sw'")
        if not re.fullmatch(r"[a-z0-9_]{1,16}", self.cc):
            raise LabError(f"invalid congestion control {self.cc!r}")


@dataclass
class Host:
    """A running host: its namespace, address and effective congestion control."""

    spec: HostSpec
    ns: str
    addr: str
    cc_effective: str = ""
    ack_priority: bool = False

    @property
    def name(self) -> str:
        """The host's name."""
        return self.spec.name


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed: {r.stderr.strip() or r.stdout.strip()}")
    return r


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_namespaces() -> list[str]:
    """Names from ``ip netns list`` (all of them; callers filter by prefix)."""
    r = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def our_namespaces() -> list[str]:
    """Existing namespaces that carry our prefix."""
    return [n for n in list_namespaces() if n.startswith(PREFIX)]


def _ns_pids(ns: str) -> list[int]:
    r = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def _kill_ns_processes(ns: str, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL, every process inside namespace ``ns``: they are
    ours, since nothing else runs in a namespace we created."""
    me = os.getpid()
    pids = [p for p in _ns_pids(ns) if p != me]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _pid_alive(p) and p in _ns_pids(ns)]
        if pids:
            time.sleep(0.05)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _delete_ns(ns: str) -> None:
    if not ns.startswith(PREFIX):  # defence in depth: never touch a foreign namespace
        raise LabError(f"refusing to delete namespace {ns!r} without our prefix")
    if ns not in list_namespaces():
        return
    _kill_ns_processes(ns)
    _run(["ip", "netns", "delete", ns], check=False)


class Testbed:
    """Hosts in namespaces around one switch namespace; see the module doc.

    Use as a context manager::

        with Testbed([HostSpec("A", LinkSpec("10mbit")), HostSpec("B", LinkSpec("10mbit"))]) as tb:
            tb.exec("A", ["ping", "-c1", tb.addr("B")])
    """

    def __init__(
        self,
        hosts: Iterable[HostSpec],
        *,
        subnet: str = DEFAULT_SUBNET,
        chive_bin: Path | None = None,
        record_dir: Path | None = None,
        widen_allowed_cc: bool = False,
        disable_offloads: bool = True,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        global _counter
        self.specs = list(hosts)
        names = [h.name for h in self.specs]
        if not names:
            raise LabError("a testbed needs at least one host")
        if len(set(names)) != len(names):
            raise LabError(f"duplicate host names in {names}")
        net = ipaddress.ip_network(subnet)
        if not net.is_private or net.num_addresses < len(names) + 2:
            raise LabError(f"subnet {subnet} must be private and hold every host")
        self.subnet = net
        with _counter_lock:
            _counter += 1
            n = _counter
        self.run_id = f"{PREFIX}{os.getpid()}-{n}"
        self.switch_ns = f"{self.run_id}-sw"
        self.chive_bin = chive_bin
        self.record_dir = record_dir or RECORD_DIR
        self.widen_allowed_cc = widen_allowed_cc
        self.disable_offloads = disable_offloads
        self.progress = progress or (lambda _m: None)
        hosts_iter = net.hosts()
        self.hosts: dict[str, Host] = {}
        for spec in self.specs:
            self.hosts[spec.name] = Host(spec, f"{self.run_id}-{spec.name}", str(next(hosts_iter)))
        self._procs: list[subprocess.Popen] = []
        self._created: list[str] = []
        self._up = False
        self._old_handlers: dict[int, object] = {}
        self._down_lock = threading.Lock()  # down() may race from a signal and a worker thread

    # ---------------------------------------------------------------- records
    @property
    def record_path(self) -> Path:
        """The record file of this run."""
        return self.record_dir / f"{self.run_id}.json"

    def _write_record(self) -> None:
        self.record_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "run_id": self.run_id,
            "owner_pid": os.getpid(),
            "created": time.time(),
            "namespaces": [self.switch_ns] + [h.ns for h in self.hosts.values()],
        }
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.record_path)

    # ------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Testbed":
        self._install_handlers()
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            prev = signal.getsignal(sig)
            if prev in (signal.SIG_DFL, None):
                self._old_handlers[sig] = prev
                signal.signal(sig, _raise_interrupt)

    def _restore_handlers(self) -> None:
        for sig, prev in self._old_handlers.items():
            try:
                signal.signal(sig, prev)  # type: ignore[arg-type]
            except (ValueError, TypeError):
                pass
        self._old_handlers.clear()

    def up(self) -> None:
        """Create namespaces, links, shaping and delay lines."""
        if self._up:
            return
        self._write_record()  # first, so a crash at any later point is recoverable
        atexit.register(self.down)
        self._up = True
        self.progress(f"netns: creating {self.run_id} with hosts {', '.join(self.hosts)}")
        for ns in [self.switch_ns] + [h.ns for h in self.hosts.values()]:
            _run(["ip", "netns", "add", ns])
            self._created.append(ns)
            self.sh(ns, ["ip", "link", "set", "lo", "up"])
            # No IPv6 chatter (router solicitations, DAD) on the measured links.
            for key in ("all", "default"):
                self.sh(ns, ["sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"], check=False)
        sw = self.switch_ns
        self.sh(sw, ["ip", "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0"])
        self.sh(sw, ["ip", "link", "set", "br0", "up"])
        plen = self.subnet.prefixlen
        for h in self.hosts.values():
            port = f"v{h.name}"
            self.sh(sw, ["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", h.ns])
            if self.disable_offloads:
                self.sh(h.ns, ["ip", "link", "set", "eth0", "gso_max_segs", "1", "gso_max_size", "1500"],
                        check=False)
            self.sh(h.ns, ["ip", "addr", "add", f"{h.addr}/{plen}", "dev", "eth0"])
            self.sh(h.ns, ["ip", "link", "set", "eth0", "up"])
            link = h.spec.link
            # Every link gets its own segment in the switch: port vX (towards
            # the host) and vXd, joined by a per-link bridge bX or, for a
            # delayed link, by the delay line; vXd's peer vXb is a port of br0.
            # vXd's egress is where a "switch"-side host→switch queue lives.
            inner, outer = f"v{h.name}d", f"v{h.name}b"
            self.sh(sw, ["ip", "link", "add", inner, "type", "veth", "peer", "name", outer])
            self.sh(sw, ["ip", "link", "set", outer, "master", "br0"])
            if link.needs_delay_line:
                for dev in (port, inner, outer):
                    self.sh(sw, ["ip", "link", "set", dev, "up"])
                self._start_delay_line(port, inner, link)
            else:
                lbr = f"b{h.name}"
                self.sh(sw, ["ip", "link", "add", lbr, "type", "bridge", "forward_delay", "0",
                             "stp_state", "0"])
                for dev in (port, inner):
                    self.sh(sw, ["ip", "link", "set", dev, "master", lbr])
                for dev in (lbr, port, inner, outer):
                    self.sh(sw, ["ip", "link", "set", dev, "up"])
            if link.rate_bps:
                self.shape_link(h.name)
            self._set_cc(h)
        self.progress(f"netns: {self.run_id} is up")

    def _set_cc(self, h: Host) -> None:
        key = "net.ipv4.tcp_congestion_control"
        r = self.sh(h.ns, ["sysctl", "-qw", f"{key}={h.spec.cc}"], check=False)
        if r.returncode != 0 and self.widen_allowed_cc:
            allowed_path = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
            allowed = allowed_path.read_text().split()
            if h.spec.cc not in allowed:
                allowed_path.write_text(" ".join(allowed + [h.spec.cc]))
            r = self.sh(h.ns, ["sysctl", "-qw", f"{key}={h.spec.cc}"], check=False)
        cur = self.sh(h.ns, ["sysctl", "-n", key], check=False).stdout.strip()
        h.cc_effective = cur
        if cur != h.spec.cc:
            self.progress(f"netns: host {h.name} keeps {cur!r} as default congestion control "
                          f"({h.spec.cc!r} is not in tcp_allowed_congestion_control); "
                          "tools must set it per socket")

    def _start_delay_line(self, a: str, b: str, link: LinkSpec) -> None:
        argv = [str(self._chive()), "delayline", "--a", a, "--b", b,
                "--delay", str(link.delay_ms), "--jitter", str(link.jitter_ms),
                "--loss", str(link.loss)]
        p = self.popen(self.switch_ns, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       text=True)
        line = p.stdout.readline() if p.stdout else ""
        if '"ready":true' not in line:
            raise LabError(f"chive delayline on {a}/{b} did not start (exit {p.poll()})")

    def _chive(self) -> Path:
        if self.chive_bin is None:
            from .network import default_binary

            self.chive_bin = default_binary()
        if not Path(self.chive_bin).exists():
            raise LabError(f"chive binary {self.chive_bin} not found (cargo build --release)")
        return Path(self.chive_bin)

    def down(self) -> None:
        """Stop every process we started and delete every namespace; idempotent."""
        with self._down_lock:
            self._down()

    def _down(self) -> None:
        if not self._up:
            self._restore_handlers()
            return
        self._up = False
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3
        for p in self._procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._procs.clear()
        for ns in reversed(self._created):
            _delete_ns(ns)
        self._created.clear()
        try:
            self.record_path.unlink()
        except FileNotFoundError:
            pass
        try:
            atexit.unregister(self.down)
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
        self._restore_handlers()

    # -------------------------------------------------------------- running
    def ns(self, host: str) -> str:
        """The namespace of ``host`` (``"sw"`` is the switch)."""
        if host == "sw":
            return self.switch_ns
        try:
            return self.hosts[host].ns
        except KeyError:
            raise LabError(f"no host {host!r} in this testbed") from None

    def addr(self, host: str) -> str:
        """The IPv4 address of ``host``."""
        return self.hosts[host].addr

    def _nsname(self, host_or_ns: str) -> str:
        return host_or_ns if host_or_ns.startswith(self.run_id) else self.ns(host_or_ns)

    def sh(self, host_or_ns: str, argv: Sequence[str], *, check: bool = True,
           timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``argv`` inside a host (by name) or namespace and wait for it."""
        return _run(["ip", "netns", "exec", self._nsname(host_or_ns), *argv], check=check,
                    timeout=timeout)

    exec = sh

    def popen(self, host_or_ns: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start ``argv`` inside a host or namespace; stopped by :meth:`down`."""
        p = subprocess.Popen(["ip", "netns", "exec", self._nsname(host_or_ns), *argv], **kw)
        self._procs.append(p)
        return p

    # -------------------------------------------------------------- shaping
    def _htb(self, ns: str, dev: str, rate: int, queue: int) -> None:
        # `replace` cannot change an HTB root in place: start from the default qdisc.
        self.sh(ns, ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
        self.sh(ns, ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"])
        self.sh(ns, ["tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                     "rate", f"{rate}bit", "ceil", f"{rate}bit"])
        self.sh(ns, ["tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "pfifo",
                     "limit", str(queue)])

    def shape_link(self, host: str) -> None:
        """(Re)apply the link's HTB rate on both ends (host egress, switch-port egress)."""
        h = self.hosts[host]
        link = h.spec.link
        if not link.rate_bps:
            return
        if link.queue_at == "host":
            self._htb(h.ns, "eth0", link.rate_bps, link.queue_packets)
        else:
            self.sh(h.ns, ["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
            self._htb(self.switch_ns, f"v{host}d", link.rate_bps, link.queue_packets)
        self._htb(self.switch_ns, f"v{host}", link.rate_bps, link.port_queue)
        h.ack_priority = False

    def set_ack_priority(self, host: str, on: bool = True, *, bulk_ceil: float | None = None) -> list[str]:
        """Install (or remove) `chive shape` ACK prioritisation on the host's
        egress, replacing the link's own HTB there: its root runs at 95% of the
        link rate, so the link's rate limit is never reached anyway.
        ``bulk_ceil`` (a fraction of the link rate) lets the data class borrow
        what the ACK class leaves idle (`chive shape --bulk-ceil`); None keeps
        the paper's hard 90% cap. Returns the tc commands that ran."""
        h = self.hosts[host]
        rate = h.spec.link.rate_bps
        if not rate:
            raise LabError(f"host {host} has no link rate to prioritise ACKs against")
        if not on:
            self.sh(h.ns, [str(self._chive()), "shape", "--dev", "eth0", "--remove"])
            self.shape_link(host)
            return []
        argv = [str(self._chive()), "shape", "--dev", "eth0", "--rate", f"{rate}bit",
                "--queue", str(h.spec.link.queue_packets)]
        if bulk_ceil is not None:
            argv += ["--bulk-ceil", f"{bulk_ceil:g}"]
        cmds = self.sh(h.ns, [*argv, "--dry-run"]).stdout.splitlines()
        self.sh(h.ns, argv)
        h.ack_priority = True
        return cmds

    def qdisc_stats(self, host_or_ns: str, dev: str = "eth0") -> str:
        """``tc -s qdisc show`` of a device, for diagnostics."""
        return self.sh(host_or_ns, ["tc", "-s", "qdisc", "show", "dev", dev], check=False).stdout


def _raise_interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class CleanReport:
    """What :func:`clean_leftovers` did."""

    removed: list[str] = field(default_factory=list)
    kept_live: list[str] = field(default_factory=list)
    records_removed: list[str] = field(default_factory=list)


def clean_leftovers(*, record_dir: Path | None = None, force: bool = False) -> CleanReport:
    """Remove namespaces (and their processes) left by crashed runs.

    A namespace is removed when a record file names it, or it carries our
    prefix, and the owning process (pid in the record / in the name) is dead —
    or always with ``force``. Namespaces of live runs are left alone.
    """
    rd = record_dir or RECORD_DIR
    report = CleanReport()
    existing = set(list_namespaces())
    handled: set[str] = set()
    if rd.is_dir():
        for rec in sorted(rd.glob(f"{PREFIX}*.json")):
            try:
                data = json.loads(rec.read_text())
                owner = int(data["owner_pid"])
                names = [str(n) for n in data["namespaces"]]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            names = [n for n in names if n.startswith(PREFIX)]
            handled.update(names)
            if _pid_alive(owner) and not force:
                report.kept_live.extend(n for n in names if n in existing)
                continue
            for n in names:
                if n in existing:
                    _delete_ns(n)
                    report.removed.append(n)
            rec.unlink(missing_ok=True)
            report.records_removed.append(rec.name)
    for n in sorted(existing - handled):
        m = _NS_RE.match(n)
        if not m:
            continue
        owner = int(m.group(1))
        if _pid_alive(owner) and not force:
            report.kept_live.append(n)
            continue
        _delete_ns(n)
        report.removed.append(n)
    return report


def cmd_netns_clean(args) -> int:
    """``chive-lab netns-clean [--force]``: report on stderr, exit 0 unless not root."""
    import sys

    why = available()
    if why:
        print(f"chive-lab: error: {why}", file=sys.stderr)
        return 1
    rep = clean_leftovers(force=bool(getattr(args, "force", False)))
    print(f"chive-lab: removed {len(rep.removed)} namespace(s)"
          + (f": {', '.join(rep.removed)}" if rep.removed else ""), file=sys.stderr)
    if rep.kept_live:
        print(f"chive-lab: left {len(rep.kept_live)} namespace(s) of live runs alone: "
              f"{', '.join(rep.kept_live)} (use --force)", file=sys.stderr)
    return 0


# ------------------------------------------------------- chive inside hosts
#: Roles a chive node can have in an :class:`Overlay`.
OVERLAY_ROLES = ("authority", "relay", "client", "httpd")
#: Bound on the consensus text a readiness probe reads.
_MAX_PROBE_BYTES = 16 << 20
_NICK_RE = re.compile(r"^[A-Za-z0-9]{1,19}$")


@dataclass
class OverlayNode:
    """One chive process placed on a host of a :class:`Testbed`."""

    name: str
    role: str
    host: str
    port: int
    config: dict
    dir: Path
    proc: subprocess.Popen | None = None
    #: File name of the process's stdout+stderr in ``dir``.
    log_name: str = "chive.log"

    @property
    def config_path(self) -> Path:
        """Where the node's TOML config is written."""
        return self.dir / f"{self.name}.toml"

    @property
    def log_path(self) -> Path:
        """The node's stdout+stderr (chive logs to stderr; tor writes its own log beside it)."""
        return self.dir / self.log_name


class Overlay:
    """A chive network placed on the hosts of a running :class:`Testbed`.

    Configs come from :mod:`chive_lab.config`'s builders (the same keys the
    loopback lab writes), with every listen address moved to the host's
    testbed address and exit policies accepting the testbed subnet::

        ov = Overlay(tb, out_dir)
        ov.add_authority("X")
        for h in "ABC":
            ov.add_relay(h, f"relay{h}", overrides={"SplitDirection": "always"})
        ov.add_client("A", "clientA"); ov.add_httpd("C", "httpdC")
        ov.start()                        # waits until a fetch through each client works
        ov.url("httpdC", "/bytes/10", exit="relayC")   # http://10.77.0.3.relayC.exit:8080/bytes/10

    Every process is started with :meth:`Testbed.popen`, so the testbed's
    ``down()`` stops it even if :meth:`stop` is never called; :meth:`stop`
    stops them in reverse start order first (so logs end cleanly).
    """

    def __init__(self, tb: Testbed, dir: Path, *, binary: Path | None = None,  # noqa: A002
                 consensus_interval: int = 1, log: str = "info",
                 progress: Callable[[str], None] | None = None) -> None:
        self.tb = tb
        self.dir = Path(dir)
        self.binary = Path(binary) if binary is not None else tb._chive()
        self.consensus_interval = consensus_interval
        self.log = log
        self.progress = progress or tb.progress
        self.nodes: dict[str, OverlayNode] = {}
        self.authority: OverlayNode | None = None
        self.authority_identity = ""

    # ------------------------------------------------------------ placing
    def _add(self, name: str, role: str, host: str, port: int, config: dict) -> OverlayNode:
        if name in self.nodes:
            raise LabError(f"duplicate overlay node {name!r}")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", name):
            raise LabError(f"invalid node name {name!r}")
        if host not in self.tb.hosts:
            raise LabError(f"no host {host!r} in this testbed")
        if not 1 <= port <= 65535:
            raise LabError(f"port {port} out of range")
        node = OverlayNode(name, role, host, port, config, self.dir / name)
        self.nodes[name] = node
        return node

    def add_authority(self, host: str, *, port: int = 7000, params: dict | None = None,
                      all_guards: bool = True, extra: dict | None = None) -> OverlayNode:
        """Place the directory authority (one per overlay) on ``host``.
        ``all_guards=False`` lets the bandwidth median decide the Guard flags."""
        from . import config as cfg

        if self.authority is not None:
            raise LabError("an overlay has one authority")
        conf = cfg.authority_config(data_dir=(self.dir / "authority").resolve(), dir_port=port,
                                    consensus_interval=self.consensus_interval,
                                    params=params or {}, log=self.log)
        conf["DirPort"] = f"{self.tb.addr(host)}:{port}"
        conf["TestingAllGuards"] = all_guards
        conf.update(extra or {})
        self.authority = self._add("authority", "authority", host, port, conf)
        return self.authority

    def add_relay(self, host: str, nickname: str, *, port: int = 9001,
                  bandwidth_rate: int | None = None, overrides: dict | None = None) -> OverlayNode:
        """Place a relay on ``host``: ORPort on the host's address, an exit for the
        testbed subnet (``ExitPolicyRejectPrivate = false``: the subnet is private)."""
        from . import config as cfg

        if not _NICK_RE.match(nickname):
            raise LabError(f"invalid nickname {nickname!r}: 1-19 letters or digits")
        conf = cfg.relay_config(nickname=nickname, data_dir=(self.dir / nickname).resolve(),
                                or_port=port, authority="", authority_identity="",
                                bandwidth_rate=bandwidth_rate, overrides=overrides or {},
                                log=self.log)
        conf["ORPort"] = f"{self.tb.addr(host)}:{port}"
        if "ExitPolicy" not in (overrides or {}):
            conf["ExitPolicy"] = [f"accept {self.tb.subnet}:*", "reject *:*"]
        conf["ExitPolicyRejectPrivate"] = False
        return self._add(nickname, "relay", host, port, conf)

    def add_client(self, host: str, name: str, *, port: int = 9050,
                   extra: dict | None = None) -> OverlayNode:
        """Place a SOCKS client on ``host`` (SocksPort on the host's address)."""
        from . import config as cfg

        conf = cfg.client_config(data_dir=(self.dir / name).resolve(), socks_port=port,
                                 authority="", authority_identity="", log=self.log)
        conf["SocksPort"] = f"{self.tb.addr(host)}:{port}"
        conf.update(extra or {})
        return self._add(name, "client", host, port, conf)

    def add_httpd(self, host: str, name: str, *, port: int = 8080) -> OverlayNode:
        """Place a ``chive httpd`` on ``host``."""
        from . import config as cfg

        conf = cfg.httpd_config(port=port)
        conf["Listen"] = f"{self.tb.addr(host)}:{port}"
        conf["Log"] = self.log
        return self._add(name, "httpd", host, port, conf)

    # ------------------------------------------------------------ addresses
    def addr(self, name: str) -> str:
        """``IP:PORT`` of a node's listening socket."""
        n = self.nodes[name]
        return f"{self.tb.addr(n.host)}:{n.port}"

    def url(self, httpd: str, path: str, *, exit: str | None = None) -> str:  # noqa: A002
        """URL of ``path`` on an httpd node; with ``exit``, in ``.exit`` notation
        (``http://IP.NICK.exit:PORT/path``) so the client must leave through it."""
        n = self.nodes[httpd]
        host = self.tb.addr(n.host) + (f".{exit}.exit" if exit else "")
        return f"http://{host}:{n.port}{path}"

    def relays(self) -> list[OverlayNode]:
        """The relay nodes in the order they were added."""
        return [n for n in self.nodes.values() if n.role == "relay"]

    # ------------------------------------------------------------ running
    def start(self, *, timeout: float = 60.0, probe_bytes: int = 1024) -> None:
        """Write configs and start every node: the authority first (its identity goes
        into every config), then relays, then — once the consensus lists every
        relay — clients and httpds; return when a verified fetch through each client
        to the first httpd works. Raises LabError (with the node's log tail)."""
        from . import config as cfg

        if self.authority is None:
            raise LabError("an overlay needs an authority (add_authority)")
        deadline = time.monotonic() + timeout
        self.dir.mkdir(parents=True, exist_ok=True)
        auth = self.authority
        cfg.write_toml(auth.config_path, auth.config)
        r = self.tb.sh(auth.host, [str(self.binary), "authority", "--config",
                                   str(auth.config_path.resolve()), "--print-identity"],
                       check=False, timeout=max(1.0, deadline - time.monotonic()))
        ident = next((ln.strip().lower() for ln in reversed(r.stdout.splitlines())
                      if re.fullmatch(r"[0-9a-fA-F]{64}", ln.strip())), "")
        if r.returncode != 0 or not ident:
            raise LabError(f"`chive authority --print-identity` failed: {r.stderr.strip()[-500:]}",
                           node="authority")
        self.authority_identity = ident
        for n in self.nodes.values():
            if n.role in ("relay", "client"):
                n.config["Authority"] = self.addr("authority")
                n.config["AuthorityIdentity"] = ident
        self._spawn(auth)
        for n in self.relays():
            self._spawn(n)
        relay_names = [n.name for n in self.relays()]
        self._wait_consensus(relay_names, deadline)
        self.progress(f"overlay: consensus lists {', '.join(relay_names)}")
        for n in self.nodes.values():
            if n.role in ("client", "httpd"):
                self._spawn(n)
        httpds = [n for n in self.nodes.values() if n.role == "httpd"]
        for c in (n for n in self.nodes.values() if n.role == "client"):
            if not httpds:
                break
            self._wait_fetch(c, self.url(httpds[0].name, f"/bytes/{probe_bytes}"), deadline)
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is not None:
                raise LabError(f"{n.name} exited during start-up", node=n.name,
                               log_tail=self._log_tail(n))
        self.progress("overlay: a verified fetch through every client worked: ready")

    def _spawn(self, n: OverlayNode) -> None:
        from . import config as cfg

        n.dir.mkdir(parents=True, exist_ok=True)
        cfg.write_toml(n.config_path, n.config)
        log = open(n.log_path, "ab")  # noqa: SIM115 - the child keeps it; closed below
        try:
            n.proc = self.tb.popen(n.host, [str(self.binary), n.role, "--config",
                                            str(n.config_path.resolve())],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   cwd=str(n.dir))
        finally:
            log.close()

    def _log_tail(self, n: OverlayNode) -> str:
        """The end of node ``n``'s log, for errors."""
        from .network import log_tail

        return log_tail(n.log_path)

    def _check_alive(self) -> None:
        for n in self.nodes.values():
            if n.proc is not None and n.proc.poll() is not None:
                raise LabError(f"{n.name} (on host {n.host}) exited with status {n.proc.returncode}",
                               node=n.name, log_tail=self._log_tail(n))

    def _consensus_probe(self, relays: list[str]) -> list[str]:
        """The command, run in the authority's host, that exits 0 once the consensus lists
        every one of ``relays``."""
        import sys

        return [sys.executable, "-m", "chive_lab.netns", "probe-consensus",
                "--url", f"http://{self.addr('authority')}/consensus", "--relays", ",".join(relays)]

    def _wait_consensus(self, relays: list[str], deadline: float) -> None:
        argv = self._consensus_probe(relays)
        last = ""
        while True:
            self._check_alive()
            r = self.tb.sh(self.authority.host, argv, check=False, timeout=15)  # type: ignore[union-attr]
            if r.returncode == 0:
                return
            last = (r.stdout + r.stderr).strip()[-300:]
            if time.monotonic() >= deadline:
                raise LabError(f"timed out waiting for a consensus listing {', '.join(relays)} ({last})",
                               node="authority")
            time.sleep(0.5)

    def _wait_fetch(self, client: OverlayNode, url: str, deadline: float) -> None:
        argv = [str(self.binary), "perf", "--socks", self.addr(client.name), "--url", url,
                "--verify", "--timeout", "10"]
        last = ""
        while True:
            self._check_alive()
            r = self.tb.sh(client.host, argv, check=False, timeout=20)
            if r.returncode == 0 and '"status":200' in r.stdout.replace(" ", ""):
                return
            last = (r.stdout + r.stderr).strip()[-300:]
            if time.monotonic() >= deadline:
                raise LabError(f"timed out fetching {url} through {client.name} ({last})",
                               node=client.name)
            time.sleep(0.5)

    def stop(self, grace: float = 5.0) -> dict[str, int | None]:
        """SIGTERM every node (clients first, authority last), wait, SIGKILL
        stragglers; returns node -> exit status."""
        order = sorted(self.nodes.values(),
                       key=lambda n: {"client": 0, "httpd": 1, "relay": 2, "authority": 3}[n.role])
        for n in order:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.terminate()
        deadline = time.monotonic() + grace
        out: dict[str, int | None] = {}
        for n in order:
            if n.proc is None:
                continue
            try:
                n.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait()
            out[n.name] = n.proc.returncode
        return out


def _probe_consensus(url: str, relays: list[str]) -> int:
    """Exit 0 if the consensus at ``url`` lists every relay (run inside a host)."""
    import urllib.request

    from .network import consensus_lists

    try:
        with urllib.request.urlopen(url, timeout=3.0) as resp:
            text = resp.read(_MAX_PROBE_BYTES + 1).decode("utf-8", "replace")
    except OSError as e:
        print(f"{url}: {e}")
        return 1
    missing = consensus_lists(text, relays)
    if missing:
        print(f"consensus does not list {', '.join(missing)} yet")
        return 1
    return 0


class NetnsBackend:
    """The runner's ``netns`` backend entry. Experiment kinds that build their
    own :class:`Testbed` (``paper002-tcp``, ``paper002-overlay``, the latter with
    an :class:`Overlay` inside it) only need it to exist; the generic
    ``overlay`` kind (clients on the runner's own host) cannot use it."""

    name = "netns"

    def start(self, spec, dir, *, impl: str = "chive", progress=None):  # noqa: A002 - runner API
        """Not for the generic overlay kind: its clients run outside namespaces."""
        raise LabError("the netns backend starts overlays only inside experiment kinds that "
                       "build their own Testbed (paper002-tcp, paper002-overlay)")

    def stop(self, dir):  # noqa: A002 - runner API
        """Nothing to stop: kinds using a Testbed remove it themselves."""
        from .process import DownReport

        return DownReport()


def _main(argv: list[str] | None = None) -> int:
    """``python -m chive_lab.netns probe-consensus --url URL --relays a,b``: the
    readiness probe :class:`Overlay` runs inside a host namespace."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m chive_lab.netns")
    ap.add_argument("cmd", choices=["probe-consensus"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--relays", required=True)
    a = ap.parse_args(argv)
    return _probe_consensus(a.url, [r for r in a.relays.split(",") if r])


if __name__ == "__main__":
    raise SystemExit(_main())
