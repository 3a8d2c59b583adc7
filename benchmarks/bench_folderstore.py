"""FolderStore vs FileStore vs TCPStore in one run: set/get/add/wait latency and barrier time at 2-64 ranks, on a
local disk and on bindfs mounts with NFS-like caches (one mount per simulated node), and FolderStore's metadata
operations per store operation (counted in-process by :mod:`benchmarks.rdzv.fsops`, the wrapper around ``os``
that the rendezvous benchmarks use).  FileStore and TCPStore are C++: their filesystem operations are not counted
in-process; a waiting FileStore rank's cost is measured with strace instead (``--no-strace`` skips it).

``python -m benchmarks.bench_folderstore`` (default: N = 2, 8, 32, 64; local and bindfs) writes
``benchmarks/results/folderstore/results.json`` and ``results.md`` (the table ``docs/folderstore.md`` quotes).

Ranks are processes forked from this one after torch is imported (a fork costs no import), started together by a
multiprocessing barrier.  Scenario per (filesystem, store, N):

* **set**: each rank sets ``K`` keys of its own; **get**: reads them back; mean latency per op.
* **add**: each rank adds 1 to ONE shared counter ``K_ADD`` times (all N contend); mean latency per op.
* **wait**: N-1 ranks block in ``wait(["go"])``; rank 0 sets it 0.2 s later; latency = wake - set (p50, max).
* **barrier**: torch's ``_store_based_barrier``: every rank ``add("b", 1)``, then reads the count with
  ``add("b", 0)``; a rank that counts N sets ``"b-done"``; all ``wait`` for it; time from the last arrival to the last
  release.
* **waiting rank**: one rank waits 3 s on a key nobody sets; metadata operations per second it costs.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

from fsmingle.fs.folderstore_torch import folder_store_class

from .opkinds import METADATA
from .rdzv.filesystems import FS_OPTS, MountSet, bindfs_unavailable_reason
from .rdzv.fsops import OpCounter, install_counting_os

K = 20  # set/get ops per rank
K_ADD = 5  # adds per rank on the one shared counter
PROFILE: str | None = None  # --profile: a directory for each rank's cProfile of its barrier add(b, 1)
STORES = ("folder", "file", "tcp")
STORE_TIMEOUT = 60.0  # seconds every store's operations may take (--limit: a slow run is measured, not failed)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "folderstore")

counter = OpCounter()


def _meta(c: dict) -> int:
    return sum(c.get(k, 0) for k in METADATA)


def _epochs(where: str, key: str) -> list:
    """[the highest epoch number of ``key`` (epochs its log crossed), its current epochs' names' capacity suffixes]."""
    from fsmingle.fs.folderstore_log import epoch_number, key_dir

    names = os.listdir(os.path.join(where, "fstore", key_dir(key)))
    return [max(map(epoch_number, names)), sorted(n.rpartition("-")[2] for n in names if "-c" in n[15:])]


def _open(kind: str, where: str, n: int, port: int, rank: int):
    t = timedelta(seconds=STORE_TIMEOUT)
    if kind == "folder":
        return folder_store_class()(os.path.join(where, "fstore"), n, timeout=t)
    if kind == "file":
        s = dist.FileStore(os.path.join(where, "filestore"), n)
        s.set_timeout(t)
        return s
    # Rank 0 hosts the server (as torch's env:// does): a server thread in the forking parent
    # would be copied mid-lock into the children (fork with threads), and hung them at N = 32.
    return dist.TCPStore("127.0.0.1", port, n, rank == 0, timeout=t, wait_for_workers=False)


def _rank(kind, where, n, port, rank, bar, q):
    try:
        counter.bind(rank)
        s = _open(kind, where, n, port, rank)
        out = {"rank": rank}

        def phase(name, fn, ops):
            bar.wait()
            c0 = dict(counter.counts[rank])
            t0 = time.monotonic()
            fn()
            dt = time.monotonic() - t0
            c1 = counter.counts[rank]
            out[name] = dt / ops
            out[name + "_meta"] = (_meta(c1) - _meta(c0)) / ops
            out[name + "_kinds"] = {k: (c1.get(k, 0) - c0.get(k, 0)) / ops for k in c1}  # mkdir: seal attempts...

        phase("set", lambda: [s.set(f"k-{rank}-{i}", b"x" * 64) for i in range(K)], K)
        phase("get", lambda: [s.get(f"k-{rank}-{i}") for i in range(K)], K)
        phase("add", lambda: [s.add("ctr", 1) for _ in range(K_ADD)], K_ADD)
        bar.wait()
        if rank == 0 and kind == "folder":
            out["add_epochs"] = _epochs(where, "ctr")  # epochs the N x K_ADD adds crossed
        if rank == 0:
            time.sleep(0.2)
            out["t_set"] = time.monotonic()
            s.set("go", "1")
        else:
            s.wait(["go"])
            out["t_woke"] = time.monotonic()
        d0 = daemon_cpu() if rank == 0 else 0.0
        bar.wait()
        out["t_arrive"], cpu0 = time.monotonic(), time.process_time()
        prof = cProfile.Profile() if PROFILE else None
        if prof:
            prof.enable()
        s.add("b", 1)  # torch's _store_based_barrier, call for call
        if prof:
            prof.disable()
            prof.dump_stats(os.path.join(PROFILE, f"rank-{rank}.prof"))
        out["t_add1"], out["cpu_add1"] = time.monotonic(), time.process_time() - cpu0
        if s.add("b", 0) == n:
            out["t_add0"] = time.monotonic()
            s.set("b-done", "1")
            out["t_done_set"] = time.monotonic()
        else:
            out["t_add0"] = time.monotonic()
        cpu1 = time.process_time()
        s.wait(["b-done"])
        out["t_released"], out["cpu_wait"] = time.monotonic(), time.process_time() - cpu1
        out["cpu_barrier"] = time.process_time() - cpu0
        bar.wait()  # nobody leaves before all are released (rank 0 hosts the TCPStore)
        if rank == 0:
            out["daemons_cpu_barrier"] = daemon_cpu() - d0  # (and the barriers' own waits around it)
            if kind == "folder":
                out["barrier_epochs"] = _epochs(where, "b")
        q.put(out)
    except BaseException as e:  # report, never hang the parent
        q.put({"rank": rank, "error": f"{type(e).__name__}: {e}"[:300]})
    finally:
        q.close()
        q.join_thread()  # put() hands the result to a feeder thread: let it finish before _exit
        os._exit(0)  # no destructors (the stores' files belong to the parent's clean-up)


def run_one(kind: str, dirs: list[str], n: int, limit: float) -> dict:
    ctx = mp.get_context("fork")
    port = 0
    if kind == "tcp":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    bar, q = ctx.Barrier(n, timeout=limit), ctx.Queue()
    ps = [ctx.Process(target=_rank, args=(kind, dirs[r % len(dirs)], n, port, r, bar, q)) for r in range(n)]
    for p in ps:
        p.start()
    outs = []
    deadline = time.monotonic() + limit
    try:
        while len(outs) < n and time.monotonic() < deadline:
            try:
                outs.append(q.get(timeout=max(0.1, deadline - time.monotonic())))
            except Exception:
                break
    finally:
        if len(outs) < n:  # hung (FileStore across bindfs mounts): no point in waiting for each
            for p in ps:
                if p.is_alive():
                    p.kill()
        for p in ps:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    errs = [o["error"] for o in outs if "error" in o]
    if errs or len(outs) < n:
        return {"error": errs[0] if errs else f"{n - len(outs)} ranks did not finish in {limit:g} s"}
    t_set = next(o["t_set"] for o in outs if "t_set" in o)
    woke = sorted(o["t_woke"] - t_set for o in outs if "t_woke" in o)
    res = {k: statistics.mean(o[k] for o in outs) for k in ("set", "get", "add")}
    if kind == "folder":
        res.update({k + "_meta": statistics.mean(o[k + "_meta"] for o in outs) for k in ("set", "get", "add")})
        res["add_kinds"] = {k: round(statistics.mean(o["add_kinds"][k] for o in outs), 2) for k in outs[0]["add_kinds"]}
        res["add_epochs"] = next(o["add_epochs"] for o in outs if "add_epochs" in o)
        res["barrier_epochs"] = next(o["barrier_epochs"] for o in outs if "barrier_epochs" in o)
    res["wait_p50"], res["wait_max"] = statistics.median(woke), woke[-1]
    res["barrier"] = max(o["t_released"] for o in outs) - max(o["t_arrive"] for o in outs)
    res["timeline"] = timeline(outs)
    return res


def _q(xs: list[float]) -> list[float]:
    xs = sorted(xs)
    return [round(xs[int(f * (len(xs) - 1))], 4) for f in (0.0, 0.5, 0.9, 1.0)]


def timeline(outs: list[dict]) -> dict:
    """Where a barrier's time goes: per-rank moments (seconds after the last arrival; min / p50 / p90 / max)
    of add(b, 1) done, add(b, 0) done, the b-done set, the wake; and the ranks' CPU seconds in the barrier."""
    t0 = max(o["t_arrive"] for o in outs)
    done = next(o["t_done_set"] for o in outs if "t_done_set" in o)
    return {
        "arrive": _q([o["t_arrive"] - t0 for o in outs]),
        "add1": _q([o["t_add1"] - t0 for o in outs]),
        "add0": _q([o["t_add0"] - t0 for o in outs]),
        "done_set": round(done - t0, 4),
        "woke": _q([o["t_released"] - t0 for o in outs]),
        "wake_after_set": _q([o["t_released"] - done for o in outs]),
        "ranks_cpu_s": round(sum(o["cpu_barrier"] for o in outs), 2),
        "ranks_cpu_add1_s": round(sum(o["cpu_add1"] for o in outs), 2),
        "ranks_cpu_wait_s": round(sum(o["cpu_wait"] for o in outs), 2),
        "daemons_cpu_s": round(next(o["daemons_cpu_barrier"] for o in outs if "daemons_cpu_barrier" in o), 2),
    }


