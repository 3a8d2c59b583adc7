"""The adversary's enumeration on a real directory, every role: a fault at EVERY filesystem call of a FolderStore
operation (``PosixStore``, ``_link_slots``, ``lookup.refresh``, the trash: the code paths fakefs never runs).

``tests/adversary_enum_posix.py`` faults node A's ``add`` with an EIO before any call and with a lost reply or an
EIO after the effect on its first three ``link()`` calls of ``_link_slots``.  Here ``os`` is replaced, in every
module of the store (``store``, ``trash``, ``lookup``, ``folderstore_log``, ``folderstore_add``), by :class:`_Os`,
which counts A's calls and puts ONE fault of :data:`FAULTS` on the ``j``-th, for every ``j``: ``eio-before`` (any
call), ``eio-after`` (a ``link``, ``mkdir``, ``rename``, ``unlink``, ``rmdir`` or creating ``open`` that took
effect), ``lost`` (a ``link()`` that took effect answers EEXIST), ``lost-stale`` (the same, and a plain ``stat``
of the linked file then answers the link count from before: Linux's NFS client keeps a file's cached attributes
after a LINK that answered an error, ``_nfs4_proc_link``; the ``statx`` forced past the cache, one more counted call
here, answers the server's), ``eio-stale`` (a ``link()`` that took effect answers EIO, and every read of the file's link
count, the forced one too, answers the count from before until a ``link()`` of it succeeds: a FUSE daemon's own
attribute cache, GlusterFS md-cache's ``mdc_link_cbk``), ``crash`` (the process dies in that call: the
operation is pending), ``neg`` (a lookup of that name -- ``open``, ``stat``, ``statx`` -- answers ENOENT for ``HIDE`` s: a kernel
negative dentry, cured at once by an exclusive ``mkdir`` of the name, as ``fuse_dentry_revalidate`` does for
``LOOKUP_EXCL``), ``stale`` (a listing answers what this process's previous listing of that directory answered);
optionally with an intruder (node B: an add, adds that seal and retire the epoch, a set, a delete) run at that call.

Oracles: Wing-Gong on every call and return (a crashed one pending, an erroring one must have had no effect);
no ``mkdir`` of a version's name that is free (``lookup.refresh`` on a free slot: a directory would take the slot);
no timeout.  ``python tests/adversary_enum_posix_roles.py [ci|big]`` prints the failures grouped, and the runs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lincheck import Failures, History, b_side, capacities, check, key_call
from lincheck import key_step as step

from fsmingle.errors import StorageError
from fsmingle.fs import folderstore_add, folderstore_log, lookup, store, trash
from fsmingle.fs.folderstore import FolderKV
from fsmingle.fs.store import PosixStore

MODULES = (store, trash, lookup, folderstore_log, folderstore_add)
ROLES = ("add", "set", "cas", "del")
INTRUDERS = (None, "add", "seal", "set", "del")
FAULTS = (None, "eio-before", "eio-after", "lost", "lost-stale", "eio-stale", "crash", "neg", "stale")
CALLS = ("link", "mkdir", "rename", "unlink", "remove", "rmdir", "listdir", "open", "stat", "lstat", "statx")
MUTATING = ("link", "mkdir", "rename", "unlink", "remove", "rmdir")
HIDE = 0.05  # seconds a negative dentry lasts (poll_max 0.02: a few pauses)
TIMEOUT = 20.0
VERSION = re.compile(r"/v-\d{12}$")


class Crash(BaseException):
    """The process died in a filesystem call."""


class _Os:
    """``os`` for the store's modules: counts A's calls while ``armed`` and acts at the ``j``-th (module docstring)."""

    def __init__(self):
        self.armed, self.n, self.intrude, self.intrude_at = False, 0, None, -1
        self.faults: dict[int, str] = {}  # A's call number -> its fault (one, or a pair: PAIRS)
        self.kinds: list[str] = []  # A's counted calls, in order ("open-create": an open with O_CREAT)
        self.neg: dict[str, float] = {}  # path -> until when a lookup of it says ENOENT
        self.listed: dict[str, list[str]] = {}  # directory -> this process's previous listing of it
        # Directories this process changed since its previous listing of them: their next listing is fresh, so a
        # "stale" fault there would inject what no NFS client does (folderstore_log.probe_dir: the reply to our own
        # change carries the directory's new change attribute, wcc data / change_info, and the client drops its
        # cached listing).  Without this, `big` failed 1 of 28,322 runs: a stale listing right after _probe.
        self.changed: set[str] = set()
        self.free_slot: list[str] = []
        self.kept: dict[str, int] = {}  # file -> the link count a plain stat of it answers (kept past a failed LINK)
        self.kept_forced: set[str] = set()  # ... and a forced statx too (the daemon's own cache)
        self.real_statx = lookup._STATX

    def __getattr__(self, name):
        return getattr(os, name)

    def _at(self, call: str, path: str) -> str | None:
        if not self.armed:
            return None
        n, self.n = self.n, self.n + 1
        self.kinds.append(call)
        if n == self.intrude_at and self.intrude is not None:
            self.armed = False
            try:
                self.intrude()
            finally:
                self.armed = True
        f = self.faults.get(n)
        if f is None:
            return None
        if f == "crash":
            raise Crash(f"died in {call} {path}")
        if f == "eio-before":
            raise OSError(errno.EIO, "Input/output error (injected before the effect)", path)
        if f == "neg" and call in ("open", "stat", "lstat", "statx"):
            self.neg[path] = time.monotonic() + HIDE
        return f

    def _hidden(self, path: str) -> None:
        if self.neg.get(str(path), 0) > time.monotonic():
            raise FileNotFoundError(errno.ENOENT, "No such file (a negative dentry, injected)", path)

    def _changes(self, *paths) -> None:
        # A's own changes only: the intruder is another host, whose change leaves A's cached listing as it was
        # (before session 12 its changes counted as A's, so A's listing after an intrusion was never stale).
        if self.armed:
            self.changed.update(os.path.dirname(str(p)) for p in paths)

    def _effect(self, f, call, path, fn):
        out = fn()
        if (f == "eio-after" and call in MUTATING) or (f == "eio-stale" and call == "link"):
            raise OSError(errno.EIO, "Input/output error (injected after the effect)", path)
        if f in ("lost", "lost-stale") and call == "link":
            raise FileExistsError(errno.EEXIST, "File exists (a retransmitted LINK)", path)
        return out

    def link(self, src, dst, **kw):
        self._changes(dst)
        f = self._at("link", dst)
        if f in ("lost-stale", "eio-stale"):
            self.kept[str(src)] = os.stat(src).st_nlink  # the count cached before this LINK, kept past its failure
            if f == "eio-stale":
                self.kept_forced.add(str(src))
        out = self._effect(f, "link", dst, lambda: os.link(src, dst, **kw))
        self.kept.pop(str(src), None)  # a LINK that succeeded: its reply carries the file's fresh attributes
        self.kept_forced.discard(str(src))
        return out

    def mkdir(self, path, *a, **kw):
        f = self._at("mkdir", path)
        if VERSION.search(str(path)) and not os.path.lexists(path) and os.path.isdir(os.path.dirname(path)):
            self.free_slot.append(f"mkdir of a free slot {path}")
        self.neg.pop(str(path), None)  # an exclusive create looks the name up afresh (LOOKUP_EXCL)
        self._changes(path)
        return self._effect(f, "mkdir", path, lambda: os.mkdir(path, *a, **kw))

    def rename(self, a, b, *x, **kw):
        self._changes(a, b)
        return self._effect(self._at("rename", a), "rename", a, lambda: os.rename(a, b, *x, **kw))

    def unlink(self, path, *a, **kw):
        self._changes(path)
        return self._effect(self._at("unlink", path), "unlink", path, lambda: os.unlink(path, *a, **kw))

    remove = unlink

    def rmdir(self, path, *a, **kw):
        self._changes(path)
        return self._effect(self._at("rmdir", path), "rmdir", path, lambda: os.rmdir(path, *a, **kw))

    def listdir(self, path="."):
        f = self._at("listdir", path)
        if f == "stale" and str(path) in self.listed and str(path) not in self.changed:
            return list(self.listed[str(path)])
        out = os.listdir(path)
        if self.armed:  # A's client's cache: what A listed (the intruder's listings are another host's)
            self.listed[str(path)] = out
            self.changed.discard(str(path))
        return out

    def open(self, path, flags, *a, **kw):
        f = self._at("open", path)
        if flags & os.O_CREAT and self.armed:
            self.kinds[-1] = "open-create"
        if not flags & os.O_CREAT:
            self._hidden(path)
        creating = "eio-after" if f == "eio-after" and flags & os.O_CREAT else None
        if flags & os.O_CREAT:
            self._changes(path)
        fd = os.open(path, flags, *a, **kw)
        if creating:
            os.close(fd)
            raise OSError(errno.EIO, "Input/output error (injected after the effect)", path)
        return fd

    def stat(self, path, *a, **kw):
        self._at("stat", path)
        self._hidden(path)
        st = os.stat(path, *a, **kw)
        if str(path) in self.kept:
            return os.stat_result((*st[:3], self.kept[str(path)], *st[4:10]))
        return st

    def statx(self, dirfd, path, flags, mask, buf):
        """``lookup._STATX`` (libc's ``statx``, forced past the cache): a counted call; a fault sets errno."""
        p = os.fsdecode(path)
        try:
            self._at("statx", p)
            self._hidden(p)
        except OSError as e:
            ctypes.set_errno(e.errno)
            return -1
        got = self.real_statx(dirfd, path, flags, mask, buf)
        if got == 0 and p in self.kept_forced:
            buf[16:20] = self.kept[p].to_bytes(4, sys.byteorder)  # stx_nlink, as the daemon's cache answers it
        return got

    def lstat(self, path, *a, **kw):
        self._at("lstat", path)
        self._hidden(path)
        return os.lstat(path, *a, **kw)


def one(seal_at, prefix, role, j, intruder, fault, then=None, also=None):
    """One run: returns (failure text or None, A's counted calls, their kinds).  ``fault`` at A's call ``j``; ``then``
    (``(k, fault2)``, k > j: PAIRS) a second fault at call ``k``, the intruder then at ``k`` instead of ``j``; ``also``
    (``{call: fault}``) more faults (the triples)."""
    px = _Os()
    real = [m.os for m in MODULES]
    for m in MODULES:
        m.os = px
    if px.real_statx is not None:
        lookup._STATX = px.statx
    try:
        return _one(px, seal_at, prefix, role, j, intruder, fault, then, also)
    finally:
        for m, o in zip(MODULES, real, strict=True):
            m.os = o
        lookup._STATX = px.real_statx


def _one(px, seal_at, prefix, role, j, intruder, fault, then, also=None):
    root = tempfile.mkdtemp(prefix="advposixroles-")
    os.chmod(root, 0o700)
    a = FolderKV(PosixStore(root), timeout=TIMEOUT, poll_max=0.02)
    b = FolderKV(PosixStore(root), poll_max=0.02)
    for kv in (a, b):
        capacities(kv, seal_at)
    h, problems = History(), []

    def run(kv, who, name, *args):
        c, t0 = h.call(name, *args, who=who), time.monotonic()
        try:
            r = key_call(kv, name, *args)
        except ValueError:
            r = "ValueError"
        except Crash:
            return  # pending
        except (StorageError, FileNotFoundError) as e:
            c.ret, c.result = -2, str(e)  # allowed only without an effect
            return
        except Exception as e:
            problems.append(f"{who}'s {name}{args} raised {type(e).__name__}: {str(e)[:140]}")
            c.ret = -3
            return
        if time.monotonic() - t0 > TIMEOUT + 1.0:
            problems.append(f"{who}'s {name}{args} took {time.monotonic() - t0:.1f} s")
        h.ret(c, r)

    intrude = b_side(run, b, prefix, intruder, seal_at)

    px.faults = {j: fault} if fault else {}
    px.intrude, px.intrude_at = (intrude if intruder else None), j
    if then is not None:
        px.intrude_at = then[0]
        if then[1]:
            px.faults[then[0]] = then[1]
    px.faults.update(also or {})
    args = {"add": (3,), "set": (b"7",), "cas": (str(prefix).encode(), b"50"), "del": ()}
    px.armed = True
    try:
        run(a, "a", role, *args[role])
    finally:
        px.armed = False
    calls = px.n
    run(FolderKV(PosixStore(root), poll_max=0.02), "c", "get")
    problems += px.free_slot
    if problems:
        return problems[0], calls, px.kinds
    bad = check([o for o in h.ops if o.ret not in (-2, -3)], None, step)
    if bad and any(o.ret == -2 for o in h.ops):
        bad = "an operation failed after its effect:\n" + bad
    return bad, calls, px.kinds


# seal_ats, prefixes (None: 2 .. seal_at + 3), roles, intruders
SIZES = {
    # prefixes 0 and 1 (session 15): A's add creates the counter (its seal of epoch 0), or waits for B's seal
    "ci": ((4,), (0, 1, 3, 5), ("add", "set"), (None, "seal")),
    "big": ((3, 4), None, ROLES, INTRUDERS),
    # session 6 (cap): A in a grown epoch of 6 (lincheck.capacities): at its 2nd version, its last delta, its seal
    "grown": (((4, 6),), (0, 1, 5, 7, 8), ("add", "set"), (None, "seal")),
}


def _configs(seal_ats, prefixes, roles):
    """``(seal_at, prefix, role)`` of a size: every start state (``prefixes`` None: 2 .. the capacity + 3) and role."""
    for seal_at in seal_ats:
        for prefix in prefixes or range(2, capacities(None, seal_at) + 4):
            for role in roles:
                yield seal_at, prefix, role


def enumerate_all(size="ci", out=print):
    seal_ats, prefixes, roles, intruders = SIZES[size]
    fails = Failures()
    for seal_at, prefix, role in _configs(seal_ats, prefixes, roles):
        _, clean, _ = one(seal_at, prefix, role, -1, None, None)
        for j in range(clean + 1):
            for intruder in intruders:
                for fault in FAULTS:
                    if intruder is not None or fault is not None:
                        case = (seal_at, prefix, role, j, intruder, fault)
                        fails.note(one(*case)[0], case)
    return fails.report(out)


# Pairs of faults (session 12): the calls that follow a failed one are where a process decides what its failure did
# (the forced link count after a link() that answered EEXIST or EIO, the token read back, the retry), and ONE fault per
# run never puts a second fault there.  For every call of A that a fault of FIRST acts on, and every one of the next
# WINDOW calls of that faulted run, every fault that acts on that call (APPLIES), or none, with or without an intruder
# there (the intruder runs at the second call).  Triples (the helper's attack on the first fix): where that intruder
# sealed and retired the epoch, a fault of THIRD on each later read of the window -- where a writer whose link() had an
# unknown effect settles it from the trash (a listing of the root, a read there).  WINDOW 9: a set's or
# compare_set's read-back after an eio-stale link() is its 8th call after it.
FIRST = ("eio-before", "eio-after", "lost", "lost-stale", "eio-stale")
THIRD = ("eio-before", "stale")
READS = ("listdir", "open", "stat", "statx")
WINDOW = 9
APPLIES = {
    "eio-before": (*CALLS, "open-create"),
    "crash": (*CALLS, "open-create"),
    "eio-after": (*MUTATING, "open-create"),
    "lost": ("link",),
    "lost-stale": ("link",),
    "eio-stale": ("link",),
    "neg": ("open", "stat", "lstat", "statx"),
    "stale": ("listdir",),
}
# seal_ats, prefixes, roles, intruders at the second call
PAIRS = {
    "pairs-ci": ((4,), (3, 5), ("add",), (None, "seal")),
    "pairs": ((4,), None, ROLES, INTRUDERS),
}


def _firsts(seal_at, prefix, role):
    """``(j, fault)`` for every call ``j`` of A's fault-free run that a fault of :data:`FIRST` acts on."""
    _, _, kinds = one(seal_at, prefix, role, -1, None, None)
    for j, kind in enumerate(kinds):
        for f1 in FIRST:
            # eio-before on a read is a retry of a read: the single-fault enumeration has it
            if kind in APPLIES[f1] and (f1 != "eio-before" or kind in (*MUTATING, "open-create")):
                yield j, f1


def enumerate_pairs(size="pairs-ci", out=print):
    seal_ats, prefixes, roles, intruders = PAIRS[size]
    fails = Failures()
    for seal_at, prefix, role in _configs(seal_ats, prefixes, roles):
        for j, f1 in _firsts(seal_at, prefix, role):
            bad, n1, kinds1 = one(seal_at, prefix, role, j, None, f1)
            fails.note(bad, (seal_at, prefix, role, j, None, f1))
            end = j + 1 + WINDOW
            for k in range(j + 1, min(n1, end)):
                for f2 in FAULTS:
                    if f2 is not None and kinds1[k] not in APPLIES[f2]:
                        continue
                    for intruder in intruders:
                        if f2 is None and intruder is None:
                            continue
                        case = (seal_at, prefix, role, j, intruder, f1, (k, f2))
                        bad, n2, kinds2 = one(*case)
                        fails.note(bad, case)
                        if intruder != "seal" or f2 is not None:
                            continue
                        for k2 in range(k + 1, min(n2, end)):
                            for f3 in THIRD:
                                if kinds2[k2] in READS and kinds2[k2] in APPLIES[f3]:
                                    fails.note(one(*case, {k2: f3})[0], (*case, {k2: f3}))
    return fails.report(out)


if __name__ == "__main__":
    size = sys.argv[1] if len(sys.argv) > 1 else "ci"
    (enumerate_pairs if size in PAIRS else enumerate_all)(size)
