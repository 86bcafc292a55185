#!/usr/bin/env python3
"""Group a `perf record -g` profile of a relay into where its CPU goes (docs/performance.md).

Reads `perf script -F comm,tid,period,ip,sym,dso` output (stdin or a file), weights each sample
by its period, and assigns it to one group from its stack: the leaf decides for crypto, copies,
the allocator, tokio, rustls and chive's own code; a sample in the kernel is assigned by the system
call it is under (futex: thread park/wake, epoll_wait, read/recv, write/send), since the leaf of a
kernel sample (a spin unlock, the context switch) says little. Prints the groups and the top-N
leaf functions, in percent of samples; `--folded FILE` also writes folded stacks (root first,
kernel frames suffixed `_[k]`) for flamegraph.pl, inferno-flamegraph or `--svg FILE`, which draws
the flame graph itself (chive_lab.flamegraph).

    perf record -F 1999 --call-graph dwarf,16384 -p PID -o relay.data -- sleep 8
    perf script -i relay.data -F comm,tid,period,ip,sym,dso | lab/scripts/perf_groups.py --top 25
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chive_lab.flamegraph import KERNEL_SUFFIX, render_svg  # noqa: E402

GROUPS = [
    ("crypto", re.compile(r"aes|gcm|ghash|sha1|Sha1|ctr::|cipher::|ring_core|poly1305|chacha", re.I)),
    ("copies (memmove, kernel copy to/from sockets)",
     re.compile(r"memmove|memcpy|memset|_copy_from_iter|_copy_to_iter|copy_user|rep_movs|skb_copy_datagram")),
    ("allocator", re.compile(r"malloc|_int_free|cfree|\bfree\b|unlink_chunk|realloc|tcache|__rust_(de)?alloc")),
]
USER_GROUPS = [
    ("tokio runtime (task hops, wakers, channels, park)", re.compile(r"^(tokio|mio|parking_lot|std::sync|std::thread|crossbeam)")),
    ("rustls record layer (non-cipher)", re.compile(r"rustls")),
    ("chive per-cell bookkeeping (core, cell, node, net)", re.compile(r"chive")),
]
SYSCALLS = [
    ("kernel: futex (thread park/wake)", re.compile(r"sys_futex")),
    ("kernel: epoll_wait", re.compile(r"sys_epoll_wait|sys_epoll_pwait")),
    ("kernel: read/recv (TCP receive)", re.compile(r"sys_(read|recvfrom|recvmsg|readv)\b")),
    ("kernel: write/send (TCP send + loopback delivery)", re.compile(r"sys_(write|sendto|sendmsg|writev)\b")),
]


def parse_perf_script(lines):
    """Yield (period, frames leaf-first as (symbol, dso)) per sample. Samples without a call
    chain (a profile recorded without -g, or input that is not `perf script` output) are
    skipped."""
    period, frames = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if period is not None and frames:
                yield period, frames
            period, frames = None, []
            continue
        if not line[0].isspace():
            if period is not None and frames:
                yield period, frames
            head = line.split()
            try:
                period = int(head[-1])
            except (ValueError, IndexError):
                period = 1
            frames = []
            continue
        m = re.match(r"\s*[0-9a-f]+\s+(.*?)\s+\(([^)]*)\)\s*$", line)
        if m:
            frames.append((m.group(1), m.group(2)))
    if period is not None and frames:
        yield period, frames


def is_kernel(dso: str) -> bool:
    return "kernel" in dso or dso.startswith("[")


def group_of(frames) -> str:
    if not frames:
        return "unknown"
    leaf, dso = frames[0]
    for name, rx in GROUPS:
        if rx.search(leaf):
            return name
    if is_kernel(dso):
        for sym, _d in frames:
            for name, rx in SYSCALLS:
                if rx.search(sym):
                    return name
        if any("sys_" in s for s, _d in frames):
            return "kernel: other system calls"
        return "kernel: interrupts, scheduler (no system call)"
    # Inlined std/core helpers (atomics, futures glue) and libc's syscall wrappers belong to the
    # first frame above them that names a component.
    for sym, _d in frames:
        for name, rx in USER_GROUPS:
            if rx.search(sym):
                return name
    return "other (libc, std)"


def owner_of(frames) -> str:
    """The first frame above the leaf that names a component: who called a memcpy."""
    for sym, _d in frames[1:]:
        m = re.search(r"(chive_\w+|rustls|tokio|bytes)::[\w:<>]*", sym)
        if m and not sym.startswith("<alloc") and "memcpy" not in sym:
            return sym if len(sym) < 100 else sym[:97] + "..."
    return "?"


def folded_name(sym: str, dso: str) -> str:
    """A frame's name in folded stacks: kernel frames marked as flamegraph.pl marks them."""
    return sym + KERNEL_SUFFIX if is_kernel(dso) else sym


def summarize(samples):
    groups, leaves, folded, copiers = Counter(), Counter(), Counter(), Counter()
    total = 0
    for period, frames in samples:
        total += period
        g = group_of(frames)
        groups[g] += period
        if g.startswith("copies"):
            copiers[owner_of(frames)] += period
        leaves[(frames[0][0] if frames else "?", g)] += period
        folded[";".join(folded_name(s, d) for s, d in reversed(frames))] += period
    return total, groups, leaves, folded, copiers


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", nargs="?", help="perf script output (default: stdin)")
    ap.add_argument("--top", type=int, default=25, help="leaf functions to list [25]")
    ap.add_argument("--folded", help="write folded stacks here (for flamegraph.pl / inferno)")
    ap.add_argument("--svg", help="draw the flame graph here (SVG)")
    ap.add_argument("--title", default="CPU samples", help="the flame graph's title")
    ap.add_argument("--markdown", action="store_true", help="markdown tables")
    args = ap.parse_args(argv)
    src = open(args.input) if args.input else sys.stdin
    total, groups, leaves, folded, copiers = summarize(parse_perf_script(src))
    if total == 0:
        print("perf_groups: no samples in the input", file=sys.stderr)
        return 1
    if args.folded:
        with open(args.folded, "w") as f:
            for stack, n in folded.most_common():
                f.write(f"{stack} {n}\n")
    if args.svg:
        Path(args.svg).write_text(render_svg(dict(folded), args.title, unit="perf periods"))
    bar = "|" if args.markdown else ""
    print(f"{bar} group {bar} % of samples {bar}" if args.markdown else "% samples  group")
    if args.markdown:
        print("|---|---:|")
    for g, n in groups.most_common():
        print(f"| {g} | {100 * n / total:.1f} |" if args.markdown else f"{100 * n / total:8.1f}   {g}")
    print()
    if args.markdown:
        print("| function (leaf) | group | % of samples |\n|---|---|---:|")
    for (sym, g), n in leaves.most_common(args.top):
        sym = sym if len(sym) < 90 else sym[:87] + "..."
        print(f"| `{sym}` | {g} | {100 * n / total:.1f} |" if args.markdown
              else f"{100 * n / total:8.1f}   {sym}  [{g}]")
    print()
    if args.markdown:
        print("| copies: caller | % of samples |\n|---|---:|")
    for sym, n in copiers.most_common(8):
        print(f"| `{sym}` | {100 * n / total:.1f} |" if args.markdown else f"{100 * n / total:8.1f}   copy in {sym}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
