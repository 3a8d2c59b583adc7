#!/bin/bash
# Session 6 end: timed A/B of branch cap (grown epochs) against main (767ebd0), 256 ranks on four 2 s-cached bindfs
# mounts, alternating, 3 rounds; each run waits for the 1-minute load < 2 (at most 90 s) and logs it.
OUT=/work/wt/cap/benchmarks/results/folderstore-cap
waitq() { for i in $(seq 1 90); do l=$(cut -d' ' -f1 /proc/loadavg); awk "BEGIN{exit !($l < 2)}" && break; sleep 1; done; }
for round in 1 2 3; do
  for t in main cap; do
    d=/work/main; [ $t = cap ] && d=/work/wt/cap
    waitq
    echo "== $t round $round N=256 bindfs2 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $(git -C $d rev-parse --short HEAD)" >> $OUT/run.log
    (cd $d && PYTHONPATH=$d timeout 300 python -m benchmarks.bench_folderstore --n 256 --fs bindfs2 --stores folder --k 2 --k-add 1 --limit 240 --no-strace --out $OUT/$t-256-$round) 2>&1 | grep "^| bindfs2" >> $OUT/run.log
    echo "   after $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/run.log
  done
done
echo DONE >> $OUT/run.log
