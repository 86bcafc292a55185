#!/usr/bin/env bash
# Run every fuzz target (or those named in FUZZ_TARGETS) for FUZZ_RUNS executions or
# FUZZ_SECONDS each (whichever comes first), one after the other, starting from the checked-in seeds (fuzz/seeds/<t>) and the growing local corpus
# (fuzz/corpus/<t>, not checked in). Prints a table of executions, exec/s, coverage (cov),
# features (ft) and corpus size per target from libFuzzer's final "DONE" line. Exits non-zero if
# a target crashed, hung or ran out of memory, naming the artifact (fuzz/artifacts/<t>/...).
#
# Environment: FUZZ_SECONDS (default 600), FUZZ_RUNS (default: no limit), FUZZ_TARGETS
# (default: all), FUZZ_SANITIZER (none, the default, or address: AddressSanitizer, 5-40 times
# slower here; the crates are #![forbid(unsafe_code)]), FUZZ_NICE (19), FUZZ_TARGET_DIR (where
# cargo-fuzz builds, default fuzz/target: the instrumented build of every dependency from scratch
# took over an hour on the loaded 2-core machine in session 14, so point worktrees at one shared,
# kept directory), FUZZ_INSTRUMENT_ALL (1: give the crypto crates coverage instrumentation
# too, as before session 21; by default fuzz/scripts/rustc-wrap leaves them out, see there and
# docs/fuzzing.md. Cargo does not see the difference: use a separate FUZZ_TARGET_DIR for each).
# Logs: fuzz/logs/<t>.log. Run from the repository root (make fuzz does).
set -euo pipefail

cd "$(dirname "$0")/../.."
export PATH="$HOME/.cargo/bin:$PATH"

seconds=${FUZZ_SECONDS:-600}
sanitizer=${FUZZ_SANITIZER:-none}
niceness=${FUZZ_NICE:-19}
runs=${FUZZ_RUNS:+-runs=$FUZZ_RUNS}
target_dir=()
[ -z "${FUZZ_TARGET_DIR:-}" ] || target_dir=(--target-dir "$FUZZ_TARGET_DIR")
all_targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^chive-fuzz$')
targets=${FUZZ_TARGETS:-$all_targets}

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: needs a nightly toolchain (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo install --locked cargo-fuzz
fi

# The crypto crates get no coverage instrumentation (fuzz/scripts/rustc-wrap says why).
if [ "${FUZZ_INSTRUMENT_ALL:-0}" != 1 ]; then
    export RUSTC_WRAPPER="$PWD/fuzz/scripts/rustc-wrap"
fi

mkdir -p fuzz/logs
# Build the chosen targets once up front, so the time limits below are spent fuzzing (only
# those: all sixteen pull in every crate, a long instrumented build on a loaded machine).
for t in $targets; do
    nice -n "$niceness" cargo +nightly fuzz build -s "$sanitizer" "${target_dir[@]}" "$t"
done

failed=()
rows=()
for t in $targets; do
    mkdir -p "fuzz/corpus/$t"
    log="fuzz/logs/$t.log"
    echo "fuzz: $t for ${seconds}s (log: $log)"
    status=0
    nice -n "$niceness" cargo +nightly fuzz run -s "$sanitizer" "${target_dir[@]}" "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 $runs \
        >"$log" 2>&1 || status=$?
    # The final stats line: "#N DONE cov: C ft: F corp: K/Sb ... exec/s: E rss: R".
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    cov=$(grep -oE 'cov: [0-9]+' <<<"$done_line" | grep -oE '[0-9]+' || true)
    ft=$(grep -oE 'ft: [0-9]+' <<<"$done_line" | grep -oE '[0-9]+' || true)
    corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' <<<"$done_line" | cut -d' ' -f2 || true)
    result=ok
    if [ "$status" -ne 0 ]; then
        artifact=$(grep -oE 'fuzz/artifacts/[^ ]+' "$log" | tail -n 1 || true)
        [ -n "$artifact" ] || artifact=$(grep -oE 'Test unit written to [^ ]+' "$log" | tail -n 1 | cut -d' ' -f5)
        result="FAILED (exit $status) ${artifact:-see $log}"
        failed+=("$t: $result")
    fi
    rows+=("$(printf '%-15s %12s %9s %7s %7s %14s  %s' "$t" "${execs:--}" "${rate:--}" "${cov:--}" "${ft:--}" "${corp:--}" "$result")")
done

echo
printf '%-15s %12s %9s %7s %7s %14s  %s\n' target execs exec/s cov ft corpus result
for r in "${rows[@]}"; do echo "$r"; done
if [ "${#failed[@]}" -gt 0 ]; then
    echo
    echo "fuzz: failures (reproduce: cargo +nightly fuzz run <target> <artifact>; then add the"
    echo "input to fuzz/regressions/<target>/ with the fix):"
    printf '  %s\n' "${failed[@]}"
    exit 1
fi
