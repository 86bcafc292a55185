#!/usr/bin/env python3
"""Per-relay queue delay of sampled cells, split into bulk-like and light circuits.

Reads each relay's metrics.jsonl under a run's network directory (``chive-lab run`` writes
them to OUT/runs/<variant>/<rep>/net/relayN/metrics.jsonl) and prints, per relay, how long
the sampled cells waited in their circuit queue (queued -> dequeued) and in the output
buffer (dequeued -> written), median and 90th percentile in ms, for two classes:

* ``bulk``: circuits that sent more than --bulk-share of the busiest circuit's cells on that
  relay (the relay cannot know the client's class; volume is what separates bulk from web
  in the paper-000 scenarios, where bulk circuits move ~10x more cells);
* ``light``: the others.

This shows WHERE the queue forms (which relay, and whether a light circuit waits there),
which the end-to-end times alone do not.

    .venv/bin/python lab/scripts/queue_delay_by_class.py runs/x/runs/ewma/1 [more run dirs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def relay_metrics(run_dir: Path) -> dict[str, Path]:
    """``{relay name: metrics.jsonl}`` of one run directory (or its ``net`` subdirectory)."""
    net = run_dir / "net" if (run_dir / "net").is_dir() else run_dir
    found = {p.parent.name: p for p in sorted(net.glob("relay*/metrics.jsonl"))}
    if not found:
        raise SystemExit(f"no relay*/metrics.jsonl under {net}")
    return found


def classify(lines: list[str], bulk_share: float) -> dict[str, dict[str, list[float]]]:
    """Queue and output-buffer delays (seconds) per class from one relay's JSON lines."""
    sent: dict[int, int] = {}
    cells = []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("type") == "circ":
            sent[d["circ"]] = d["cells_sent"]  # the last record is the total
        elif d.get("type") == "cell":
            cells.append(d)
    busiest = max(sent.values(), default=0)
    out: dict[str, dict[str, list[float]]] = {}
    for c in cells:
        cls = "bulk" if busiest and sent.get(c["circ"], 0) > bulk_share * busiest else "light"
        d = out.setdefault(cls, {"queue": [], "outbuf": []})
        d["queue"].append(c["dequeued"] - c["queued"])
        if c.get("written") is not None:
            d["outbuf"].append(c["written"] - c["dequeued"])
    return out


def summarize(values: list[float]) -> tuple[int, float, float]:
    """(n, median ms, p90 ms)."""
    if not values:
        return 0, float("nan"), float("nan")
    s = sorted(values)
    return len(s), statistics.median(s) * 1000, s[min(len(s) - 1, int(0.9 * len(s)))] * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (…/runs/<variant>/<rep>)")
    ap.add_argument("--bulk-share", type=float, default=0.3,
                    help="a circuit is bulk if it sent more than this share of the busiest one's cells")
    a = ap.parse_args(argv)
    if not 0 < a.bulk_share < 1:
        ap.error("--bulk-share must be between 0 and 1")
    for run in a.runs:
        print(run)
        for name, path in relay_metrics(run).items():
            by = classify(path.read_text(errors="replace").splitlines(), a.bulk_share)
            parts = []
            for cls in ("light", "bulk"):
                if cls in by:
                    n, q50, q90 = summarize(by[cls]["queue"])
                    _, o50, o90 = summarize(by[cls]["outbuf"])
                    parts.append(f"{cls}: n={n} queue p50/p90 {q50:.1f}/{q90:.1f} ms, "
                                 f"outbuf {o50:.1f}/{o90:.1f} ms")
            print(f"  {name}: " + ("; ".join(parts) or "no sampled cells"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
