#!/bin/bash
# FolderStore's 256-rank barrier on four 2 s-cached bindfs mounts, trees alternating (the order reversed
# every other round); each run waits for the 1-minute load < 2 (at most WAIT s, default 90).  Results: <name>-256-<round>/
# and trees.log.  Usage: [WAIT=s] trees_ab.sh FIRST LAST NAME=TREE...  (NAME=ENV:VALUE@TREE: that run with ENV=VALUE)
OUT=$(cd "$(dirname "$0")" && pwd)
FIRST=$1; LAST=$2; shift 2
waitq() { for i in $(seq 1 ${WAIT:-90}); do l=$(cut -d' ' -f1 /proc/loadavg); awk "BEGIN{exit !($l < 2)}" && break; sleep 1; done; }
for round in $(seq $FIRST $LAST); do
  trees=("$@"); [ $((round % 2)) = 0 ] && trees=($(printf '%s\n' "$@" | tac))
  for nt in "${trees[@]}"; do
    t=${nt%%=*}; d=${nt#*=}; envs=()
    case $d in *@*) envs=("${d%%@*}"); envs=("${envs[0]/:/=}"); d=${d#*@};; esac
    waitq
    echo "== $t round $round N=256 bindfs2 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $(git -C $d rev-parse --short HEAD)" >> $OUT/trees.log
    (cd $d && env "${envs[@]}" PYTHONPATH=$d timeout 400 python -m benchmarks.bench_folderstore --n 256 --fs bindfs2 --stores folder --k 2 --k-add 1 --limit 240 --no-strace --out $OUT/$t-256-$round) 2>&1 | grep "^| bindfs2" >> $OUT/trees.log
    echo "   after $(cut -d' ' -f1 /proc/loadavg)" >> $OUT/trees.log
  done
done
echo "DONE rounds $FIRST-$LAST $(date -u +%H:%M:%S)" >> $OUT/trees.log
