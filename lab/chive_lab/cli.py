"""``chive-lab``: the command line over :mod:`chive_lab.network`.

stdout carries only machine-readable results (one JSON object for ``up``);
progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from . import __version__
from .config import parse_assignment, parse_param
from .errors import LabError
from .network import MAX_RELAYS, MIN_RELAYS, Network, NetworkSpec


def _assignment(text: str):
    try:
        return parse_assignment(text)
    except LabError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _param(text: str):
    try:
        return parse_param(text)
    except LabError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from e
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from e
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``chive-lab`` (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="chive-lab",
        description="Start and stop private chive networks on loopback, and run experiments on them.",
        epilog="See docs/lab.md in the chive repository for the directory layout and examples.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser(
        "up",
        help="start a network and wait until it works",
        description=(
            "Write configs and start 1 authority, N relays (all exits allowing 127.0.0.0/8), "
            "1 SOCKS client and 1 `chive httpd` on 127.0.0.1, each on a port the kernel picks (port 0, read back "
            "from the node's PortsFile); wait until the "
            "consensus lists every relay and a real fetch through the SOCKS port returns the "
            "expected bytes; then print one JSON object on stdout: "
            '{"socks": "127.0.0.1:P", "http": "http://127.0.0.1:P", "dir": DIR, "pids": {...}}. '
            "On failure, stop what was started and exit 1 with the reason and the failing "
            "node's log tail on stderr."
        ),
    )
    up.add_argument("--dir", required=True, type=Path,
                    help="directory for configs, data, logs (DIR/<node>/chive.log) and state.json; "
                         "must not already hold a network")
    up.add_argument("--relays", type=int, default=3, metavar="N",
                    help=f"number of relays, {MIN_RELAYS}..{MAX_RELAYS} (default: 3)")
    up.add_argument("--bandwidth-rate", type=_non_negative_int, default=None, metavar="BYTES",
                    help="set BandwidthRate and BandwidthBurst (bytes/s) on every relay "
                         "(default: unlimited)")
    up.add_argument("--set", dest="sets", action="append", type=_assignment, default=[],
                    metavar="KEY=VALUE",
                    help="add or override KEY in every relay's config; repeatable. VALUE is typed: "
                         "integer, float, true/false, a JSON list if it starts with '[', else a string "
                         "(e.g. --set CircuitPriorityHalflife=0)")
    up.add_argument("--param", dest="params", action="append", type=_param, default=[],
                    metavar="KEY=INT",
                    help="set an authority [NetworkParameters] entry; repeatable "
                         "(e.g. --param circwindow=101)")
    up.add_argument("--timeout", type=_positive_float, default=60.0, metavar="SECONDS",
                    help="give up if the network does not work within this time (default: 60)")
    up.add_argument("--consensus-interval", type=int, default=2, metavar="SECONDS",
                    help="the authority's ConsensusInterval (default: 2)")
    up.add_argument("--log-level", default="info", metavar="FILTER",
                    help="the Log setting of every node, e.g. debug (default: info)")
    up.add_argument("--impl", choices=("chive", "tor"), default="chive",
                    help="chive (default), or tor: the real Tor (tor + tor-gencert, Debian package "
                         "`tor`) as a private network configured as Chutney does, with chive httpd; "
                         "relay options map onto torrc (see docs/tor-baseline.md); waits at least 180 s")
    up.add_argument("--onion-service", action="store_true",
                    help="chive only: also start node `service`, a chive client running an onion "
                         "service in front of the httpd (HiddenServicePort 80); wait until a fetch "
                         'through it works; the JSON gains "onion": "http://<addr>.onion"')
    up.add_argument("--chive-bin", type=Path, default=None, metavar="PATH",
                    help="the chive binary (default: $CHIVE_BIN, else target/release/chive "
                         "in the repository)")
    up.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")

    down = sub.add_parser(
        "down",
        help="stop every process a network directory recorded",
        description=(
            "SIGTERM every process recorded in DIR/state.json that is still the same process "
            "(same command line and start time, so a reused pid is never signalled), wait up to "
            "5 s, SIGKILL the rest. Exit 1 listing any that would not stop. Removes no files."
        ),
    )
    down.add_argument("--dir", required=True, type=Path, help="the directory given to `up`")

    # Experiments (scenarios, analysis, report): chive_lab.runner / analysis / report.
    run = sub.add_parser(
        "run",
        help="run a scenario: every variant x repetition, then analyze and report",
        description=(
            "Run SCENARIO (a TOML file, see docs/lab.md) into OUT: for each repetition and variant "
            "a fresh network in OUT/runs/<variant>/<rep>/net, the scenario's chive perf clients for "
            "warm-up + duration, then everything stopped (also on errors and Ctrl-C, keeping what was "
            "collected). Writes OUT/manifest.json, summary.json, report.html and figures/."
        ),
    )
    run.add_argument("scenario", type=Path, help="scenario file, e.g. scenarios/paper000-ewma-web-vs-bulk.toml")
    run.add_argument("--out", required=True, type=Path, help="new or empty output directory")
    run.add_argument("--quick", action="store_true", help="apply the scenario's [quick] overrides (CI, demos)")
    run.add_argument("--variants", default=None, metavar="LABEL,...",
                     help="run only these variants (comma-separated labels)")
    run.add_argument("--repetitions", type=int, default=None, metavar="N",
                     help="override the number of repetitions")
    run.add_argument("--chive-bin", type=Path, default=None, metavar="PATH",
                     help="the chive binary (default: $CHIVE_BIN, else target/release/chive)")
    run.add_argument("--impl", choices=("chive", "tor", "both"), default=None,
                     help="replace the scenario's impl: both = every variant on chive and on the real Tor")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    analyze = sub.add_parser("analyze", help="recompute OUT/summary.json from the raw records",
                             description="Recompute DIR/summary.json (schema: docs/summary-schema.md) "
                                         "from DIR/runs/*/*/clients/*.jsonl and print it.")
    analyze.add_argument("dir", type=Path, help="a `chive-lab run` output directory")

    report = sub.add_parser("report", help="write DIR/report.html with figures and CSVs",
                            description="Re-analyze DIR and write DIR/report.html, DIR/figures/*.png "
                                        "and one CSV per figure with exactly the plotted data.")
    report.add_argument("dir", type=Path, help="a `chive-lab run` output directory")

    compare = sub.add_parser("compare", help="p50/p75 per class and variant of two runs, with the change",
                             description="Print ttlb/ttfb p50 and p75 of every class and variant present "
                                         "in both DIR1/summary.json and DIR2/summary.json, and the "
                                         "relative change from DIR1 to DIR2.")
    compare.add_argument("dir1", type=Path)
    compare.add_argument("dir2", type=Path)

    pool = sub.add_parser(
        "pool", help="analyse several finished results of one setup as one batch",
        description="Read the per-run data of each SRC (results of one kind and one setup, "
                    "checked) and analyse all runs together into OUT, as the kind of the first SRC does "
                    "(paper002-overlay: throughput CSVs, summary.json, comparison.md and pool.json listing "
                    "the sources' revisions).")
    pool.add_argument("--out", required=True, type=Path, help="output directory for the pooled analysis")
    pool.add_argument("--exclude-extra-channels", action="store_true",
                      help="paper002-overlay: leave out runs in which a relay pair carried bulk on more "
                           "connections than the variant opens, i.e. on two channels (listed in pool.json)")
    pool.add_argument("sources", type=Path, nargs="+", metavar="SRC", help="result directories to pool")

    export = sub.add_parser("export", help="write a run's transfers in another tool's format",
                            description="Write every transfer of DIR (a `chive-lab run` output directory) "
                                        "as OnionPerf analysis JSON (version 4.0; chive_lab.onionperf), "
                                        "readable by OnionPerf's and Tor Metrics' tooling.")
    export.add_argument("--onionperf", type=Path, required=True, metavar="DIR",
                        help="the run directory to export")
    export.add_argument("--out", type=Path, default=None,
                        help="output file (default: DIR/onionperf.analysis.json)")

    # netns backend leftovers (chive_lab.netns, brief K).
    clean = sub.add_parser("netns-clean", help="remove namespaces and processes left by crashed netns runs",
                           description="Delete chv-* network namespaces (and the processes inside them) "
                                       "recorded by netns runs whose owner process is gone; live runs "
                                       "are left alone unless --force. Needs root.")
    clean.add_argument("--force", action="store_true", help="also remove namespaces of live runs")
    return parser


def _print_error(err: LabError) -> None:
    print(f"chive-lab: error: {err}", file=sys.stderr)
    if err.log_tail:
        print(f"--- last lines of the {err.node} log ---", file=sys.stderr)
        print(err.log_tail, file=sys.stderr)
        print("---", file=sys.stderr)


def cmd_up(args: argparse.Namespace) -> int:
    """``chive-lab up``."""
    spec = NetworkSpec(
        relays=args.relays,
        bandwidth_rate=args.bandwidth_rate,
        relay_overrides=dict(args.sets),
        authority_params=dict(args.params),
        binary=args.chive_bin,
        timeout=args.timeout,
        consensus_interval=args.consensus_interval,
        log_level=args.log_level,
        impl=args.impl,
        onion_service=args.onion_service,
    )
    progress = None if args.quiet else _stderr
    # SIGTERM (e.g. from a script's trap) must also stop what `up` started:
    # turn it into the KeyboardInterrupt that Network.up cleans up after.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        info = Network.up(spec, args.dir, progress=progress)
    except LabError as e:
        _print_error(e)
        return 1
    except KeyboardInterrupt:
        print("chive-lab: interrupted; stopped what had been started", file=sys.stderr)
        return 130
    print(json.dumps(info.to_json()), flush=True)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """``chive-lab down``."""
    try:
        report = Network.down(args.dir)
    except LabError as e:
        _print_error(e)
        return 1
    parts = []
    if report.stopped:
        parts.append(f"stopped {', '.join(report.stopped)}")
    if report.killed:
        parts.append(f"killed (SIGKILL) {', '.join(report.killed)}")
    if report.not_running:
        parts.append(f"already gone: {', '.join(report.not_running)}")
    if report.not_ours:
        parts.append(f"left alone (pid now runs something else): {', '.join(report.not_ours)}")
    print(f"chive-lab: {'; '.join(parts) or 'nothing recorded'}", file=sys.stderr)
    for name, why in report.failed.items():
        print(f"chive-lab: error: {name} would not stop: {why}", file=sys.stderr)
    return 0 if report.ok else 1


def cmd_run(args: argparse.Namespace) -> int:
    """``chive-lab run``."""
    from .runner import run_experiment

    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else None
    try:
        return run_experiment(args.scenario, args.out, quick=args.quick, variants=variants,
                              repetitions=args.repetitions, binary=args.chive_bin,
                              progress=not args.quiet, argv=sys.argv, impl=args.impl)
    except LabError as e:
        _print_error(e)
        return 1


def cmd_analyze(args: argparse.Namespace) -> int:
    """``chive-lab analyze``."""
    from .runner import analyze_dir

    try:
        result = analyze_dir(args.dir)
    except LabError as e:
        _print_error(e)
        return 1
    print(json.dumps(result.summary, indent=2))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``chive-lab report``."""
    from .report import write_report
    from .runner import analyze_dir

    try:
        path = write_report(args.dir, analyze_dir(args.dir))
    except LabError as e:
        _print_error(e)
        return 1
    print(path)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """``chive-lab compare``."""
    from .report import compare, format_compare

    try:
        rows = compare(args.dir1, args.dir2)
    except LabError as e:
        _print_error(e)
        return 1
    print(format_compare(rows, str(args.dir1), str(args.dir2)))
    return 0


