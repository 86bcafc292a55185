#!/usr/bin/env python3
"""Where chive's relays spend their CPU under load: a profile of each role, as groups and as a
flame graph (docs/performance.md, "Where the time goes now").

Starts a 3-relay loopback network without rate limits (`chive-lab up`, as relay_cpu.py does),
starts one long download through it with curl, finds which relay is the guard (the one the client
is connected to), the exit (the one connected to the httpd) and the middle (the third) from their
TCP connections, then records the chosen roles at the same time with `perf record --call-graph
dwarf` for --seconds and groups each one's samples by stack (lab/scripts/perf_groups.py). The CPU
per relayed byte of the window is measured beside it (utime + stime of each process over the
httpd's written bytes): perf's unwinding copies each sample's stack, so the profiled window costs
more than an unprofiled one; the shares are what the profile is for.

Writes to --out: ROLE-groups.csv (group, % of samples), ROLE.folded.gz (the folded stacks the graph
is drawn from, weighted in ns of CPU (perf's cpu-clock periods); a stack is cut at the first frame
under --prune of all samples and the rest is counted in a frame "[N frames under X %]", so the file
stays small and still adds up), ROLE.svg (the flame graph, chive_lab.flamegraph), window.csv (CPU per byte of each process in the window),
summary.md (the groups side by side) and manifest.json (git revision, binary, perf, host, load).
Needs root or perf_event_paranoid ≤ 1, and Debian's linux-perf.

    .venv/bin/python lab/scripts/relay_profile.py --roles guard,middle,exit,client --out DIR
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS.parent))
sys.path.insert(0, str(SCRIPTS))

import perf_groups  # noqa: E402
import relay_cpu  # noqa: E402
from chive_lab import manifest as lab_manifest  # noqa: E402
from chive_lab import procstat  # noqa: E402
from chive_lab.flamegraph import build_tree, render_svg  # noqa: E402

ROLES = ("guard", "middle", "exit", "client")
# The largest body `chive httpd` serves (10 GiB, about a minute here); the downloads repeat
# until the profile is done.
DOWNLOAD_BYTES = 10 * 1024**3


def progress(msg: str) -> None:
    print(f"relay-profile: {msg}", file=sys.stderr, flush=True)


def path_roles(conns: dict[str, set[tuple[int, int]]], http_port: int,
               client_received: dict[tuple[int, int], int]) -> dict[str, str]:
    """Role → process name on the download's path, from each process's established connections
    ((local port, remote port)) and the bytes each of the client's connections received over a
    moment of the download: the exit holds the connection to the httpd, the guard the other end
    of the client's busiest connection (a client may hold links to several relays), the middle
    is the remaining relay. Raises ValueError saying what was not found."""
    relays = sorted(n for n in conns if n.startswith("relay"))
    if len(relays) != 3 or "client" not in conns:
        raise ValueError(f"need 3 relays and a client, have {', '.join(sorted(conns)) or 'none'}")
    exits = [n for n in relays if any(remote == http_port for _local, remote in conns[n])]
    busy = max((c for c in conns["client"] if client_received.get(c, 0) > 0),
               key=lambda c: client_received[c], default=None)
    guards = [n for n in relays if busy is not None and (busy[1], busy[0]) in conns[n]]
    if len(exits) != 1 or len(guards) != 1 or exits == guards:
        raise ValueError(f"cannot tell the path: relays connected to the httpd {exits or 'none'}, "
                         f"at the client's busiest connection {guards or 'none'}")
    middle = [n for n in relays if n not in exits + guards]
    return {"guard": guards[0], "middle": middle[0], "exit": exits[0], "client": "client"}


def parse_ss_received(text: str) -> dict[tuple[int, int], int]:
    """(local port, remote port) → `bytes_received` from `ss -tinH state established`: a line
    per socket (Recv-Q, Send-Q, local, peer) and an indented line of its TCP_INFO."""
    out: dict[tuple[int, int], int] = {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            f = line.split()
            key = None
            if len(f) >= 4:
                try:
                    key = (int(f[2].rsplit(":", 1)[1]), int(f[3].rsplit(":", 1)[1]))
                except (ValueError, IndexError):
                    key = None
            if key is not None:
                out[key] = 0
        elif key is not None:
            for item in line.split():
                if item.startswith("bytes_received:"):
                    out[key] = int(item.split(":", 1)[1])
    return out


def received_during(seconds: float) -> dict[tuple[int, int], int]:
    """Bytes each established TCP connection received over `seconds` (`ss`, iproute2)."""
    def sample():
        res = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True,
                             text=True, check=True)
        return parse_ss_received(res.stdout)
    before = sample()
    time.sleep(seconds)
    after = sample()
    return {k: v - before[k] for k, v in after.items() if k in before}


def find_path(pids: dict[str, int], http_port: int, tries: int = 10) -> dict[str, str]:
    """`path_roles` of the running processes, asked again for a moment if the download is
    between two requests."""
    for i in range(tries):
        try:
            received = received_during(0.3)
            return path_roles(procstat.established_ports(pids), http_port, received)
        except ValueError:
            if i == tries - 1:
                raise
    raise AssertionError("unreachable")


def prune_folded(folded: dict[str, int], min_fraction: float) -> dict[str, int]:
    """The same samples with every stack cut at its first frame whose subtree holds less than
    `min_fraction` of all samples: what is cut off is counted in one frame naming how many
    frames it stands for. Totals and every frame at or above the fraction are unchanged."""
    if min_fraction <= 0:
        return dict(folded)
    root = build_tree(folded)
    limit = min_fraction * root.value
    out: Counter[str] = Counter()
    for stack, n in folded.items():
        frames = stack.split(";")
        node, kept = root, []
        for i, name in enumerate(frames):
            node = node.children[name]
            if node.value < limit:
                kept.append(f"[{len(frames) - i} frames under {100 * min_fraction:g} %]")
                break
            kept.append(name)
        out[";".join(kept)] += n
    return dict(out)


class Downloads:
    """Downloads through the network's SOCKS port, one after another, until stopped; the first
    failure (curl's message) is kept and ends them."""

    def __init__(self, socks: str, url: str):
        self.argv = ["curl", "--silent", "--show-error", "--fail", "--socks5-hostname", socks,
                     "-o", "/dev/null", url]
        self.stop = threading.Event()
        self.error: str | None = None
        self.current: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                if self.stop.is_set():
                    return
                self.current = subprocess.Popen(self.argv, stderr=subprocess.PIPE, text=True)
            _out, err = self.current.communicate()
            if self.current.returncode != 0 and not self.stop.is_set():
                self.error = err.strip()[-300:] or f"curl exited with {self.current.returncode}"
                return

    def close(self) -> None:
        with self.lock:
            self.stop.set()
            if self.current is not None and self.current.poll() is None:
                self.current.kill()
        self.thread.join(timeout=10)


def check_perf() -> str | None:
    """Why perf cannot record here, or None."""
    if not shutil.which("perf"):
        return "perf not found (Debian: apt-get install linux-perf)"
    with tempfile.TemporaryDirectory() as d:
        res = subprocess.run(["perf", "record", "-q", "-o", f"{d}/probe.data", "--", "true"],
                             capture_output=True, text=True)
    if res.returncode != 0:
        return f"perf record fails: {res.stderr.strip()[-300:]} (root, or perf_event_paranoid <= 1)"
    return None


def record(pids: dict[str, int], seconds: float, freq: int, workdir: Path) -> dict[str, Path]:
    """`perf record` of each process at once for `seconds`; role → perf.data path."""
    procs, data = {}, {}
    for role, pid in pids.items():
        data[role] = workdir / f"{role}.data"
        procs[role] = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(freq), "--call-graph", "dwarf,16384", "-p", str(pid),
             "-o", str(data[role]), "--", "sleep", str(seconds)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    failed = []
    for role, p in procs.items():
        _out, err = p.communicate(timeout=seconds + 120)
        if p.returncode != 0 or not data[role].exists():
            failed.append(f"{role}: {err.strip()[-300:]}")
    if failed:
        raise RuntimeError("perf record failed: " + "; ".join(failed))
    return data


def group_samples(data: Path):
    """perf_groups' summary of one perf.data (streamed through `perf script`)."""
    p = subprocess.Popen(["perf", "script", "-i", str(data), "-F", "comm,tid,period,ip,sym,dso"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace")
    try:
        summary = perf_groups.summarize(perf_groups.parse_perf_script(p.stdout))
    finally:
        p.stdout.close()
        p.wait()
    return summary


def write_role(out: Path, role: str, title: str, summary, prune: float) -> dict[str, float]:
    total, groups, _leaves, folded, _copiers = summary
    if total == 0:
        raise RuntimeError(f"{role}: perf recorded no samples with stacks")
    shares = {g: 100 * n / total for g, n in groups.most_common()}
    with open(out / f"{role}-groups.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["group", "percent_of_samples"])
        w.writerows((g, f"{s:.2f}") for g, s in shares.items())
    kept = prune_folded(dict(folded), prune)
    # Gzipped: a profile's stacks are long, repetitive names (~2 MB of text, ~50 kB packed).
    with gzip.open(out / f"{role}.folded.gz", "wt") as f:
        for stack, n in sorted(kept.items(), key=lambda kv: (-kv[1], kv[0])):
            f.write(f"{stack} {n}\n")
    (out / f"{role}.svg").write_text(render_svg(kept, title, unit="ns of CPU",
                                                min_fraction=max(prune, 0.001)))
    return shares


def summary_markdown(shares: dict[str, dict[str, float]], window: dict[str, dict]) -> str:
    roles = list(shares)
    groups = sorted({g for s in shares.values() for g in s}, key=lambda g: -max(s.get(g, 0) for s in shares.values()))
    lines = ["| group (% of samples) | " + " | ".join(roles) + " |",
             "|---|" + "---:|" * len(roles)]
    for g in groups:
        lines.append(f"| {g} | " + " | ".join(f"{shares[r].get(g, 0):.1f}" for r in roles) + " |")
    lines.append("| CPU per relayed byte in the window (ns/B, profiled) | "
                 + " | ".join(f"{window[r]['ns_per_byte']:.2f}" for r in roles) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roles", default="middle",
                    help=f"comma-separated, of {', '.join(ROLES)}; recorded at the same time [middle]")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of the profile [8]")
    ap.add_argument("--warmup", type=float, default=3.0,
                    help="seconds of download before the profile starts [3]")
    ap.add_argument("--freq", type=int, default=1999, help="samples per second per process [1999]")
    ap.add_argument("--prune", type=float, default=0.0005,
                    help="cut stacks at frames under this fraction of the samples [0.0005]")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a relay option for chive's relays (repeatable)")
    ap.add_argument("--param", dest="params", action="append", default=[], metavar="KEY=INT",
                    help="a network parameter (repeatable), e.g. cc_alg=2")
    ap.add_argument("--out", type=Path, default=relay_cpu.ROOT / "runs" / "relay-profile")
    ap.add_argument("--keep-data", action="store_true", help="keep the perf.data files in --out")
    args = ap.parse_args(argv)
    args.roles = [r for r in args.roles.split(",") if r]
    bad = [r for r in args.roles if r not in ROLES]
    if bad or not args.roles:
        ap.error(f"--roles takes {', '.join(ROLES)}, not {','.join(bad) or 'nothing'}")
    if args.seconds <= 0 or args.warmup < 0 or not 1 <= args.freq <= 20000:
        ap.error("--seconds must be positive, --warmup not negative, --freq 1..20000")
    if not 0 <= args.prune < 0.1:
        ap.error("--prune is a fraction below 0.1, e.g. 0.0005")
    if any("=" not in kv for kv in args.sets):
        ap.error("--set takes KEY=VALUE")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if not relay_cpu.LAB.exists() or not relay_cpu.CHIVE.exists():
        progress(f"need {relay_cpu.LAB} and {relay_cpu.CHIVE}: run `make build` first")
        return 1
    why = check_perf()
    if why:
        progress(why)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    git = lab_manifest.git_state()
    manifest = {"script": "lab/scripts/relay_profile.py", "command": sys.argv,
                "git": {"revision": git["revision"], "dirty": git["dirty"]},
                "binary": str(relay_cpu.CHIVE),
                "versions": {"chive": lab_manifest.cmd_output([str(relay_cpu.CHIVE), "--version"]),
                             "perf": lab_manifest.cmd_output(["perf", "--version"])},
                "roles": args.roles, "seconds": args.seconds, "freq": args.freq, "prune": args.prune,
                "sets": args.sets, "params": args.params,
                "host": {"cores": os.cpu_count(), "load_at_start": os.getloadavg()},
                "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "status": "running"}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    hz = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="relay-profile-") as tmp:
        netdir = Path(tmp) / "net"
        progress("starting a 3-relay network")
        info = relay_cpu.lab_up("chive", netdir, args.sets, args.params)
        downloads = Downloads(info["socks"], f"{info['http']}/bytes/{DOWNLOAD_BYTES}")
        try:
            time.sleep(args.warmup)
            if downloads.error:
                raise RuntimeError(f"the download failed: {downloads.error}")
            pids = relay_cpu.measured_pids(info)
            names = find_path(pids, int(info["http"].rsplit(":", 1)[1]))
            manifest["processes"] = {r: {"name": names[r], "pid": pids[names[r]]} for r in ROLES}
            progress("path: " + ", ".join(f"{r} {names[r]}" for r in ROLES)
                     + f"; recording {','.join(args.roles)} for {args.seconds:g} s")
            before = {r: procstat.read_proc(pids[names[r]]) for r in ROLES}
            wchar0 = procstat.read_io_wchar(pids["httpd"])
            t0 = time.monotonic()
            data = record({r: pids[names[r]] for r in args.roles}, args.seconds, args.freq,
                          args.out if args.keep_data else Path(tmp))
            elapsed = time.monotonic() - t0
            nbytes = procstat.read_io_wchar(pids["httpd"]) - wchar0
            after = {r: procstat.read_proc(pids[names[r]]) for r in ROLES}
            if downloads.error:
                raise RuntimeError(f"the download failed while recording: {downloads.error}")
        finally:
            downloads.close()
            relay_cpu.lab_down(netdir)
        if nbytes <= 0:
            raise RuntimeError("no bytes moved while recording")
        window = {r: {"cpu_s": procstat.cpu_delta(before[r], after[r], hz)["cpu_s"]} for r in ROLES}
        for row in window.values():
            row["ns_per_byte"] = relay_cpu.ns_per_byte(row["cpu_s"], nbytes)
        with open(args.out / "window.csv", "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["role", "cpu_s", "bytes", "seconds", "ns_per_byte", "profiled"])
            for r in ROLES:
                out.writerow([r, f"{window[r]['cpu_s']:.3f}", nbytes, f"{elapsed:.2f}",
                              f"{window[r]['ns_per_byte']:.3f}", r in args.roles])
        shares = {}
        for role in args.roles:
            progress(f"{role}: grouping the samples (perf script)")
            doing = "receiving" if role == "client" else "relaying"
            title = (f"chive {role} {doing} a 3-hop loopback download, {args.seconds:g} s at "
                     f"{nbytes / elapsed / 1e6:.0f} MB/s (git {(git['revision'] or 'unknown')[:10]})")
            shares[role] = write_role(args.out, role, title, group_samples(data[role]), args.prune)
    table = summary_markdown(shares, window)
    (args.out / "summary.md").write_text(table)
    manifest.update(end=time.strftime("%Y-%m-%dT%H:%M:%S%z"), status="complete",
                    bytes=nbytes, goodput_MBps=nbytes / elapsed / 1e6)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    print(table)
    print(f"flame graphs: {', '.join(str(args.out / f'{r}.svg') for r in args.roles)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
