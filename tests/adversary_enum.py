"""The adversary's enumeration of FolderStore's delta ``add`` over fakefs: every preemption point, every fault.

One run: node B brings the key to a start state (``prefix`` writes: epoch 0, version 1 of an epoch, mid-epoch,
the last delta slot, the seal next), then node A adds.  At A's ``k``-th store operation (every k up to its last)
an intruder runs on node B or C (an add, adds until the epoch is sealed and retired, a set of an integer or not,
a compare_set, a delete); A's ``j``-th ``create`` gets a fault (none, a lost reply, EIO after or before the
effect, its version then unreadable for a while).  Every call and return is checked by the Wing-Gong checker
(tests/lincheck.py) against one torch store key, and so is the final value (a fresh get).

``python tests/adversary_enum.py [seal_at ...]`` prints the failures grouped, and how many runs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakefs import AdvancingClock, FakeFS
from lincheck import History, capacities, check, plain_intruder
from lincheck import key_step as step

from fsmingle.fs.folderstore import FolderKV

INTRUDERS = ("add", "seal", "set", "set-nonint", "cas", "del", "add-seal0", "add-seal1", "add-seal2", "add-seal4")
FAULTS = (None, "lost", "eio-after", "eio-before", "blind")


def one(seal_at: int, prefix: int, k: int, intruder: str, fault, j: int, amount: int = 3, lag_a: float = 0.0):
    """One run; returns (failure text or None, A's store operations)."""
    fs = FakeFS(max_staleness=3.0)
    views = [fs.view(n) for n in ("a", "b", "c")]
    views[0].lag, views[2].lag = lag_a, 1.0
    fs.mkdir_truth("", None)
    kvs = [FolderKV(v, clock=AdvancingClock(fs), poll_max=0.5, timeout=60.0) for v in views]
    for kv in kvs:
        top = capacities(kv, seal_at)
    h = History()

    def run(node, name, *args):
        kv = kvs[node]
        c = h.call(name, *args, who="abc"[node])
        try:
            if name == "add":
                r = kv.add("k", args[0])
            elif name == "set":
                r = kv.set("k", args[0])
            elif name == "cas":
                r = kv.compare_set("k", *args)
            elif name == "del":
                r = kv.delete("k")
            else:
                r = kv.try_get("k")
        except ValueError:
            r = "ValueError"
        h.ret(c, r)
        return r

    for _ in range(prefix):
        run(1, "add", 1)
        fs.advance(0.05)

    def intrude():
        node = 2 if k % 2 else 1
        plain = plain_intruder(intruder, seal_at)
        if plain:
            for name, *args in plain:
                run(node, name, *args)
        elif intruder == "cas":
            cur = kvs[node].try_get("k") or b""
            run(node, "cas", cur, b"50")
        elif intruder.startswith("add-seal"):  # an add now, the seal (and retirement) a few operations later
            run(node, "add", 10)

            def seal():
                for _ in range(top + 1):
                    run(3 - node, "add", 100)

            a.arm_hook(int(intruder[-1]), seal)
        else:
            run(node, "del")

    a = views[0]
    a.arm_hook(k, intrude)
    match = lambda n: "/v-" in n
    if fault == "lost":
        a.arm_lost_reply(j, match=match)
    elif fault in ("eio-after", "eio-before"):
        a.arm_io_error(j, match=match, ops=("create",), after_effect=fault == "eio-after", blind_for=0.5)
    elif fault == "blind":
        for d in [d for d in fs.dirs if "/e-" in d]:
            for n in range(1, top + 2):
                a.blind(f"{d}/v-{n:012d}", 0.7)
    ops0 = a.ops
    err = None
    try:
        run(0, "add", amount)
    except Exception as e:  # an add must answer: any other error is a finding
        err = f"A's add raised {type(e).__name__}: {str(e)[:160]}"
        h.ops = [o for o in h.ops if o.ret != -1]
    a_ops = a.ops - ops0
    a.disarm()
    a._io_at = None
    fs.advance(5.0)
    run(2, "get")
    if err:
        return err, a_ops
    bad = check(h.ops, None, step)
    return (bad, a_ops) if bad else (None, a_ops)


def enumerate_all(seal_ats=(3, 4, 6), amounts=(3,), lags=(0.0, 2.5), out=print):
    runs, fails = 0, {}
    for seal_at in seal_ats:
        for prefix in range(0, capacities(None, seal_at) + 4):
            for amount in amounts:
                for lag in lags:
                    _, clean_ops = one(seal_at, prefix, 10**6, "add", None, 0, amount, lag)
                    for k in range(clean_ops + 1):
                        for intruder in INTRUDERS:
                            for fault in FAULTS:
                                for j in range(3) if fault not in (None, "blind") else (0,):
                                    runs += 1
                                    bad, _ = one(seal_at, prefix, k, intruder, fault, j, amount, lag)
                                    if bad:
                                        what = re.sub(r"e-\d{12}-[0-9a-f]{16}|v-\d{12}", "#", bad.splitlines()[0])[:110]
                                        fails.setdefault(what, []).append((seal_at, prefix, k, intruder, fault, j,
                                                                           amount, lag))  # fmt: skip
    for what, cases in fails.items():
        out(f"{len(cases)} x {what}\n    first: {cases[0]}")
    out(f"{runs} runs, {sum(map(len, fails.values()))} failed")
    return runs, fails


if __name__ == "__main__":
    # "4:6": epochs of 4, and every epoch a delta's writer seals of 6 (lincheck.capacities)
    caps = [tuple(map(int, a.split(":"))) if ":" in a else int(a) for a in sys.argv[1:]]
    enumerate_all(tuple(caps) or (3, 4, 6))
