"""``python -m chive_lab.netns probe-consensus --url URL --relays a,b``: the readiness probe
:class:`~chive_lab.netns.Overlay` runs inside a host namespace."""

from __future__ import annotations

import argparse

from ..network import consensus_lists
from .overlay import probe_consensus


def main(argv: list[str] | None = None) -> int:
    """Exit 0 once the consensus at ``--url`` lists every relay of ``--relays``."""
    ap = argparse.ArgumentParser(prog="python -m chive_lab.netns")
    ap.add_argument("cmd", choices=["probe-consensus"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--relays", required=True)
    a = ap.parse_args(argv)
    relays = [r for r in a.relays.split(",") if r]
    return probe_consensus(a.url, lambda text: consensus_lists(text, relays))


if __name__ == "__main__":
    raise SystemExit(main())
