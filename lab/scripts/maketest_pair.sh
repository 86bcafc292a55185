#!/usr/bin/env bash
# How long `make test` takes at two revisions on the same machine at the same time: two clean
# clones of this repository, each running CI's entry point (`CI=true bash .ci/run`), started
# together so that both see the same load (docs/testing.md: "Against the revision issue 15 was
# filed at"). Prints each run's wall time and exit status; the logs stay in OUT.
#   lab/scripts/maketest_pair.sh [OLD_REV] [NEW_REV] [OUT]
# defaults: b8fe300 (issue 15's filing revision), HEAD, a new temporary directory.
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
old=${1:-b8fe300}
new=${2:-HEAD}
out=${3:-$(mktemp -d /tmp/maketest-pair.XXXXXX)}
mkdir -p "$out"
for side in old new; do
    rev=$old
    [ "$side" = new ] && rev=$new
    rev=$(git -C "$repo" rev-parse --verify "$rev^{commit}")
    rm -rf "${out:?}/$side"
    git clone -q "$repo" "$out/$side"
    git -C "$out/$side" checkout -q "$rev"
    echo "$side: $rev"
done
echo "logs: $out/old.log $out/new.log (both running; this takes 20-70 minutes)"
for side in old new; do
    (cd "$out/$side" && { time CI=true bash .ci/run; } > "$out/$side.log" 2>&1; echo "rc=$?" >> "$out/$side.log") &
done
wait
for side in old new; do
    printf '%s: %s, %s\n' "$side" "$(grep -m1 '^real' "$out/$side.log" | tr -s '\t ' ' ')" "$(tail -n 1 "$out/$side.log")"
done
