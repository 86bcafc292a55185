"""The links of a testbed: each host's ``eth0`` joined to the switch through a segment of
its own, with a user-space delay line (``chive delayline``) in it when the link has delay,
jitter or loss (this kernel has no netem), the link's HTB shaping, and the host's TCP
congestion control. See the layout in :mod:`chive_lab.netns`.

:class:`HostLinks` is a part of :class:`~chive_lab.netns.Testbed`, which gives it
``hosts``, ``switch_ns``, ``subnet``, ``sh``, ``popen`` and ``_chive``; it keeps the link
plumbing apart from the namespace lifecycle.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import LabError
from .spec import Host, LinkSpec

__all__ = ["HostLinks"]


class HostLinks:
    """How :class:`~chive_lab.netns.Testbed` wires the switch and each host's link."""

    def _make_switch(self) -> None:
        sw = self.switch_ns
        self.sh(sw, ["ip", "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0"])
        self.sh(sw, ["ip", "link", "set", "br0", "up"])

    def _make_link(self, h: Host) -> None:
        """Host ``h``'s eth0, its segment in the switch, the link's shaping and the host's
        congestion control."""
        sw = self.switch_ns
        plen = self.subnet.prefixlen
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
