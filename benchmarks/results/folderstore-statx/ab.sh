#!/bin/bash
# Session 11: timed A/B of the link count read past the attribute cache (lookup.link_count: statx with
# AT_STATX_FORCE_SYNC, one GETATTR per lost race) against main before it (79ea8cc, a throw-away worktree), 256 ranks
# on four 2 s-cached bindfs mounts and 16 ranks on a local disk, alternating; each run waits for the 1-minute load < 2
# (at most WAIT s, default 90) and logs it.  Usage: [WAIT=s] ab.sh ROUNDS BASE_TREE NEW_TREE [FIRST_ROUND]
OUT=$(cd "$(dirname "$0")" && pwd)
ROUNDS=$1; BASE=$2; NEW=$3; FIRST=${4:-1}
waitq() { for i in $(seq 1 ${WAIT:-90}); do l=$(cut -d' ' -f1 /proc/loadavg); awk "BEGIN{exit !($l < 2)}" && break; sleep 1; done; }
for round in $(seq $FIRST $((FIRST + ROUNDS - 1))); do
  for t in base statx; do
    d=$BASE; [ $t = statx ] && d=$NEW
    waitq
    echo "== $t round $round N=256 bindfs2 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $(git -C $d rev-parse --short HEAD)" >> $OUT/run.log
    (cd $d && PYTHONPATH=$d timeout 300 python -m benchmarks.bench_folderstore --n 256 --fs bindfs2 --stores folder --k 2 --k-add 1 --limit 240 --no-strace --out $OUT/$t-256-$round) 2>&1 | grep "^| bindfs2" >> $OUT/run.log
    echo "   after $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/run.log
  done
  for t in base statx; do
    d=$BASE; [ $t = statx ] && d=$NEW
    waitq
    echo "== $t round $round N=16 local $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $(git -C $d rev-parse --short HEAD)" >> $OUT/run.log
    (cd $d && PYTHONPATH=$d timeout 300 python -m benchmarks.bench_folderstore --n 16 --fs local --stores folder,file --no-strace --out $OUT/$t-16-$round) 2>&1 | grep -E "^\| local|^- local" >> $OUT/run.log
  done
done
echo DONE >> $OUT/run.log
