"""Counting filesystem operations, two ways.

1. **In process** (fsmingle only): :func:`install_counting_os` replaces the ``os`` module seen by
   every imported ``fsmingle.*`` module with a proxy that counts, per participant thread, each call
   that reaches the filesystem -- ``create`` (``open`` with ``O_CREAT``), ``open`` (lookups, failed
   ones included: an ENOENT costs the server a LOOKUP), ``opendir``/``readdir`` (one listing) and
   the **directory entries** it returned, ``read``, ``write``, ``fsync``, ``stat``, ``rename``,
   ``link``, ``unlink``, ``mkdir``, ``rmdir`` -- and ``stat`` for each ``statx`` that ``fsmingle.fs.lookup`` makes
   through libc (``dir_signature``, ``link_count``: forced past the cache, a GETATTR each; uncounted before session
   11, when the waiters' were the only ones).  Exact, cheap at 4,096 participants, and the same
   accounting as the simulator's (:mod:`benchmarks.sim`).  ``shutil.rmtree`` of a retired
   generation is not counted (it uses shutil's own ``os``).
2. **strace** (any backend, torch's C++ FileStore included): ``strace -f -y`` attached to a sample
   of waiting processes for a window, classified per thread (:func:`classify_strace_by_tid`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

# the categories of the counting wrapper, shared with the simulator; re-exported for the harness
from ..opkinds import KINDS, fs_ops  # noqa: F401

# ----------------------------------------------------------------- in-process counting


class OpCounter:
    """Per-participant counters; a thread says which participant it is with :meth:`bind`."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.counts: dict[int, dict[str, int]] = {}
        self.unbound = dict.fromkeys(KINDS, 0)

    def bind(self, p: int) -> None:
        self._local.p = p
        if p not in self.counts:
            self.counts[p] = dict.fromkeys(KINDS, 0)

    def add(self, kind: str, k: int = 1) -> None:
        p = getattr(self._local, "p", None)
        c = self.unbound if p is None else self.counts[p]
        c[kind] += k  # only the participant's own thread writes its dict

    def snapshot(self) -> dict[int, dict[str, int]]:
        return {p: dict(c) for p, c in list(self.counts.items())}


# os functions counted one call = one operation of a kind (``open``, ``listdir`` and ``scandir``
# need more than that and have methods of their own below).
_ONE_OP = {
    "read": "read",
    "write": "write",
    "fsync": "fsync",
    "close": "close",
    "stat": "stat",
    "lstat": "stat",
    "fstat": "stat",
    "replace": "rename",
    "rename": "rename",
    "link": "link",
    "unlink": "unlink",
    "remove": "unlink",
    "mkdir": "mkdir",
    "rmdir": "rmdir",
}


class _CountingOs:
    """Stands in for the ``os`` module inside fsmingle: counts, then calls the real function."""

    def __init__(self, real, counter: OpCounter) -> None:
        self._real, self._c = real, counter

    def __getattr__(self, name):
        real = getattr(self._real, name)
        kind = _ONE_OP.get(name)
        if kind is None:
            setattr(self, name, real)  # found in the instance from now on: __getattr__ is not called again
            return real

        def counted(*a, **k):
            self._c.add(kind)
            return real(*a, **k)

        setattr(self, name, counted)
        return counted

    def open(self, path, flags, *a, **k):
        self._c.add("create" if flags & os.O_CREAT else "readdir" if flags & getattr(os, "O_DIRECTORY", 0) else "open")
        return self._real.open(path, flags, *a, **k)

    def listdir(self, path="."):
        self._c.add("readdir")
        names = self._real.listdir(path)
        self._c.add("entries", len(names))
        return names

    def scandir(self, path="."):
        self._c.add("readdir")
        entries = list(self._real.scandir(path))
        self._c.add("entries", len(entries))
        return iter(entries)


def install_counting_os(counter: OpCounter, prefix: str = "fsmingle") -> list[str]:
    """Point the ``os`` global of every loaded module under ``prefix`` at a counting proxy.

    Returns:
        list[str]: the modules patched (their calls are the ones counted).
    """
    import sys

    proxy = _CountingOs(os, counter)
    done = []
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name == prefix or name.startswith(prefix + ".")) and getattr(mod, "os", None) is os:
            mod.os = proxy
            done.append(name)
    lookup = sys.modules.get(f"{prefix}.fs.lookup")
    real_statx = getattr(lookup, "_STATX", None)
    if real_statx is not None and not getattr(real_statx, "counted", False):

        def statx(*a):  # libc's statx through ctypes: no os call to see, one GETATTR to count
            counter.add("stat")
            return real_statx(*a)

        statx.counted = True
        lookup._STATX = statx
    return sorted(done)


def diff_counts(a: dict, b: dict) -> dict:
    return {k: b.get(k, 0) - a.get(k, 0) for k in KINDS}


# ----------------------------------------------------------------- strace

STRACE_SET = (
    "%file,read,write,pread64,pwrite64,readv,writev,close,flock,fcntl,getdents64,"
    "fstat,lseek,fsync,fdatasync,ftruncate,%network,poll,ppoll"
)
_OPEN = {"open", "openat", "openat2", "creat"}
_STAT = {
    "stat",
    "lstat",
    "fstat",
    "newfstatat",
    "fstatat64",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "readlink",
    "readlinkat",
    "statfs",
    "fstatfs",
}
_MUT = {
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "link",
    "linkat",
    "mkdir",
    "mkdirat",
    "rmdir",
    "symlink",
    "symlinkat",
    "chmod",
    "fchmodat",
    "utimensat",
    "truncate",
    "ftruncate",
    "fsync",
    "fdatasync",
}
_RW_FD = {"read", "write", "pread64", "pwrite64", "readv", "writev"}
_LINE = re.compile(r"^(?:\[pid\s+)?(\d+)\]?\s+(\w+)\((.*)$")
_FD0 = re.compile(r"^\s*(-?\d+|AT_FDCWD)<([^>]*)>")
_PATHARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_NET = {
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "connect",
    "accept",
    "accept4",
    "socket",
    "poll",
    "ppoll",
    "shutdown",
    "setsockopt",
    "getsockopt",
    "bind",
    "listen",
    "getsockname",
    "getpeername",
}


