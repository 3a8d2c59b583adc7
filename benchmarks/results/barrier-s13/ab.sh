#!/bin/bash
# Session 13: where issue 30's barrier targets stand on main, each beside its peers in the same round:
#  - 256 ranks on four 2 s-cached bindfs mounts: FolderStore's barrier on main (NEW tree), on BASE (79ea8cc: before
#    the link count read past the cache, session 11, and session 12's settling -- more rounds of that A/B), and the
#    floor (benchmarks/folderstore_floor.py: the same processes, no contention);
#  - 16 ranks on a local disk: main's FolderStore against FileStore.
# Each run waits for the 1-minute load < 2 (at most WAIT s, default 90) and logs the load before / after.
# Round 1 (first version of this script) ran main and the floor only.  Usage: [WAIT=s] ab.sh FIRST LAST BASE NEW
OUT=$(cd "$(dirname "$0")" && pwd)
FIRST=$1; LAST=$2; BASE=$3; NEW=$4
waitq() { for i in $(seq 1 ${WAIT:-90}); do l=$(cut -d' ' -f1 /proc/loadavg); awk "BEGIN{exit !($l < 2)}" && break; sleep 1; done; }
for round in $(seq $FIRST $LAST); do
  order="folder base floor"; [ $((round % 2)) = 0 ] && order="floor base folder"
  for t in $order; do
    d=$NEW; [ $t = base ] && d=$BASE
    waitq
    echo "== $t round $round N=256 bindfs2 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $(git -C $d rev-parse --short HEAD)" >> $OUT/run.log
    if [ $t = floor ]; then
      (cd $d && timeout 300 python -m benchmarks.folderstore_floor --n 256 --fs bindfs2) 2>&1 | tail -1 >> $OUT/run.log
    else
      (cd $d && PYTHONPATH=$d timeout 400 python -m benchmarks.bench_folderstore --n 256 --fs bindfs2 --stores folder --k 2 --k-add 1 --limit 240 --no-strace --out $OUT/$t-256-$round) 2>&1 | grep "^| bindfs2" >> $OUT/run.log
    fi
    echo "   after $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/run.log
  done
  waitq
  echo "== round $round N=16 local $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/run.log
  (cd $NEW && timeout 300 python -m benchmarks.bench_folderstore --n 16 --fs local --stores folder,file --no-strace --out $OUT/local-16-$round) 2>&1 | grep -E "^\| local" >> $OUT/run.log
done
echo "DONE rounds $FIRST-$LAST $(date -u +%H:%M:%S)" >> $OUT/run.log
