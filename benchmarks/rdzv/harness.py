"""Start the participants (processes x threads) and run the "last arrival" scenario once.

1. Spawn every process (``python -m benchmarks.rdzv.worker CFG GROUP``; the configuration is a
   file); each imports its backend and says ``ready``.  Nothing is timed yet.
2. ``go`` to every process but the last: the N-1 early participants start together.
3. Wait until they have joined: fsmingle -- rank 0 reports all N-1 present (its progress
   callback), else N-1 beacons on the backing directory; torch -- each participant's first
   "synced its local changes" debug record.
4. Settle.  Inside the window, the counting wrapper is snapshotted twice (fsmingle) and a sample
   of processes is attached with strace (any backend); strace is detached before step 5.
5. ``go`` to the last process; its participant's arrival is stamped in its own thread right
   before the rendezvous call; every release is stamped when the call returns
   (``CLOCK_MONOTONIC`` is system-wide, so times compare across processes).
6. Validate: ranks a permutation of 0..N-1, one world size, one master.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .common import (
    REPO,
    BackendUnavailable,
    RunError,
    free_port,
    layout,
    participant_addr,
)
from .fsops import KINDS, diff_counts, fs_ops, strace_sample


@dataclass
class Worker:
    idx: int
    participants: list[int]
    proc: subprocess.Popen
    pid: int = 0


def _reader(w: Worker, q: queue.Queue[tuple[int, dict]]) -> None:
    for raw in w.proc.stdout:  # type: ignore[union-attr]
        if raw.startswith("@@ "):
            try:
                ev = json.loads(raw[3:])
            except ValueError:
                continue
            q.put((w.idx, ev))
    q.put((w.idx, {"ev": "eof"}))


def _tail(path: str, nchars: int = 2000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-nchars:]
    except OSError:
        return ""


def count_beacons(job_dir: str) -> int:
    """Beacons directly in ``<job>/gen-N/`` (not ``master/``), read on the backing directory."""
    n = 0
    try:
        for g in os.scandir(job_dir):
            if g.is_dir() and g.name.startswith("gen-"):
                n += sum(1 for f in os.scandir(g.path) if f.name.startswith("beacon") and f.name.endswith(".json"))
    except OSError:
        return 0
    return n


@dataclass
class Scenario:
    """Settings of one repetition (from the command line)."""

    settle: float = 6.0
    strace_secs: float = 4.0
    strace_procs: int = 2
    max_procs: int = 16
    timeout: float = 120.0
    ready_timeout: float = 300.0
    keep_logs: bool = False
    v1_root: str = "/tmp/v1"
    fsmingle_root: str | None = None
    progress: bool = True
    one_addr: bool = False  # every participant on 127.0.0.1 (else one loopback address each)
    extra: dict = field(default_factory=dict)


def run_once(
    sc: Scenario, backend: str, fs: str, n: int, rep: int, dirs_for: list[str], backing_root: str, workdir: str, log
) -> dict:
    """One repetition of the last-arrival scenario.

    Returns:
        dict: timings, validation and operation counts (see :mod:`benchmarks.rdzv.report`).

    Raises:
        RunError: a phase timed out, a worker died or a participant failed.
        BackendUnavailable: the backend cannot run here.
    """
    groups = layout(n, sc.max_procs)
    job_id = f"bench-{backend}-{fs}-n{n}-r{rep}-{uuid.uuid4().hex[:8]}"
    run_rel = f"run-{uuid.uuid4().hex[:12]}"  # a fresh root: nothing from an earlier run can be seen
    os.makedirs(os.path.join(backing_root, run_rel), mode=0o700)
    if backend != "torch-tcp":
        # fsmingle never creates --dir (nor the job dir's parent); torch's FileStore needs its parent.
        os.makedirs(
            os.path.join(backing_root, run_rel, job_id)
            if backend == "torch-file"
            else os.path.join(backing_root, run_rel),
            mode=0o700,
            exist_ok=True,
        )
    dirs = [os.path.join(dirs_for[p % len(dirs_for)], run_rel) for p in range(n)]
    logdir = os.path.join(workdir, "logs", job_id)
    os.makedirs(logdir, exist_ok=True)
    cfg = {
        "backend": backend,
        "nnodes": n,
        "job_id": job_id,
        "dirs": dirs,
        "addrs": ["127.0.0.1" if sc.one_addr else participant_addr(p) for p in range(n)],
        "rdzv_timeout": float(sc.timeout),
        "tcp_endpoint": f"127.0.0.1:{free_port()}" if backend == "torch-tcp" else None,
        "tcp_host": 0,
        "groups": [g for g in groups],
        "progress": sc.progress,
        "impl_root": sc.v1_root if backend == "fsmingle-v1" else sc.fsmingle_root if backend == "fsmingle" else None,
    }
    cfg_path = os.path.join(logdir, "config.json")
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

    evq: queue.Queue[tuple[int, dict]] = queue.Queue()
    workers: list[Worker] = []
    st: dict[str, Any] = {
        "ready": {},
        "entered": {},
        "joined": {},
        "released": {},
        "errors": {},
        "world_ready": None,
        "counts": {},
        "tid": {},
    }
    t_spawn = time.monotonic()

    def send(ws, line: str) -> None:
        for w in ws:
            w.proc.stdin.write(line + "\n")
            w.proc.stdin.flush()

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
                st["ready"][widx] = ev
            elif kind == "entered":
                st["entered"][ev["p"]] = ev["t"]
                st["tid"][ev["tid"]] = ev["p"]
            elif kind == "joined":
                st["joined"][ev["p"]] = ev["t"]
            elif kind == "world_ready":
                st["world_ready"] = ev["t"]
            elif kind == "released":
                st["released"][ev["p"]] = ev
            elif kind == "counts":
                st["counts"].setdefault(ev["tag"], {}).update(ev["counts"])
                st["counts"].setdefault(ev["tag"] + "@t", []).append(ev["t"])
            elif kind == "error":
                st["errors"][ev["p"]] = ev["error"]
            elif kind == "unavailable":
                raise BackendUnavailable(ev["reason"])
            elif kind == "fatal":
                raise RunError(f"worker {widx} failed to start:\n{ev['error']}")
            elif kind == "eof":
                if widx not in st["ready"] or any(p not in st["released"] for p in workers[widx].participants):
                    tail = _tail(os.path.join(logdir, f"worker{widx}.stderr"))
                    raise RunError(f"worker {widx} exited early (rc={workers[widx].proc.poll()}): {tail}")
            if st["errors"]:
                p, err = next(iter(st["errors"].items()))
                raise RunError(f"participant {p} failed: {err.strip().splitlines()[-1]}\n{err}")

    strace_secs, fsops, window = 0.0, None, None
    try:
        for i, grp in enumerate(groups):
            with open(os.path.join(logdir, f"worker{i}.stderr"), "w") as errf:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.rdzv.worker", cfg_path, str(i)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=errf,
                    text=True,
                    env=env,
                    cwd=REPO,
                    bufsize=1,
                )
            w = Worker(i, grp, proc, proc.pid)
            workers.append(w)
            threading.Thread(target=_reader, args=(w, evq), daemon=True).start()
        pump(lambda: len(st["ready"]) == len(workers), sc.ready_timeout, "workers to import")
        t_ready = time.monotonic()
        torch_in_fsmingle = (
            any(ev["torch_imported"] for ev in st["ready"].values()) if backend.startswith("fsmingle") else None
        )
        send(workers[:-1], "go")
        t_go = time.monotonic()
        pump(lambda: len(st["entered"]) == n - 1, sc.timeout, "early participants to start")
        if backend.startswith("fsmingle"):
            job_dir = os.path.join(backing_root, run_rel, job_id)
            join_how = "rank 0 sees N-1 (progress), else N-1 beacons"
            last_check = [0.0, 0]

            def joined() -> bool:
                if st["world_ready"] is not None:
                    return True
                now = time.monotonic()
                if now - last_check[0] > 1.0:  # the backing dir listing is O(N): not too often
                    last_check[0], last_check[1] = now, count_beacons(job_dir)
                # Without a progress callback: every early participant has a beacon (then settle).
                return not sc.progress and last_check[1] >= n - 1

            pump(joined, sc.timeout, "rank 0 to see the N-1 early participants")
        else:
            join_how = "torch-log"
            pump(lambda: len(st["joined"]) >= n - 1, sc.timeout, "early participants to join")
        t_joined = time.monotonic()
        warm = min(1.0, sc.settle * 0.25)
        strace_secs = max(0.0, min(sc.strace_secs, sc.settle - warm - 0.5))
        pump(lambda: time.monotonic() - t_joined >= warm, warm + 5, "warm-up")
        counted = backend.startswith("fsmingle")
        if counted:
            send(workers[:-1], "snap a")
        if strace_secs > 0 and sc.strace_procs > 0 and shutil.which("strace"):
            fsops = _strace(sc, backend, cfg, workers, dirs_for, strace_secs, logdir, st)
        else:
            pump(lambda: time.monotonic() - t_joined >= warm + strace_secs, strace_secs + 5, "window")
        if counted:
            send(workers[:-1], "snap b")
            pump(lambda: len(st["counts"].get("b@t", [])) == len(workers) - 1, sc.timeout, "operation counts")
            ta, tb = min(st["counts"]["a@t"]), max(st["counts"]["b@t"])
            window = {
                "seconds": tb - ta,
                "per_participant": {
                    p: diff_counts(st["counts"]["a"].get(p, {}), c) for p, c in st["counts"]["b"].items()
                },
            }
        pump(lambda: time.monotonic() - t_joined >= sc.settle, sc.settle + 5, "settle")
        if st["released"]:
            raise RunError(f"{len(st['released'])} participants released before the last arrived")
        send(workers[-1:], "go")
        pump(lambda: len(st["released"]) == n, sc.timeout, "all participants to be released")
        t_end = time.monotonic()
    finally:
        for w in workers:
            try:
                send([w], "exit")
            except Exception:
                pass
        for w in workers:
            try:
                w.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()

    rel = st["released"]
    t_arr_last = rel[n - 1]["t_arr"]
    after = [rel[p]["t_rel"] - t_arr_last for p in range(n)]
    problems = []
    ranks = sorted(rel[p]["rank"] for p in range(n))
    if ranks != list(range(n)):
        problems.append(f"ranks are not a permutation of 0..{n - 1}: {ranks[:10]}...")
    if {rel[p]["world"] for p in range(n)} != {n}:
        problems.append("world size differs from N")
    masters = {(rel[p]["master_addr"], rel[p]["master_port"]) for p in range(n)}
    if len(masters) != 1:
        problems.append(f"{len(masters)} different master addr/port pairs")
    if torch_in_fsmingle:
        problems.append("torch was imported in an fsmingle worker")
    for smp in fsops or []:
        smp["ranks"] = {str(p): rel[p]["rank"] for p in smp["participant_ids"]}
    ops = None
    if all("ops" in rel[p] for p in range(n)):
        ops = _ops_summary(rel, n, window)
    result = {
        "backend": backend,
        "fs": fs,
        "n": n,
        "rep": rep,
        "job_id": job_id,
        "procs": len(groups),
        "max_threads_per_proc": max(len(g) for g in groups),
        "last_own_s": rel[n - 1]["t_rel"] - t_arr_last,
        "last_all_s": max(after),
        "waiters_after_last_s": after[:-1],
        "spawn_to_ready_s": t_ready - t_spawn,
        "go_to_joined_s": t_joined - t_go,
        "join_detection": join_how,
        "wall_s": t_end - t_spawn,
        "settle_s": sc.settle,
        "strace_s": strace_secs,
        "fsops": fsops,
        "ops": ops,
        "generations": sorted({rel[p].get("generation") for p in range(n)}, key=str),
        "master": min(masters),
        "torch_imported_in_fsmingle": torch_in_fsmingle,
        "impl": next(iter(st["ready"].values())).get("impl"),
        "valid": not problems,
        "problems": problems,
    }
    o = ops or {}
    log(
        f"    rep {rep}: last->own {result['last_own_s']:.3f}s  last->all {result['last_all_s']:.3f}s  "
        f"wall {result['wall_s']:.1f}s  join {result['go_to_joined_s']:.2f}s"
        + (
            f"  fs ops/participant {o['fs_ops_mean']:.1f} (max {o['fs_ops_max']}), entries {o['entries_mean']:.0f}"
            if ops
            else ""
        )
        + (f"  waiter {o['waiter_fs_ops_per_s_p50']:.3f} ops/s" if o.get("waiter_fs_ops_per_s_p50") is not None else "")
        + ("" if not problems else f"  INVALID: {problems}")
    )
    if not sc.keep_logs:
        shutil.rmtree(logdir, ignore_errors=True)
    shutil.rmtree(os.path.join(backing_root, run_rel), ignore_errors=True)
    return result


def _ops_summary(rel: dict, n: int, window: dict | None) -> dict:
    """Per-participant operation counts (counting wrapper) for the whole generation and the waiting window."""
    from .common import pct

    per = [rel[p]["ops"] for p in range(n)]
    r0 = next(p for p in range(n) if rel[p]["rank"] == 0)
    totals = {k: sum(c.get(k, 0) for c in per) for k in KINDS}
    fo = [fs_ops(c) for c in per]
    out = {
        "per_kind_mean": {k: v / n for k, v in totals.items()},
        "fs_ops_mean": sum(fo) / n,
        "fs_ops_p50": pct(fo, 50),
        "fs_ops_max": max(fo),
        "fs_ops_rank0": fs_ops(per[r0]),
        "fs_ops_last": fs_ops(per[n - 1]),
        "entries_mean": totals["entries"] / n,
        "entries_rank0": per[r0].get("entries", 0),
        "entries_last": per[n - 1].get("entries", 0),
        "rank0_participant": r0,
    }
    if window and window["seconds"] > 0:
        secs = window["seconds"]
        rates = {int(p): fs_ops(c) / secs for p, c in window["per_participant"].items()}
        waiters = [v for p, v in rates.items() if p != r0]
        out["window_s"] = secs
        out["waiter_fs_ops_per_s_p50"] = pct(waiters, 50)
        out["waiter_fs_ops_per_s_max"] = max(waiters) if waiters else None
        out["waiter_fs_ops_per_s_mean"] = sum(waiters) / len(waiters) if waiters else None
        out["rank0_fs_ops_per_s"] = rates.get(r0)
        out["window_by_kind_mean"] = {
            k: sum(c.get(k, 0) for p, c in window["per_participant"].items() if int(p) != r0)
            / max(1, len(waiters))
            / secs
            for k in KINDS
        }
    return out


def _strace(sc, backend, cfg, workers, dirs_for, secs, logdir, st) -> list[dict]:
    cands = [w for w in workers[:-1] if not (backend == "torch-tcp" and cfg["tcp_host"] in w.participants)]
    k = min(sc.strace_procs, len(cands))
    sample = [cands[round(i * (len(cands) - 1) / max(k - 1, 1))] for i in range(k)] if k else []
    sample = list({id(w): w for w in sample}.values())
    prefixes = tuple(sorted({os.path.realpath(d) for d in dirs_for} | set(dirs_for)))
    res = strace_sample([w.pid for w in sample], secs, logdir, prefixes)
    per = []
    tidmap = st["tid"]
    for w, r in zip(sample, res):
        k = len(w.participants)
        own = {}
        for tid, cnt in r["tids"].items():
            p = tidmap.get(int(tid))
            if p is not None:
                own[p] = {c: v / r["seconds"] for c, v in cnt.items()}
        helpers = {
            c: sum(cnt[c] for tid, cnt in r["tids"].items() if int(tid) not in tidmap) / r["seconds"]
            for c in r["counts"]
        }
        per.append(
            {
                "participants": k,
                "participant_ids": list(w.participants),
                "seconds": r["seconds"],
                "counts": r["counts"],
                "per_participant_per_s": {c: v / r["seconds"] / k for c, v in r["counts"].items()},
                "own_thread_per_s": own,
                "helper_threads_per_s": helpers,
                "strace_rc": r["strace_rc"],
            }
        )
    return per