def cmd_pool(args: argparse.Namespace) -> int:
    """``chive-lab pool``: dispatched to the kind of the first source."""
    from .kinds import get_kind, kind_of_result

    try:
        kind = get_kind(kind_of_result(args.sources[0]))
        options = {"exclude_extra_channels": True} if args.exclude_extra_channels else {}
        summary = kind.pool(list(args.sources), args.out, **options)
    except LabError as e:
        _print_error(e)
        return 2
    print(json.dumps(summary.get("targets", summary.get("variants", {})), indent=1))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``chive-lab export --onionperf DIR``."""
    from .onionperf import export_dir

    try:
        path = export_dir(args.onionperf, args.out)
    except LabError as e:
        _print_error(e)
        return 1
    except OSError as e:
        print(f"chive-lab: error: cannot write the export: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _raise_interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _stderr(msg: str) -> None:
    print(f"chive-lab: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``chive-lab`` console script."""
    args = build_parser().parse_args(argv)
    if args.command == "up":
        return cmd_up(args)
    if args.command == "down":
        return cmd_down(args)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "analyze":
        return cmd_analyze(args)
    if args.command == "report":
        return cmd_report(args)
    if args.command == "compare":
        return cmd_compare(args)
    if args.command == "pool":
        return cmd_pool(args)
    if args.command == "export":
        return cmd_export(args)
    if args.command == "netns-clean":
        from .netns import cmd_netns_clean

        return cmd_netns_clean(args)
    raise AssertionError(f"unknown command {args.command}")  # argparse prevents this


if __name__ == "__main__":
    raise SystemExit(main())
