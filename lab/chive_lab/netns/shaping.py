"""Shaping a testbed's links with ``tc``: HTB at the link rate on both ends of a link
(the host's egress, or the switch side for ``queue_at="switch"``, and the switch port
towards the host), each class with a packet FIFO; and ``chive shape`` ACK prioritisation
on a host's egress in place of the link's own HTB.

:class:`LinkShaping` is a part of :class:`~chive_lab.netns.Testbed`, which gives it
``hosts``, ``switch_ns``, ``sh`` and ``_chive``.
"""

from __future__ import annotations

from ..errors import LabError

__all__ = ["LinkShaping"]


class LinkShaping:
    """The ``tc`` side of :class:`~chive_lab.netns.Testbed`."""

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