def classify_strace(text: str, prefixes: tuple[str, ...] = ()) -> dict[str, int]:
    return classify_strace_by_tid(text, prefixes)["total"]


_CATS = (
    "opens",
    "stats",
    "listdirs",
    "getdents",
    "locks",
    "reads",
    "writes",
    "closes",
    "mutations",
    "other_file",
    "net",
    "outside",
)


def _finish(c: dict[str, int]) -> dict[str, int]:
    # Operations that can reach a shared filesystem's server (NFS/Lustre):
    # everything file-related except close/lseek-style local bookkeeping.
    c["fs_ops"] = (
        c["opens"] + c["stats"] + c["listdirs"] + c["getdents"] + c["locks"] + c["reads"] + c["writes"] + c["mutations"]
    )
    c["fs_syscalls"] = c["fs_ops"] + c["closes"] + c["other_file"]
    return c


def classify_strace_by_tid(text: str, prefixes: tuple[str, ...] = ()) -> dict:
    """Count syscalls of an ``strace -f -y`` log into categories.

    fd-based calls are attributed by strace's -y annotation: ``<\\/path>`` is
    a file, ``<socket:...>``/``<TCP:...>`` network, pipes/anon inodes are the
    harness's own control channel and are ignored.  File operations whose path
    lies under one of `prefixes` (the rendezvous directories) go into the
    categories; file operations elsewhere (e.g. torch's ``inspect.stack()``
    stat()ing its own source files on every rendezvous event) are counted in
    ``outside`` only.
    """
    total = {k: 0 for k in _CATS}
    tids: dict[int, dict[str, int]] = {}
    for line in text.splitlines():
        if "resumed>" in line or line.startswith(("---", "+++")):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, args = m.group(2), m.group(3)
        tid = int(m.group(1))
        fdm = _FD0.match(args)
        fdkind, path = None, None
        if fdm:
            target = fdm.group(2)
            if target.startswith("/"):
                fdkind, path = "file", target
            elif target.startswith(("socket:", "TCP", "UDP", "UNIX", "NETLINK")):
                fdkind = "net"
            else:
                fdkind = "ipc"
        q = _PATHARG.search(args)
        if q and (name in _OPEN or name in _STAT or name in _MUT or name.startswith(("access", "readlink"))):
            path = q.group(1)
            if not path.startswith("/") and fdm and fdm.group(2).startswith("/"):
                path = os.path.join(fdm.group(2), path)
        net_call = name in _NET
        if net_call or (fdkind == "net" and name in (_RW_FD | {"close"})):
            if name in ("poll", "ppoll") and "socket" not in args and "TCP" not in args:
                continue
            cat = "net"
        elif fdkind == "ipc":
            continue
        elif name in _OPEN:
            cat = "listdirs" if "O_DIRECTORY" in args else "opens"
        elif name in _STAT:
            if fdm and name in ("fstat", "fstatfs") and fdkind != "file":
                continue
            cat = "stats"
        elif name in ("getdents64", "getdents"):
            cat = "getdents"
        elif name == "flock" or (name == "fcntl" and re.search(r"F_(OFD_)?SETLKW?", args)):
            cat = "locks"
        elif name in _RW_FD:
            if fdkind != "file":
                continue
            cat = "reads" if name.startswith(("read", "pread")) else "writes"
        elif name == "close":
            if fdkind != "file":
                continue
            cat = "closes"
        elif name in _MUT:
            cat = "mutations"
        else:
            if fdm and fdkind != "file":
                continue
            cat = "other_file"
        if (
            cat != "net"
            and path is not None
            and prefixes
            and not any(path == pf or path.startswith(pf.rstrip("/") + "/") for pf in prefixes)
        ):
            cat = "outside"
        total[cat] += 1
        t = tids.get(tid)
        if t is None:
            t = tids[tid] = {k: 0 for k in _CATS}
        t[cat] += 1
    return {"total": _finish(total), "tids": {k: _finish(v) for k, v in tids.items()}}


def strace_sample(pids: list[int], seconds: float, logdir: str, prefixes: tuple[str, ...] = ()) -> list[dict]:
    """Attach strace -f -y to each pid for `seconds`; return per-pid counts."""
    procs = []
    for pid in pids:
        out = os.path.join(logdir, f"strace.{pid}.log")
        cmd = ["strace", "-f", "-y", "-qq", "-e", f"trace={STRACE_SET}", "-o", out, "-p", str(pid)]
        procs.append((pid, out, subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)))
    t_start = time.monotonic()
    time.sleep(seconds)
    for _, _, sp in procs:
        sp.send_signal(signal.SIGINT)  # detach cleanly
    t_end = time.monotonic()
    res = []
    for pid, out, sp in procs:
        try:
            _, err = sp.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            sp.kill()
            _, err = sp.communicate()
        try:
            with open(out) as f:
                text = f.read()
        except OSError:
            text = ""
        cl = classify_strace_by_tid(text, prefixes)
        res.append(
            {
                "pid": pid,
                "seconds": t_end - t_start,
                "counts": cl["total"],
                "tids": cl["tids"],
                "strace_rc": sp.returncode,
                "strace_err": err.decode(errors="replace")[-500:],
            }
        )
    return res
