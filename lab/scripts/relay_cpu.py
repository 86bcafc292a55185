#!/usr/bin/env python3
"""Issue 20's measurement: CPU time per relayed byte of each process of a 3-hop download.

For each implementation (chive, then Debian's tor 0.4.9 in the same run): start a 3-relay
loopback network without rate limits (`chive-lab up --relays 3`), download --bytes through the
client's SOCKS port with curl --runs times, and read utime+stime (/proc/PID/stat) and the peak
RSS (VmHWM, /proc/PID/status) of every relay, the client and the httpd before and after each
download. Reported: ns of CPU per relayed byte (CPU time / downloaded bytes: in a 3-relay network
every relay carries every byte once), goodput, peak RSS. Then the memory per circuit: RSS delta of
each relay after --circuits SOCKS streams on circuits of their own (idle: connected, no request;
busy: each asks for a large body that nobody reads, so every queue on the path fills to its limit).

The crypto floor, measured in the same run with criterion (`cargo bench`, short warm-up/measure
times; the estimates are read from target/criterion/*/new/estimates.json, so nothing parses
criterion's human output): one cell's onion layer (chive-crypto `RelayHopCrypto`, AES-128-CTR over
509 bytes; the exit's also takes SHA-1), the client's three layers, and rustls TLS 1.3 records of
16 KiB, both the cipher alone (AES-128-GCM, the suite chive's links negotiate since session 14,
via rustls's record encrypter/decrypter) and through rustls's connection API on an in-memory pair
(which adds copies).
The IO floor (`--impl io`, in the same run): the same download through plain TCP forwarders in
place of the client and the relays (lab/chive_lab/iofloor.py, crates/tools/examples/tcpfwd.rs:
read, write, no crypto, no cells); chive's rows then say `own ns/B`, their CPU per byte minus the
IO floor of their role and minus the crypto floor: what chive's own work costs.
`--impl io-rate` runs the same forwarders once more at chive's median goodput of this run (curl
--limit-rate; chive must come first in --impl): a forwarder woken for smaller pieces at ~120 MB/s
spends more per byte than at full loopback speed, so `own at rate` (chive minus this floor and
the crypto floor) is chive's own work against forwarding at the same rate.

Floor per relayed byte (ciphers only): guard and middle = TLS open + one layer + TLS seal; exit = originate
(layer + digest) + TLS seal; client = TLS open + three layers. A cell carries 498 bytes of data in
514 on the wire, so TLS costs scale by 514/498 and a cell's crypto is spread over 498 bytes.

`--param cc_alg=2` (any KEY=INT network parameter) runs both networks with it. Writes DIR/results.json, DIR/results.csv, DIR/manifest.json (git revision, binaries, host).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / ".venv" / "bin" / "chive-lab"
CHIVE = Path(os.environ.get("CHIVE_BIN", ROOT / "target" / "release" / "chive"))
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
FWD = Path(os.environ.get("TCPFWD_BIN", TARGET / "release" / "examples" / "tcpfwd"))
IMPLS = ("chive", "io", "io-rate", "tor")
# The implementations that are plain TCP forwarders (no crypto, no cells): the IO floors.
FORWARDERS = ("io", "io-rate")

# A relay cell: 509 bytes of payload, of which 498 carry stream data; 514 bytes on the link.
CELL_PAYLOAD = 509
CELL_DATA = 498
CELL_WIRE = 514
TLS_RECORD = 16 * 1024

# The criterion benches the floor is made of: (package, bench target, filter, estimates paths);
# all of them are chive-benches' (crates/benches), which builds the benches of the other crates.
FLOOR_BENCHES = {
    "onion_layer": ("chive-benches", "crypto", "relay_cell/relay_encrypt_backward"),
    "onion_originate": ("chive-benches", "crypto", "relay_cell/relay_originate_backward"),
    "client_3hop": ("chive-benches", "crypto", "relay_cell/client_3hop_decrypt_from_exit"),
    # The cipher alone (ring's AES-128-GCM, the suite chive's links negotiate, through rustls's
    # record encrypter/decrypter).
    "aead_seal": ("chive-benches", "tls_record", "tls_record/aead_seal_16k/aes128gcm"),
    "aead_open": ("chive-benches", "tls_record", "tls_record/aead_open_16k/aes128gcm"),
    # rustls's connection API, with its buffering copies (what the relays call).
    "rustls_seal": ("chive-benches", "tls_record", "tls_record/seal_16k/aes128gcm"),
    "rustls_seal_open": ("chive-benches", "tls_record", "tls_record/seal_open_16k/aes128gcm"),
    # AES-256-GCM, what the links negotiated before session 14, for comparison.
    "rustls256_seal_open": ("chive-benches", "tls_record", "tls_record/seal_open_16k/aes256gcm"),
    # tor1's running SHA-1 at an edge (part of `onion_originate` and `client_3hop`): one cell's
    # digest (extend by 509 bytes, finalize a clone) and the compression function's own speed.
    "sha1_cell": ("chive-benches", "crypto", "sha1_floor/running_digest_cell"),
    "sha1_8k": ("chive-benches", "crypto", "sha1_floor/blocks_8k"),
}

# SHA-1 blocks in an 8 KiB update (`sha1_8k`).
SHA1_8K_BLOCKS = 8192 // 64


def progress(msg: str) -> None:
    print(f"relay-cpu: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- /proc (chive_lab.procstat) ----

# The readers live in the library; imported here so `relay_cpu.read_proc` etc. stay the script's API.
from chive_lab.procstat import (  # noqa: E402,F401
    connected_to, cpu_delta, parse_net_tcp, parse_stat, parse_status_kib, read_proc, socket_inodes)


def ns_per_byte(cpu_s: float, nbytes: int) -> float:
    return cpu_s * 1e9 / nbytes if nbytes > 0 else float("nan")


# ---------------------------------------------------------------- the crypto floor (pure) ------

def read_estimate(path: Path) -> float:
    """ns per iteration from a criterion estimates.json (its median: robust on a loaded host)."""
    obj = json.loads(Path(path).read_text())
    return float(obj["median"]["point_estimate"])


def floor_from_estimates(est: dict[str, float]) -> dict:
    """ns per relayed byte of the crypto each role must do, from per-iteration ns of the benches.

    `est` maps FLOOR_BENCHES keys to ns per iteration (per cell, or per 16 KiB record). The
    floor (`relay`, `exit`, `client`) counts the ciphers only; `relay_rustls` is the same work
    through rustls's connection API, which adds a copy in and a copy out per side."""
    wire = CELL_WIRE / CELL_DATA
    tls_seal = est["aead_seal"] / TLS_RECORD * wire
    tls_open = est["aead_open"] / TLS_RECORD * wire
    layer = est["onion_layer"] / CELL_DATA
    out = {
        "tls_seal_ns_per_byte": tls_seal,
        "tls_open_ns_per_byte": tls_open,
        "onion_layer_ns_per_byte": layer,
        "relay": tls_open + layer + tls_seal,
        "exit": est["onion_originate"] / CELL_DATA + tls_seal,
        "client": tls_open + est["client_3hop"] / CELL_DATA,
        # Raw throughput of the primitives, for comparison with `openssl speed`.
        "aes128ctr_GBps": CELL_PAYLOAD / est["onion_layer"],
        "aes128gcm_seal_GBps": TLS_RECORD / est["aead_seal"],
        "aes128gcm_open_GBps": TLS_RECORD / est["aead_open"],
    }
    if "rustls_seal_open" in est:
        out["relay_rustls"] = est["rustls_seal_open"] / TLS_RECORD * wire + layer
        out["rustls_seal_open_GBps"] = TLS_RECORD / est["rustls_seal_open"]
    if "rustls256_seal_open" in est:
        out["rustls256_seal_open_GBps"] = TLS_RECORD / est["rustls256_seal_open"]
    if "sha1_cell" in est and "sha1_8k" in est:
        # The edges' running digest per relayed byte, the compression function's speed, and a
        # cell's digest in compressions' worth (9.08 would be compressions and nothing else).
        out["sha1_digest_ns_per_byte"] = est["sha1_cell"] / CELL_DATA
        out["sha1_GBps"] = SHA1_8K_BLOCKS * 64 / est["sha1_8k"]
        out["sha1_blocks_per_cell"] = est["sha1_cell"] / (est["sha1_8k"] / SHA1_8K_BLOCKS)
    return out


