"""Which fsmingle call makes each filesystem operation of a rendezvous: N participants as threads of
one process, the counting wrapper of :mod:`benchmarks.rdzv.fsops`, issue 13's kinds only.

``python -m benchmarks.ops_trace --n 16 --stagger 0.1`` prints the mean per participant by kind,
then, for rank 0, the first members and the last, each operation with its caller (the innermost
three fsmingle frames).  ``--stagger`` seconds between arrivals (0: all start together).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import threading
import time
import traceback

import fsmingle

from .opkinds import ISSUE13_KINDS
from .rdzv.fsops import OpCounter, install_counting_os

_PLUMBING = {"wrapper", "create_record", "make_dir", "publish_record"}


class TracingCounter(OpCounter):
    """An :class:`OpCounter` that also keeps each issue-13 operation's fsmingle callers."""

    def __init__(self) -> None:
        super().__init__()
        self.log: dict[int, list[tuple[str, str]]] = collections.defaultdict(list)

    def add(self, kind: str, k: int = 1) -> None:
        super().add(kind, k)
        p = getattr(self._local, "p", None)
        if kind in ISSUE13_KINDS and p is not None:
            # fsmingle's own frames, but for the store's error-translating decorator (``wrapper``)
            # and the read-back helpers around a create, which say nothing of who asked.
            frames = [
                f
                for f in traceback.extract_stack()[:-2]
                if f"{os.sep}fsmingle{os.sep}" in f.filename and f.name not in _PLUMBING
            ]
            where = " < ".join(f"{os.path.basename(f.filename)}:{f.name}" for f in frames[-3:][::-1])
            self.log[p].append((kind, where))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16, help="participants (threads)")
    ap.add_argument("--stagger", type=float, default=0.0, help="seconds between arrivals")
    ap.add_argument("--timeout", type=float, default=60.0, help="fsmingle's --timeout (s)")
    a = ap.parse_args()
    counter = TracingCounter()
    install_counting_os(counter)
    base = tempfile.mkdtemp(prefix="fsmingle-trace-")
    ranks: dict[int, int] = {}

    def participant(p: int) -> None:
        counter.bind(p)
        ranks[p] = fsmingle.rendezvous(base, "trace", nnodes=a.n, addr="127.0.0.1", timeout=a.timeout).node_rank

    threads = []
    for p in range(a.n):
        threads.append(threading.Thread(target=participant, args=(p,)))
        threads[-1].start()
        time.sleep(a.stagger)
    for t in threads:
        t.join()
    shutil.rmtree(base, ignore_errors=True)
    total = collections.Counter(kind for p in range(a.n) for kind, _ in counter.log[p])
    print(
        f"N = {a.n}, stagger {a.stagger:g} s: mean per participant "
        + " + ".join(f"{k} {total[k] / a.n:.2f}" for k in ISSUE13_KINDS)
        + f" = {sum(total.values()) / a.n:.2f}"
    )
    by_rank = sorted(ranks, key=ranks.get)
    for p in dict.fromkeys(by_rank[:3] + by_rank[-1:]):
        print(f"--- rank {ranks[p]}: {len(counter.log[p])} operations")
        for (kind, where), n in collections.Counter(counter.log[p]).most_common():
            print(f"  {n:3d} {kind:8s} {where}")


if __name__ == "__main__":
    main()
