#!/bin/bash
# Session 8: timed A/B of adds in a window (FolderKV(window=W), branch window) against window 0 (off) in the SAME
# tree: 256 ranks on four 2 s-cached bindfs mounts, alternating, ROUNDS rounds; each run waits for the 1-minute
# load < 2 (at most 90 s) and logs it.  Usage: ab.sh ROUNDS W [W2...]
OUT=$(cd "$(dirname "$0")" && pwd); T=$(cd "$OUT/../../.." && pwd)
ROUNDS=$1; shift
waitq() { for i in $(seq 1 90); do l=$(cut -d' ' -f1 /proc/loadavg); awk "BEGIN{exit !($l < 2)}" && break; sleep 1; done; }
for round in $(seq 1 $ROUNDS); do
  for w in 0 "$@"; do
    waitq
    echo "== window $w round $round N=256 bindfs2 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $(git -C $T rev-parse --short HEAD)" >> $OUT/run.log
    (cd $T && PYTHONPATH=$T timeout 300 python -m benchmarks.bench_folderstore --n 256 --fs bindfs2 --stores folder --k 2 --k-add 1 --limit 240 --no-strace --window $w --out $OUT/w$w-256-$round) 2>&1 | grep "^| bindfs2" >> $OUT/run.log
    echo "   after $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/run.log
  done
done
echo DONE >> $OUT/run.log
