"""The adversary's enumeration of FolderStore over fakefs, every role: a fault at EVERY store step of EVERY operation.

``tests/adversary_enum.py`` faults only node A's ``add`` and only its first three creates; its intruders (the
concurrent operations) run clean.  Here, from every start state of an epoch (``prefix`` adds of 1 by node B: epoch
0, version 1 of an epoch, mid-epoch, the last delta slot, the seal next), node A runs one of :data:`ROLES` (an add,
a set, a compare_set that matches or not, a delete, a get: each one is the seal where the prefix puts it there), an
intruder from :data:`INTRUDERS` runs on node B or C at A's ``k``-th store operation (every ``k``), and ONE fault of
:data:`FAULTS` hits the ``s``-th store operation (every ``s`` it applies to) of A's operation -- or of the
intruder's (``target``).  The faults:

* ``crash`` / ``crash-after``: the process dies in that operation, before or after its effect (SIGKILL; the
  operation never returns: a *pending* call that may or may not have taken effect, tests/lincheck.py);
* ``lost``: a ``create`` (``link()``) takes effect and answers EEXIST (a retransmitted LINK);
* ``eio-after`` / ``eio-before``: a mutation answers EIO after / before its effect (a soft mount's timeout);
  ``eio-before`` on a read or a listing too;
* ``neg``: the name of that operation is looked up "absent" for ``HIDE`` s -- a kernel negative dentry, which
  ``fsmingle.fs.lookup.refresh`` cures (its ``mkdir``, modelled below);
* ``blind``: the same, a client cache the refresh does not cure (GlusterFS nl-cache);
* ``stale``: a listing answers as the directory was ``max_staleness`` ago (never older than this client's last).

**What fakefs did not cover, modelled here**: ``lookup.refresh`` -- a ``mkdir`` of a *version's* name, undone if it
succeeds -- never ran in the model before ``Store.refresh`` (``fresh_lookup`` returned at once when the store was
not a ``PosixStore``), and fakefs's ``refresh`` is one step that never makes a directory.  It is safe only if
never called on a free slot: a directory there would take the slot from a ``link()`` (EEXIST: a delta moves on and
leaves a gap once the directory goes) and a listing would show it (a read: not a regular file,
``CorruptStateError``).  :func:`_refresh` runs it as two store operations (the ``mkdir``, the undo) where hooks and
faults reach it, records any refresh of a free slot as a failure, and reads a directory at a version's name as
``UNTRUSTED`` (as ``PosixStore.read`` does).

The oracle, for every run: every call and return (a crashed one pending) is checked by the Wing-Gong checker
against one torch store key, with a fresh node's ``get`` and ``add`` at the end; an operation that raised
``StorageError`` must have had no effect (the history without it checks); an ``add``'s answers are unique when
only adds ran; no operation times out or runs past its timeout plus one poll (fake time); no free slot refreshed.

``python tests/adversary_enum_roles.py [size]`` (``ci``, ``big``) prints the failures grouped, and the runs.
``python tests/adversary_enum_roles.py waits [crowd]``: role ``wait`` (``FolderKV.wait_for``, ``WAIT_TIMEOUT``),
every node's ``FolderKV.crowd`` set to ``crowd`` (256 by default: ``folderstore_wait.fast_pause``); a wait is
checked as a get of its answer, its timeout as a get of None (session 6, ``adv``: no enumeration ran a wait before).
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakefs import AdvancingClock, Crash, FakeFS, FakeStore, parent
from lincheck import History, capacities, check, key_call, plain_intruder
from lincheck import key_step as step

from fsmingle.errors import StorageError
from fsmingle.fs.folderstore import FolderKV, FolderStoreTimeout
from fsmingle.fs.store import UNTRUSTED

ROLES = ("add", "set", "cas", "cas-miss", "del", "get")
INTRUDERS = ("add", "seal", "set", "cas", "del", "add-seal2")
FAULTS = ("crash", "crash-after", "lost", "eio-after", "eio-before", "neg", "blind", "stale")
GHOST = FAULTS + ("ghost",)  # with a client that keeps retired directories by inode (FaultyStore.ghost)
MUTATIONS = ("create", "publish", "mkdir", "remove", "retire")
APPLIES = {
    "none": (),
    "crash": None,  # every operation
    "crash-after": MUTATIONS,
    "lost": ("create",),
    "eio-after": ("create", "publish", "remove", "retire"),
    "eio-before": None,
    "neg": None,
    "blind": None,
    "stale": ("listdir",),
    "ghost": None,
}
TIMEOUT, POLL_MAX, HIDE = 60.0, 0.5, 0.7
OPS_LIMIT = 20_000  # store operations in one run: past it the run is a livelock


CROWD = 1  # FolderKV.crowd of every node (``python tests/adversary_enum_roles.py waits [crowd]``: 256)
WAIT_TIMEOUT = (
    10.0  # a wait's (role "wait"): well past the model's lags (2.5 s) and hidden names (0.7 s): a timeout is a miss
)


class _WaitTimeout(Exception):
    """A wait's timeout (role "wait"): the key never seen before TIMEOUT."""


