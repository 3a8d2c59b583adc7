#!/bin/bash
# Session 12: python -m benchmarks.recovery on the fsmingle paths, base (79ea8cc, stop 38) against head (session 12),
# in throw-away worktrees (the harness runs every process with PYTHONPATH = its own tree), alternating rounds, each
# after the 1-minute load falls under 2 (at most WAIT s).  N = 4, SIGKILL, one rep per round.
set -u
OUT=${OUT:-/tmp/recovery-s12}
WAIT=${WAIT:-240}
mkdir -p "$OUT"
quiet() { for _ in $(seq "$WAIT"); do awk '{exit !($1 < 2)}' /proc/loadavg && return; sleep 1; done; }
for r in 1 2; do
  for side in base head; do
    quiet
    echo "$(date -u +%T) $side r$r load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "/tmp/wt-$side" && python -m benchmarks.recovery --n 4 --paths inproc,fsmingle-run,torchrun-fsmingle \
      --faults kill --reps 1 --out "$OUT/$side-r$r" > "$OUT/$side-r$r.log" 2>&1)
    echo "$(date -u +%T) $side r$r rc $?"
  done
done
# Rounds 3-6 (added after rounds 1-2 showed torchrun-fsmingle's release 7.8/8.6 s base against 13.7/12.2 s head):
# that path alone, to tell a change from its spread.
for r in 3 4 5 6; do
  for side in base head; do
    quiet
    echo "$(date -u +%T) $side r$r load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "/tmp/wt-$side" && python -m benchmarks.recovery --n 4 --paths torchrun-fsmingle \
      --faults kill --reps 1 --out "$OUT/$side-r$r" > "$OUT/$side-r$r.log" 2>&1)
    echo "$(date -u +%T) $side r$r rc $?"
  done
done
