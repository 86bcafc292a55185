#!/usr/bin/env python3
"""Coverage-guided fuzzing of the lab's scenario files (docs/fuzzing.md, "The lab's scenario files").

Runs ``chive_lab.fuzzing.check_scenario_input`` under atheris (libFuzzer for Python; ``pip install
'lab[fuzz]'``), with the lab's modules instrumented for coverage. The seeds are made from the
repository's ``scenarios/*.toml`` at start; the corpus the run grows goes to ``--corpus`` (not
checked in). A finding is written as ``crash-<sha1>`` to ``--artifacts``: copy it to
``lab/tests/data/fuzz-scenario/`` so ``make test`` replays it (``lab/tests/test_fuzzing.py``).

    .venv/bin/python lab/scripts/fuzz_scenarios.py --runs 100000 --seconds 600

Ends with libFuzzer's final statistics (executions, exec/s, coverage) and exit status 0 when
nothing was found.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

LAB = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--runs", type=int, default=1_000_000, help="executions to stop after (default 1000000)")
    ap.add_argument("--seconds", type=int, default=3600, help="time limit in seconds (default 3600)")
    ap.add_argument("--corpus", type=Path, default=Path("fuzz/corpus/scenario"),
                    help="corpus directory the run reads and grows (default fuzz/corpus/scenario)")
    ap.add_argument("--artifacts", type=Path, default=Path("fuzz/artifacts/scenario"),
                    help="where a finding is written (default fuzz/artifacts/scenario)")
    ap.add_argument("--max-len", type=int, default=16384, help="largest input in bytes (default 16384)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.seconds < 1 or args.max_len < 2:
        ap.error("--runs, --seconds and --max-len must be positive")
    try:
        import atheris
    except ImportError:
        print("fuzz_scenarios: atheris is not installed (pip install 'lab[fuzz]', or `make fuzz`)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(LAB))
    with atheris.instrument_imports(include=["chive_lab"]):
        from chive_lab import fuzzing

        fuzzing.preload_kinds()

    args.corpus.mkdir(parents=True, exist_ok=True)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    seeds = Path(tempfile.mkdtemp(prefix="chive-scenario-seeds-"))
    for name, data in fuzzing.seed_inputs():
        (seeds / name).write_bytes(data)

    def one_input(data: bytes) -> None:
        fuzzing.check_scenario_input(data)

    libfuzzer_args = [
        sys.argv[0], str(args.corpus), str(seeds),
        f"-runs={args.runs}", f"-max_total_time={args.seconds}", f"-max_len={args.max_len}",
        "-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1",
        f"-artifact_prefix={args.artifacts}/",
    ]
    print(f"fuzz_scenarios: {len(fuzzing.seed_inputs())} seeds from {fuzzing.SCENARIO_DIR}, corpus {args.corpus}",
          flush=True)
    atheris.Setup(libfuzzer_args, one_input)
    atheris.Fuzz()  # exits the process with libFuzzer's status
    return 0


if __name__ == "__main__":
    sys.exit(main())