class Livelock(BaseException):
    """A run made more store operations than any correct one needs (a loop that never reaches its deadline)."""


def applies(kind: str, op: str) -> bool:
    return APPLIES[kind] is None or op in APPLIES[kind]


class FaultyStore(FakeStore):
    """A fakefs view that puts one fault (``arm``) on its ``s``-th next store operation, records every operation
    (``trace``), and reads a directory at a file's name as ``UNTRUSTED`` (``PosixStore.read``: not a regular file)."""

    def __init__(self, fs: FakeFS, node: str):
        super().__init__(fs, node)
        self.trace = []
        self.fault: tuple[int, str] | None = None
        self.later: list[tuple[int, str]] = []  # further faults (a pair: enumerate_pairs), armed as each fires
        self.curable: set[str] = set()  # names hidden by a negative dentry that refresh() cures
        self.hit: tuple[str, str, str] | None = None
        self.refreshed_here: set[str] = set()
        # From the "ghost" fault on, this client reaches a directory it listed by a cached handle after it was
        # retired (FUSE GlusterFS, MooseFS, JuiceFS; NFS: measured, docs/folderstore.md): its kept files are read
        # and listed, a link() of a kept name answers EEXIST, of a free one succeeds -- into the trash.
        self.ghost = False

    def _in_ghost(self, name: str) -> bool:
        d, fs = parent(name), self.fs
        return self.ghost and d in self.listed and d in fs.dirs and not fs.dir_exists(d) and not self.hidden(d)

    def refresh(self, name):
        return _refresh(self, name)

    def arm(self, s: int, kind: str, *more: tuple[int, str]) -> None:
        """Fault ``kind`` on the ``s``-th next store operation; ``more``: (step, kind) pairs, steps counted alike."""
        at = sorted([(self.ops + s, kind), *((self.ops + t, f) for t, f in more)])
        self.fault, self.later = at[0], at[1:]

    def _take(self, op: str, name: str) -> str | None:
        if self.ops > OPS_LIMIT:
            raise Livelock(f"{self.node}: over {OPS_LIMIT} store operations")
        if self.fault is None or self.ops != self.fault[0]:
            return None
        kind, self.fault = self.fault[1], (self.later.pop(0) if self.later else None)
        if kind == "none" or not applies(kind, op):
            return None
        self.hit = (kind, op, name)
        if kind == "ghost":
            self.ghost = True
            return None
        if kind in ("neg", "blind"):
            self.blind(name, HIDE)
            if kind == "neg":
                self.curable.add(name)
            return None
        if kind in ("crash", "crash-after"):
            self.arm_crash(0, after_effect=kind == "crash-after")
            return None
        return kind

    def _eio(self, op: str, name: str) -> StorageError:
        err = StorageError(f"cannot {op} {self.path(name)}: Input/output error (injected)")
        err.errno = 5
        return err

    def _mutate(self, op: str, name: str, call):
        kind = self._take(op, name)
        if kind == "eio-before":
            self._op(op, name)
            if op in ("create", "publish"):
                self.fs.new_tmp(parent(name), self.node)
            raise self._eio(op, name)
        out = call()
        if kind == "eio-after":
            raise self._eio(op, name)
        if kind == "lost" and out is True:
            return False
        return out

    def create(self, name, data, fsync=True):
        if self._in_ghost(name):
            self._take("create", name)
            self._op("create", name)
            if name in self.fs.kept:
                return False
            self.fs.kept[name] = bytes(data)
            return True
        return self._mutate("create", name, lambda: super(FaultyStore, self).create(name, data, fsync))

    def publish(self, name, data):
        if self._in_ghost(name):  # a probe's hidden file: made in the trash, so the probe says "still there"
            self._take("publish", name)
            self._op("publish", name)
            return None
        return self._mutate("publish", name, lambda: super(FaultyStore, self).publish(name, data))

    def mkdir(self, name):
        return self._mutate("mkdir", name, lambda: super(FaultyStore, self).mkdir(name))

    def remove(self, name):
        return self._mutate("remove", name, lambda: super(FaultyStore, self).remove(name))

    def retire(self, name, keep_for=0.0):
        return self._mutate("retire", name, lambda: super(FaultyStore, self).retire(name, keep_for))

    def read(self, name):
        if self._in_ghost(name):
            self._take("read", name)
            self._op("read", name)
            return self.fs.kept.get(name)
        if self._take("read", name) == "eio-before":
            self._op("read", name)
            raise self._eio("read", name)
        if self.fs.dir_exists(name) and not self.hidden(name):
            self._op("read", name)
            return UNTRUSTED  # PosixStore.read: "not a regular file"
        return super().read(name)

    def listdir(self, name=""):
        if self._in_ghost(name + "/x"):
            self._take("listdir", name)
            self._op("listdir", name)
            return sorted({k[len(name) + 1 :] for k in self.fs.kept if parent(k) == name and "/." not in k})
        kind = self._take("listdir", name)
        if kind == "eio-before":
            self._op("listdir", name)
            raise self._eio("list", name)
        if kind != "stale":
            return super().listdir(name)
        lag, self._lag = self._lag, self.fs.max_staleness
        try:
            return super().listdir(name)
        finally:
            self._lag = lag


