#!/usr/bin/env python3
"""Bulk goodput through rate-limited relays, with and without CPU contention.

For each round, contention level and relay config: start a network (`chive-lab up --relays 3
--bandwidth-rate RATE`, the config's `--set` options), optionally start BUSY busy-loop
processes at normal priority (killed by pid afterwards), run one continuous bulk download
through it for --seconds after a --warmup, and record its goodput as a share of RATE. The
configs alternate within each round, so they are compared under the same machine load.

    .venv/bin/python lab/scripts/rate_late_wakeups.py --out /work/runs/rate/late-wakeups \\
        [--rate 500000] [--busy 2] [--rounds 2] [--seconds 20] \\
        [--config fixed:OutbufMaxMsec=0 --config stretched:]

Writes goodput.csv (round, busy, config, bytes, seconds, goodput_Bps, share_of_rate,
loadavg_1m) and manifest.json under --out, and prints a table of the median share per
(busy, config). A cell carries 498 payload bytes in 514, so 96.9% of RATE is the ceiling.
"""

import argparse
import csv
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chive_lab.socks import bulk_download  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / ".venv" / "bin" / "chive-lab"
CHIVE = Path(os.environ.get("CHIVE_BIN", ROOT / "target" / "release" / "chive"))


def parse_config(text: str) -> tuple[str, list[str]]:
    """`label:K=V,K=V` (an empty list after the colon: the defaults)."""
    label, _, sets = text.partition(":")
    if not label:
        raise argparse.ArgumentTypeError(f"config {text!r} needs a label before ':'")
    pairs = [kv for kv in sets.split(",") if kv]
    for kv in pairs:
        if "=" not in kv:
            raise argparse.ArgumentTypeError(f"config {text!r}: {kv!r} is not KEY=VALUE")
    return label, pairs


def start_busy(n: int) -> list[subprocess.Popen]:
    """`n` busy loops at normal priority (the caller kills them by pid)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_busy(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(timeout=10)


def measure(args, label: str, sets: list[str], busy: int, netdir: Path) -> dict:
    up = [str(LAB), "up", "--dir", str(netdir), "--relays", "3", "--bandwidth-rate",
          str(args.rate), "--chive-bin", str(CHIVE), "--quiet"]
    for kv in sets:
        up += ["--set", kv]
    info = json.loads(subprocess.run(up, check=True, capture_output=True, text=True).stdout)
    procs: list[subprocess.Popen] = []
    try:
        procs = start_busy(busy)
        stop = threading.Event()
        count = [0]

        def add(n: int) -> None:
            count[0] += n

        t = threading.Thread(target=bulk_download, args=(info["socks"], info["http"], stop, add),
                             kwargs={"username": "bulk"}, daemon=True)
        t.start()
        stop.wait(args.warmup)
        t0, c0 = time.monotonic(), count[0]
        stop.wait(args.seconds)
        elapsed, got = time.monotonic() - t0, count[0] - c0
        load1 = os.getloadavg()[0]
        stop.set()
        t.join(timeout=5)
        return {"config": label, "busy": busy, "bytes": got, "seconds": round(elapsed, 3),
                "goodput_Bps": round(got / elapsed, 1),
                "share_of_rate": round(got / elapsed / args.rate, 4),
                "loadavg_1m": round(load1, 2)}
    finally:
        stop_busy(procs)
        subprocess.run([str(LAB), "down", "--dir", str(netdir)], check=False,
                       capture_output=True)


def manifest(args) -> dict:
    from chive_lab import manifest as m

    git = m.git_state()
    return {"script": "lab/scripts/rate_late_wakeups.py", "command": sys.argv,
            "git": {"revision": git["revision"], "dirty": git["dirty"]}, "binary": str(CHIVE),
            "versions": {"chive": m.cmd_output([str(CHIVE), "--version"])},
            "rate": args.rate, "busy": args.busy, "rounds": args.rounds,
            "seconds": args.seconds, "warmup": args.warmup,
            "configs": {label: sets for label, sets in args.config},
            "host": {"hostname": socket.gethostname(), "kernel": platform.release(),
                     "cores": os.cpu_count(), "loadavg_at_start": os.getloadavg()},
            "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "end": None, "status": "running"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rate", type=int, default=500_000, help="relays' BandwidthRate [500000]")
    ap.add_argument("--busy", type=int, default=2,
                    help="busy-loop processes in the contended half [2]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0, help="measured seconds per download")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring [5]")
    ap.add_argument("--config", type=parse_config, action="append", default=None,
                    help="LABEL:K=V,... relay options of one config (repeatable); default "
                         "fixed:OutbufMaxMsec=0 and stretched: (the defaults)")
    args = ap.parse_args()
    args.config = args.config or [("fixed", ["OutbufMaxMsec=0"]), ("stretched", [])]
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    args.out.mkdir(parents=True, exist_ok=True)
    man = manifest(args)
    (args.out / "manifest.json").write_text(json.dumps(man, indent=2))
    rows = []
    fields = ["round", "busy", "config", "bytes", "seconds", "goodput_Bps", "share_of_rate",
              "loadavg_1m"]
    with open(args.out / "goodput.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for rnd in range(1, args.rounds + 1):
            for busy in (0, args.busy):
                for label, sets in args.config:
                    print(f"== round {rnd} busy {busy} {label}", file=sys.stderr)
                    r = {"round": rnd, **measure(args, label, sets, busy,
                                                 args.out / f"net-{rnd}-{busy}-{label}")}
                    print(f"   share {r['share_of_rate']:.3f} load {r['loadavg_1m']}",
                          file=sys.stderr)
                    w.writerow(r)
                    f.flush()
                    rows.append(r)
    man.update(end=time.strftime("%Y-%m-%dT%H:%M:%S%z"), status="complete")
    (args.out / "manifest.json").write_text(json.dumps(man, indent=2))
    print(f"{'busy':>4} {'config':12} {'median share':>12}  shares")
    for busy in (0, args.busy):
        for label, _ in args.config:
            s = [r["share_of_rate"] for r in rows if r["busy"] == busy and r["config"] == label]
            print(f"{busy:>4} {label:12} {statistics.median(s):>12.3f}  "
                  + " ".join(f"{x:.3f}" for x in s))


if __name__ == "__main__":
    main()
