#!/usr/bin/env bash
# `make demo`: (1) start a 3-relay chive network on loopback, download 1 MiB and
# 10 MiB through it with curl --socks5-hostname, print curl's timings and a
# byte-exact check, and always stop the network (trap), even on failure;
# (2) run the quick EWMA-vs-round-robin scenario (scenarios/paper000-ewma-web-vs-bulk.toml
# --quick, about three minutes) and print its key table: web p50/p75 per variant,
# the improvement in percent, the bulk K-S p value and where the report is.
#
# Environment: DEMO_DIR (default runs/demo), DEMO_RELAYS (default 3),
# DEMO_SCENARIO (default scenarios/paper000-ewma-web-vs-bulk.toml),
# DEMO_EXPERIMENT_DIR (default runs/demo-ewma), DEMO_SKIP_EXPERIMENT=1 to skip (2).
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
echo "demo: curl part OK (logs: $DIR/<node>/chive.log)" >&2
"$LAB" down --dir "$DIR" >/dev/null 2>&1 || true

if [ "${DEMO_SKIP_EXPERIMENT:-0}" = 1 ]; then
    exit 0
fi
SCEN=${DEMO_SCENARIO:-$ROOT/scenarios/paper000-ewma-web-vs-bulk.toml}
EXP=${DEMO_EXPERIMENT_DIR:-$ROOT/runs/demo-ewma}
rm -rf "$EXP"
echo "demo: running $(basename "$SCEN") --quick into $EXP (a few minutes)" >&2
"$LAB" run "$SCEN" --quick --out "$EXP"
"$PY" - "$EXP/summary.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
order = s["variants_order"]
base = order[0]
print()
print(f"{'variant':<10} {'web ttlb p50':>13} {'web ttlb p75':>13} {'p50 vs ' + base:>12} {'bulk K-S p':>11}")
for label in order:
    web = s["variants"][label].get("web", {})
    bulk = s["variants"][label].get("bulk", {})
    p50, p75 = web.get("ttlb", {}).get("p50"), web.get("ttlb", {}).get("p75")
    b50 = s["variants"][base].get("web", {}).get("ttlb", {}).get("p50")
    gain = None if None in (p50, b50) or b50 == 0 else (b50 - p50) / b50 * 100
    imp = "" if gain is None else (f"{gain:.1f}% faster" if gain >= 0 else f"{-gain:.1f}% slower")
    ks = bulk.get("ks_vs_first", {}).get("pvalue")
    f = lambda v: "-" if v is None else f"{v:.3f} s"
    print(f"{label:<10} {f(p50):>13} {f(p75):>13} {imp if label != base else '(baseline)':>12} "
          f"{'-' if ks is None or label == base else f'{ks:.3g}':>11}")
print("(ttlb: time to last byte from the start of the transfer; K-S: bulk ttlb vs the baseline)")
PYEOF
echo "demo: report: $EXP/report.html" >&2
