#!/usr/bin/env python3
"""Rendezvous benchmark: fsmingle vs. torch's c10d rendezvous (FileStore, TCPStore).

Scenario ("last arrival"): N participants are real processes (or, for large N,
threads inside a bounded number of processes, each thread with its own
identity).  All processes are spawned first and import what their backend
needs (torch for the torch backends, *not* torch for fsmingle) and report
"ready".  Then N-1 participants are released together ("go"), join, and
settle into steady-state polling.  During that steady-state window a sample
of waiting processes is attached with ``strace -f`` to count their
filesystem operations.  strace is detached, and then the last participant
joins.  We measure the time from the last participant's arrival to its own
release and to everyone's release.

Run ``python benchmarks/bench_rendezvous.py --help``; see benchmarks/README.md.

The same file is the worker program (``--worker``): the orchestrator talks
to each worker over its stdin/stdout pipes (blocking reads, so a waiting
worker makes no extra system calls that strace would count).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ("fsmingle", "torch-file", "torch-tcp")
FS_MODES = ("local", "bindfs", "bindfs-coherent")
# NFS-like: per-mount attribute/lookup caches of 1 s, no lock forwarding
# (flock is then local to each mount, like NFS with local_lock).
BINDFS_OPTS = "attr_timeout=1,entry_timeout=1,negative_timeout=1"
# A lock-coherent shared mount, like NFS with a working lock manager where a
# lock revalidates the cache: locks forwarded to the backing directory (bindfs
# requires multithreaded mode for that), no attribute cache, no page cache.
# torch's FileStore (flock + append to one log file) needs this: on plain
# "bindfs" a stale cached file size makes its appends overwrite the log and
# the rendezvous hangs from N = 4 on (measured, see README).
BINDFS_COHERENT_OPTS = ("attr_timeout=0,entry_timeout=0,negative_timeout=0,"
                        "enable-lock-forwarding,multithreaded,direct_io")
FS_OPTS = {"bindfs": BINDFS_OPTS, "bindfs-coherent": BINDFS_COHERENT_OPTS}
MSG = "@@"  # prefix of worker protocol lines on stdout


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (not an error in the harness)."""


# --------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------

_out_lock = threading.Lock()


def _emit(**ev: Any) -> None:
    line = MSG + " " + json.dumps(ev) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