FREE_SLOT_REFRESHED: list[str] = []  # what FaultyStore.refresh found (a failure of the run)
REFUSED: list[str] = []  # operations that raised StorageError/FileNotFoundError with no effect (allowed; counted)


def _refresh(store: FaultyStore, name: str) -> bool:
    """``PosixStore.refresh`` (``fsmingle.fs.lookup.refresh``) as it is on a real directory: ``mkdir`` of the name
    (EEXIST: the lookup was fresh, a kernel negative dentry cured), undone by an ``rmdir`` if it succeeded -- two
    store operations, where hooks and faults reach, instead of fakefs's one step that never makes a directory."""
    if name in store.refreshed_here:
        return False  # once per name and process, as lookup.refresh
    store.refreshed_here.add(name)
    fs = store.fs
    if fs.dir_exists(parent(name)) and fs.current(name) is None and not fs.dir_exists(name):
        FREE_SLOT_REFRESHED.append(f"{store.node} refreshed a free slot {name}")
    try:
        made = store.mkdir(name)
    except (FileNotFoundError, StorageError):
        return True
    if made:
        store.retire(name)  # the rmdir
    elif fs.current(name) is not None:
        if name in store.curable:
            store.neg.pop(name, None)  # the dentry turned positive (a kernel one; nl-cache is not cured)
        store.seen[name] = len(fs.files[name]) - 1
    return True


