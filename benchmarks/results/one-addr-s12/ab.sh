#!/bin/bash
# Session 12: the one-address scale benchmark (benchmarks/README.md, "Issue 29") re-run after session 11's change of
# the claim path (PosixStore.create: a forced statx per lost claim, lookup.link_count) and session 12's (a plain stat
# for the first claim's proof).  base = 79ea8cc (stop 38, before both), head = the working tree; alternating rounds,
# each waiting for the 1-minute load to fall under 2 (at most WAIT s).
set -u
OUT=${OUT:-/tmp/oneaddr-s12}
WAIT=${WAIT:-240}
BASE=${BASE:-/tmp/base-79ea}   # git archive 79ea8cc fsmingle | tar -x -C $BASE
mkdir -p "$OUT"
quiet() { for _ in $(seq "$WAIT"); do awk '{exit !($1 < 2)}' /proc/loadavg && return; sleep 1; done; }
run() {  # name n procs settle timeout [root]
  local name=$1 n=$2 procs=$3 settle=$4 to=$5 root=${6:-}
  quiet
  echo "$(date -u +%T) $name load $(cut -d' ' -f1 /proc/loadavg)"
  python -m benchmarks.rdzv --n "$n" --max-procs "$procs" --backends fsmingle --fs local --reps 1 --settle "$settle" \
    --strace-secs 2 --strace-procs 0 --timeout "$to" --one-addr --no-progress ${root:+--fsmingle-root "$root"} \
    --workdir "$OUT/work-$name" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$(date -u +%T) $name rc $?"
  rm -rf "$OUT/work-$name"
}
for r in 1 2; do
  run "base-1024-r$r" 1024 5 5 90 "$BASE"
  run "head-1024-r$r" 1024 5 5 90
done
run base-4096 4096 9 20 120 "$BASE"
run head-4096 4096 9 20 120
