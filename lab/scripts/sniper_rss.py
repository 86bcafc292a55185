#!/usr/bin/env python3
"""The sniper attack (Jansen et al., NDSS 2014) on the entry relay of a 3-relay loopback network,
chive and Debian's tor in one run, the entry's RSS sampled every 50 ms (issue 18; the library is
chive_lab/sniper.py, which says how the attack goes).

    CHIVE_BIN=$PWD/target/release/chive .venv/bin/python lab/scripts/sniper_rss.py \\
        --out /work/runs/sniper/DIR [--runs chive,chive-nocap,tor-cc0,tor-cc2] [--circuits 800] \\
        [--max-mem "256 MB"] [--hold 20] [--drain 2] [--honest-bytes 10000000]

Runs: `chive` (its defaults: the per-client queue cap and the OOM handler); `chive-nocap`
(`PerClientQueueCells = 0`: the OOM handler alone); `tor-cc0` (tor with consensus cc_alg=0:
fixed 1000-cell circuit windows, as chive); `tor-cc2` (cc_alg=2, Vegas, tor's default); `tor` (cc_alg left unset). Each run starts
its own network in OUT/net-<run>. Writes OUT/rss-<run>.{csv,png}, OUT/rss-all.{csv,png},
OUT/summary.json (per run: RSS before/peak/end/after in MiB, OOM kills, the honest download),
OUT/summary.md (the table) and OUT/manifest.json (git revision, binary, tor version, host).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chive_lab.errors import LabError  # noqa: E402
from chive_lab.network import default_binary  # noqa: E402
from chive_lab.sniper import AttackConfig, run_attack  # noqa: E402
from chive_lab.sniper_report import (  # noqa: E402
    markdown_table,
    run_manifest,
    text_table,
    write_comparison,
    write_json,
    write_run,
)

# name -> (implementation, tor's cc_alg, chive's PerClientQueueCells; None = the default)
RUNS = {
    "chive": ("chive", None, None),
    "chive-nocap": ("chive", None, 0),
    "tor": ("tor", None, None),
    "tor-cc0": ("tor", 0, None),
    "tor-cc2": ("tor", 2, None),
}


def progress(msg: str) -> None:
    print(f"sniper: {msg}", file=sys.stderr, flush=True)


def configs(args: argparse.Namespace) -> list[AttackConfig]:
    out = []
    for name in args.runs.split(","):
        if name not in RUNS:
            raise SystemExit(f"unknown run {name!r}: one of {', '.join(RUNS)}")
        impl, cc, per_client = RUNS[name]
        c = AttackConfig(impl=impl, label=name, circuits=args.circuits, streams=args.streams,
                         max_mem=args.max_mem, cc_alg=cc, per_client_queue_cells=per_client, drain_s=args.drain, hold_s=args.hold,
                         after_s=args.after, honest_bytes=args.honest_bytes, sample_s=args.sample,
                         read_while_opening=args.read_while_opening)
        c.validate()
        out.append(c)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="a new or empty directory")
    ap.add_argument("--runs", default="chive,chive-nocap,tor-cc0,tor-cc2", help=f"comma-separated, of {', '.join(RUNS)}")
    ap.add_argument("--circuits", type=int, default=800, help="attack circuits [800]")
    ap.add_argument("--streams", type=int, default=2, help="bulk streams per circuit [2]")
    ap.add_argument("--max-mem", default="256 MB", help='MaxMemInQueues of every relay ["256 MB"]')
    ap.add_argument("--drain", type=float, default=2.0, help="seconds the streams are read before SIGSTOP [2]")
    ap.add_argument("--read-while-opening", action="store_true",
                    help="read each attack stream from the moment it opens (default: only for --drain "
                         "seconds once all are open)")
    ap.add_argument("--hold", type=float, default=20.0, help="seconds the attacker stays stopped [20]")
    ap.add_argument("--after", type=float, default=5.0, help="seconds sampled after the attacker's kill [5]")
    ap.add_argument("--honest-bytes", type=int, default=10_000_000, help="honest download size [10000000]")
    ap.add_argument("--sample", type=float, default=0.05, help="RSS sampling interval in seconds [0.05]")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    runs = configs(args)
    binary = default_binary()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = run_manifest(sys.argv if argv is None else ["sniper_rss.py", *argv], binary,
                            [asdict(c) for c in runs])
    write_json(args.out / "manifest.json", manifest)
    results = []
    failed = []
    for c in runs:
        try:
            r = run_attack(c, args.out / f"net-{c.name()}", binary, progress).to_json()
        except LabError as e:
            progress(f"{c.name()} failed: {e}")
            failed.append({"label": c.name(), "error": str(e)})
            continue
        write_run(r, args.out)
        results.append(r)
        write_json(args.out / "summary.json", {"runs": [x["summary"] for x in results], "failed": failed})
    if results:
        write_comparison(results, args.out)
    summaries = [r["summary"] for r in results]
    write_json(args.out / "summary.json", {"runs": summaries, "failed": failed,
                                           "marks": {r["summary"]["label"]: r["marks"] for r in results}})
    (args.out / "summary.md").write_text(markdown_table(summaries) + "\n", encoding="utf-8")
    manifest.update(end=time.strftime("%Y-%m-%dT%H:%M:%S%z"), status="failed" if failed else "complete",
                    failed=failed)
    write_json(args.out / "manifest.json", manifest)
    print(text_table(summaries))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
