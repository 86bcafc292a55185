#!/usr/bin/env bash
# `make bench` (end-to-end part): 3-hop loopback goodput. Starts a 3-relay
# network without rate limits, downloads 50 MB through SOCKS with curl
# BENCH_RUNS times (default 3), prints MB/s (10^6 bytes/s) of each run and the
# median, and always stops the network.
#
# Environment: BENCH_DIR (default runs/bench-goodput), BENCH_BYTES (default
# 50000000), BENCH_RUNS (default 3).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LAB="$ROOT/.venv/bin/chive-lab"
PY="$ROOT/.venv/bin/python"
DIR=${BENCH_DIR:-$ROOT/runs/bench-goodput}
BYTES=${BENCH_BYTES:-50000000}
RUNS=${BENCH_RUNS:-3}

if [ ! -x "$LAB" ]; then
    echo "bench: $LAB not found: run \`make build\` first" >&2
    exit 1
fi
if [ -f "$DIR/state.json" ]; then
    "$LAB" down --dir "$DIR" || true
fi
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"

cleanup() {
    local rc=$?
    trap - EXIT
    if [ -f "$DIR/state.json" ]; then
        "$LAB" down --dir "$DIR" || rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

info=$("$LAB" up --dir "$DIR" --relays 3)
field() { "$PY" -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$info" "$1"; }
socks=$(field socks)
http=$(field http)

rates=()
for i in $(seq 1 "$RUNS"); do
    # size_download and time_total come from curl itself; the body is discarded.
    result=$(curl --silent --show-error --fail --max-time 600 \
        --socks5-hostname "$socks" -o /dev/null \
        -w '%{size_download} %{time_total}' "$http/bytes/$BYTES")
    read -r got secs <<<"$result"
    if [ "$got" != "$BYTES" ]; then
        echo "bench: run $i received $got bytes, expected $BYTES" >&2
        exit 1
    fi
    rate=$("$PY" -c 'import sys; print(f"{int(sys.argv[1]) / float(sys.argv[2]) / 1e6:.2f}")' "$got" "$secs")
    echo "run $i: $got bytes in ${secs}s = $rate MB/s"
    rates+=("$rate")
done
median=$("$PY" -c 'import statistics, sys; print(f"{statistics.median(map(float, sys.argv[1:])):.2f}")' "${rates[@]}")
echo "3-hop loopback goodput, $BYTES bytes, no rate limit: median $median MB/s over $RUNS runs"