class _TorchC10d:
    """c10d rendezvous (DynamicRendezvousHandler) exactly as torchrun builds it."""

    def __init__(self, cfg: dict) -> None:
        import logging

        # What torchrun's agent imports; registry registers "c10d".
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        self.cfg = cfg
        self.Params = RendezvousParameters
        self.get_handler = get_rendezvous_handler
        self.handlers: list = []  # keep alive: heartbeats keep running after release
        self.thread_to_pid: dict[int, int] = {}
        self.joined: set[int] = set()

        # Join detection: the first "successfully synced its local changes"
        # debug record of a participant's thread follows its ADD_TO_PARTICIPANTS.
        outer = self

        class _JoinHook(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    if "has successfully synced its local changes" not in record.getMessage():
                        return
                    p = outer.thread_to_pid.get(record.thread)
                    if p is not None and p not in outer.joined:
                        outer.joined.add(p)
                        _emit(ev="joined", p=p, t=time.monotonic())
                except Exception:
                    pass

        lg = logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
        lg.setLevel(logging.DEBUG)
        lg.propagate = False
        lg.addHandler(_JoinHook())

    def join(self, p: int) -> dict:
        cfg = self.cfg
        self.thread_to_pid[threading.get_ident()] = p
        if cfg["backend"] == "torch-file":
            endpoint = os.path.join(cfg["dirs"][p], cfg["job_id"], "c10d.store")
            conf = {"store_type": "file"}
        else:
            endpoint = cfg["tcp_endpoint"]
            # One participant hosts the TCPStore, as the node whose address is
            # the endpoint would under torchrun.
            conf = {"is_host": "1" if p == cfg["tcp_host"] else "0"}
        params = self.Params(
            backend="c10d",
            endpoint=endpoint,
            run_id=cfg["job_id"],
            min_nodes=cfg["nnodes"],
            max_nodes=cfg["nnodes"],
            local_addr=cfg["addrs"][p],
            **conf,
        )
        handler = self.get_handler(params)
        self.handlers.append(handler)
        t_handler = time.monotonic()
        info = handler.next_rendezvous()
        bs = info.bootstrap_store_info
        return {
            "rank": info.rank,
            "world": info.world_size,
            "master_addr": bs.master_addr,
            "master_port": bs.master_port,
            "generation": None,
            "t_handler": t_handler,
        }


class _Fsmingle:
    """Adapter for fsmingle.rendezvous(dir, job_id, *, nnodes, node_rank, addr, timeout)."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.fn = _fsmingle_entry()

    def join(self, p: int) -> dict:
        cfg = self.cfg
        r = self.fn(
            cfg["dirs"][p],
            cfg["job_id"],
            nnodes=cfg["nnodes"],
            node_rank=None,
            addr=cfg["addrs"][p],
            timeout=cfg["rdzv_timeout"],
        )
        return {
            "rank": r.node_rank,
            "world": r.nnodes,
            "master_addr": r.master_addr,
            "master_port": r.master_port,
            "generation": getattr(r, "generation", None),
            "job_id": getattr(r, "job_id", None),
        }


def _fsmingle_entry():
    """Return fsmingle.rendezvous or raise BackendUnavailable with the reason."""
    try:
        import fsmingle  # noqa: F401
    except Exception as exc:  # ImportError, or a half-written package
        raise BackendUnavailable(f"fsmingle not available: import fsmingle failed: {exc!r}") from exc
    fn = getattr(fsmingle, "rendezvous", None)
    if not callable(fn):
        raise BackendUnavailable(
            "fsmingle not available: the installed fsmingle package has no callable "
            "fsmingle.rendezvous (the core API is not written yet?)"
        )
    return fn


def worker_main(cfg: dict) -> None:
    t0 = time.monotonic()
    try:
        if cfg["backend"] == "fsmingle":
            backend: Any = _Fsmingle(cfg)
        else:
            backend = _TorchC10d(cfg)
    except BackendUnavailable as exc:
        _emit(ev="unavailable", reason=str(exc))
        sys.stdout.flush()
        os._exit(3)
    except Exception:
        _emit(ev="fatal", error=traceback.format_exc())
        os._exit(4)
    _emit(
        ev="ready",
        pid=os.getpid(),
        import_s=time.monotonic() - t0,
        torch_imported="torch" in sys.modules,
    )

    def participant(p: int) -> None:
        t_arr = time.monotonic()
        _emit(ev="entered", p=p, t=t_arr, tid=threading.get_native_id())
        try:
            res = backend.join(p)
            t_rel = time.monotonic()
            _emit(ev="released", p=p, t_arr=t_arr, t_rel=t_rel, **res)
        except BaseException:
            _emit(ev="error", p=p, t=time.monotonic(), error=traceback.format_exc())

    threads = []
    for line in sys.stdin:
        cmd = line.strip()
        if cmd in ("go", "last"):
            group = cfg["early"] if cmd == "go" else cfg["late"]
            for p in group:
                th = threading.Thread(target=participant, args=(p,), daemon=True, name=f"p{p}")
                th.start()
                threads.append(th)
        elif cmd == "exit":
            break
    # Do not call handler.shutdown(): it would close the rendezvous for
    # everyone.  torch's heartbeat threads are daemons; leave hard.
    sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------------------
# strace accounting
# --------------------------------------------------------------------------

STRACE_SET = (
    "%file,read,write,pread64,pwrite64,readv,writev,close,flock,fcntl,getdents64,"
    "fstat,lseek,fsync,fdatasync,ftruncate,%network,poll,ppoll"
)
_OPEN = {"open", "openat", "openat2", "creat"}
_STAT = {"stat", "lstat", "fstat", "newfstatat", "fstatat64", "statx", "access",
         "faccessat", "faccessat2", "readlink", "readlinkat", "statfs", "fstatfs"}
_MUT = {"rename", "renameat", "renameat2", "unlink", "unlinkat", "link", "linkat",
        "mkdir", "mkdirat", "rmdir", "symlink", "symlinkat", "chmod", "fchmodat",
        "utimensat", "truncate", "ftruncate", "fsync", "fdatasync"}
_RW_FD = {"read", "write", "pread64", "pwrite64", "readv", "writev"}
_LINE = re.compile(r"^(?:\[pid\s+)?(\d+)\]?\s+(\w+)\((.*)$")
_FD0 = re.compile(r"^\s*(-?\d+|AT_FDCWD)<([^>]*)>")
_PATHARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_NET = {"sendto", "recvfrom", "sendmsg", "recvmsg", "connect", "accept", "accept4", "socket",
        "poll", "ppoll", "shutdown", "setsockopt", "getsockopt", "bind", "listen",
        "getsockname", "getpeername"}


def classify_strace(text: str, prefixes: tuple[str, ...] = ()) -> dict[str, int]:
    return classify_strace_by_tid(text, prefixes)["total"]


_CATS = ("opens", "stats", "listdirs", "getdents", "locks", "reads",
         "writes", "closes", "mutations", "other_file", "net", "outside")


def _finish(c: dict[str, int]) -> dict[str, int]:
    # Operations that can reach a shared filesystem's server (NFS/Lustre):
    # everything file-related except close/lseek-style local bookkeeping.
    c["fs_ops"] = (c["opens"] + c["stats"] + c["listdirs"] + c["getdents"] + c["locks"]
                   + c["reads"] + c["writes"] + c["mutations"])
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
        if cat != "net" and path is not None and prefixes and not any(
            path == pf or path.startswith(pf.rstrip("/") + "/") for pf in prefixes
        ):
            cat = "outside"
        total[cat] += 1
        t = tids.get(tid)
        if t is None:
            t = tids[tid] = {k: 0 for k in _CATS}
        t[cat] += 1
    return {"total": _finish(total), "tids": {k: _finish(v) for k, v in tids.items()}}


def strace_sample(pids: list[int], seconds: float, logdir: str,
                  prefixes: tuple[str, ...] = ()) -> list[dict]:
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
        res.append({"pid": pid, "seconds": t_end - t_start, "counts": cl["total"], "tids": cl["tids"],
                    "strace_rc": sp.returncode, "strace_err": err.decode(errors="replace")[-500:]})
    return res


# --------------------------------------------------------------------------
# Filesystems
# --------------------------------------------------------------------------


def bindfs_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root (per-participant FUSE mounts need root here)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse missing"
    if not shutil.which("bindfs"):
        return "bindfs not installed (apt-get install bindfs fuse3)"
    if not (shutil.which("fusermount3") or shutil.which("fusermount") or shutil.which("umount")):
        return "no fusermount/umount"
    return None


def _unmount(mnt: str) -> None:
    for cmd in (["fusermount3", "-u", mnt], ["fusermount", "-u", mnt], ["umount", "-l", mnt]):
        if shutil.which(cmd[0]):
            r = subprocess.run(cmd, capture_output=True)
            if r.returncode == 0:
                return


class MountSet:
    """One backing directory and M bindfs mounts of it (NFS-like client caches)."""

    def __init__(self, root: str, count: int, opts: str) -> None:
        self.root = root
        self.backing = os.path.join(root, "backing")
        os.makedirs(self.backing, mode=0o700, exist_ok=True)
        self.mounts: list[str] = []
        self.opts = opts
        try:
            for i in range(count):
                mnt = os.path.join(root, f"mnt{i:04d}")
                os.makedirs(mnt, exist_ok=True)
                r = subprocess.run(["bindfs", "-o", self.opts, self.backing, mnt],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError(f"bindfs mount {i} failed: {r.stderr.strip()}")
                self.mounts.append(mnt)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for mnt in self.mounts:
            _unmount(mnt)
        self.mounts = []


# --------------------------------------------------------------------------
# Orchestrator
# --------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def participant_addr(p: int) -> str:
    # Distinct loopback address per participant (all of 127/8 is loopback).
    return f"127.0.{p // 250}.{p % 250 + 1}"


def layout(n: int, max_procs: int) -> list[list[int]]:
    """Participants per process.  The last participant always gets its own
    process; the N-1 early ones are spread round-robin over the rest."""
    if n < 2:
        raise ValueError("N must be >= 2")
    procs = max(1, min(n - 1, max_procs - 1))
    groups: list[list[int]] = [[] for _ in range(procs)]
    for p in range(n - 1):
        groups[p % procs].append(p)
    groups.append([n - 1])
    return groups


def mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class Worker:
    idx: int
    participants: list[int]
    proc: subprocess.Popen
    pid: int = 0
    lines: "queue.Queue[dict]" = field(default_factory=queue.Queue)


def _reader(w: Worker, q: "queue.Queue[tuple[int, dict]]") -> None:
    for raw in w.proc.stdout:  # type: ignore[union-attr]
        if raw.startswith(MSG + " "):
            try:
                ev = json.loads(raw[len(MSG) + 1:])
            except ValueError:
                continue
            q.put((w.idx, ev))
    q.put((w.idx, {"ev": "eof"}))


class RunError(RuntimeError):
    pass


def run_once(args, backend: str, fs: str, n: int, rep: int, dirs_for: list[str],
             backing_root: str, workdir: str, log) -> dict:
    """One repetition of the last-arrival scenario.  Returns a result dict."""
    groups = layout(n, args.max_procs)
    job_id = f"bench-{backend}-{fs}-n{n}-r{rep}-{uuid.uuid4().hex[:8]}"
    # A fresh root per repetition: nothing from an earlier run can be seen.
    run_rel = f"run-{uuid.uuid4().hex[:12]}"
    os.makedirs(os.path.join(backing_root, run_rel), mode=0o700)
    if backend == "torch-file":
        os.makedirs(os.path.join(backing_root, run_rel, job_id), mode=0o700)
    dirs = [os.path.join(dirs_for[p % len(dirs_for)], run_rel) for p in range(n)]
    cfg_base = {
        "backend": backend,
        "nnodes": n,
        "job_id": job_id,
        "dirs": dirs,
        "addrs": [participant_addr(p) for p in range(n)],
        "rdzv_timeout": float(args.timeout),
        "tcp_endpoint": f"127.0.0.1:{free_port()}" if backend == "torch-tcp" else None,
        "tcp_host": 0,
        "late": [],
        "early": [],
    }
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    # Make the in-tree fsmingle importable even when not pip-installed.
    repo = os.path.dirname(HERE)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    logdir = os.path.join(workdir, "logs", job_id)
    os.makedirs(logdir, exist_ok=True)

    evq: "queue.Queue[tuple[int, dict]]" = queue.Queue()
    workers: list[Worker] = []
    t_spawn = time.monotonic()
    try:
        for i, grp in enumerate(groups):
            last_proc = i == len(groups) - 1
            cfg = dict(cfg_base, early=[] if last_proc else grp, late=grp if last_proc else [])
            errf = open(os.path.join(logdir, f"worker{i}.stderr"), "w")
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, text=True,
                env=env, cwd=workdir, bufsize=1,
            )
            errf.close()
            w = Worker(i, grp, proc, proc.pid)
            workers.append(w)
            threading.Thread(target=_reader, args=(w, evq), daemon=True).start()

        state: dict[str, Any] = {"ready": {}, "entered": {}, "joined": {}, "released": {},
                                 "errors": {}, "unavailable": None, "eof": set()}

        def pump(until, timeout: float, what: str) -> None:
            deadline = time.monotonic() + timeout
            while not until():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RunError(f"timed out after {timeout:.0f}s waiting for {what}")
                try:
                    widx, ev = evq.get(timeout=min(left, 0.5))
                except queue.Empty:
                    continue
                kind = ev.get("ev")
                if kind == "ready":
                    state["ready"][widx] = ev
                elif kind == "entered":
                    state["entered"][ev["p"]] = ev["t"]
                    state.setdefault("tid", {})[ev["tid"]] = ev["p"]
                elif kind == "joined":
                    state["joined"][ev["p"]] = ev["t"]
                elif kind == "released":
                    state["released"][ev["p"]] = ev
                elif kind == "error":
                    state["errors"][ev["p"]] = ev["error"]
                elif kind == "unavailable":
                    state["unavailable"] = ev["reason"]
                    raise BackendUnavailable(ev["reason"])
                elif kind == "fatal":
                    raise RunError(f"worker {widx} failed to start:\n{ev['error']}")
                elif kind == "eof":
                    state["eof"].add(widx)
                    if widx not in state["ready"] or any(
                        p not in state["released"] for p in workers[widx].participants
                    ):
                        tail = _tail(os.path.join(logdir, f"worker{widx}.stderr"))
                        raise RunError(f"worker {widx} exited early (rc={workers[widx].proc.poll()}): {tail}")
                if state["errors"]:
                    p, err = next(iter(state["errors"].items()))
                    raise RunError(f"participant {p} failed: {err.strip().splitlines()[-1]}\n{err}")

        # 1. all processes spawned and imported
        pump(lambda: len(state["ready"]) == len(workers), args.ready_timeout, "workers to import")
        t_ready = time.monotonic()
        torch_in_fsmingle = any(ev["torch_imported"] for ev in state["ready"].values()) \
            if backend == "fsmingle" else None
        early = [p for p in range(n - 1)]
        # 2. release the N-1 early participants together
        for w in workers[:-1]:
            w.proc.stdin.write("go\n")
            w.proc.stdin.flush()
        t_go = time.monotonic()
        pump(lambda: len(state["entered"]) == n - 1, args.timeout, "early participants to start")
        # 3. wait until they have joined (torch: from its own debug log; fsmingle:
        #    its beacons in the backing directory), then settle.
        if backend == "fsmingle":
            job_dir = os.path.join(backing_root, run_rel, job_id)
            join_how = "beacons"
            pump(lambda: _count_beacons(job_dir) >= n - 1, args.timeout, "beacons of early participants")
        else:
            join_how = "torch-log"
            pump(lambda: len(state["joined"]) >= n - 1, args.timeout, "early participants to join")
        t_joined = time.monotonic()
        warm = min(1.0, args.settle * 0.25)
        strace_secs = max(0.0, min(args.strace_secs, args.settle - warm - 0.5))
        pump(lambda: time.monotonic() - t_joined >= warm, warm + 5, "warm-up")  # keep draining events
        fsops = None
        if strace_secs > 0 and args.strace_procs > 0 and shutil.which("strace"):
            cands = [w for w in workers[:-1]
                     if not (backend == "torch-tcp" and cfg_base["tcp_host"] in w.participants)]
            k = min(args.strace_procs, len(cands))
            # spread the sample over the early processes
            sample = [cands[round(i * (len(cands) - 1) / max(k - 1, 1))] for i in range(k)] if k else []
            sample = list({id(w): w for w in sample}.values())
            prefixes = tuple(sorted({os.path.realpath(d) for d in dirs_for} | set(dirs_for)))
            res = strace_sample([w.pid for w in sample], strace_secs, logdir, prefixes)
            per = []
            tidmap = state.get("tid", {})
            for w, r in zip(sample, res):
                k = len(w.participants)
                own = {}  # participant -> fs calls/s made on its own thread
                for tid, cnt in r["tids"].items():
                    p = tidmap.get(int(tid))
                    if p is not None:
                        own[p] = {c: v / r["seconds"] for c, v in cnt.items()}
                helpers = {c: sum(cnt[c] for tid, cnt in r["tids"].items() if int(tid) not in tidmap)
                           / r["seconds"] for c in r["counts"]}
                per.append({"participants": k, "participant_ids": list(w.participants),
                            "seconds": r["seconds"], "counts": r["counts"],
                            "per_participant_per_s": {c: v / r["seconds"] / k for c, v in r["counts"].items()},
                            "own_thread_per_s": own, "helper_threads_per_s": helpers,
                            "strace_rc": r["strace_rc"]})
            fsops = per
        pump(lambda: time.monotonic() - t_joined >= args.settle, args.settle + 5, "settle")
        if state["released"]:
            raise RunError(f"{len(state['released'])} participants released before the last arrived")
        # 4. the last participant arrives
        workers[-1].proc.stdin.write("last\n")
        workers[-1].proc.stdin.flush()
        pump(lambda: len(state["released"]) == n, args.timeout, "all participants to be released")
        t_end = time.monotonic()
    finally:
        for w in workers:
            try:
                w.proc.stdin.write("exit\n")
                w.proc.stdin.flush()
            except Exception:
                pass
        for w in workers:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    rel = state["released"]
    t_arr_last = rel[n - 1]["t_arr"]
    per_participant = [rel[p]["t_rel"] - t_arr_last for p in range(n)]
    # validate what the rendezvous handed out
    problems = []
    ranks = sorted(rel[p]["rank"] for p in range(n))
    if ranks != list(range(n)):
        problems.append(f"ranks are not a permutation of 0..{n-1}: {ranks[:10]}...")
    if {rel[p]["world"] for p in range(n)} != {n}:
        problems.append("world size differs from N")
    masters = {(rel[p]["master_addr"], rel[p]["master_port"]) for p in range(n)}
    if len(masters) != 1:
        problems.append(f"{len(masters)} different master addr/port pairs")
    if torch_in_fsmingle:
        problems.append("torch was imported in an fsmingle worker")
    for smp in fsops or []:
        smp["ranks"] = {str(p): rel[p]["rank"] for p in smp["participant_ids"]}
    result = {
        "backend": backend, "fs": fs, "n": n, "rep": rep, "job_id": job_id,
        "procs": len(groups), "max_threads_per_proc": max(len(g) for g in groups),
        "last_own_s": rel[n - 1]["t_rel"] - t_arr_last,
        "last_all_s": max(per_participant),
        "waiters_after_last_s": per_participant[:-1],
        "spawn_to_ready_s": t_ready - t_spawn,
        "go_to_joined_s": t_joined - t_go,
        "join_detection": join_how,
        "wall_s": t_end - t_spawn,
        "settle_s": args.settle,
        "strace_s": strace_secs,
        "fsops": fsops,
        "master": sorted(masters)[0],
        "torch_imported_in_fsmingle": torch_in_fsmingle,
        "valid": not problems,
        "problems": problems,
    }
    log(f"    rep {rep}: last->own {result['last_own_s']:.3f}s  last->all {result['last_all_s']:.3f}s  "
        f"wall {result['wall_s']:.1f}s  join {result['go_to_joined_s']:.2f}s"
        + ("" if not problems else f"  INVALID: {problems}"))
    if not args.keep_logs:
        shutil.rmtree(logdir, ignore_errors=True)
    shutil.rmtree(os.path.join(backing_root, run_rel), ignore_errors=True)
    return result


def _count_beacons(job_dir: str) -> int:
    """fsmingle beacons (``<job>/gen-N/beacon-*.json``, see docs/protocol.md)
    under the job directory, read on the backing store by the orchestrator,
    never through a participant's mount."""
    n = 0
    try:
        for root, dnames, fnames in os.walk(job_dir):
            dnames[:] = [d for d in dnames if not d.startswith(".")]
            n += sum(1 for f in fnames if f.startswith("beacon") and f.endswith(".json"))
    except OSError:
        return 0
    return n


def _tail(path: str, nchars: int = 2000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-nchars:]
    except OSError:
        return ""


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("valid")]
    s: dict[str, Any] = {"reps_ok": len(ok), "reps": len(runs)}
    if not ok:
        return s
    own = [r["last_own_s"] for r in ok]
    allr = [r["last_all_s"] for r in ok]
    waiters = [x for r in ok for x in r["waiters_after_last_s"]]
    for name, xs in (("last_own", own), ("last_all", allr), ("waiter", waiters)):
        s[f"{name}_p50"] = pct(xs, 50)
        s[f"{name}_p95"] = pct(xs, 95)
        s[f"{name}_max"] = max(xs)
    s["wall_p50"] = pct([r["wall_s"] for r in ok], 50)
    s["join_p50"] = pct([r["go_to_joined_s"] for r in ok], 50)
    s["procs"] = ok[0]["procs"]
    s["max_threads_per_proc"] = ok[0]["max_threads_per_proc"]
    samples = [x for r in ok for x in (r["fsops"] or [])]
    if samples:
        cats = samples[0]["per_participant_per_s"].keys()
        s["ops_per_s"] = {c: sum(x["per_participant_per_s"][c] for x in samples) / len(samples) for c in cats}
        s["ops_samples"] = len(samples)
        own = [(x["ranks"].get(str(p)), v) for x in samples for p, v in x["own_thread_per_s"].items()
               if "ranks" in x]
        if own:
            s["own_fs_ops_p50"] = pct([v["fs_ops"] for _, v in own], 50)
            s["own_fs_ops_max"] = max(v["fs_ops"] for _, v in own)
            non0 = [v for r, v in own if r != 0]
            r0 = [v for r, v in own if r == 0]
            s["own_non_rank0_p50"] = {c: pct([v[c] for v in non0], 50) for c in cats} if non0 else None
            s["own_rank0_p50"] = {c: pct([v[c] for v in r0], 50) for c in cats} if r0 else None
            s["own_participants"] = len(own)
    return s


