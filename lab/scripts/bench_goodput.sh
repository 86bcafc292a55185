#!/usr/bin/env bash
# `make bench` (end-to-end part): 3-hop loopback goodput. For each
# implementation, starts a 3-relay network without rate limits, downloads 50 MB
# through SOCKS with curl BENCH_RUNS times (default 3), prints the MB/s (10^6
# bytes/s) of each run, always stops the network, and at the end prints one
# table with every implementation's runs and median.
#
# Usage: bench_goodput.sh [--impl chive|tor|both]
# Environment: BENCH_IMPL (chive, tor or both; default chive; --impl wins),
# BENCH_DIR (default runs/bench-goodput; one subdirectory per implementation),
# BENCH_BYTES (default 50000000), BENCH_RUNS (default 3), BENCH_SET (space-separated
# KEY=VALUE relay options for chive, passed as `chive-lab up --set`, e.g.
# BENCH_SET=LinkRecordLayer=own).
# `tor` is the real Tor (Debian package `tor`) configured by `chive-lab up
# --impl tor`; see docs/tor-baseline.md.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LAB="$ROOT/.venv/bin/chive-lab"
PY="$ROOT/.venv/bin/python"
BASE=${BENCH_DIR:-$ROOT/runs/bench-goodput}
BYTES=${BENCH_BYTES:-50000000}
RUNS=${BENCH_RUNS:-3}
IMPL=${BENCH_IMPL:-chive}

while [ $# -gt 0 ]; do
    case "$1" in
        --impl) IMPL=${2:-}; shift 2 ;;
        --impl=*) IMPL=${1#--impl=}; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "bench: unknown argument $1 (usage: $0 [--impl chive|tor|both])" >&2; exit 2 ;;
    esac
done
case "$IMPL" in
    chive) impls=(chive) ;;
    tor) impls=(tor) ;;
    both) impls=(chive tor) ;;
    *) echo "bench: --impl must be chive, tor or both, not '$IMPL'" >&2; exit 2 ;;
esac

if [ ! -x "$LAB" ]; then
    echo "bench: $LAB not found: run \`make build\` first" >&2
    exit 1
fi

DIR=""
cleanup() {
    local rc=$?
    trap - EXIT
    if [ -n "$DIR" ] && [ -f "$DIR/state.json" ]; then
        "$LAB" down --dir "$DIR" || rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

field() { "$PY" -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
declare -A table

for impl in "${impls[@]}"; do
    DIR="$BASE/$impl"
    if [ -f "$DIR/state.json" ]; then
        "$LAB" down --dir "$DIR" || true
    fi
    rm -rf "$DIR"
    mkdir -p "$(dirname "$DIR")"

    echo "bench: $impl: starting a 3-relay network in $DIR" >&2
    sets=()
    if [ "$impl" = chive ]; then
        for kv in ${BENCH_SET:-}; do sets+=(--set "$kv"); done
    fi
    info=$("$LAB" up --impl "$impl" --dir "$DIR" --relays 3 "${sets[@]}")
    socks=$(field "$info" socks)
    http=$(field "$info" http)

    rates=()
    for i in $(seq 1 "$RUNS"); do
        # size_download and time_total come from curl itself; the body is discarded.
        result=$(curl --silent --show-error --fail --max-time 600 \
            --socks5-hostname "$socks" -o /dev/null \
            -w '%{size_download} %{time_total}' "$http/bytes/$BYTES")
        read -r got secs <<<"$result"
        if [ "$got" != "$BYTES" ]; then
            echo "bench: $impl run $i received $got bytes, expected $BYTES" >&2
            exit 1
        fi
        rate=$("$PY" -c 'import sys; print(f"{int(sys.argv[1]) / float(sys.argv[2]) / 1e6:.2f}")' "$got" "$secs")
        echo "$impl run $i: $got bytes in ${secs}s = $rate MB/s"
        rates+=("$rate")
    done
    median=$("$PY" -c 'import statistics, sys; print(f"{statistics.median(map(float, sys.argv[1:])):.2f}")' "${rates[@]}")
    echo "3-hop loopback goodput ($impl), $BYTES bytes, no rate limit: median $median MB/s over $RUNS runs"
    table[$impl]="${rates[*]} | $median"

    "$LAB" down --dir "$DIR"
    DIR=""
done

echo
echo "3-hop loopback goodput, $BYTES bytes per download, no rate limits (MB/s = 10^6 bytes/s)"
printf '%-6s | %-28s | %s\n' impl "runs (MB/s)" "median (MB/s)"
for impl in "${impls[@]}"; do
    printf '%-6s | %-28s | %s\n' "$impl" "${table[$impl]% | *}" "${table[$impl]##* | }"
done
if [ -n "${table[chive]:-}" ] && [ -n "${table[tor]:-}" ]; then
    "$PY" -c 'import sys; c, t = float(sys.argv[1]), float(sys.argv[2]); print(f"chive / tor: {c / t:.2f}x" if t > 0 else "")' \
        "${table[chive]##* | }" "${table[tor]##* | }"
fi
