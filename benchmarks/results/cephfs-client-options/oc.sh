#!/bin/bash
# Cross-client rename/read rounds on CephFS: default ceph-fuse vs client_oc=false (and fuse_disable_pagecache)
set -u
source /work/shared/notes/cephfs.sh
B=/tmp/cx/ceph
ceph_up $B || { echo "ceph_up failed"; exit 1; }
run() {  # $1 label, rest: extra ceph-fuse args
  local label=$1; shift
  mkdir -p /tmp/cx/A /tmp/cx/B
  ceph-fuse -c $B/ceph.conf --id a$label "$@" /tmp/cx/A >/dev/null 2>&1
  ceph-fuse -c $B/ceph.conf --id b$label "$@" /tmp/cx/B >/dev/null 2>&1
  python3 - "$label" <<'PY'
import os, sys, time
a, b = "/tmp/cx/A/r", "/tmp/cx/B/r"
os.makedirs(a, exist_ok=True)
for rnd in range(3):
    t0 = time.monotonic(); n = 20
    for i in range(n):
        tmp = f"{a}/t"; open(tmp, "w").write(str(i)); os.rename(tmp, f"{a}/f")
        while True:
            try:
                if open(f"{b}/f").read() == str(i): break
            except FileNotFoundError: pass
    dt = time.monotonic() - t0
    # a link race's cost: A links a name, B links the same name
    t1 = time.monotonic()
    for i in range(n):
        open(f"{a}/x{rnd}-{i}", "w").close(); open(f"{b}/y{rnd}-{i}", "w").close()
        try: os.link(f"{a}/x{rnd}-{i}", f"{a}/v{rnd}-{i}")
        except FileExistsError: pass
        try: os.link(f"{b}/y{rnd}-{i}", f"{b}/v{rnd}-{i}")
        except FileExistsError: pass
        os.listdir(a); os.listdir(b)
    dl = time.monotonic() - t1
    print(f"{sys.argv[1]} round {rnd}: rename-on-A/read-on-B {dt/n*1000:.0f} ms/round; link race + both list {dl/n*1000:.0f} ms/round", flush=True)
PY
  fusermount -uz /tmp/cx/A; fusermount -uz /tmp/cx/B
  pkill -f -- "--id a$label" ; pkill -f -- "--id b$label"; sleep 1
}
run def
run nooc --client_oc=false
run nopc --fuse_disable_pagecache=true
run both --client_oc=false --fuse_disable_pagecache=true
ceph_down
