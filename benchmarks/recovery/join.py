"""``python -m benchmarks.recovery.join``: a torchrun JOIN, ``--rdzv-backend fsmingle`` against ``c10d``.

N ``torchrun --nnodes N --nproc-per-node 1`` agents start at once on one address (127.0.0.1), with
the recovery benchmark's runner (:class:`benchmarks.recovery.harness.Run`, torch's default
timeouts: keep-alive 5 s x 3, ``read_timeout`` 60 s); the workers' entrypoint is this module's
``line``, whose first line logs the time.  Measured, in seconds after the first agent was started
(``time.time()``, one machine), the latest over the N agents or workers of:

* **agents up**: the agent imported torchrun (and, for fsmingle, its handler) and is about to
  rendezvous (``agent`` below, before ``torch.distributed.run.main``);
* **round in**: the agent entered torch's ``next_rendezvous`` (its handler made);
* **round**: torch's ``DynamicRendezvousHandler.next_rendezvous`` returned (the round complete and
  the agent's store connected; both backends use that handler);
* **confirmed** (fsmingle): the confirmation round (``fsmingle/torchrun/reach.py``
  ``confirm_round``) returned ``ok``; its duration on rank 0 (which starts first: it hosts the
  store the others look up) and the time it adds after the last agent's round;
* **first line**: every worker ran its first line -- the JOIN.

``after agents up`` = first line - agents up: what the rendezvous costs once every agent is there
(the import of torch by N agents on a shared machine is most of the rest, the same for both).

``agent`` and ``line`` are this module's sub-commands used by the runs themselves.
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = time.time()  # the worker's first line (``line``): before any import of the benchmark's


def _say(**kw) -> None:
    with open(os.environ["BENCH_LOG"], "a") as f:  # O_APPEND: agent and worker share a node's log
        f.write(json.dumps({"t": time.time(), "pid": os.getpid(), **kw}) + "\n")


def line() -> None:
    """The workers' entrypoint: log the first line's time, then wait to be killed (an exit would end the run)."""
    _say(ev="first", t=T0, rank=int(os.environ.get("RANK", "-1")))
    time.sleep(600)


def agent(argv: list[str]) -> None:
    """``torchrun argv...`` with its round and (fsmingle) its confirmation timed into ``$BENCH_LOG``."""
    import torch.distributed.run as run
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    base = dr.DynamicRendezvousHandler.next_rendezvous

    def timed_round(self):
        t = time.time()
        info = base(self)
        _say(ev="round", t_in=t, rank=info.rank)
        return info

    dr.DynamicRendezvousHandler.next_rendezvous = timed_round
    if "fsmingle" in argv:
        import fsmingle.torchrun.handler as h

        confirm = h.confirm_round

        def timed_confirm(store, rank, world_size, bound_s):
            t = time.time()
            verdict = confirm(store, rank, world_size, bound_s)
            _say(ev="confirm", s=time.time() - t, rank=rank, verdict=verdict)
            return verdict

        h.confirm_round = timed_confirm
    _say(ev="agent")
    run.main(argv)


def one_join(path: str, n: int, limit_s: float = 300.0, min_free_gb: float = 3.0) -> dict:
    """One JOIN of ``n`` agents on ``path`` (``torchrun-fsmingle`` or ``torchrun-c10d``): its row.

    The run is given up (``ok`` False) after ``limit_s`` seconds, or as soon as the machine's available
    memory falls below ``min_free_gb`` GiB (the machine is shared: its other users come first)."""
    import shutil
    import tempfile
    from pathlib import Path

    import psutil

    from .harness import Run, _tree

    work = Path(tempfile.mkdtemp(prefix=f"join-{path}-{n}-"))
    work.chmod(0o755)
    r = Run(path, n, "kill", work, stale_after=10.0, pg_timeout=10.0)
    r.launcher = ["-m", "benchmarks.recovery.join", "agent"]
    r.entry = ["-m", "benchmarks.recovery.join", "line"]
    r.timeouts = False  # torch's defaults, as a user runs it
    row: dict = dict(path=path, n=n)
    try:
        t0 = time.time()
        for i in range(n):
            r.start_node(i)

        def firsts():
            return [e for _i, e in r.events() if e.get("ev") == "first"]

        end = time.monotonic() + limit_s
        low = False
        while len(firsts()) < n and time.monotonic() < end and not r._all_exited(-1):
            low = psutil.virtual_memory().available < min_free_gb * 2**30
            if low:
                break
            time.sleep(0.1)
        evs = [e for _i, e in r.events()]
        row["mem_gb"] = round(sum(_rss(q) for p in r.procs for q in _tree(p.pid)) / 2**30, 2)
        if low:
            return dict(row, ok=False, note=f"given up: less than {min_free_gb:g} GiB of memory available")
        if len(firsts()) < n:
            return dict(row, ok=False, note=f"{len(firsts())}/{n} workers started within {limit_s:g} s\n{r._why()}")

        def last(ev, key="t"):
            ts = [e[key] for e in evs if e.get("ev") == ev]
            return round(max(ts) - t0, 3) if ts else None

        conf = [e for e in evs if e.get("ev") == "confirm"]
        row.update(
            ok=True,
            agents_up=last("agent"),
            round_in=last("round", "t_in"),
            round=last("round"),
            confirmed=last("confirm"),
            join=last("first"),
            confirm_rank0=round(max((e["s"] for e in conf if e["rank"] == 0), default=0), 3) if conf else None,
            confirm_max=round(max(e["s"] for e in conf), 3) if conf else None,
            redo=sum(e["verdict"] != "ok" for e in conf),
            rounds=sum(e.get("ev") == "round" for e in evs),
        )
        row["after_agents"] = round(row["join"] - row["agents_up"], 3)
        if conf:  # what the confirmation adds once the last agent's round is over
            row["confirm_after_round"] = round(row["confirmed"] - row["round"], 3)
        return row
    finally:
        r.close()
        shutil.rmtree(work, ignore_errors=True)


def _rss(q) -> int:
    try:
        return q.memory_info().rss
    except Exception:  # psutil.Error: the process ended
        return 0


def markdown(rows: list[dict]) -> str:
    from .table import median as med
    from .table import two_places as f

    lines = [
        "| N | path | runs ok | agents up (s) | round (s) | confirmed (s) | every worker's first line (s) | "
        "after agents up (s) | confirm: on rank 0 / after the last round (s) | fsmingle / c10d: first line, after agents up | "
        "load | RSS of every process (GiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sorted({r["n"] for r in rows}):
        meds = {}
        for path in ("torchrun-c10d", "torchrun-fsmingle"):
            rs = [r for r in rows if (r["n"], r["path"]) == (n, path)]
            if not rs:
                continue
            ok = [r for r in rs if r["ok"]]
            m = {k: med(r.get(k) for r in ok) for k in ("agents_up", "round", "confirmed", "join", "after_agents")}
            meds[path] = m
            ratio = "—"
            c = meds.get("torchrun-c10d")
            if path == "torchrun-fsmingle" and c and m["join"] and c["join"]:
                ratio = f"{m['join'] / c['join']:.2f}x, {m['after_agents'] / c['after_agents']:.2f}x"
            confirm = "—"
            if path == "torchrun-fsmingle" and ok:
                confirm = (
                    f"{f(med(r['confirm_rank0'] for r in ok))} / {f(med(r.get('confirm_after_round') for r in ok))}"
                )
            lines.append(
                f"| {n} | {path} | {len(ok)}/{len(rs)} | {f(m['agents_up'])} | {f(m['round'])} | "
                f"{f(m['confirmed'])} | {f(m['join'])} | {f(m['after_agents'])} | {confirm} | {ratio} | "
                f"{f(med(r['load'] for r in rs))} | {f(med(r.get('mem_gb') for r in rs))} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import argparse

    from .table import printed_rows, write_results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.recovery.join", description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="8,16,32", help="agent counts, comma-separated")
    ap.add_argument("--reps", type=int, default=2, help="runs of each path at each N (alternating c10d first)")
    ap.add_argument("--limit-s", type=float, default=300.0, help="give up on a run after this many seconds")
    ap.add_argument("--min-free-gb", type=float, default=3.0, help="give a run up below this much available memory")
    ap.add_argument("--out", default=None, help="directory for results.json and results.md")
    ap.add_argument("--from-log", default=None, help="no runs: the table from the JSON rows a run printed")
    a = ap.parse_args(argv)
    rows = []
    if a.from_log:
        rows = printed_rows(a.from_log)
    else:
        for n in [int(x) for x in a.n.split(",")]:
            for rep in range(a.reps):
                paths = ["torchrun-c10d", "torchrun-fsmingle"]
                for path in paths if rep % 2 == 0 else paths[::-1]:
                    load = os.getloadavg()[0]
                    row = one_join(path, n, a.limit_s, a.min_free_gb)
                    row.update(rep=rep, load=round(load, 2), when=time.strftime("%H:%M:%S", time.gmtime()))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    table = markdown(rows)
    print(table)
    if a.out:
        write_results(a.out, rows, table)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["line"]:
        line()
    elif sys.argv[1:2] == ["agent"]:
        agent(sys.argv[2:])
    else:
        raise SystemExit(main(sys.argv[1:]))
