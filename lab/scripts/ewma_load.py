#!/usr/bin/env python3
"""Issue 3's load figure: 50 KiB fetch times idle and under bulk load, per scheduler.

For each scheduler: start a network (`chive-lab up --relays 4 --bandwidth-rate 1000000`),
time 50 KiB fetches every 0.5 s on fresh circuits while idle, then again while two
continuous bulk downloads run, and measure the bulk goodput. Prints p25/p50/p75 and
the load/idle ratio of the median, and writes the raw records under --out.

    .venv/bin/python lab/scripts/ewma_load.py --out runs/ewma-load [--samples 40]
        [--schedulers rr,ewma,tor:ewma] [--set ConstrainedSockets=true ...]

A `tor:` prefix runs the same measurement on a private network of the real Tor
(`chive-lab up --impl tor`), with its scheduler mapped (ewma: CircuitPriorityHalflife,
rr: CircuitPriorityHalflife 0).
"""

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chive_lab.socks import bulk_download  # noqa: E402
from chive_lab.stats import quartiles  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / ".venv" / "bin" / "chive-lab"
# $CHIVE_BIN, as chive-lab: measure a copy while the tree is rebuilt.
CHIVE = Path(os.environ.get("CHIVE_BIN", ROOT / "target" / "release" / "chive"))
RATE = 1_000_000


def fetch_times(socks, url, samples, out):
    """`chive perf` fetches on fresh circuits; returns last_byte - start per success."""
    with open(out, "w") as f:
        subprocess.run(
            [str(CHIVE), "perf", "--socks", socks, "--url", url, "--count", str(samples),
             "--interval", "0.5", "--isolate", "--timeout", "60"],
            stdout=f, check=False)
    times = []
    for line in open(out):
        r = json.loads(line)
        if r.get("type", "transfer") == "transfer" and not r.get("error"):
            times.append(r["last_byte"] - r["start"])
    return times


def run_one(scheduler, args, outdir):
    netdir = outdir / f"net-{scheduler.replace(':', '-')}"
    impl, _, sched = scheduler.rpartition(":")
    impl = impl or "chive"
    up = [str(LAB), "up", "--dir", str(netdir), "--relays", "4", "--bandwidth-rate", str(RATE),
          "--impl", impl, "--set", f"Scheduler={sched}", "--quiet"]
    for kv in args.set:
        up += ["--set", kv]
    info = json.loads(subprocess.run(up, check=True, capture_output=True, text=True).stdout)
    try:
        socks, http = info["socks"], info["http"]
        small = f"{http}/bytes/51200"
        label = scheduler.replace(":", "-")
        idle = fetch_times(socks, small, args.samples, outdir / f"{label}-idle.jsonl")
        stop = threading.Event()
        counters = [0, 0]
        def count(i):
            def add(n):
                counters[i] += n
            return add

        threads = [threading.Thread(target=bulk_download, args=(socks, http, stop, count(i)),
                                    kwargs={"username": f"bulk{i}"}, daemon=True)
                   for i in range(2)]
        for t in threads:
            t.start()
        stop.wait(5)  # let the bulk transfers ramp up
        # Bulk alone: what the two downloads get from the bottleneck with nothing else running.
        t0, c0 = time.monotonic(), sum(counters)
        stop.wait(args.bulk_alone)
        alone = (sum(counters) - c0) / (time.monotonic() - t0)
        t0, c0 = time.monotonic(), sum(counters)
        load = fetch_times(socks, small, args.samples, outdir / f"{label}-load.jsonl")
        elapsed = time.monotonic() - t0
        goodput = (sum(counters) - c0) / elapsed
        web = 51200 * len(load) / elapsed
        stop.set()
        for t in threads:
            t.join(timeout=5)
        return {"idle": quartiles(idle), "load": quartiles(load),
                "bulk_alone_Bps": alone, "bulk_alone_share_of_rate": alone / RATE,
                "bulk_goodput_Bps": goodput, "bulk_share_of_rate": goodput / RATE,
                "web_goodput_Bps": web, "total_share_of_rate": (goodput + web) / RATE}
    finally:
        subprocess.run([str(LAB), "down", "--dir", str(netdir)], check=False)


def run_manifest(args) -> dict:
    """What produced this run: git revision, binaries, host, command (the lab's run manifest,
    reduced to what a script run has)."""
    from chive_lab import manifest

    git = manifest.git_state()
    rev, dirty = git["revision"], git["dirty"]
    binary = os.environ.get("CHIVE_BIN") or str(ROOT / "target" / "release" / "chive")
    versions = {"chive": manifest.cmd_output([binary, "--version"])}
    if any(s.startswith("tor:") for s in args.schedulers.split(",")):
        tor = manifest.cmd_output(["tor", "--version"])
        versions["tor"] = tor.splitlines()[0] if tor else None
    return {"script": "lab/scripts/ewma_load.py", "command": sys.argv, "git": {"revision": rev, "dirty": dirty},
            "binary": binary, "versions": versions, "relay_rate": RATE, "samples": args.samples,
            "schedulers": args.schedulers, "set": args.set,
            "host": {"hostname": socket.gethostname(), "kernel": platform.release(),
                     "cores": os.cpu_count()},
            "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "end": None, "status": "running"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--schedulers", default="rr,ewma",
                    help="comma-separated; prefix tor: to run the real Tor (e.g. rr,ewma,tor:ewma,tor:rr)")
    ap.add_argument("--set", action="append", default=[], help="extra relay option KEY=VALUE")
    ap.add_argument("--bulk-alone", type=float, default=10.0,
                    help="seconds to measure the bulk downloads alone before the fetches [10]")
    args = ap.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the network of the run in progress is taken down.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = run_manifest(args)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    results = {}
    for sched in args.schedulers.split(","):
        print(f"== {sched}", file=sys.stderr)
        results[sched] = run_one(sched, args, args.out)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    manifest.update(end=time.strftime("%Y-%m-%dT%H:%M:%S%z"), status="complete")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    wire = 51200 / RATE
    print(f"Goodput columns are shares of the {RATE / 1e6:g} MB/s bottleneck; a cell carries 498 "
          f"payload bytes in 514, so 96.9% is the ceiling. 50 KiB takes {wire:.3f} s on the wire.")
    print(f"{'scheduler':10} {'idle p25/p50/p75 (s)':25} {'load p25/p50/p75 (s)':25} "
          f"{'load/idle':>9} {'load/wire':>9}  bulk alone  bulk+web  (bulk, web)")
    for sched, r in results.items():
        i, l = r["idle"], r["load"]
        print(f"{sched:10} {i['p25']:.4f}/{i['p50']:.4f}/{i['p75']:.4f}{'':4} "
              f"{l['p25']:.4f}/{l['p50']:.4f}/{l['p75']:.4f}{'':4} {l['p50'] / i['p50']:>8.1f}x "
              f"{l['p50'] / wire:>8.2f}x  {100 * r['bulk_alone_share_of_rate']:>9.1f}% "
              f"{100 * r['total_share_of_rate']:>8.1f}%  ({100 * r['bulk_share_of_rate']:.1f}%, "
              f"{100 * r['web_goodput_Bps'] / RATE:.1f}%)")


if __name__ == "__main__":
    main()
