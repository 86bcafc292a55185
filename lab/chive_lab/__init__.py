"""chive_lab: start, stop and measure private chive networks on one machine.

Library first: :class:`~chive_lab.network.Network` does the work and
``chive_lab.cli`` is a thin command line over it.
"""

from .errors import LabError
from .network import DownReport, Network, NetworkInfo, NetworkSpec

__all__ = ["DownReport", "LabError", "Network", "NetworkInfo", "NetworkSpec"]
__version__ = "0.1.0"
