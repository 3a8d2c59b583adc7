#!/bin/bash
# Session 7: timed A/B of branch loss (losers pause) against main, 256 ranks on four 2 s-cached bindfs mounts,
# then 16 ranks on a local disk (FolderStore and FileStore), alternating, ROUNDS rounds; each run waits for the
# 1-minute load < 2 (at most 90 s) and logs it.  Usage: ab.sh TREE_A NAME_A TREE_B NAME_B ROUNDS [SIZES]
# (SIZES: "256" for the 256-rank rows only; default "256 16")
OUT=/work/wt/loss/benchmarks/results/folderstore-loss
A=$1; NA=$2; B=$3; NB=$4; ROUNDS=$5; SIZES=${6:-256 16}
waitq() { for i in $(seq 1 90); do l=$(cut -d' ' -f1 /proc/loadavg); awk "BEGIN{exit !($l < 2)}" && break; sleep 1; done; }
for round in $(seq 1 $ROUNDS); do
  for t in $NA $NB; do
    d=$A; [ $t = $NB ] && d=$B
    waitq
    echo "== $t round $round N=256 bindfs2 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $(git -C $d rev-parse --short HEAD)" >> $OUT/run.log
    (cd $d && PYTHONPATH=$d timeout 300 python -m benchmarks.bench_folderstore --n 256 --fs bindfs2 --stores folder --k 2 --k-add 1 --limit 240 --no-strace --out $OUT/$t-256-$round) 2>&1 | grep "^| bindfs2" >> $OUT/run.log
    echo "   after $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/run.log
    [ "$SIZES" = 256 ] && continue
    waitq
    echo "== $t round $round N=16 local $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/run.log
    (cd $d && PYTHONPATH=$d timeout 300 python -m benchmarks.bench_folderstore --n 16 --fs local --stores folder,file --limit 120 --no-strace --out $OUT/$t-16-$round) 2>&1 | grep "^| local" >> $OUT/run.log
  done
done
echo DONE >> $OUT/run.log