def bindfs_stats() -> Iterator[list[str]]:
    """The fields after the command in ``/proc/<pid>/stat`` of every bindfs daemon on the machine (the benchmark's
    mounts' FUSE servers); a process gone between the listing and the read is skipped."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        if st[st.index("(") + 1 : st.rindex(")")] == "bindfs":
            yield st[st.rindex(")") + 2 :].split()


def daemon_cpu() -> float:
    """CPU seconds (user + system) of every bindfs daemon on the machine."""
    tck = os.sysconf("SC_CLK_TCK")
    return sum(((int(fields[11]) + int(fields[12])) / tck for fields in bindfs_stats()), 0.0)  # 0.0 when none


def waiting_cost(where: str, seconds: float = 6.0) -> dict:
    """Metadata operations per second of one rank waiting on a missing key (FolderStore counted in-process)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def waiter():
        import threading

        counter.bind(9999)
        s = folder_store_class()(os.path.join(where, "fstore-wait"), 1)
        snaps = [dict(counter.counts[9999])]
        # A second snapshot after 1 s: the first second holds the backoff's ramp from 2 ms.
        threading.Timer(1.0, lambda: snaps.append(dict(counter.counts[9999]))).start()
        try:
            s.wait(["never"], timedelta(seconds=seconds))
        except dist.DistStoreError:
            pass
        snaps.append(dict(counter.counts[9999]))
        q.put({"first": _meta(snaps[1]) - _meta(snaps[0]), "steady": (_meta(snaps[2]) - _meta(snaps[1]))})
        q.close()
        q.join_thread()
        os._exit(0)

    p = ctx.Process(target=waiter)
    p.start()
    c = q.get(timeout=seconds + 30)
    p.join()
    return {"folder_meta_first_s": c["first"], "folder_meta_per_s_after": c["steady"] / (seconds - 1.0)}


