#!/usr/bin/env python3
"""EWMA gaming (paper 001, future work 8.2): does spreading one bulk download over many
circuits win a larger share of a bottleneck relay than one circuit does?

For each configuration: start a network (`chive-lab up --relays 4 --bandwidth-rate 1000000`,
EWMA), then three clients of our own, each with its own link (channel) to the same entry,
relay1 (`EntryNodes`): the *gamer* runs `--circuits` (50) continuous downloads, each with its
own SOCKS username so each gets its own circuit (IsolateSOCKSAuth); the *single* client runs
one continuous download on one circuit; the *web* client times 50 KiB fetches on fresh
circuits. After a warm-up, the goodput of gamer and single are measured over the same window,
while the web fetches run. All relays are limited to 1 MB/s; the entry carries everything, so
it is the bottleneck, and there the two bulk clients are on different channels. By default the
two bulk clients' paths meet only there (gamer: relay1-relay2-relay3, single: relay1-relay4-
relay5, by MiddleNodes and .exit notation); `--shared-middles` lets them share middles, and so
the middles' channels to the entry, where no relay can tell the clients apart.

    CHIVE_BIN=$PWD/target/release/chive .venv/bin/python lab/scripts/ewma_gaming.py \\
        --out runs/ewma-gaming [--configs ewma,ewma+fair,rr] [--circuits 50] [--seconds 30]
        [--shared-middles] [--set ReadRateMargin=1.0] [--param cc_alg=2]

Configurations: `ewma` (today's default: CrossChannelPriority ranks a channel by its best
circuit), `ewma+fair` (`ChannelFairness = true`: client channels ranked by their total),
`ewma+fair+cap` (`ChannelFairness` and `PerClientQueueCells = --cap`: the entry holds back a
client's SENDMEs once that many cells wait there for it, so the gamer's excess waits at the entry,
not in the middles; with `--set ClientCircuitWindow=500` the bound also counts what the
client's circuits may have in flight, so new circuits cannot set more moving; off by default),
`rr` (round-robin circuits, the baseline for EWMA's web gain). The other
configurations set `PerClientQueueCells = 0`. Prints gamer/single goodput and the web fetch quantiles; writes results.json.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from chive_lab.socks import SocksError, bulk_download, socks5_connect  # noqa: E402
from chive_lab.stats import quartiles  # noqa: E402
from ewma_load import fetch_times  # noqa: E402  (this script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / ".venv" / "bin" / "chive-lab"
CHIVE = Path(os.environ.get("CHIVE_BIN", ROOT / "target" / "release" / "chive"))
RATE = 1_000_000
CONFIGS = {
    "ewma": ["Scheduler=ewma", "ChannelFairness=false", "PerClientQueueCells=0"],
    "ewma+fair": ["Scheduler=ewma", "ChannelFairness=true", "PerClientQueueCells=0"],
    # PerClientQueueCells is set from --cap in main().
    "ewma+fair+cap": ["Scheduler=ewma", "ChannelFairness=true"],
    "rr": ["Scheduler=rr", "PerClientQueueCells=0"],
}


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_client(netdir, name, middles):
    """A `chive client` of our own, pinned to relay1 as its entry (its own channel there) and
    to `middles` as middle relays (empty: any)."""
    base = tomllib.loads((netdir / "client" / "client.toml").read_text())
    d = netdir / name
    d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    lines = [
        f'DataDirectory = "{d}"',
        f'SocksPort = "127.0.0.1:{port}"',
        f'Authority = "{base["Authority"]}"',
        f'AuthorityIdentity = "{base["AuthorityIdentity"]}"',
        'EntryNodes = ["relay1"]',
        "MiddleNodes = [" + ", ".join(f'"{m}"' for m in middles) + "]",
        "PreemptiveCircuits = 2",
        'Log = "info"',
    ]
    (d / "client.toml").write_text("\n".join(lines) + "\n")
    log = open(d / "chive.log", "w")
    proc = subprocess.Popen([str(CHIVE), "client", "--config", str(d / "client.toml")],
                            stdout=subprocess.DEVNULL, stderr=log)
    return proc, f"127.0.0.1:{port}"


def wait_fetch(socks, http, deadline):
    """Until a 1 KiB fetch through `socks` works (the client has its consensus and a circuit)."""
    host, port = http.removeprefix("http://").rsplit(":", 1)
    while time.monotonic() < deadline:
        try:
            s = socks5_connect(socks, host, int(port), timeout=5)
            s.sendall(b"GET /bytes/1024 HTTP/1.0\r\n\r\n")
            got = b""
            while chunk := s.recv(65536):
                got += chunk
            s.close()
            if got.endswith(bytes(i % 251 for i in range(1024))):
                return
        except (OSError, SocksError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"client at {socks} never fetched")


def web_fetches(socks, http, count, out):
    """50 KiB fetches on fresh circuits (ewma_load.py's `fetch_times`)."""
    return fetch_times(socks, f"{http}/bytes/51200", count, out)


def run_one(name, args, outdir):
    netdir = outdir / f"net-{name.replace('+', '-')}"
    relays = 5 if args.disjoint else 4
    up = [str(LAB), "up", "--dir", str(netdir), "--relays", str(relays), "--bandwidth-rate", str(RATE),
          "--quiet"]
    for kv in CONFIGS[name] + args.set:
        up += ["--set", kv]
    for kv in args.param:
        up += ["--param", kv]
    info = json.loads(subprocess.run(up, check=True, capture_output=True, text=True).stdout)
    procs = []
    try:
        http = info["http"]
        clients = {}
        # Disjoint: the gamer's circuits run relay1-relay2-relay3, the single's relay1-relay4-
        # relay5, so they meet only at the entry, on separate channels. Otherwise both pick
        # middles and exits among relay2-4 and share the middles' channels to the entry.
        middles = {"gamer": ["relay2"], "single": ["relay4"], "web": []} if args.disjoint else {}
        exits = {"gamer": "relay3", "single": "relay5"} if args.disjoint else {}
        for c in ("gamer", "single", "web"):
            proc, socks = start_client(netdir, c, middles.get(c, []))
            procs.append(proc)
            clients[c] = socks
        deadline = time.monotonic() + 60
        for socks in clients.values():
            wait_fetch(socks, http, deadline)
        stop = threading.Event()
        counters = {"gamer": 0, "single": 0}
        def download(client, user):
            def add(n):
                counters[client] += n
            return threading.Thread(target=bulk_download, args=(clients[client], http, stop, add),
                                    kwargs={"username": user, "exit_relay": exits.get(client)},
                                    daemon=True)

        threads = [download("gamer", f"g{i}") for i in range(args.circuits)]
        threads.append(download("single", "s"))
        for t in threads:
            t.start()
        stop.wait(args.warmup)
        t0, c0 = time.monotonic(), dict(counters)
        web = web_fetches(clients["web"], http, args.web, outdir / f"{name}-web.jsonl")
        left = args.seconds - (time.monotonic() - t0)
        if left > 0:
            stop.wait(left)
        elapsed = time.monotonic() - t0
        gamer = (counters["gamer"] - c0["gamer"]) / elapsed
        single = (counters["single"] - c0["single"]) / elapsed
        stop.set()
        for t in threads:
            t.join(timeout=5)
        # How many circuits the gamer really used: the client logs each stream's circuit.
        log = (netdir / "gamer" / "chive.log").read_text()
        circuits = {line.split("key=")[1].split()[0] for line in log.splitlines()
                    if "stream attached" in line and "isolation=g" in line}
        return {"gamer_Bps": gamer, "single_Bps": single,
                "gamer_over_single": gamer / single if single else None,
                "gamer_circuits": len(circuits), "seconds": elapsed,
                "share_of_rate": (gamer + single) / RATE, "web": quartiles(web)}
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        subprocess.run([str(LAB), "down", "--dir", str(netdir)], check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--configs", default="ewma,ewma+fair", help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--circuits", type=int, default=50, help="the gamer's circuits [50]")
    ap.add_argument("--seconds", type=float, default=30.0, help="measurement window [30]")
    ap.add_argument("--warmup", type=float, default=20.0,
                    help="seconds before measuring [20]: the channels' counts have a 30 s half-life, "
                         "so a shorter warm-up measures the repayment of the start-up, not the share")
    ap.add_argument("--web", type=int, default=20, help="50 KiB fetches during the window [20]")
    ap.add_argument("--shared-middles", dest="disjoint", action="store_false",
                    help="let gamer and single share middles and exits (4 relays), so they also meet "
                         "on the middles' channels to the entry; default: disjoint paths (5 relays)")
    ap.add_argument("--set", action="append", default=[], help="extra relay option KEY=VALUE")
    ap.add_argument("--param", action="append", default=[],
                    help="consensus parameter KEY=INT for the authority, e.g. cc_alg=2 (Vegas)")
    ap.add_argument("--cap", type=int, default=2000,
                    help="PerClientQueueCells of the ewma+fair+cap configuration [2000]")
    args = ap.parse_args()
    CONFIGS["ewma+fair+cap"].append(f"PerClientQueueCells={args.cap}")
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"command": sys.argv, "relay_rate": RATE, "circuits": args.circuits,
               "disjoint_paths": args.disjoint, "cap": args.cap, "runs": {}}
    for name in args.configs.split(","):
        if name not in CONFIGS:
            raise SystemExit(f"unknown config {name!r}")
        print(f"== {name}", file=sys.stderr)
        results["runs"][name] = run_one(name, args, args.out)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"{'config':13} {'gamer kB/s':>10} {'single kB/s':>11} {'gamer/single':>12} {'circuits':>8} "
          f"{'use of rate':>11}  web 50 KiB p25/p50/p75 (s)")
    for name, r in results["runs"].items():
        w = r["web"]
        fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        ratio = "-" if r["gamer_over_single"] is None else f"{r['gamer_over_single']:.2f}x"
        print(f"{name:13} {r['gamer_Bps'] / 1e3:>10.1f} {r['single_Bps'] / 1e3:>11.1f} {ratio:>12} "
              f"{r['gamer_circuits']:>8} {100 * r['share_of_rate']:>10.1f}%  "
              f"{fmt(w['p25'])}/{fmt(w['p50'])}/{fmt(w['p75'])} (n={w['n']})")


if __name__ == "__main__":
    main()