def measure_floor(args) -> dict:
    """Run the criterion benches (short times) and compute floor_from_estimates."""
    by_bench: dict[tuple[str, str], list[str]] = {}
    for pkg, bench, ident in FLOOR_BENCHES.values():
        by_bench.setdefault((pkg, bench), []).append(ident)
    for (pkg, bench), idents in by_bench.items():
        group = "|".join(sorted({i.split("/")[0] for i in idents}))  # criterion: a regex
        cmd = ["cargo", "bench", "--quiet", "-p", pkg, "--bench", bench, "--", group,
               "--warm-up-time", "1", "--measurement-time", str(args.floor_seconds)]
        progress("crypto floor: " + " ".join(cmd))
        res = subprocess.run(cmd, cwd=ROOT, check=False, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()[-2000:]}")
    est = {key: read_estimate(TARGET / "criterion" / ident / "new" / "estimates.json")
           for key, (_pkg, _bench, ident) in FLOOR_BENCHES.items()}
    openssl = {alg: openssl_speed(alg) for alg in ("aes-128-ctr", "aes-128-gcm", "aes-256-gcm", "sha1")}
    return {"estimates_ns": est, **floor_from_estimates(est), "openssl_GBps": openssl}


def parse_openssl_speed(text: str, alg: str) -> float | None:
    """GB/s from `openssl speed -bytes 16384 -evp ALG` output (its last line: `alg  NNNN.NNk`,
    thousands of bytes per second)."""
    for line in reversed(text.splitlines()):
        f = line.split()
        if len(f) >= 2 and f[0].lower() == alg.lower() and f[-1].endswith("k"):
            try:
                return float(f[-1][:-1]) * 1e3 / 1e9
            except ValueError:
                return None
    return None


