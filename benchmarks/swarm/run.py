"""One run of the swarm benchmark: spawn the swarm processes, drive a scenario, collect the figures.

Layout: rank 0's process holds participant 0 alone (it starts first, so it creates the
generation and takes rank 0 -- its process CPU is rank 0's CPU, and its thousands of sockets
have a process's whole open-file limit); the N - 2 early members are spread over ``procs``
swarm processes (each member costs two descriptors: its socket and its channel's epoll); the
last participant has a process of its own, as in :mod:`benchmarks.rdzv`.

Scenarios:

* ``last`` (as :mod:`benchmarks.rdzv`): rank 0, then the N - 2 early members together; once rank
  0 sees N - 1 present, ``settle`` seconds (the waiting window is counted in its middle), then
  the last participant; **last→all** is its arrival to the last release.
* ``cold``: rank 0, then all N - 1 others at once; **go→all** to the last release.
* ``storm`` (issue 31, item 4): as ``last`` up to the settle; then one member (it holds a claim
  and a verified connection) is killed, and at once restarted (a fresh participant, as a node
  that comes back) while the last participant arrives; **kill→all**: the kill to the last
  release of the next generation.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from ..rdzv.common import REPO, RunError, participant_addr
from ..rdzv.fsops import diff_counts
from ..rdzv.harness import _ops_summary


def groups_for(n: int, procs: int) -> list[list[int]]:
    """[[0], early members over ``procs`` processes..., [n - 1]]."""
    if n < 3:
        raise ValueError("the swarm needs N >= 3")
    procs = max(1, min(procs, n - 2))
    mid: list[list[int]] = [[] for _ in range(procs)]
    for i, p in enumerate(range(1, n - 1)):
        mid[i % procs].append(p)
    return [[0], *mid, [n - 1]]


def run_once(
    n: int,
    scenario: str = "last",
    *,
    procs: int = 2,
    sources: str = "own",
    unauth_cap: int | None = None,
    settle: float = 4.0,
    timeout: float = 300.0,
    nice: int = 0,
    root: str | None = None,
    timing: dict | None = None,
    profile: str | None = None,
    sample: str | None = None,
    log=print,
) -> dict:
    """One repetition; returns its measurements (keys as :func:`benchmarks.rdzv.harness.run_once`'s,
    plus ``rank0_cpu_*``, ``swarm`` process statistics and, for ``storm``/``cold``, their times).

    Raises:
        RunError: a phase timed out, a process died or a participant failed.
    """
    groups = groups_for(n, procs)
    base = tempfile.mkdtemp(prefix="swarm-", dir=root)
    job_id = f"swarm-n{n}-{uuid.uuid4().hex[:8]}"
    cfg = {
        "nnodes": n,
        "job_id": job_id,
        "dir": base,
        "addrs": [participant_addr(p) for p in range(n)],
        "rdzv_timeout": float(timeout),
        "groups": groups,
        "sources": sources,
        "unauth_cap": unauth_cap,
        "timing": timing or {},
        "profile": profile and os.path.abspath(profile),
        "sample": sample and os.path.abspath(sample),
    }
    cfg_path = f"{base}.json"
    with open(cfg_path, "w") as fh:
        json.dump(cfg, fh)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    evq: queue.Queue = queue.Queue()
    procs_: list[subprocess.Popen] = []
    owner = {p: g for g, grp in enumerate(groups) for p in grp}
    st: dict[str, Any] = {"ready": {}, "released": {}, "errors": {}, "counts": {}, "stats": {}, "eof": set()}
    loadavg = os.getloadavg()

    def reader(i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("@@ "):
                evq.put((i, json.loads(line[3:])))
        evq.put((i, {"ev": "eof"}))

    def send(i: int, line: str) -> None:
        procs_[i].stdin.write(line + "\n")
        procs_[i].stdin.flush()

    def pump(until, limit: float, what: str) -> None:
        deadline = time.monotonic() + limit
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunError(f"timed out after {limit:.0f} s waiting for {what}")
            try:
                i, ev = evq.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            k = ev["ev"]
            if k in ("ready", "rank0", "world_ready", "killed"):
                st.setdefault(k, ev) if k != "ready" else st["ready"].__setitem__(i, ev)
            elif k == "released":
                st["released"][ev["p"]] = ev
            elif k == "counts":
                if i == 0:
                    st.setdefault("cpu0", {})[ev["tag"]] = (ev["t"], ev["cpu"])
                    st.setdefault("sys0", {})[ev["tag"]] = ev.get("sys")
                st["counts"].setdefault(ev["tag"], {}).update(ev["counts"])
                st["counts"].setdefault(ev["tag"] + "@t", []).append(ev["t"])
            elif k == "stats":
                st["stats"][i] = ev
            elif k == "error":
                st["errors"][ev["p"]] = ev["error"]
                raise RunError(f"participant {ev['p']} failed:\n{ev['error']}")
            elif k == "fatal":
                raise RunError(f"swarm process {i} failed:\n{ev['error']}")
            elif k == "eof":
                st["eof"].add(i)

    t_spawn = time.monotonic()
    res: dict[str, Any] = {}
    try:
        for i in range(len(groups)):
            cmd = [sys.executable, "-m", "benchmarks.swarm.driver", cfg_path, str(i)]
            if nice and 0 < i < len(groups) - 1:
                cmd = ["nice", "-n", str(nice), *cmd]  # rank 0's process keeps the scheduler's favour
            errf = open(f"{base}-{i}.stderr", "w")
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, text=True, env=env, cwd=REPO, bufsize=1
            )
            procs_.append(proc)
            threading.Thread(target=reader, args=(i, proc), daemon=True).start()
        pump(lambda: len(st["ready"]) == len(groups) or st["eof"], 120, "swarm processes to start")
        if st["eof"]:
            raise RunError(f"a swarm process exited at start (see {base}-*.stderr)")
        send(0, "go")
        pump(lambda: "rank0" in st, 60, "participant 0 to take rank 0")
        t_go = time.monotonic()
        last = len(groups) - 1
        for i in range(1, last + (scenario == "cold")):
            send(i, "go")
        if scenario == "cold":
            pump(lambda: len(st["released"]) == n, timeout, "all participants to be released")
        else:
            pump(lambda: "world_ready" in st, timeout, "rank 0 to see the N - 1 early participants")
            t_joined = time.monotonic()
            warm = min(1.0, settle * 0.25)
            pump(lambda: time.monotonic() - t_joined >= warm, warm + 5, "warm-up")
            for i in range(last):
                send(i, "snap a")
            pump(lambda: time.monotonic() - t_joined >= settle - 0.5, settle + 5, "window")
            for i in range(last):
                send(i, "snap b")
            pump(lambda: len(st["counts"].get("b@t", [])) == last, 60, "operation counts")
            pump(lambda: time.monotonic() - t_joined >= settle, settle + 5, "settle")
            if st["released"]:
                raise RunError(f"{len(st['released'])} participants released before the last arrived")
            if scenario == "storm":
                victim = 1
                send(owner[victim], "kill 1")
                pump(lambda: "killed" in st, 30, "the kill")
                send(owner[victim], "go 1")  # the node comes back at once: a fresh participant
            send(0, "snap pre")
            pump(lambda: "pre" in st.get("cpu0", {}), 30, "rank 0's CPU before the last arrival")
            send(last, "go")
            pump(lambda: len(st["released"]) == n, timeout, "all participants to be released")
            res["go_to_joined_s"] = t_joined - t_go
            ta, tb = min(st["counts"]["a@t"]), max(st["counts"]["b@t"])
            res["window"] = {
                "seconds": tb - ta,
                "per_participant": {
                    p: diff_counts(st["counts"]["a"].get(p, {}), c) for p, c in st["counts"]["b"].items()
                },
            }
        t_end = time.monotonic()
        for i in range(len(groups)):
            send(i, "stats")
        pump(lambda: len(st["stats"]) == len(groups), 60, "process statistics")
    finally:
        for i in range(len(procs_)):
            try:
                send(i, "exit")
            except Exception:
                pass
        for proc in procs_:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)
    for i in range(len(groups)):  # the processes' stderr beside it: kept only when the run failed
        path = f"{base}-{i}.stderr"
        if os.path.exists(path):
            os.unlink(path)
    os.unlink(cfg_path)
    return _results(n, scenario, st, res, t_go, t_spawn, t_end, groups, sources, unauth_cap, nice, loadavg, log)


def _results(n, scenario, st, res, t_go, t_spawn, t_end, groups, sources, unauth_cap, nice, loadavg, log) -> dict:
    rel = st["released"]
    problems = []
    ranks = sorted(rel[p]["rank"] for p in range(n))
    if ranks != list(range(n)):
        problems.append(f"ranks are not a permutation of 0..{n - 1}")
    if {rel[p]["world"] for p in range(n)} != {n}:
        problems.append("world size differs from N")
    if len({(rel[p]["master_addr"], rel[p]["master_port"]) for p in range(n)}) != 1:
        problems.append("more than one master")
    if rel[0]["rank"] != 0 and scenario != "storm":  # after a void, rank 0 is whoever wins the race
        problems.append("participant 0 is not rank 0: rank 0's CPU below is not its process's")
    t_last_rel = max(rel[p]["t_rel"] for p in range(n))
    out: dict[str, Any] = {
        "backend": "fsmingle-swarm",
        "fs": "local",
        "n": n,
        "scenario": scenario,
        "procs": len(groups),
        "max_threads_per_proc": max(len(g) for g in groups),
        "sources": sources,
        "unauth_cap": unauth_cap,
        "unauth_cap_shipped": st["stats"][0].get("cap_shipped"),
        "nice_members": nice,
        "loadavg_at_start": loadavg,
        "wall_s": t_end - t_spawn,
        "generations": sorted({rel[p]["generation"] for p in range(n)}),
        "valid": not problems,
        "problems": problems,
        "fsops": None,
        **res,
    }
    if scenario == "cold":
        out["go_to_all_s"] = t_last_rel - t_go
        t_ref = t_go
    else:
        t_ref = rel[n - 1]["t_arr"]
        out["last_own_s"] = rel[n - 1]["t_rel"] - t_ref
    after = [rel[p]["t_rel"] - t_ref for p in range(n)]
    out["last_all_s"] = max(after)
    out["last_own_s"] = out.get("last_own_s", out["last_all_s"])
    out["waiters_after_last_s"] = after[:-1]
    out["go_to_joined_s"] = res.get("go_to_joined_s", out["last_all_s"])
    if scenario == "storm":
        out["kill_to_all_s"] = t_last_rel - st["killed"]["t"]
        out["killed"] = {k: st["killed"][k] for k in ("gen", "rank", "state")}
    out["ops"] = _ops_summary(rel, n, res.get("window"))
    cpu_rel = rel[0]["cpu"]
    cpu_ready = st.get("world_ready", {}).get("cpu")
    out["rank0_cpu_s"] = cpu_rel
    out["rank0_cpu_us_per_member"] = 1e6 * cpu_rel / n
    c0 = st.get("cpu0", {})
    if cpu_ready is not None and "pre" in c0:
        # Rank 0's work for the world: gathering (go -> N - 1 present) plus the release (the last
        # arrival -> its own release); the waiting in between is its own figure (pings, per second).
        (ta, ca), (tb, cb) = c0["a"], c0["b"]
        out["rank0_cpu_join_s"] = cpu_ready
        out["rank0_cpu_release_s"] = cpu_rel - c0["pre"][1]
        out["rank0_cpu_us_per_member"] = 1e6 * (cpu_ready + out["rank0_cpu_release_s"]) / n
        out["rank0_cpu_waiting_per_s"] = (cb - ca) / (tb - ta) if tb > ta else None
        sys_ready, sys_pre = st["world_ready"].get("sys"), st.get("sys0", {}).get("pre")
        if sys_ready is not None and sys_pre is not None and rel[0].get("sys") is not None:
            # The kernel's part (system calls: accept, send, recv, epoll, file reads) of the same figure.
            out["rank0_sys_us_per_member"] = 1e6 * (sys_ready + rel[0]["sys"] - sys_pre) / n
    out["swarm"] = {str(i): {k: v for k, v in s.items() if k not in ("ev",)} for i, s in st["stats"].items()}
    lags = [s.get("lag_p99") or 0 for i, s in st["stats"].items() if 0 < int(i) < len(groups) - 1]
    o = out["ops"]
    log(
        f"  swarm N={n} {scenario}: last->all {out['last_all_s']:.3f}s"
        + (f"  kill->all {out['kill_to_all_s']:.3f}s" if scenario == "storm" else "")
        + f"  gens {out['generations']}  rank0 cpu {out['rank0_cpu_us_per_member']:.0f} us/member"
        + (f" ({out['rank0_sys_us_per_member']:.0f} system)" if "rank0_sys_us_per_member" in out else "")
        + f"  fs ops/participant {o['fs_ops_mean']:.1f} (rank 0 {o['fs_ops_rank0']})"
        + f"  member-proc lag p99 {max(lags) if lags else 0:.3f}s  wall {out['wall_s']:.0f}s"
        + ("" if not problems else f"  INVALID: {problems}")
    )
    return out
