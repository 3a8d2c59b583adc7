"""The adversary's enumeration of a delta ``add`` on a real directory (``PosixStore``: the ``_link_slots`` loop that
fakefs never runs), by Python's audit events: at A's ``k``-th filesystem call (open, link, listdir, mkdir, rename,
remove...) an intruder runs on B (an add, adds that seal and retire the epoch, a set, a set of a non-integer, a
delete), and/or that call fails with EIO before its effect (raised from the audit hook), or A's ``j``-th
``link()`` takes effect and answers EIO or EEXIST (a lost reply).  Checked: every answer, Wing-Gong.

``python tests/adversary_enum_posix.py`` prints the failures grouped, and how many runs.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lincheck import Failures, History, b_side, check, key_call
from lincheck import key_step as step

from fsmingle.fs import folderstore_add as fa
from fsmingle.fs.folderstore import FolderKV
from fsmingle.fs.store import PosixStore

EVENTS = {"open", "os.link", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.mkdir", "os.rmdir"}
INTRUDERS = (None, "add", "seal", "set", "set-nonint", "del")
FAULTS = (None, "eio-before", "link-eio-after", "link-lost")


class _Hook:
    """The audit hook: counts A's calls (its thread, while armed) and acts at the k-th."""

    def __init__(self):
        self.armed = False
        self.thread = None
        self.n = 0
        self.at: dict[int, object] = {}

    def __call__(self, event, args):
        if not self.armed or event not in EVENTS or threading.get_ident() != self.thread:
            return
        n, self.n = self.n, self.n + 1
        act = self.at.pop(n, None)
        if act is not None:
            self.armed = False
            try:
                act()
            finally:
                self.armed = True


HOOK = _Hook()
sys.addaudithook(HOOK)


class _Os:
    """``os`` for folderstore_add: its ``j``-th ``link()`` takes effect, then answers ``err``."""

    def __init__(self, j, err):
        self.j, self.err = j, err

    def __getattr__(self, name):
        return getattr(os, name)

    def link(self, src, dst):
        os.link(src, dst)
        self.j -= 1
        if self.j == -1:
            raise OSError(self.err, os.strerror(self.err), dst)


def one(seal_at, prefix, k, intruder, fault, j, amount=3):
    root = tempfile.mkdtemp(prefix="advposix-")
    os.chmod(root, 0o700)
    a = FolderKV(PosixStore(root), timeout=20.0, poll_max=0.02)
    b = FolderKV(PosixStore(root), poll_max=0.02)
    for kv in (a, b):
        kv.seal_at = kv.seal_first = seal_at  # a counter's first epoch too (its creating add names it)
    h = History()

    def run(kv, who, name, *args):
        c = h.call(name, *args, who=who)
        try:
            r = key_call(kv, name, *args)
        except ValueError:
            r = "ValueError"
        h.ret(c, r)

    intrude = b_side(run, b, prefix, intruder, seal_at)

    def eio():
        raise OSError(errno.EIO, "Input/output error (injected before the effect)")

    HOOK.n, HOOK.at, HOOK.thread = 0, {}, threading.get_ident()
    if intruder:
        HOOK.at[k] = intrude
    if fault == "eio-before":
        prev = HOOK.at.get(k)
        HOOK.at[k] = (lambda: (prev(), eio())) if prev else eio
    if fault in ("link-eio-after", "link-lost"):
        fa.os = _Os(j, errno.EIO if fault == "link-eio-after" else errno.EEXIST)
    HOOK.armed = True
    err = None
    try:
        run(a, "a", "add", amount)
    except Exception as e:
        err = f"A's add raised {type(e).__name__}: {str(e)[:140]}"
        h.ops = [o for o in h.ops if o.ret != -1]
    finally:
        HOOK.armed = False
        fa.os = os
    calls = HOOK.n
    run(b, "b", "get")
    if err:
        # An error with no effect is allowed: then the history without A's add must check.
        bad = check([o for o in h.ops if o.who != "a"], None, step)
        return (None if bad is None else err), calls
    return check(h.ops, None, step), calls


def enumerate_all(seal_ats=(4,), out=print):
    fails = Failures()
    for seal_at in seal_ats:
        for prefix in range(2, seal_at + 4):
            _, clean = one(seal_at, prefix, 10**6, None, None, 0)
            for k in range(clean + 1):
                for intruder in INTRUDERS:
                    for fault in FAULTS:
                        for j in range(3) if fault and fault.startswith("link") else (0,):
                            if intruder is None and fault != "eio-before" and not (fault or "").startswith("link"):
                                continue
                            case = (seal_at, prefix, k, intruder, fault, j)
                            fails.note(one(*case)[0], case)
    return fails.report(out)


if __name__ == "__main__":
    enumerate_all(tuple(int(a) for a in sys.argv[1:]) or (4,))