def openssl_speed(alg: str) -> float | None:
    """What openssl (tor's crypto library) does on this machine, for reference; None if absent."""
    try:
        res = subprocess.run(["openssl", "speed", "-seconds", "1", "-bytes", str(TLS_RECORD), "-evp", alg],
                             check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_openssl_speed(res.stdout, alg)


# ---------------------------------------------------------------- results (pure) ---------------

def role_of(name: str, exits: list[str]) -> str:
    if name in ("client", "httpd"):
        return name
    if name.startswith("relay"):
        return "exit" if name in exits else "relay"
    return "other"


def summarize(runs: dict[str, list[dict]], floor: dict | None) -> list[dict]:
    """One row per (implementation, process): median over runs of ns/byte, goodput, peak RSS;
    ratio to the floor of its role and to tor's median relay (relays) or tor's client (client)."""
    rows = []
    for impl, rs in runs.items():
        names = list(rs[0]["procs"])
        for name in names:
            vals = [r["procs"][name]["ns_per_byte"] for r in rs if name in r["procs"]]
            # The exit is found per download; a circuit rebuilt between runs may move it.
            role = statistics.mode(r["procs"][name]["role"] for r in rs if name in r["procs"])
            rows.append({
                "impl": impl, "process": name, "role": role,
                "ns_per_byte": statistics.median(vals), "ns_per_byte_runs": vals,
                "net_ns_per_byte": statistics.median(r["procs"][name].get("net_ns_per_byte", r["procs"][name]["ns_per_byte"])
                                                     for r in rs if name in r["procs"]),
                "idle_ms_per_s": 1e3 * statistics.median(r["procs"][name].get("idle_cpu_per_s", 0.0)
                                                         for r in rs if name in r["procs"]),
                "user_share": statistics.median(r["procs"][name]["user_s"] / r["procs"][name]["cpu_s"]
                                                if r["procs"][name]["cpu_s"] else 0.0 for r in rs),
                "goodput_MBps": statistics.median(r["goodput_MBps"] for r in rs),
                "peak_rss_MiB": max(r["procs"][name]["hwm_kib"] or 0 for r in rs) / 1024,
            })
    tor_relays = [r["ns_per_byte"] for r in rows if r["impl"] == "tor" and r["role"] in ("relay", "exit")]
    tor_relay = statistics.median(tor_relays) if tor_relays else None
    tor_client = next((r["ns_per_byte"] for r in rows if r["impl"] == "tor" and r["role"] == "client"), None)
    io_floor = io_floor_by_role(rows)
    io_floor_at_rate = io_floor_by_role(rows, "io-rate")
    for r in rows:
        f = floor.get("exit" if r["role"] == "exit" else r["role"]) if floor else None
        # The forwarders of the IO floor do no crypto: no crypto floor for them.
        r["floor_ns_per_byte"] = (f if r["role"] in ("relay", "exit", "client")
                                  and r["impl"] not in FORWARDERS else None)
        r["x_floor"] = r["ns_per_byte"] / f if r["floor_ns_per_byte"] else None
        ref = (None if r["impl"] in FORWARDERS else tor_client if r["role"] == "client"
               else tor_relay if r["role"] in ("relay", "exit") else None)
        r["x_tor"] = r["ns_per_byte"] / ref if ref else None
        for key, floors in (("", io_floor), ("_at_rate", io_floor_at_rate)):
            io = floors.get(r["role"]) if r["impl"] not in FORWARDERS else None
            r[f"io_floor{key}_ns_per_byte"] = io
            r[f"own{key}_ns_per_byte"] = (r["ns_per_byte"] - io - (f or 0.0)
                                          if io is not None and r["floor_ns_per_byte"] else None)
    return rows


def io_floor_by_role(rows: list[dict], impl: str = "io") -> dict[str, float]:
    """An IO floor per role (relay, exit, client): the median of the `impl` rows of that role
    (`io`: the forwarders at full speed; `io-rate`: at chive's goodput)."""
    by_role: dict[str, list[float]] = {}
    for r in rows:
        if r["impl"] == impl and r["role"] in ("relay", "exit", "client"):
            by_role.setdefault(r["role"], []).append(r["ns_per_byte"])
    return {role: statistics.median(v) for role, v in by_role.items()}


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


COLUMNS = [("impl", "impl", "s"), ("process", "process", "s"), ("role", "role", "s"),
           ("ns_per_byte", "ns/byte", ".2f"), ("net_ns_per_byte", "net of idle", ".2f"),
           ("idle_ms_per_s", "idle ms/s", ".1f"), ("floor_ns_per_byte", "floor ns/B", ".3f"),
           ("x_floor", "x floor", ".1f"), ("io_floor_ns_per_byte", "IO floor ns/B", ".2f"),
           ("own_ns_per_byte", "own ns/B", ".2f"),
           ("io_floor_at_rate_ns_per_byte", "IO floor at rate", ".2f"),
           ("own_at_rate_ns_per_byte", "own at rate", ".2f"), ("x_tor", "x tor", ".2f"),
           ("goodput_MBps", "goodput MB/s", ".1f"), ("peak_rss_MiB", "peak RSS MiB", ".1f")]


def text_table(rows: list[dict]) -> str:
    head = [h for _k, h, _s in COLUMNS]
    body = [[_fmt(r[k], s) for k, _h, s in COLUMNS] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [head, *body])


def markdown_table(rows: list[dict]) -> str:
    out = ["| " + " | ".join(h for _k, h, _s in COLUMNS) + " |",
           "|" + "|".join("---" for _ in COLUMNS) + "|"]
    out += ["| " + " | ".join(_fmt(r[k], s) for k, _h, s in COLUMNS) + " |" for r in rows]
    return "\n".join(out)


def memory_table(mem: dict[str, dict]) -> str:
    lines = [f"{'impl':6} {'process':8} {'idle B/circuit':>15} {'busy B/circuit':>15}"]
    for impl, m in mem.items():
        for name, v in m["per_process"].items():
            lines.append(f"{impl:6} {name:8} {v['idle_bytes_per_circuit']:>15.0f} "
                         f"{v['busy_bytes_per_circuit']:>15.0f}")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = [k for k, _h, _s in COLUMNS] + ["user_share"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


# ---------------------------------------------------------------- running a network ------------

def lab_up(impl: str, netdir: Path, sets: list[str] = (), params: list[str] = ()) -> dict:
    """Start the network; `sets` (KEY=VALUE) go to chive's relays as `chive-lab up --set`,
    `params` (KEY=INT) to either network's authorities as `chive-lab up --param`."""
    cmd = [str(LAB), "up", "--impl", impl, "--dir", str(netdir), "--relays", "3", "--quiet"]
    for kv in params:
        cmd += ["--param", kv]
    if impl == "chive":
        cmd += ["--chive-bin", str(CHIVE)]
        for kv in sets:
            cmd += ["--set", kv]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"chive-lab up --impl {impl} failed: {res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout)


def lab_down(netdir: Path) -> None:
    subprocess.run([str(LAB), "down", "--dir", str(netdir)], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measured_pids(info: dict) -> dict[str, int]:
    """The relays, the client and the httpd (not the authorities, which carry no data)."""
    return {n: p for n, p in info["pids"].items()
            if n.startswith("relay") or n in ("client", "httpd")}


def curl(socks: str | None, url: str, timeout: float, rate: int | None = None) -> tuple[int, float]:
    """Download `url` through SOCKS (directly without), body discarded, at most `rate` bytes/s
    if given; (bytes, seconds) as curl reports them."""
    proxy = ["--socks5-hostname", socks] if socks else []
    if rate:
        proxy += ["--limit-rate", str(rate)]
    res = subprocess.run(
        ["curl", "--silent", "--show-error", "--fail", "--max-time", str(timeout), *proxy,
         "-o", "/dev/null", "-w", "%{size_download} %{time_total}", url],
        check=True, capture_output=True, text=True)
    got, secs = res.stdout.split()
    return int(got), float(secs)


def idle_rates(info: dict, seconds: float, hz: int) -> dict[str, float]:
    """CPU seconds per second of each process with nothing flowing (timers, housekeeping)."""
    pids = measured_pids(info)
    before = {n: read_proc(p) for n, p in pids.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {n: read_proc(p) for n, p in pids.items()}
    elapsed = time.monotonic() - t0
    return {n: cpu_delta(before[n], after[n], hz)["cpu_s"] / elapsed for n in pids}


def net_ns_per_byte(cpu_s: float, idle_rate: float, seconds: float, nbytes: int) -> float:
    """ns/byte after taking out what the process spends anyway (idle CPU/s times the transfer's
    duration): a slow transfer on a process with busy timers otherwise looks costlier per byte."""
    return ns_per_byte(max(cpu_s - idle_rate * seconds, 0.0), nbytes)


def one_download(info: dict, nbytes: int, hz: int, timeout: float, idle: dict[str, float],
                 rate: int | None = None) -> dict:
    pids = measured_pids(info)
    http_port = int(info["http"].rsplit(":", 1)[1])
    before = {n: read_proc(p) for n, p in pids.items()}
    exits: list[str] = []
    done = threading.Event()

    def find_exit():
        # The exit is the relay holding a connection to the httpd while the body flows.
        while not done.is_set():
            found = [n for n in connected_to(pids, http_port) if n.startswith("relay")]
            if found:
                exits.extend(found)
                return
            done.wait(0.005)

    t = threading.Thread(target=find_exit, daemon=True)
    t.start()
    try:
        got, secs = curl(info["socks"], f"{info.get('entry', info['http'])}/bytes/{nbytes}", timeout, rate)
        after = {n: read_proc(p) for n, p in pids.items()}
    finally:
        done.set()
        t.join(timeout=2)
    if got != nbytes:
        raise RuntimeError(f"received {got} bytes, expected {nbytes}")
    procs = {}
    for n in pids:
        d = cpu_delta(before[n], after[n], hz)
        procs[n] = {**d, "role": role_of(n, exits), "ns_per_byte": ns_per_byte(d["cpu_s"], got),
                    "idle_cpu_per_s": idle.get(n, 0.0),
                    "net_ns_per_byte": net_ns_per_byte(d["cpu_s"], idle.get(n, 0.0), secs, got),
                    "hwm_kib": after[n]["hwm_kib"], "rss_kib": after[n]["rss_kib"]}
    return {"bytes": got, "seconds": secs, "goodput_MBps": got / secs / 1e6, "procs": procs}


def memory_per_circuit(info: dict, k: int, settle: float) -> dict:
    """RSS delta per circuit of each relay and the client: K idle streams, then K busy ones."""
    from chive_lab.socks import socks5_connect

    pids = measured_pids(info)
    pids.pop("httpd", None)
    host, port = info["http"].removeprefix("http://").rsplit(":", 1)
    base = {n: read_proc(p)["rss_kib"] for n, p in pids.items()}
    socks_list = []
    errors = 0
    try:
        for i in range(k):
            try:
                # A username of its own puts each stream on a circuit of its own (isolation).
                s = socks5_connect(info["socks"], host, int(port), username=f"mem{i}", password="x")
                socks_list.append(s)
            except Exception:  # noqa: BLE001 - a refused stream is counted, not fatal
                errors += 1
        time.sleep(settle)
        idle = {n: read_proc(p)["rss_kib"] for n, p in pids.items()}
        for s in socks_list:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /bytes/100000000000 HTTP/1.0\r\n\r\n")
        time.sleep(settle * 2)
        busy = {n: read_proc(p)["rss_kib"] for n, p in pids.items()}
    finally:
        for s in socks_list:
            s.close()
    n = len(socks_list)
    per = {name: {"idle_bytes_per_circuit": (idle[name] - base[name]) * 1024 / n if n else float("nan"),
                  "busy_bytes_per_circuit": (busy[name] - base[name]) * 1024 / n if n else float("nan"),
                  "rss_kib": {"base": base[name], "idle": idle[name], "busy": busy[name]}}
           for name in pids}
    return {"circuits": n, "failed": errors, "per_process": per}


def forwarder_rate(impl: str, args, earlier: dict[str, list[dict]]) -> int | None:
    """curl's --limit-rate for a forwarder chain: `io` at --io-limit-rate (none: full speed),
    `io-rate` at the median goodput of this run's chive downloads."""
    if impl == "io":
        return args.io_limit_rate
    if impl == "io-rate":
        return int(statistics.median(r["goodput_MBps"] for r in earlier["chive"]) * 1e6)
    return None


def run_impl(impl: str, args, hz: int,
             earlier: dict[str, list[dict]] | None = None) -> tuple[list[dict], dict | None]:
    """Run `impl`'s downloads; `earlier`: the runs of the implementations before it."""
    netdir = args.out / f"net-{impl}"
    rate = forwarder_rate(impl, args, earlier or {})
    if impl in FORWARDERS:
        from chive_lab.iofloor import IoChain

        at = f", downloads at most {rate / 1e6:.1f} MB/s" if rate else ""
        progress(f"{impl}: starting a chain of 4 TCP forwarders ({FWD}) in front of an httpd{at}")
        chain = IoChain(CHIVE, FWD, netdir, args.io_read_size, args.io_write_size)
        info, stop = chain.info, chain.close
    else:
        lab_down(netdir)
        progress(f"{impl}: starting a 3-relay network in {netdir}")
        info, stop = lab_up(impl, netdir, args.sets, args.params), lambda: lab_down(netdir)
    try:
        curl(info["socks"], f"{info.get('entry', info['http'])}/bytes/1000000", args.timeout)  # warm-up
        idle = idle_rates(info, args.idle_seconds, hz) if args.idle_seconds > 0 else {}
        if idle:
            progress(f"{impl} idle CPU (ms/s): " + ", ".join(f"{n} {1e3 * v:.1f}" for n, v in idle.items()))
        runs = []
        for i in range(args.runs):
            r = one_download(info, args.bytes, hz, args.timeout, idle, rate)
            relays = ", ".join(f"{n} {v['ns_per_byte']:.2f}" for n, v in r["procs"].items())
            progress(f"{impl} run {i + 1}/{args.runs}: {r['goodput_MBps']:.1f} MB/s; ns/byte: {relays}")
            runs.append(r)
        mem = None
        if args.circuits > 0 and impl not in FORWARDERS:
            progress(f"{impl}: memory with {args.circuits} circuits")
            mem = memory_per_circuit(info, args.circuits, args.settle)
        return runs, mem
    finally:
        stop()


def build_forwarder() -> bool:
    """Build the IO floor's forwarder (an example of chive-tools) unless TCPFWD_BIN names one."""
    if "TCPFWD_BIN" not in os.environ:
        cmd = ["cargo", "build", "--release", "--quiet", "-p", "chive-tools", "--example", "tcpfwd"]
        progress("io floor: " + " ".join(cmd))
        if subprocess.run(cmd, cwd=ROOT, check=False).returncode != 0:
            return False
    if not FWD.exists():
        print(f"relay-cpu: no forwarder at {FWD}", file=sys.stderr)
        return False
    return True


def run_manifest(args) -> dict:
    from chive_lab import manifest

    git = manifest.git_state()
    versions = {"chive": manifest.cmd_output([str(CHIVE), "--version"])}
    if any(i in FORWARDERS for i in args.impl):
        versions["tcpfwd"] = str(FWD)
    if "tor" in args.impl:
        tor = manifest.cmd_output(["tor", "--version"])
        versions["tor"] = tor.splitlines()[0] if tor else None
    return {"script": "lab/scripts/relay_cpu.py", "command": sys.argv,
            "git": {"revision": git["revision"], "dirty": git["dirty"]}, "binary": str(CHIVE),
            "versions": versions, "bytes": args.bytes, "runs": args.runs, "impl": args.impl,
            "circuits": args.circuits, "sets": args.sets, "params": args.params,
            "io_read_size": args.io_read_size, "io_write_size": args.io_write_size,
            "io_limit_rate": args.io_limit_rate,
            "host": {"hostname": socket.gethostname(), "kernel": platform.release(),
                     "cores": os.cpu_count(), "load": os.getloadavg()},
            "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "end": None, "status": "running"}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=int, default=500_000_000, help="bytes per download [500000000]")
    ap.add_argument("--runs", type=int, default=3, help="downloads per implementation [3]")
    ap.add_argument("--impl", default="chive,io,io-rate,tor",
                    help="comma-separated, run in this order: chive, io (the IO floor: plain TCP "
                         "forwarders at full speed), io-rate (the same at chive's goodput of this "
                         "run; after chive), tor [chive,io,io-rate,tor]")
    ap.add_argument("--io-read-size", type=int, default=None,
                    help="the forwarders' largest read in bytes [tcpfwd's: the node's read batch]")
    ap.add_argument("--io-write-size", type=int, default=None,
                    help="the forwarders' largest write in bytes, 0 = a whole read [0]")
    ap.add_argument("--io-limit-rate", type=int, default=None, metavar="BYTES_PER_S",
                    help="download through the forwarders at most this fast (curl --limit-rate), e.g. "
                         "at chive's goodput, where wake-ups bring smaller batches than at full speed")
    ap.add_argument("--circuits", type=int, default=100,
                    help="circuits for the memory measurement, 0 to skip [100]")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds to wait before reading RSS in the memory measurement [2]")
    ap.add_argument("--idle-seconds", type=float, default=5.0,
                    help="seconds of idle CPU measured before the downloads, 0 to skip [5]")
    ap.add_argument("--timeout", type=float, default=900.0, help="curl --max-time per download [900]")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "relay-cpu")
    ap.add_argument("--no-floor", action="store_true", help="skip the criterion crypto floor")
    ap.add_argument("--floor-seconds", type=int, default=3, help="criterion measurement time [3]")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a relay option for chive's relays (repeatable), e.g. LinkRecordLayer=own")
    ap.add_argument("--param", dest="params", action="append", default=[], metavar="KEY=INT",
                    help="a network parameter for chive's and tor's authorities (repeatable), e.g. "
                         "cc_alg=2 (congestion control on chive's relays; tor's default already)")
    ap.add_argument("--markdown", action="store_true", help="also print the table as markdown")
    args = ap.parse_args(argv)
    args.impl = [i for i in args.impl.split(",") if i]
    bad = [i for i in args.impl if i not in IMPLS]
    if bad or not args.impl:
        ap.error(f"--impl takes chive, io, io-rate and/or tor, not {','.join(bad) or 'nothing'}")
    if "io-rate" in args.impl and ("chive" not in args.impl
                                   or args.impl.index("chive") > args.impl.index("io-rate")):
        ap.error("--impl io-rate runs at chive's goodput: put chive before it")
    if args.bytes <= 0 or args.runs <= 0:
        ap.error("--bytes and --runs must be positive")
    if any("=" not in kv for kv in args.sets):
        ap.error("--set takes KEY=VALUE")
    if any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=-?[0-9]+", kv) for kv in args.params):
        ap.error("--param takes KEY=INT, e.g. cc_alg=2")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if not LAB.exists() or not CHIVE.exists():
        print(f"relay-cpu: need {LAB} and {CHIVE}: run `make build` first", file=sys.stderr)
        return 1
    if any(i in FORWARDERS for i in args.impl) and not build_forwarder():
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = run_manifest(args)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    hz = os.sysconf("SC_CLK_TCK")
    runs, mem = {}, {}
    for impl in args.impl:
        runs[impl], m = run_impl(impl, args, hz, runs)
        if m:
            mem[impl] = m
    if "io-rate" in runs:
        manifest["io_rate_limit_Bps"] = forwarder_rate("io-rate", args, runs)
    floor = None if args.no_floor else measure_floor(args)
    rows = summarize(runs, floor)
    results = {"rows": rows, "floor": floor, "memory": mem, "runs": runs}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    write_csv(args.out / "results.csv", rows)
    manifest.update(end=time.strftime("%Y-%m-%dT%H:%M:%S%z"), status="complete")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))

    # Outside a git checkout (an unpacked tarball, a copied tree) the revision is unknown.
    revision = (manifest["git"]["revision"] or "unknown")[:12]
    print(f"CPU per relayed byte, {args.bytes} bytes per download, median of {args.runs} runs, "
          f"3-hop loopback, no rate limits (git {revision}"
          f"{' dirty' if manifest['git']['dirty'] else ''})")
    print(text_table(rows))
    if floor:
        print(f"crypto floor (ns/byte): relay {floor['relay']:.3f} (TLS open {floor['tls_open_ns_per_byte']:.3f}"
              f" + onion layer {floor['onion_layer_ns_per_byte']:.3f} + TLS seal "
              f"{floor['tls_seal_ns_per_byte']:.3f}), exit {floor['exit']:.3f}, client {floor['client']:.3f}; "
              f"through rustls's API: relay {floor.get('relay_rustls', float('nan')):.3f}")
        print(f"crypto throughput (GB/s): AES-128-CTR onion layer {floor['aes128ctr_GBps']:.2f}, "
              f"AES-128-GCM seal {floor['aes128gcm_seal_GBps']:.2f} / open {floor['aes128gcm_open_GBps']:.2f}, "
              f"rustls seal+open {floor.get('rustls_seal_open_GBps', float('nan')):.2f} (AES-256-GCM "
              f"{floor.get('rustls256_seal_open_GBps', float('nan')):.2f}); openssl: "
              + ", ".join(f"{alg} {v:.2f}" for alg, v in floor["openssl_GBps"].items() if v))
        if "sha1_GBps" in floor:
            print(f"tor1 running SHA-1 at the edges: {floor['sha1_digest_ns_per_byte']:.3f} ns/byte "
                  f"({floor['sha1_blocks_per_cell']:.1f} compressions' worth per cell; 9.08 are "
                  f"needed), compression {floor['sha1_GBps']:.2f} GB/s")
    if mem:
        print(memory_table(mem))
    if args.markdown:
        print()
        print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
