"""The floor under a 256-rank store barrier on cached mounts: the same processes making only the calls no design
can skip, without contention.  Each rank (forked after torch is imported, as in ``bench_folderstore``) writes one
temporary, ``link()``s it under a name of its own, unlinks the temporary and lists the directory (its add); the
last to finish (a shared counter) creates ``done``; every rank lists the directory every ``--poll`` seconds until it shows ``done``.
Reports the time from the last arrival to the last release and the CPU seconds of the ranks and bindfs daemons.

``python -m benchmarks.folderstore_floor --n 256 --fs bindfs2``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
import time

import torch.distributed  # noqa: F401  (the ranks' size, as in bench_folderstore)

from .bench_folderstore import daemon_cpu
from .rdzv.filesystems import FS_OPTS, MountSet


def _rank(d: str, r: int, n: int, poll: float, bar, left, q) -> None:
    bar.wait()
    t0, c0 = time.monotonic(), time.process_time()
    tmp = os.path.join(d, f"t-{r}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"x" * 64)
    os.close(fd)
    os.link(tmp, os.path.join(d, f"v-{r}"))
    os.unlink(tmp)
    os.listdir(d)
    with left.get_lock():
        left.value -= 1
        last = left.value == 0
    if last:
        open(os.path.join(d, "done"), "w").close()
    while "done" not in os.listdir(d):  # a listing: a lookup would meet the negative dentry of an early look
        time.sleep(poll)
    q.put((t0, time.monotonic(), time.process_time() - c0))
    q.close()
    q.join_thread()  # put() hands the result to a feeder thread: let it finish before _exit
    os._exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--fs", default="bindfs2")
    ap.add_argument("--mounts", type=int, default=4)
    ap.add_argument("--poll", type=float, default=0.16, help="seconds between a waiter's looks")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="fsmingle-floor-")
    ms = MountSet(root, a.mounts, FS_OPTS[a.fs])
    try:
        os.makedirs(os.path.join(ms.backing, "d"))
        ctx = mp.get_context("fork")
        bar, left, q = ctx.Barrier(a.n + 1), ctx.Value("i", a.n), ctx.Queue()
        ps = [ctx.Process(target=_rank, args=(os.path.join(ms.mounts[r % a.mounts], "d"), r, a.n, a.poll, bar, left, q))
              for r in range(a.n)]  # fmt: skip
        for p in ps:
            p.start()
        d0, load = daemon_cpu(), os.getloadavg()[0]
        bar.wait()
        outs = [q.get(timeout=120) for _ in range(a.n)]
        for p in ps:
            p.join()
        print(f"floor N={a.n} {a.fs}: barrier {max(o[1] for o in outs) - max(o[0] for o in outs):.3f} s, ranks CPU "
              f"{sum(o[2] for o in outs):.2f} s, daemons CPU {daemon_cpu() - d0:.2f} s, load before/after "
              f"{load:.1f} / {os.getloadavg()[0]:.1f}")  # fmt: skip
    finally:
        ms.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