def one(seal_at, prefix, role, k, intruder, target, s, fault, lag_a=0.0, second=None):
    """Returns (failure text or None, A's store operations, the intruder's: their names).  ``second``: (step, kind)
    of a second fault of A's operation (:func:`enumerate_pairs`)."""
    del FREE_SLOT_REFRESHED[:], REFUSED[:]
    fs = FakeFS(max_staleness=3.0)
    fs.mkdir_truth("", None)
    views = [FaultyStore(fs, n) for n in ("a", "b", "c", "d")]
    views[0].lag, views[2].lag = lag_a, 1.0
    kvs = [FolderKV(v, clock=AdvancingClock(fs), poll_max=POLL_MAX, timeout=TIMEOUT, rng=random.Random(i))
           for i, v in enumerate(views)]  # fmt: skip
    for kv in kvs:
        top = capacities(kv, seal_at)
        kv.crowd = CROWD  # the waiters of a job of CROWD processes (fast 5f75225: folderstore_wait.fast_pause)
    h, dead, problems, counts = History(), set(), [], {"i": []}

    def run(node, name, *args):
        if node in dead:
            return None
        # A wait (role "wait": kv.wait_for of key "k", WAIT_TIMEOUT) is checked as a get of what it returned; its
        # timeout as a get of None (the key absent at some instant of the wait: a wait that times out while the key
        # existed throughout fails the check; one whose key appeared within a listing's lag of the deadline does not).
        kv, c, t0 = kvs[node], h.call("get" if name == "wait" else name, *args, who="abcd"[node]), fs.now
        try:
            if name == "wait":
                try:
                    r = kv.wait_for(["k"], WAIT_TIMEOUT, lambda missing: _WaitTimeout(missing))[0]
                except (_WaitTimeout, FolderStoreTimeout):  # the key missing, or a version unreadable, at the end
                    r = None
            else:
                r = key_call(kv, name, *args)
        except ValueError:
            r = "ValueError"
        except Crash:
            dead.add(node)
            return None  # pending: ret stays -1
        except (StorageError, FileNotFoundError) as e:  # allowed only without an effect (checked below)
            c.ret, c.result = -2, f"{type(e).__name__}: {e}"
            REFUSED.append(f"{'abcd'[node]}'s {name} raised {type(e).__name__}")
            return None
        except Livelock as e:
            problems.append(f"{'abcd'[node]}'s {name}{args}: {e}")
            c.ret = -3
            return None
        except Exception as e:  # a timeout, CorruptStateError...: every operation must answer
            problems.append(f"{'abcd'[node]}'s {name}{args} raised {type(e).__name__}: {str(e)[:150]}")
            c.ret = -3
            return None
        limit = WAIT_TIMEOUT if name == "wait" else TIMEOUT
        if fs.now - t0 > limit + POLL_MAX:
            problems.append(f"{'abcd'[node]}'s {name}{args} took {fs.now - t0:.1f} s (timeout {limit:g} s)")
        h.ret(c, r)
        return r

    for _ in range(prefix):
        run(1, "add", 1)
        fs.advance(0.05)
    before = str(prefix).encode() if prefix else b""

    def intrude():
        node = 2 if k % 2 else 1
        v = views[node]
        if target == "i":
            v.arm(s, fault)
        start = len(v.trace)
        plain = plain_intruder(intruder, seal_at)
        if plain:
            for name, *args in plain:
                run(node, name, *args)
        elif intruder == "cas":
            cur = (kvs[node].try_get("k") or b"") if node not in dead else b""
            run(node, "cas", cur, b"50")
        elif intruder == "add-seal2":
            run(node, "add", 10)

            def seal():
                for _ in range(top + 1):
                    run(3 - node, "add", 100)

            views[0].arm_hook(2, seal)
        counts["i"] = [op for op, _ in v.trace[start:]]
        v.fault = None

    a = views[0]
    if intruder:
        a.arm_hook(k, intrude)
    if target == "a":
        a.arm(s, fault, *([second] if second else []))
    ops0 = len(a.trace)
    args = {"add": (3,), "set": (b"7",), "cas": (before, b"50"), "cas-miss": (b"nope", b"51"), "del": (), "get": (),
            "wait": ()}  # fmt: skip
    run(0, "cas" if role.startswith("cas") else role, *args[role])
    a_ops = [op for op, _ in a.trace[ops0:]]
    for v in views:
        v.disarm()
        v.fault = None
    fs.advance(5.0)
    run(3, "get")
    run(3, "add", 1)
    problems += FREE_SLOT_REFRESHED
    if problems:
        return problems[0], a_ops, counts["i"]
    ops = [o for o in h.ops if o.ret != -2 and o.ret != -3]
    for o in [o for o in h.ops if o.ret == -2]:  # an error must leave no effect: the history without it checks
        if check(ops, None, step) is not None:
            return f"{o.who}'s {o.name}{o.args} failed ({o.result[:80]}) after its effect?", a_ops, counts["i"]
    bad = check(ops, None, step)
    if bad is None and all(o.name in ("add", "get") for o in ops):
        got = [o.result for o in ops if o.name == "add" and o.ret > 0]
        if len(got) != len(set(got)):
            bad = f"an add's value returned twice: {sorted(got)}"
    return bad, a_ops, counts["i"]


