#!/usr/bin/env python3
"""Compare chive binaries or network settings by CPU per relayed byte, in rotating rounds.

One `relay_cpu.py` figure moves by 10-25 % with this shared host's load, more than most changes
do, so two builds (or two sets of parameters) are compared in rounds: each round runs every
variant once (`relay_cpu.py --impl chive --no-floor --circuits 0 --idle-seconds 0`), the order
rotated by one each round so that every variant runs first equally often, and each variant is
compared with the first one given (the reference) inside the same round. Reported per variant:
medians over the rounds of the guard and middle (pooled), the exit, the client and the goodput;
against the reference, the median per-round difference and in how many rounds the variant was
lower (a sign test's two-sided p-value beside it).

A variant is a label and what differs, as one argument:

    --variant main                                   the current build, default settings
    --variant "new bin=/tmp/chive-branch"            another chive binary (CHIVE_BIN)
    --variant "vegas param=cc_alg=2"                 a network parameter (relay_cpu.py --param)
    --variant "small set=OutbufCells=64"             a relay option (relay_cpu.py --set)

    .venv/bin/python lab/scripts/cpu_rounds.py --variant main --variant "new bin=B" --rounds 6 --out DIR

Writes DIR/rounds.csv (one line per run), DIR/manifest.json (variants with their binaries'
`chive --version`, the git state, host, command) and DIR/runs/LABEL.ROUND/ (each run's own
relay_cpu.py output; not for results/: the CSV and manifest are the record).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab"))

from chive_lab import manifest as lab_manifest  # noqa: E402
from chive_lab import stats  # noqa: E402

RELAY_CPU = ROOT / "lab" / "scripts" / "relay_cpu.py"
PYTHON = ROOT / ".venv" / "bin" / "python"
DEFAULT_CHIVE = Path(os.environ.get("CHIVE_BIN", ROOT / "target" / "release" / "chive"))
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
KINDS = ("bin", "param", "set")
CSV_FIELDS = ("round", "variant", "position", "load", "relay_a", "relay_b", "exit", "client",
              "goodput_MBps")
# What the summary compares: the two non-exit relays pooled, then the edges and the goodput.
MEASURES = ("relays", "exit", "client", "goodput_MBps")


class RunFailed(Exception):
    """One relay_cpu.py run gave no figures; the rounds go on without it."""


@dataclass
class Variant:
    label: str
    binary: Path = DEFAULT_CHIVE
    params: list[str] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)

    def relay_cpu_args(self) -> list[str]:
        args = []
        for kv in self.params:
            args += ["--param", kv]
        for kv in self.sets:
            args += ["--set", kv]
        return args


def parse_variant(text: str) -> Variant:
    """`LABEL [bin=PATH] [param=K=V ...] [set=K=V ...]`; ValueError says what is wrong."""
    words = text.split()
    if not words or not LABEL.fullmatch(words[0]):
        raise ValueError(f"variant {text!r}: start with a label (letters, digits, . _ -)")
    v = Variant(words[0])
    for word in words[1:]:
        kind, sep, value = word.partition("=")
        if not sep or kind not in KINDS or not value:
            raise ValueError(f"variant {v.label}: {word!r} is not bin=PATH, param=K=V or set=K=V")
        if kind == "bin":
            v.binary = Path(value)
        elif "=" not in value:
            raise ValueError(f"variant {v.label}: {kind}={value} needs KEY=VALUE")
        else:
            (v.params if kind == "param" else v.sets).append(value)
    return v


def round_order(n_variants: int, round_no: int) -> list[int]:
    """Variant indices of round `round_no` (1-based): rotated by one per round, so over any
    `n_variants` consecutive rounds each variant runs first once."""
    shift = (round_no - 1) % n_variants
    return [(shift + j) % n_variants for j in range(n_variants)]


def row_from_results(results: dict) -> dict:
    """The figures of one relay_cpu.py run (its results.json) that a round compares."""
    chive = [r for r in results["rows"] if r.get("impl") == "chive"]
    relays = sorted(r["ns_per_byte"] for r in chive if r["role"] == "relay")
    one = {role: next((r["ns_per_byte"] for r in chive if r["role"] == role), None)
           for role in ("exit", "client")}
    goodput = next((r["goodput_MBps"] for r in chive if r.get("goodput_MBps")), None)
    if len(relays) != 2 or None in one.values() or goodput is None:
        raise ValueError("relay_cpu.py results without two relays, an exit, a client and goodput")
    return {"relay_a": relays[0], "relay_b": relays[1], **one, "goodput_MBps": goodput}


def _measure(row: dict, name: str) -> float:
    if name == "relays":
        return (float(row["relay_a"]) + float(row["relay_b"])) / 2
    return float(row[name])


def summarize(rows: list[dict], labels: list[str]) -> list[dict]:
    """Per variant: medians (guard and middle pooled) and, against labels[0] in the same
    round, the median difference and the sign test of each measure."""
    by = {(str(r["round"]), r["variant"]): r for r in rows}
    rounds = sorted({str(r["round"]) for r in rows}, key=int)
    out = []
    for label in labels:
        mine = [r for r in rows if r["variant"] == label]
        pooled = [float(r[k]) for r in mine for k in ("relay_a", "relay_b")]
        s = {"variant": label, "rounds": len(mine),
             "relays": statistics.median(pooled) if pooled else None,
             "relays_min": min(pooled, default=None), "relays_max": max(pooled, default=None)}
        for name in MEASURES[1:]:
            vals = [float(r[name]) for r in mine]
            s[name] = statistics.median(vals) if vals else None
        if label != labels[0]:
            pairs = [(by[(n, labels[0])], by[(n, label)]) for n in rounds
                     if (n, labels[0]) in by and (n, label) in by]
            for name in MEASURES:
                diffs = [_measure(b, name) - _measure(a, name) for a, b in pairs]
                s[f"{name}_diff"] = statistics.median(diffs) if diffs else None
                s[f"{name}_sign"] = stats.sign_test(diffs)
        out.append(s)
    return out


def _f(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def summary_table(summary: list[dict]) -> str:
    ref = summary[0]["variant"]
    lines = [f"| variant | guard/middle ns/B | exit | client | goodput MB/s | against {ref}, per round |",
             "|---|---|---|---|---|---|"]
    for s in summary:
        vs = ""
        if "relays_diff" in s:
            parts = []
            for name, unit, spec in (("relays", "", "+.2f"), ("exit", "", "+.2f"), ("client", "", "+.2f"),
                                     ("goodput_MBps", " MB/s", "+.1f")):
                sign = s[f"{name}_sign"]
                n = sign["lower"] + sign["higher"] + sign["ties"]
                parts.append(f"{name.split('_')[0]} {_f(s[f'{name}_diff'], spec)}{unit} "
                             f"(lower in {sign['lower']} of {n}, p {_f(sign['pvalue'], '.2g')})")
            vs = "; ".join(parts)
        lines.append(f"| {s['variant']} | {_f(s['relays'])} ({_f(s['relays_min'])}–{_f(s['relays_max'])}) "
                     f"| {_f(s['exit'])} | {_f(s['client'])} | {_f(s['goodput_MBps'], '.1f')} | {vs} |")
    return "\n".join(lines)


def progress(msg: str) -> None:
    print(f"cpu-rounds: {msg}", file=sys.stderr, flush=True)


def run_one(v: Variant, args, out: Path) -> dict:
    cmd = [str(PYTHON), str(RELAY_CPU), "--impl", "chive", "--bytes", str(args.bytes),
           "--runs", str(args.runs), "--no-floor", "--circuits", "0", "--idle-seconds", "0",
           "--timeout", str(args.timeout), "--out", str(out), *v.relay_cpu_args()]
    env = dict(os.environ, CHIVE_BIN=str(v.binary))
    with open(out.with_suffix(".log"), "w") as log:
        res = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if res.returncode != 0:
        raise RunFailed(f"relay_cpu.py exited {res.returncode}: see {out}.log")
    try:
        return row_from_results(json.loads((out / "results.json").read_text()))
    except (OSError, ValueError, KeyError) as e:
        raise RunFailed(f"no figures in {out}/results.json ({e})") from e


def run_manifest(args, variants: list[Variant]) -> dict:
    return {"script": "lab/scripts/cpu_rounds.py", "command": sys.argv,
            "git": lab_manifest.git_state(), "bytes": args.bytes, "runs": args.runs,
            "rounds": args.rounds,
            "variants": [{"label": v.label, "binary": str(v.binary), "params": v.params,
                          "sets": v.sets,
                          "version": lab_manifest.cmd_output([str(v.binary), "--version"])}
                         for v in variants],
            "host": {"hostname": socket.gethostname(), "cores": os.cpu_count(),
                     "load": os.getloadavg()},
            "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "end": None, "status": "running"}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", dest="variants", action="append", default=[], metavar="SPEC",
                    help="LABEL [bin=PATH] [param=K=V] [set=K=V]; repeat, at least two; the first "
                         "is the reference")
    ap.add_argument("--rounds", type=int, default=4, help="rounds [4]")
    ap.add_argument("--bytes", type=int, default=300_000_000, help="bytes per download [300000000]")
    ap.add_argument("--runs", type=int, default=3, help="downloads per run (their median) [3]")
    ap.add_argument("--timeout", type=float, default=900.0, help="curl --max-time per download [900]")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "cpu-rounds")
    args = ap.parse_args(argv)
    try:
        args.variants = [parse_variant(t) for t in args.variants]
    except ValueError as e:
        ap.error(str(e))
    labels = [v.label for v in args.variants]
    if len(labels) < 2 or len(set(labels)) != len(labels):
        ap.error("give at least two --variant, each with its own label")
    if args.rounds <= 0 or args.bytes <= 0 or args.runs <= 0:
        ap.error("--rounds, --bytes and --runs must be positive")
    missing = [str(v.binary) for v in args.variants if not v.binary.exists()]
    if missing:
        ap.error(f"no chive binary at {', '.join(missing)} (make build, or bin=PATH)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    variants: list[Variant] = args.variants
    (args.out / "runs").mkdir(parents=True, exist_ok=True)
    manifest = run_manifest(args, variants)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    rows, failed = [], []
    with open(args.out / "rounds.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for n in range(1, args.rounds + 1):
            for pos, i in enumerate(round_order(len(variants), n)):
                v = variants[i]
                progress(f"round {n}/{args.rounds}, {pos + 1} of {len(variants)}: {v.label}")
                load = os.getloadavg()[0]
                try:
                    figures = run_one(v, args, args.out / "runs" / f"{v.label}.{n}")
                except RunFailed as e:
                    # A long batch keeps its other runs: this round compares without this one.
                    progress(f"  failed, left out of round {n}: {e}")
                    failed.append({"round": n, "variant": v.label, "error": str(e)})
                    continue
                row = {"round": n, "variant": v.label, "position": pos + 1, "load": f"{load:.2f}",
                       **figures}
                w.writerow(row)
                f.flush()
                rows.append(row)
                progress(f"  relays {row['relay_a']:.2f} / {row['relay_b']:.2f}, exit {row['exit']:.2f}, "
                         f"client {row['client']:.2f} ns/B, {row['goodput_MBps']:.1f} MB/s")
    summary = summarize(rows, [v.label for v in variants])
    manifest.update(end=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    status="failed runs" if failed else "complete", failed=failed, summary=summary)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    print(f"CPU per relayed byte, medians of {args.rounds} rounds ({args.runs} × {args.bytes} bytes "
          f"per run); differences against {variants[0].label} in the same round")
    print(summary_table(summary))
    if failed:
        print(f"cpu-rounds: {len(failed)} run(s) failed and were left out (manifest.json \"failed\")",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
