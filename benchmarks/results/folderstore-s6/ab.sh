#!/bin/bash
# Session 6 A/B of FolderStore: base = main (a throw-away worktree of it), fast = branch fast. Alternating, 2 rounds;
# each run waits for the 1-minute load < 4 (at most 60 s) and logs the load before / after.
OUT=/work/wt/fast/benchmarks/results/folderstore-s6
mkdir -p $OUT
waitq() { for i in $(seq 1 60); do l=$(cut -d' ' -f1 /proc/loadavg); awk "BEGIN{exit !($l < 4)}" && break; sleep 1; done; }
for round in ${ROUNDS:-1 2}; do
  for t in base fast; do
    d=/work/wt/fast-base; [ $t = fast ] && d=/work/wt/fast
    waitq
    echo "== $t round $round N=256 bindfs2 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $(git -C $d rev-parse --short HEAD)" >> $OUT/run.log
    (cd $d && PYTHONPATH=$d timeout 400 python -m benchmarks.bench_folderstore --n 256 --fs bindfs2 --stores folder --k 2 --k-add 1 --limit 240 --no-strace --out $OUT/$t-256-$round) 2>&1 | grep "^| bindfs2" >> $OUT/run.log
    echo "   after $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/run.log
  done
  for t in base fast; do
    d=/work/wt/fast-base; [ $t = fast ] && d=/work/wt/fast
    waitq
    echo "== $t round $round N=16 local $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/run.log
    (cd $d && PYTHONPATH=$d timeout 300 python -m benchmarks.bench_folderstore --n 16 --fs local --stores folder,file --no-strace --out $OUT/$t-16-$round) 2>&1 | grep -E "^\| local|^- local" >> $OUT/run.log
  done
done
echo "DONE rounds ${ROUNDS:-1 2}" >> $OUT/run.log