SIZES = {
    # seal_ats, roles, intruders, A's lags, A's steps faulted with an intruder at its k-th (None: every step; else
    # k-1 .. k+n), A's steps at which the intruder runs faulted (None: every k; else k = 0, the middle, the last)
    "ci": ((4,), ROLES, ("add", "seal", "set", "del"), (2.5,), 0, "mid"),
    # session 6 (cap): epochs of 4 and, sealed by a delta's writer, of 6 named in the epoch (lincheck.capacities)
    "grown": (((4, 6),), ROLES, ("add", "seal", "set", "del"), (2.5,), 0, "mid"),
    "ci3": ((3,), ROLES, ("add", "seal", "set", "del"), (0.0,), 1, "ends"),  # session 5's first CI size
    "adds": ((3, 4), ("add",), INTRUDERS, (0.0, 2.5), None, "ends"),  # the delta add's own, deeper
    "big": ((3,), ROLES, INTRUDERS, (0.0, 2.5), None, None),
    "huge": ((3, 4), ROLES, INTRUDERS, (0.0, 2.5), None, None),
    # A waiter (FolderKV.wait_for) of a 256-process job (CROWD, set by main) and of a small one, every fault.
    "waits": ((3,), ("wait",), ("add", "seal", "set", "del", "add-seal2"), (2.5,), 0, "mid"),
}