FILESTORE_WAIT = """
import sys, datetime, torch.distributed as d
s = d.FileStore(sys.argv[1], 1)
try:
    s.wait(["never"], datetime.timedelta(seconds=float(sys.argv[2])))
except Exception:
    pass
"""


def filestore_waiting_cost(where: str, seconds: float = 3.0) -> dict | None:
    """openat + flock calls per second of one FileStore rank waiting on a missing key (strace -f -c)."""
    if not shutil.which("strace"):
        return None
    log = os.path.join(where, "strace.txt")
    path = os.path.join(where, "filestore-wait")
    cmd = ["strace", "-f", "-c", "-o", log, "-e", "trace=openat,flock,fstat,lseek,read", sys.executable, "-c"]
    # The import costs thousands of openat: count a waiting of `seconds` minus one of 0 s.
    counts = []
    for s in (0.001, seconds):  # 0 would mean "no timeout"
        subprocess.run([*cmd, FILESTORE_WAIT, path, str(s)], capture_output=True, timeout=120)
        c = {}
        for line in open(log).read().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-1] in ("openat", "flock", "fstat", "lseek", "read"):
                c[parts[-1]] = int(parts[3])
        counts.append(c)
        if os.path.exists(path):
            os.unlink(path)
    return {k: (counts[1].get(k, 0) - counts[0].get(k, 0)) / (seconds - 0.001) for k in ("openat", "flock")}


def _load(r: dict) -> str:
    return " / ".join(f"{x:.1f}" for x in r.get("load", ()))