def _f(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def render_tables(rows: list[dict], notes: list[str]) -> str:
    out = []
    out.append("### Last arrival → release (seconds) and steady-state filesystem load\n")
    out.append("| backend | fs | N | procs × threads | reps | last→own p50 / p95 / max | last→all p50 / p95 / max "
               "| any waiter p50 / p95 | wall p50 | opens/s | stats/s | listdirs/s | locks/s | reads/s | writes/s "
               "| mutations/s | fs ops/s | net ops/s | other files/s | typical waiter fs ops/s | rank 0 fs ops/s | status |")
    out.append("|" + "---|" * 22)
    for r in rows:
        s = r.get("summary", {})
        o = s.get("ops_per_s") or {}
        lay = f"{s.get('procs', '—')} × ≤{s.get('max_threads_per_proc', '—')}" if s.get("procs") else "—"
        status = r.get("status", "ok")
        if len(status) > 80:
            status = status[:77] + "..."
        status = status.replace("|", "/").replace("\n", " ")
        g = lambda k: _f(o.get(k)) if o else "—"  # noqa: E731
        tw = _f((s.get("own_non_rank0_p50") or {}).get("fs_ops"))
        r0 = _f((s.get("own_rank0_p50") or {}).get("fs_ops"))
        out.append(
            f"| {r['backend']} | {r['fs']} | {r['n']} | {lay} | {s.get('reps_ok', 0)}/{s.get('reps', 0)} "
            f"| {_f(s.get('last_own_p50'))} / {_f(s.get('last_own_p95'))} / {_f(s.get('last_own_max'))} "
            f"| {_f(s.get('last_all_p50'))} / {_f(s.get('last_all_p95'))} / {_f(s.get('last_all_max'))} "
            f"| {_f(s.get('waiter_p50'))} / {_f(s.get('waiter_p95'))} | {_f(s.get('wall_p50'), 1)} "
            f"| {g('opens')} | {g('stats')} | {g('listdirs')} | {g('locks')} | {g('reads')} | {g('writes')} "
            f"| {g('mutations')} | {g('fs_ops')} | {g('net')} | {g('outside')} | {tw} | {r0} | {status} |"
        )
    # ratios fsmingle / torch
    by = {(r["backend"], r["fs"], r["n"]): r.get("summary", {}) for r in rows}
    fs_list = sorted({r["fs"] for r in rows if r["backend"] == "fsmingle"})
    ns = sorted({r["n"] for r in rows})
    if fs_list and any(b != "fsmingle" for b, _, _ in by):
        out.append("\n### Ratios fsmingle / torch (p50 last arrival → everyone released; "
                   "mean fs ops/s per waiting participant)\n")
        out.append("| fs | N | fsmingle s | torch-file (same fs) s | ratio | torch-file (bindfs-coherent) s | ratio "
                   "| torch-tcp s | ratio | fs ops/s fsmingle / torch-file (same fs) |")
        out.append("|" + "---|" * 10)
        for fs in fs_list:
            for n in ns:
                fm = by.get(("fsmingle", fs, n))
                if fm is None:
                    continue
                tf = by.get(("torch-file", fs, n), {})
                tc = by.get(("torch-file", "bindfs-coherent", n), {}) if fs.startswith("bindfs") else {}
                tt = by.get(("torch-tcp", "net", n), {})
                a = fm.get("last_all_p50")

                def ratio(x):
                    return f"{a / x:.2f}" if a is not None and x else "—"

                b, c, d = tf.get("last_all_p50"), tc.get("last_all_p50"), tt.get("last_all_p50")
                fo = (fm.get("ops_per_s") or {}).get("fs_ops")
                to = (tf.get("ops_per_s") or {}).get("fs_ops")
                ro = f"{fo / to:.2f}" if fo is not None and to else "—"
                out.append(f"| {fs} | {n} | {_f(a)} | {_f(b)} | {ratio(b)} | {_f(c)} | {ratio(c)} "
                           f"| {_f(d)} | {ratio(d)} | {ro} |")
    if notes:
        out.append("\n### Notes\n")
        out.extend(f"- {x}" for x in notes)
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    series: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for r in rows:
        s = r.get("summary", {})
        if s.get("last_all_p50") is not None:
            series.setdefault((r["backend"], r["fs"]), []).append((r["n"], s))
    for (b, fs), pts in sorted(series.items()):
        pts.sort(key=lambda t: t[0])
        xs = [p[0] for p in pts]
        p50 = [p[1]["last_all_p50"] for p in pts]
        p95 = [p[1]["last_all_p95"] for p in pts]
        lo = [p[1]["last_own_p50"] for p in pts]
        (line,) = ax1.plot(xs, p50, marker="o", label=f"{b} / {fs}: everyone (p50)")
        ax1.plot(xs, p95, ls=":", color=line.get_color(), alpha=0.7)
        ax1.plot(xs, lo, ls="--", marker="x", color=line.get_color(), alpha=0.7)
        ops = [(p[0], p[1]["ops_per_s"]["fs_ops"]) for p in pts if p[1].get("ops_per_s")]
        typ = [(p[0], p[1]["own_non_rank0_p50"]["fs_ops"]) for p in pts if p[1].get("own_non_rank0_p50")]
        if fs != "net" and (ops or typ):
            (l2,) = ax2.plot([o[0] for o in typ], [max(o[1], 1e-2) for o in typ], marker="o",
                             label=f"{b} / {fs}: typical waiter")
            ax2.plot([o[0] for o in ops], [max(o[1], 1e-2) for o in ops], ls=":", marker=".",
                     color=l2.get_color(), alpha=0.7)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("participants N")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("seconds after the last arrival")
    ax1.set_title("Release latency (solid p50 all, dotted p95 all, dashed p50 last's own)", fontsize=9)
    ax2.set_ylabel("fs ops / s per waiting participant (strace)")
    ax2.set_yscale("log")
    ax2.set_title("Steady-state fs ops on the rendezvous directory (strace; solid: typical\n"
                  "non-rank-0 waiter's own thread, dotted: per-process mean incl. coordinator)", fontsize=9)
    if series:
        ax1.legend(fontsize=7)
    if ax2.lines:
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment() -> dict:
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "mem_available_gib": (mem_available_bytes() or 0) / 2**30,
    }
    for dist in ("torch", "fsmingle", "matplotlib"):
        try:
            from importlib.metadata import version

            env[dist] = version(dist)
        except Exception:
            env[dist] = None
    try:
        r = subprocess.run(["git", "-C", os.path.dirname(HERE), "rev-parse", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        env["git_commit"] = r.stdout.strip() or None
    except Exception:
        env["git_commit"] = None
    return env


def check_backend(backend: str) -> str | None:
    """Quick availability check in a clean subprocess (no torch for fsmingle)."""
    if backend == "fsmingle":
        code = ("import sys; sys.path.insert(0, %r)\n"
                "import bench_rendezvous as b\n"
                "try:\n    b._fsmingle_entry()\n"
                "except b.BackendUnavailable as e:\n    print(e); sys.exit(3)\n") % HERE
    else:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            return f"{backend} not available: torch is not installed"
        return None
    env = dict(os.environ)
    repo = os.path.dirname(HERE)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    if r.returncode == 0:
        return None
    msg = (r.stdout.strip() or r.stderr.strip().splitlines()[-1:] or ["unknown"])
    return msg if isinstance(msg, str) else f"{backend} not available: {msg[0]}"


PER_PROC_BYTES = {"fsmingle": 60 << 20, "torch-file": 300 << 20, "torch-tcp": 300 << 20}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", default="2,4,16,64", help="comma-separated participant counts")
    ap.add_argument("--backends", default="fsmingle,torch-file,torch-tcp")
    ap.add_argument("--fs", default="local,bindfs", help="local, bindfs (NFS-like caches), bindfs-coherent (lock-coherent, uncached); torch-tcp ignores it: fs='net'")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per configuration")
    ap.add_argument("--settle", type=float, default=6.0,
                    help="seconds between 'all early participants joined' and the last arrival")
    ap.add_argument("--strace-secs", type=float, default=4.0, help="strace window inside the settle period")
    ap.add_argument("--strace-procs", type=int, default=2, help="waiting processes sampled with strace per repetition")
    ap.add_argument("--max-procs", type=int, default=16,
                    help="participant processes at most; beyond, participants are threads (the last one always has its own process)")
    ap.add_argument("--max-mounts", type=int, default=64, help="bindfs mounts at most (participant p uses mount p %% M)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-phase timeout (s) and fsmingle's timeout")
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="time allowed for spawning and imports")
    ap.add_argument("--budget", type=float, default=900.0,
                    help="stop escalating N for a backend/fs once one configuration takes longer than this (s)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a new temp dir)")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--replot", metavar="RESULTS_JSON", default=None,
                    help="only re-render the table and plot of an earlier results.json into --out")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.replot:
        with open(args.replot) as fh:
            old = json.load(fh)
        os.makedirs(args.out, exist_ok=True)
        table = render_tables(old["rows"], old["notes"])
        print(table)
        with open(os.path.join(args.out, "results.md"), "w") as fh:
            fh.write(f"Command: `{old['command']}`\n\n")
            fh.write(f"Environment: {json.dumps(old['environment'], default=str)}\n\n")
            fh.write(table)
        plot(old["rows"], os.path.join(args.out, "rendezvous.png"))
        return 0

    if args.worker is not None:
        worker_main(json.loads(args.worker))
        return 0

    ns = sorted({int(x) for x in args.n.split(",") if x.strip()})
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    fss = [f.strip() for f in args.fs.split(",") if f.strip()]
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r}; choose from {BACKENDS}")
    for f in fss:
        if f not in FS_MODES:
            ap.error(f"unknown fs {f!r}; choose from {FS_MODES}")
    if any(n < 2 for n in ns):
        ap.error("N must be >= 2")
    os.makedirs(args.out, exist_ok=True)
    command = " ".join(shlex.quote(x) for x in ["python", os.path.relpath(os.path.abspath(__file__))]
                       + (list(argv) if argv is not None else sys.argv[1:]))

    def log(msg: str) -> None:
        print(msg, flush=True)

    notes: list[str] = []
    workdir = args.workdir or tempfile.mkdtemp(prefix="fsmingle-bench-")
    os.makedirs(workdir, exist_ok=True)
    env_info = environment()
    log(f"# workdir {workdir}; torch {env_info.get('torch')}; {env_info['cpus']} CPUs; "
        f"load {env_info['loadavg_start']}")

    unavailable = {b: check_backend(b) for b in backends}
    for b, why in unavailable.items():
        if why:
            log(f"! {b}: {why}")

    bindfs_reason = bindfs_unavailable_reason() if any(f in FS_OPTS for f in fss) else None
    if bindfs_reason:
        log(f"! skipping bindfs mode: {bindfs_reason}")
        notes.append(f"bindfs mode skipped: {bindfs_reason}")

    # (backend, fs) combinations; torch-tcp does not use the filesystem.
    combos: list[tuple[str, str]] = []
    for b in backends:
        if b == "torch-tcp":
            combos.append((b, "net"))
            continue
        for f in fss:
            if f in FS_OPTS and bindfs_reason:
                continue
            combos.append((b, f))

    rows: list[dict] = []
    mountsets: dict[str, MountSet] = {}
    exit_code = 0
    started = time.monotonic()
    try:
        for b, f in combos:
            stopped: str | None = None
            for n in ns:
                row: dict[str, Any] = {"backend": b, "fs": f, "n": n, "runs": []}
                rows.append(row)
                if unavailable.get(b):
                    row["status"] = unavailable[b]
                    exit_code = 1
                    continue
                if stopped:
                    row["status"] = f"not run: {stopped}"
                    continue
                groups = layout(n, args.max_procs)
                need = len(groups) * PER_PROC_BYTES[b]
                avail = mem_available_bytes()
                if avail is not None and need > 0.7 * avail:
                    stopped = (f"stopped before N={n}: {len(groups)} processes need ~{need / 2**30:.1f} GiB, "
                               f"only {avail / 2**30:.1f} GiB available")
                    row["status"] = f"not run: {stopped}"
                    notes.append(f"{b}/{f}: {stopped}")
                    continue
                # directories for participants
                if f in FS_OPTS:
                    m = min(max(ns), args.max_mounts)
                    if f not in mountsets:
                        root = os.path.join(workdir, f)
                        log(f"# mounting {m} bindfs mounts (-o {FS_OPTS[f]}) under {root}")
                        mountsets[f] = MountSet(root, m, FS_OPTS[f])
                    ms = mountsets[f]
                    dirs_for = ms.mounts[: min(n, len(ms.mounts))]
                    backing = ms.backing
                    row["mounts"] = len(dirs_for)
                    row["mount_opts"] = ms.opts
                else:
                    backing = os.path.join(workdir, "local")
                    os.makedirs(backing, mode=0o700, exist_ok=True)
                    dirs_for = [backing]
                log(f"## {b} fs={f} N={n}: {len(groups)} processes (≤{max(len(g) for g in groups)} "
                    f"participants each){'' if f not in FS_OPTS else f', {len(dirs_for)} mounts'}")
                t_cfg = time.monotonic()
                for rep in range(args.reps):
                    try:
                        row["runs"].append(run_once(args, b, f, n, rep, dirs_for, backing, workdir, log))
                    except BackendUnavailable as exc:
                        row["status"] = str(exc)
                        exit_code = 1
                        break
                    except Exception as exc:
                        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                        row["status"] = f"failed: {msg}"
                        row.setdefault("errors", []).append(traceback.format_exc())
                        log(f"    rep {rep} FAILED: {exc}")
                        stopped = f"stopped after N={n} failed ({msg[:120]})"
                        notes.append(f"{b}/{f}: {stopped}")
                        exit_code = 1
                        break
                row["summary"] = summarize(row["runs"])
                if "status" not in row:
                    bad = [r for r in row["runs"] if not r["valid"]]
                    row["status"] = "ok" if not bad else f"INVALID: {bad[0]['problems']}"
                    if bad:
                        exit_code = 1
                dt = time.monotonic() - t_cfg
                if not stopped and dt > args.budget and n != ns[-1]:
                    stopped = f"stopped after N={n}: it took {dt:.0f}s > budget {args.budget:.0f}s"
                    notes.append(f"{b}/{f}: {stopped}")
    except KeyboardInterrupt:
        notes.append("interrupted")
        exit_code = 130
    finally:
        for ms in mountsets.values():
            ms.close()

    if any(max(len(g) for g in layout(n, args.max_procs)) > 1 for n in ns):
        notes.append(f"At most {args.max_procs} processes per configuration: beyond that, participants are "
                     f"threads inside a process (own identity each: own handler/store client or own fsmingle call "
                     f"with its own address); the last participant always has a process of its own.")
    notes.append(f"Settle {args.settle:g}s after all N-1 early participants joined; strace window "
                 f"{args.strace_secs:g}s on ≤{args.strace_procs} waiting processes per repetition "
                 f"(ops/s are per waiting participant; strace is detached before the last arrival).")
    for f in fss:
        if f in FS_OPTS and not bindfs_reason:
            notes.append(f"{f}: one bindfs mount per participant up to {args.max_mounts} (then shared "
                         f"round-robin) of one backing directory, -o {FS_OPTS[f]}.")
    notes.append("torch: c10d DynamicRendezvousHandler via registry.get_rendezvous_handler with torch defaults "
                 "(join_timeout 600, last_call_timeout 30 — unused since min_nodes = max_nodes, "
                 "keep_alive_interval 5, state cache 1 s, poll delay 1 s); local_addr = participant address.")
    notes.append(f"wall = spawn of all processes → everyone released (includes imports, join and settle); "
                 f"harness time {time.monotonic() - started:.0f}s.")

    table = render_tables(rows, notes)
    print()
    print(table)
    results = {"command": command, "args": vars(args), "environment": env_info,
               "loadavg_end": os.getloadavg(), "rows": rows, "notes": notes}
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    with open(os.path.join(args.out, "results.md"), "w") as fh:
        fh.write(f"Command: `{command}`\n\n")
        fh.write(f"Environment: {json.dumps(env_info, default=str)}\n\n")
        fh.write(table)
    with open(os.path.join(args.out, "command.txt"), "w") as fh:
        fh.write(command + "\n")
    try:
        plot(rows, os.path.join(args.out, "rendezvous.png"))
    except Exception as exc:  # a missing plot must not hide the numbers
        log(f"! plot failed: {exc!r}")
        exit_code = exit_code or 1
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    log(f"# wrote {args.out}/results.json, results.md, rendezvous.png, command.txt")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