def enumerate_all(size="ci", out=print, one=one, verbose=False, faults=None):
    """Every start state x role x fault at every step of A's operation; then every intruder at every step k of A's
    with A faulted at every step (``big``; ``ci``: at k-1 .. k+1) and the intruder faulted at each of its steps
    (``big``: for every k; ``ci``: for k at A's first, middle and last step)."""
    seal_ats, roles, intruders, lags, near, iks = SIZES[size]
    faults = faults or (FAULTS if size.startswith("ci") else GHOST)
    runs, fails, refused = 0, {}, {}

    def go(*case):
        nonlocal runs
        runs += 1
        bad, a_ops, i_ops = one(*case)
        for r in REFUSED:
            refused[r] = refused.get(r, 0) + 1
        if bad:
            what = re.sub(r"e-\d{12}-[0-9a-f]{16}|v-\d{12}|\d+\.\d+", "#", bad.splitlines()[0])[:110]
            if verbose and what not in fails:
                out(f"NEW: {what}\n    case: {case}")
            fails.setdefault(what, []).append(case)
        return a_ops, i_ops

    for seal_at in seal_ats:
        for prefix in range(capacities(None, seal_at) + 3):
            for role in roles:
                for lag in lags:
                    clean, _ = go(seal_at, prefix, role, 10**6, None, None, 0, "none", lag)
                    for s, op in enumerate(clean):  # A faulted at each step, alone
                        for fault in faults:
                            if applies(fault, op):
                                go(seal_at, prefix, role, 10**6, None, "a", s, fault, lag)
                    for k in range(len(clean) + 1):
                        for intruder in intruders:
                            a_ops, i_ops = go(seal_at, prefix, role, k, intruder, None, 0, "none", lag)
                            steps = (
                                range(len(a_ops))
                                if near is None
                                else range(max(0, k - 1), min(len(a_ops), k + near + 1))
                            )
                            ends = iks is None or k in (
                                (0, len(clean) // 2, len(clean)) if iks == "ends" else (len(clean) // 2,)
                            )
                            for fault in faults:
                                for s in steps:  # A faulted at each step, the intruder at A's k-th
                                    if applies(fault, a_ops[s]):
                                        go(seal_at, prefix, role, k, intruder, "a", s, fault, lag)
                                for s, op in enumerate(i_ops if ends else ()):  # the intruder faulted at each step
                                    if applies(fault, op):
                                        go(seal_at, prefix, role, k, intruder, "i", s, fault, lag)
            if verbose:
                out(f"seal_at {seal_at}, prefix {prefix}: {runs} runs, {sum(map(len, fails.values()))} failed so far")
    for what, cases in fails.items():
        out(f"{len(cases)} x {what}\n    first: {cases[0]}")
    for what, n in sorted(refused.items()):
        out(f"allowed (an error, no effect): {n} x {what}")
    out(f"{runs} runs, {sum(map(len, fails.values()))} failed")
    return runs, fails


FIRST = ("lost", "eio-after", "crash-after")  # what a create may meet first ...
SECOND = ("eio-before", "neg", "blind", "stale", "crash", "eio-after", "lost")  # ... and what any later step meets


def enumerate_pairs(seal_ats=(4,), lag=2.5, out=print):
    """Depth 2 for the add: a fault of :data:`FIRST` on each of A's creates, then one of :data:`SECOND` on each later
    store step of A's add, alone and with an intruder (an add, adds that seal) at A's middle step."""
    runs, fails = 0, {}
    for seal_at in seal_ats:
        for prefix in range(capacities(None, seal_at) + 3):
            clean = one(seal_at, prefix, "add", 10**6, None, None, 0, "none", lag)[1]
            for k, intruder in ((10**6, None), (len(clean) // 2, "add"), (len(clean) // 2, "seal")):
                trace = one(seal_at, prefix, "add", k, intruder, None, 0, "none", lag)[1]
                for s1, op1 in enumerate(trace):
                    for f1 in FIRST if op1 == "create" else ():
                        after = one(seal_at, prefix, "add", k, intruder, "a", s1, f1, lag)[1]
                        for s2 in range(s1 + 1, len(after)):
                            for f2 in SECOND:
                                if applies(f2, after[s2]):
                                    runs += 1
                                    case = (seal_at, prefix, "add", k, intruder, "a", s1, f1, lag, (s2, f2))
                                    bad = one(*case)[0]
                                    if bad:
                                        what = re.sub(
                                            r"e-\d{12}-[0-9a-f]{16}|v-\d{12}|\d+\.\d+", "#", bad.splitlines()[0]
                                        )
                                        if what[:110] not in fails:
                                            out(f"NEW: {what[:110]}\n    case: {case}")
                                        fails.setdefault(what[:110], []).append(case)
        # ... and a seal with its retirement at each step after the second fault (finding 5: the pause it causes)
        for prefix in range(capacities(None, seal_at) + 3):
            trace = one(seal_at, prefix, "add", 10**6, None, None, 0, "none", lag)[1]
            for s1, op1 in enumerate(trace):
                for f1 in ("lost", "eio-after") if op1 == "create" else ():
                    after = one(seal_at, prefix, "add", 10**6, None, "a", s1, f1, lag)[1]
                    for s2 in [s for s in range(s1 + 1, len(after)) if after[s] in ("read", "listdir")][:2]:
                        for f2 in ("eio-before", "neg"):
                            for k in range(s2, len(after) + 4):
                                runs += 1
                                case = (seal_at, prefix, "add", k, "seal", "a", s1, f1, lag, (s2, f2))
                                bad = one(*case)[0]
                                if bad:
                                    what = re.sub(r"e-\d{12}-[0-9a-f]{16}|v-\d{12}", "#", bad.splitlines()[0])[:110]
                                    if what not in fails:
                                        out(f"NEW: {what}\n    case: {case}")
                                    fails.setdefault(what, []).append(case)
    out(f"pairs: {runs} runs, {sum(map(len, fails.values()))} failed")
    return runs, fails


if __name__ == "__main__":
    if sys.argv[1:2] == ["waits"]:
        CROWD = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    if sys.argv[1:2] in (["pairs"], ["pairs-grown"]):
        enumerate_pairs((4,) if sys.argv[1] == "pairs" else ((4, 6),), out=lambda line: print(line, flush=True))
        sys.exit()
    enumerate_all(sys.argv[1] if len(sys.argv) > 1 else "ci", out=lambda line: print(line, flush=True), verbose=True)
