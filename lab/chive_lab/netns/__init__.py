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

The parts: :mod:`.spec` (hosts and links as validated data), :mod:`.namespaces` (our
namespaces, records and leftovers), :mod:`.testbed` (the lifecycle), :mod:`.links` (the
wiring and delay lines), :mod:`.shaping` (``tc``), :mod:`.overlay` (a chive network placed
on the hosts; Debian's tor is :mod:`chive_lab.tor_netns`). Every public name is importable
from here, as when this was one module.
"""

from __future__ import annotations

from .namespaces import (
    PREFIX,
    RECORD_DIR,
    CleanReport,
    available,
    clean_leftovers,
    cmd_netns_clean,
    delete_namespace,
    list_namespaces,
    our_namespaces,
    run_cmd,
)
from .overlay import OVERLAY_ROLES, NetnsBackend, Overlay, OverlayNode, probe_consensus
from .spec import DEFAULT_SUBNET, Host, HostSpec, LinkSpec, parse_rate
from .testbed import Testbed

__all__ = [
    "DEFAULT_SUBNET",
    "OVERLAY_ROLES",
    "PREFIX",
    "RECORD_DIR",
    "CleanReport",
    "Host",
    "HostSpec",
    "LinkSpec",
    "NetnsBackend",
    "Overlay",
    "OverlayNode",
    "Testbed",
    "available",
    "clean_leftovers",
    "cmd_netns_clean",
    "delete_namespace",
    "list_namespaces",
    "our_namespaces",
    "parse_rate",
    "probe_consensus",
    "run_cmd",
]
