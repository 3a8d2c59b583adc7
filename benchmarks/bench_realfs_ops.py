"""fsmingle's filesystem operations on the real filesystems of the cluster harness, side by side.

For each filesystem named (``tests/cluster/``'s ``Cluster(2, fs=...)``: two network-namespace
hosts, each with its own FUSE client): the median of 30 of each operation fsmingle makes, by one
client through :class:`fsmingle.fs.store.PosixStore`, and the median of 5 two-node releases
(``fsmingle env --nnodes 2`` on both hosts, start to both exited; about 1.5 s of it is the
interpreter starting).  The filesystems run one after the other on the same machine: compare
columns of one run, not absolute numbers across runs.

Run (root; .ci/run's packages): ``python benchmarks/bench_realfs_ops.py moosefs juicefs juicefs-cached``
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import cluster as cl  # noqa: E402

OPS = r"""
import json, os, statistics, sys, time
from fsmingle.fs.store import PosixStore
root = sys.argv[1]
os.makedirs(root, exist_ok=True)
st = PosixStore(root)
res = {}
def med(name, fn, n=30):
    ts = []
    for i in range(n):
        t0 = time.perf_counter(); fn(i); ts.append(time.perf_counter() - t0)
    res[name] = round(statistics.median(ts) * 1000, 2)
med("mkdir", lambda i: st.mkdir(f"d{i}"))
med("claim (link)", lambda i: st.create(f"d{i}/claim", b"x" * 64))
med("publish (rename)", lambda i: st.publish("beacon", str(i).encode() * 16))
med("read", lambda i: st.read("beacon"))
med("listdir", lambda i: st.listdir(""))
print(json.dumps(res))
"""


def release(c, job: str) -> float:
    rdzv = os.path.join(c.shared, "rdzv")
    t0 = time.monotonic()
    procs = [
        h.popen(
            ["fsmingle", "env", "--dir", rdzv, "--job-id", job, "--nnodes", "2", "--timeout", "60"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for h in c.hosts[:2]
    ]
    for p in procs:
        if p.wait(timeout=90) != 0:
            raise RuntimeError(f"release {job} failed")
    return time.monotonic() - t0


def main(fss: list[str]) -> dict:
    out = {}
    for fs in fss:
        with cl.Cluster(2, fs=fs) as c:
            r = c[0].run([sys.executable, "-c", OPS, os.path.join(c.shared, "ops")], timeout=300, check=True)
            row = json.loads(r.stdout.strip().splitlines()[-1])
            row["2-node release (s)"] = round(statistics.median(release(c, f"rel{i}") for i in range(5)), 2)
            out[fs] = row
            print(fs, json.dumps(row), flush=True)
    return out


if __name__ == "__main__":
    main(sys.argv[1:] or ["moosefs", "juicefs", "juicefs-cached"])