def table(results: dict) -> str:
    ms = lambda v: f"{v * 1e3:.2f}"
    lines = [
        "| filesystem | N | store | set ms | get ms | add ms (N contend) | wait wake p50 / max ms | barrier ms "
        "| metadata ops per set / get / add | load before / after |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for fsname, by_n in results["runs"].items():
        for n, by_store in by_n.items():
            for kind, r in by_store.items():
                if "error" in r:
                    lines.append(f"| {fsname} | {n} | {kind} | failed: {r['error'][:80]} | | | | | | {_load(r)} |")
                    continue
                meta = f"{r['set_meta']:.1f} / {r['get_meta']:.1f} / {r['add_meta']:.1f}" if "set_meta" in r else "n/a"
                lines.append(
                    f"| {fsname} | {n} | {kind} | {ms(r['set'])} | {ms(r['get'])} | {ms(r['add'])} "
                    f"| {ms(r['wait_p50'])} / {ms(r['wait_max'])} | {ms(r['barrier'])} | {meta} | {_load(r)} |"
                )
    ratios = []
    for fsname, by_n in results["runs"].items():
        for n, by_store in by_n.items():
            fo, fi = by_store.get("folder", {}), by_store.get("file", {})
            if "barrier" in fo and "barrier" in fi:
                ratios.append(
                    f"- {fsname} N={n}: FolderStore / FileStore, same run: barrier {fo['barrier'] / fi['barrier']:.2f}x, "
                    f"wait wake p50 {fo['wait_p50'] / fi['wait_p50']:.2f}x"
                )
    return "\n".join(lines) + "\n" + ("\n" + "\n".join(ratios) + "\n" if ratios else "")


def main() -> None:
    global K, K_ADD, STORE_TIMEOUT, PROFILE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="2,8,32,64", help="rank counts, comma-separated")
    ap.add_argument("--fs", default="local,bindfs", help="filesystems: local, bindfs (1 s caches), bindfs2, bindfs5")
    ap.add_argument("--k", type=int, default=K, help="set/get ops per rank")
    ap.add_argument("--k-add", type=int, default=K_ADD, help="adds per rank on the one shared counter")
    ap.add_argument("--stores", default=",".join(STORES))
    ap.add_argument("--mounts", type=int, default=4, help="bindfs mounts (simulated nodes); rank r uses r %% mounts")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds one (filesystem, store, N) may take")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--no-strace", action="store_true")
    ap.add_argument(
        "--profile",
        metavar="DIR",
        help="cProfile each rank's barrier add(b, 1) into DIR/rank-<r>.prof (the profiler slows it: its timings "
        "compare only with each other; python -m benchmarks.profile_adds DIR sums them)",
    )
    a = ap.parse_args()
    K, K_ADD, STORE_TIMEOUT, PROFILE = a.k, a.k_add, a.limit, a.profile  # read by the forked ranks
    if PROFILE:
        os.makedirs(PROFILE, exist_ok=True)
    install_counting_os(counter)
    ns = [int(x) for x in a.n.split(",")]
    results: dict = {"k": K, "k_add": K_ADD, "cpus": os.cpu_count(), "runs": {}}
    for fsname in a.fs.split(","):
        root = tempfile.mkdtemp(prefix=f"fsmingle-fstore-{fsname}-")
        mounts = None
        try:
            if fsname == "local":
                dirs = [root]
            else:
                why = bindfs_unavailable_reason()
                if why:
                    print(f"skipping {fsname}: {why}", file=sys.stderr)
                    continue
                mounts = MountSet(root, a.mounts, FS_OPTS[fsname])
                dirs = mounts.mounts
            for n in ns:
                for kind in a.stores.split(","):
                    run_dirs = []
                    for d in dirs:  # a fresh store per run: the mounts share one backing directory
                        run_dirs.append(os.path.join(d, f"run-{kind}-{n}"))
                    os.makedirs(os.path.join(mounts.backing if mounts else root, f"run-{kind}-{n}"), mode=0o700)
                    load = os.getloadavg()[0]  # the machine is shared: every figure is reported beside it
                    t0, d0 = time.monotonic(), daemon_cpu()
                    # FileStore across bindfs mounts hangs (flock and its cached file size are
                    # per mount): 30 s is plenty where it finishes in 5 s on a local disk.
                    limit = min(a.limit, 30.0) if kind == "file" and fsname != "local" else a.limit
                    r = run_one(kind, run_dirs, n, limit)
                    r["load"] = [load, os.getloadavg()[0]]
                    r["daemons_cpu_s"] = round(daemon_cpu() - d0, 2)  # the whole run's (all phases), not the barrier's
                    print(f"{fsname} N={n} {kind}: {time.monotonic() - t0:.1f} s {r}", file=sys.stderr, flush=True)
                    results["runs"].setdefault(fsname, {}).setdefault(str(n), {})[kind] = r
            results.setdefault("waiting", {})[fsname] = waiting_cost(dirs[0])
            if not a.no_strace and fsname == "local":
                results["waiting"]["filestore_local_syscalls_per_s"] = filestore_waiting_cost(root)
        finally:
            if mounts:
                mounts.close()
            shutil.rmtree(root, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = table(results) + "\nWaiting rank (one missing key): " + json.dumps(results.get("waiting", {})) + "\n"
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(a.out, "command.txt"), "w") as f:
        f.write("python -m benchmarks.bench_folderstore " + " ".join(sys.argv[1:]) + "\n")
    print(md)


if __name__ == "__main__":
    main()
