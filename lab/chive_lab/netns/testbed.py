"""A testbed: hosts in network namespaces around one switch namespace, made and removed as
one, with clean-up guaranteed on success, failure and Ctrl-C/SIGTERM (see
:mod:`chive_lab.netns` for the layout). The links are :class:`~.links.HostLinks`' work,
their shaping :class:`~.shaping.LinkShaping`'s; this module holds the lifecycle and
running commands inside hosts.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..errors import LabError
from .links import HostLinks
from .namespaces import PREFIX, RECORD_DIR, delete_namespace, run_cmd
from .shaping import LinkShaping
from .spec import DEFAULT_SUBNET, Host, HostSpec

__all__ = ["Testbed"]

_counter_lock = threading.Lock()
_counter = 0


class Testbed(HostLinks, LinkShaping):
    """Hosts in namespaces around one switch namespace; see :mod:`chive_lab.netns`.

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
            run_cmd(["ip", "netns", "add", ns])
            self._created.append(ns)
            self.sh(ns, ["ip", "link", "set", "lo", "up"])
            # No IPv6 chatter (router solicitations, DAD) on the measured links.
            for key in ("all", "default"):
                self.sh(ns, ["sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"], check=False)
        self._make_switch()
        for h in self.hosts.values():
            self._make_link(h)
        self.progress(f"netns: {self.run_id} is up")

    def _chive(self) -> Path:
        if self.chive_bin is None:
            from ..network import default_binary

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
            delete_namespace(ns)
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
        return run_cmd(["ip", "netns", "exec", self._nsname(host_or_ns), *argv], check=check,
                       timeout=timeout)

    exec = sh

    def popen(self, host_or_ns: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start ``argv`` inside a host or namespace; stopped by :meth:`down`."""
        p = subprocess.Popen(["ip", "netns", "exec", self._nsname(host_or_ns), *argv], **kw)
        self._procs.append(p)
        return p


def _raise_interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
