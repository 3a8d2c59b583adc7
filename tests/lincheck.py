"""A Wing–Gong linearizability checker (with Lowe's memoization) for histories of one object.

No maintained Python library does this (PyPI has none; Porcupine and Knossos are Go and Clojure), and
the search is thirty lines.  A history is a list of :class:`Op` with integer call and return times
(any clock whose order is real-time order); :func:`check` says whether some total order of the
operations, consistent with that real-time order, is a legal sequential run of ``step`` from
``init`` -- and if not, returns the history, so that the failure message shows it.

Sources: J. M. Wing and C. Gong, "Testing and verifying concurrent objects", JPDC 17 (1993);
G. Lowe, "Testing for linearizability", CCPE 29 (2017) (the cache of (linearized set, state)).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field


@dataclass
class Op:
    name: str
    args: tuple
    call: int
    ret: int = -1
    result: object = None
    who: str = field(default="")

    def __str__(self):
        return f"[{self.call:>3}..{self.ret:>3}] {self.who} {self.name}{self.args} -> {self.result!r}"


class History:
    """Records call and return events on one logical clock (nested calls overlap their caller)."""

    def __init__(self):
        self.t = 0
        self.ops: list[Op] = []

    def call(self, name: str, *args, who: str = "") -> Op:
        self.t += 1
        op = Op(name, args, self.t, who=who)
        self.ops.append(op)
        return op

    def ret(self, op: Op, result) -> None:
        self.t += 1
        op.ret, op.result = self.t, result


def check(ops: list[Op], init: Hashable, step: Callable[[Hashable, Op], tuple[bool, Hashable]]) -> str | None:
    """None if ``ops`` is linearizable, else the history as text.

    ``step(state, op)`` returns ``(op.result is what the sequential object answers, next state)``.  An op that
    never returned (``ret == -1``: its process crashed inside it) is *pending*: it may take effect at any point
    after its call, with whatever answer, or never (Herlihy and Wing's completion of a history).
    """
    ops = sorted(ops, key=lambda o: o.call)
    n = len(ops)
    rets = [o.ret if o.ret != -1 else float("inf") for o in ops]
    required = sum(1 << i for i in range(n) if ops[i].ret != -1)
    seen: set = set()

    def search(done: int, state) -> bool:
        if done & required == required:
            return True
        if (done, state) in seen:
            return False
        seen.add((done, state))
        first_ret = min(rets[i] for i in range(n) if not done >> i & 1)
        for i in range(n):
            # An operation may come next only if it was called before every pending one returned.
            if not done >> i & 1 and ops[i].call < first_ret:
                ok, nxt = step(state, ops[i])
                if (ok or ops[i].ret == -1) and search(done | 1 << i, nxt):
                    return True
        return False

    return None if search(0, init) else "not linearizable:\n" + "\n".join(map(str, ops))


def key_step(state: bytes | None, op: Op) -> tuple[bool, bytes | None]:
    """The sequential spec of one torch store key (None: missing), for :func:`check`: ``add`` (onto a value
    that is not an integer: "ValueError", no effect), ``set``, ``cas`` (torch's compare_set: expected ``b""``
    matches a missing key), ``del``, ``get`` and ``check``."""
    r = op.result
    if op.name == "add":
        if state is not None and not state.lstrip(b"-").isdigit():  # "-3" is an integer: isdigit() alone says no
            return r == "ValueError", state
        new = (int(state) if state is not None else 0) + op.args[0]
        return r == new, str(new).encode()
    if op.name == "set":
        return True, op.args[0]
    if op.name == "cas":
        expected, desired = op.args
        if state is None:
            return (r == desired, desired) if expected == b"" else (r == expected, state)
        return (r == desired, desired) if state == expected else (r == state, state)
    if op.name == "del":
        return r == (state is not None), None
    if op.name in ("get", "check"):
        return r == (state if op.name == "get" else state is not None), state
    raise AssertionError(op.name)


def key_call(kv, name: str, *args):
    """Run the operation ``name`` (:func:`key_step`'s names: add, set, cas, del, get) on key ``"k"`` of the
    FolderKV ``kv`` -- one dispatch for every enumeration that checks its history against that spec."""
    return {"add": kv.add, "set": kv.set, "cas": kv.compare_set, "del": kv.delete, "get": kv.try_get}[name]("k", *args)


def capacities(kv, seal_at) -> int:
    """Set an enumeration's capacities on ``kv``: ``seal_at`` an int (every epoch holds that many, but a contended
    counter's next one, doubling to 4x: the store's rule), or ``(seal_at, grown)``: every epoch a delta's writer
    seals is named with capacity ``grown`` (``grow_after`` 0), the others ``seal_at`` -- so that short runs reach
    epochs of both capacities, and seals at both slots.  Returns the largest capacity (for prefixes and intruders)."""
    base, grown = seal_at if isinstance(seal_at, tuple) else (seal_at, None)
    if kv is not None:
        kv.seal_at = kv.seal_first = base  # a counter's first epoch too (its creating add names it)
        if grown is not None:
            kv.seal_max, kv.grow_after = grown, 0
    return grown or base


def plain_intruder(intruder: str, seal_at) -> list[tuple] | None:
    """The calls ``(name, *args)`` of an enumeration's plain intruder: one add of 10, adds that fill and seal an
    epoch (``seal``), a set of an integer or not, a delete; None for an intruder the caller plays itself."""
    return {
        "add": [("add", 10)],
        "seal": [("add", 10)] * (capacities(None, seal_at) + 1),
        "set": [("set", b"7")],
        "set-nonint": [("set", b"x")],
        "del": [("del",)],
    }.get(intruder)


def b_side(run, b, prefix: int, intruder: str | None, seal_at: int):
    """B's part of a two-client run: ``prefix`` adds of 1 now, and the closure B runs at A's fault point (its
    :func:`plain_intruder` calls, each through ``run(b, "b", name, *args)``)."""
    for _ in range(prefix):
        run(b, "b", "add", 1)

    def intrude():
        for name, *args in plain_intruder(intruder, seal_at) or ():
            run(b, "b", name, *args)

    return intrude


class Failures(dict):
    """An enumeration's tally: ``runs``, and the failing cases grouped by their failure's first line (numbers and
    temporary paths masked, so one hole is one group).  ``(runs, failures)`` is what the enumerations return."""

    def __init__(self):
        super().__init__()
        self.runs = 0

    def note(self, bad: str | None, case: tuple) -> None:
        self.runs += 1
        if bad:
            self.setdefault(re.sub(r"/tmp/\S+|\d+", "#", bad.splitlines()[0])[:110], []).append(case)

    def report(self, out) -> tuple[int, Failures]:
        for what, cases in self.items():
            out(f"{len(cases)} x {what}\n    first: {cases[0]}")
        out(f"{self.runs} runs, {sum(map(len, self.values()))} failed")
        return self.runs, self
