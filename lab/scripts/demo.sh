#!/usr/bin/env bash
# `make demo`: start a 3-relay chive network on loopback, download 1 MiB and
# 10 MiB through it with curl --socks5-hostname, print curl's timings and a
# byte-exact check, and always stop the network (trap), even on failure.
#
# Environment: DEMO_DIR (default runs/demo), DEMO_RELAYS (default 3).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LAB="$ROOT/.venv/bin/chive-lab"
PY="$ROOT/.venv/bin/python"
DIR=${DEMO_DIR:-$ROOT/runs/demo}
RELAYS=${DEMO_RELAYS:-3}

if [ ! -x "$LAB" ]; then
    echo "demo: $LAB not found: run \`make build\` first" >&2
    exit 1
fi

# A previous demo's network (if one was left running) is stopped, and its
# directory replaced: `chive-lab up` wants a fresh directory.
if [ -f "$DIR/state.json" ]; then
    "$LAB" down --dir "$DIR" || true
fi
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"

cleanup() {
    local rc=$?
    trap - EXIT
    if [ -f "$DIR/state.json" ]; then
        echo "demo: stopping the network" >&2
        "$LAB" down --dir "$DIR" || rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "demo: starting 1 authority, $RELAYS relays, 1 client and 1 httpd in $DIR" >&2
info=$("$LAB" up --dir "$DIR" --relays "$RELAYS")
field() { "$PY" -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$info" "$1"; }
socks=$(field socks)
http=$(field http)
echo "demo: network ready: SOCKS $socks, HTTP $http" >&2

failed=0
for spec in "1 MiB:1048576" "10 MiB:10485760"; do
    label=${spec%%:*}
    size=${spec##*:}
    out="$DIR/download-$size.bin"
    if ! timing=$(curl --silent --show-error --fail --max-time 300 \
            --socks5-hostname "$socks" -o "$out" \
            -w 'time_connect=%{time_connect}s time_starttransfer=%{time_starttransfer}s time_total=%{time_total}s' \
            "$http/bytes/$size"); then
        echo "$label: curl failed" >&2
        failed=1
        continue
    fi
    if "$PY" -c 'import sys; from chive_lab.content import main; sys.exit(main())' "$out" "$size"; then
        check="byte-exact"
    else
        check="NOT byte-exact"
        failed=1
    fi
    echo "$label: $timing ($check)"
done

if [ "$failed" -ne 0 ]; then
    echo "demo: FAILED (logs: $DIR/<node>/chive.log)" >&2
    exit 1
fi
echo "demo: OK (logs: $DIR/<node>/chive.log)" >&2
