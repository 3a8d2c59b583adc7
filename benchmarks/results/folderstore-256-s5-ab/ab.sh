#!/bin/bash
out=/tmp/nrb_ab2; mkdir -p $out
for i in 1 2; do
  for t in base nrb; do
    if [ $t = base ]; then dir=/tmp/nrb-base; else dir=/work/wt/nrb; fi
    echo "== $t run $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $dir && PYTHONPATH=$dir timeout 600 python -m benchmarks.bench_folderstore --n 256 --fs local,bindfs2 --stores folder --k 2 --k-add 1 --limit 240 --no-strace --out $out/$t-$i 2>&1 | grep "^| \(local\|bindfs2\)")
    echo "   after load $(cut -d' ' -f1 /proc/loadavg)"
    sleep 15
  done
done
