"""Keep-alive load of ``torchrun --rdzv-backend fsmingle`` with 1,024 simulated agents.

Every agent is a real handler made by the backend's own creator
(``create_rdzv_handler``) on a real directory, run as a thread; the agents
are spread over several processes.  The run starts right after a completed
round of all agents (the state a 1,024-node ``next_rendezvous`` leaves
behind, written directly so the benchmark measures the steady state, not a
1,024-way join), then for ``--duration`` seconds:

* each agent's keep-alive runs as in torchrun: ``_start_heartbeats()``
  (torch's keep-alive timer for ``before``, the heartbeat-file writer for
  ``after``);
* each agent is polled like torchrun's monitor loop polls it,
  ``num_nodes_waiting()``, every ``--poll`` seconds (torchrun polls every
  0.1 s with a 1 s state cache; scaled down so 1,024 agents fit 2 cores);
* a *spurious re-rendezvous* is counted when a live agent would leave its
  round: it sees ``num_nodes_waiting() > 0`` (torchrun restarts the workers),
  finds itself dropped from the participants (judged dead), or sees the
  round change.

Reported: writes/s of the shared compare-and-set state (versions created),
compare-and-set attempts that lost, heartbeat-file writes/s, torch's
"failed to send a keep-alive heartbeat" warnings, spurious re-rendezvous,
and (``after``) how an outside observer judges the agents (a new agent's
view: members it would call dead, oldest heartbeat age).

``before`` is the single-module backend before keep-alives moved out of the
shared state, loaded from git (``--before-rev``).  Example::

    python benchmarks/bench_torchrun_keepalive.py --impl after --duration 180
    python benchmarks/bench_torchrun_keepalive.py --impl before --duration 60 --report benchmarks/results/torchrun-keepalive.md
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_ID = "bench"


def load_impl(impl: str, before_rev: str):
    """``(create_rdzv_handler, FsRendezvousBackend)`` of ``after`` (this tree) or ``before`` (git)."""
    if impl == "after":
        from fsmingle.torchrun.backend import FsRendezvousBackend
        from fsmingle.torchrun.handler import create_rdzv_handler

        return create_rdzv_handler, FsRendezvousBackend
    src = subprocess.check_output(["git", "-C", str(REPO), "show", f"{before_rev}:fsmingle/torchrun_backend.py"])
    name = "fsmingle._torchrun_before"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "fsmingle"  # its relative imports resolve to this tree's fsmingle modules
    sys.modules[name] = mod
    # Our own repository's code at a revision the caller names: trusted.
    exec(compile(src, f"{before_rev}:fsmingle/torchrun_backend.py", "exec"), mod.__dict__)
    # It had its own copy of the schema version, since bumped in records.py
    # (the duplication the package removed): write what this tree reads.
    from fsmingle.fs.records import SCHEMA_VERSION

    mod.SCHEMA_VERSION = SCHEMA_VERSION
    return mod.create_rdzv_handler, mod.FsRendezvousBackend


def _params(endpoint: str, n: int, a):
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    return RendezvousParameters(
        backend="fsmingle",
        endpoint=endpoint,
        run_id=RUN_ID,
        min_nodes=n,
        max_nodes=n,
        addr="127.0.0.1",
        keep_alive_interval=a.interval,
        keep_alive_max_attempt=a.max_attempt,
        join_timeout=600,
    )


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.keepalive_failed = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "failed to send a keep-alive heartbeat" in record.getMessage():
            self.keepalive_failed += 1


def _count(obj, name: str, stats: dict, key: str) -> None:
    orig = getattr(obj, name)
    lock = threading.Lock()

    def wrapped(*args, **kw):
        r = orig(*args, **kw)
        with lock:
            stats[key] += 1
            if name == "set_state" and r is not None and not r[2]:
                stats["cas_lost"] += 1
        return r

    setattr(obj, name, wrapped)


def _hb(handlers) -> int:
    return sum(getattr(getattr(h, "_beats", None), "writes", 0) for h in handlers)


def worker(idx: int, n_local: int, n_total: int, endpoint: str, a, conn) -> None:
    """One process hosting ``n_local`` agents (threads)."""
    logging.basicConfig(level=logging.ERROR)
    warn = _Warnings()
    logging.getLogger().addHandler(warn)
    logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous").setLevel(logging.WARNING)
    create, _ = load_impl(a.impl, a.before_rev)
    stats = {"get_state": 0, "set_state": 0, "cas_lost": 0}
    handlers = [create(_params(endpoint, n_total, a)) for _ in range(n_local)]
    for h in handlers:
        _count(h._fs_backend, "get_state", stats, "get_state")
        _count(h._fs_backend, "set_state", stats, "set_state")

    def start_keepalives() -> None:
        # Spread over one interval, as agents finish a 1,024-way join at different moments.
        for h in handlers:
            time.sleep(a.interval / n_local)
            h._start_heartbeats()

    # Keep-alives start where a real join starts them: after, the heartbeat
    # file exists before the node enters the state; before, torch's timer
    # starts once the node has the completed round.
    if a.impl == "after":
        start_keepalives()
    conn.send([[h._this_node.addr, h._this_node.pid, h._this_node.local_id] for h in handlers])
    conn.recv()  # the completed round is on disk
    for h in handlers:
        h._state_holder.sync()  # what next_rendezvous leaves: the round's state
    round0 = handlers[0]._state_holder.state.round
    events = {"waiting": set(), "dropped": set(), "round_changed": set()}
    stop = threading.Event()

    def monitor() -> None:
        i = 0
        while not stop.wait(a.poll / n_local):
            h = handlers[i % n_local]
            i += 1
            try:
                w = h.num_nodes_waiting()
            except Exception as e:  # counted, the run goes on
                events.setdefault("errors", set()).add(f"{type(e).__name__}: {e}")
                continue
            st = h._state_holder.state
            if w > 0:
                events["waiting"].add(i % n_local)
            if h._this_node not in st.participants:
                events["dropped"].add(i % n_local)
            if st.round != round0:
                events["round_changed"].add(i % n_local)

    conn.send("ready")
    conn.recv()  # measure from here (the state's heartbeat times were just refreshed)
    for h in handlers:
        h._state_holder._last_sync_time = -1  # torch's 1 s cache: read the refreshed state next
        if hasattr(h, "_beats"):
            h._beats.max_gap = 0.0  # count beat gaps from here, not during start-up
    base = {"hb": _hb(handlers), **stats}
    if a.impl == "before":
        threading.Thread(target=start_keepalives, daemon=True).start()
    threading.Thread(target=monitor, daemon=True).start()
    conn.recv()  # stop
    stop.set()
    for h in handlers:
        if a.impl == "after":
            h._beats.stop(remove=False)
        else:
            h._stop_heartbeats()
    hb = _hb(handlers) - base["hb"]
    gaps = sorted(getattr(getattr(h, "_beats", None), "max_gap", 0.0) for h in handlers)
    stats = {k: v - base[k] for k, v in stats.items()}
    reads = sum(getattr(getattr(h._fs_backend, "view", None), "reads", 0) for h in handlers)
    scans = sum(getattr(getattr(h._fs_backend, "view", None), "scans", 0) for h in handlers)
    conn.send(
        {
            **stats,
            "hb_writes": hb,
            "max_beat_gap": gaps[-1],
            "hb_reads": reads,
            "scans": scans,
            "keepalive_failed": warn.keepalive_failed,
            **{k: len(v) for k, v in events.items() if k != "errors"},
            "errors": sorted(events.get("errors", ()))[:5],
        }
    )
    os._exit(0)  # torch timers and daemon threads: no slow interpreter teardown


def run(a) -> dict:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _NodeDesc,
        _RendezvousState,
    )

    from fsmingle.fs.jobdir import open_job_dir
    from fsmingle.torchrun.backend import FsRendezvousBackend as Reader

    base = Path(tempfile.mkdtemp(prefix="bench-keepalive-", dir=a.dir))
    endpoint = base / "rdzv"
    endpoint.mkdir(mode=0o700)
    ctx = mp.get_context("fork")
    per = [a.agents // a.procs + (1 if i < a.agents % a.procs else 0) for i in range(a.procs)]
    pipes, procs = [], []
    for i, n in enumerate(per):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=worker, args=(i, n, a.agents, str(endpoint), a, child), daemon=True)
        p.start()
        pipes.append(parent)
        procs.append(p)
    nodes = [_NodeDesc(*x) for c in pipes for x in c.recv()]
    st = _RendezvousState()
    st.round, st.complete = 1, True
    now = datetime.now(timezone.utc)
    for rank, n in enumerate(sorted(nodes)):
        st.participants[n] = rank
        st.last_heartbeats[n] = now
    _, writer_backend = load_impl(a.impl, a.before_rev)
    writer = writer_backend(open_job_dir(str(endpoint), RUN_ID), RUN_ID)
    _, token, ok = writer.set_state(pickle.dumps(st), None)
    assert ok
    for c in pipes:
        c.send("go")
    for c in pipes:
        assert c.recv() == "ready"  # every agent has read the round: steady state
    # The round "completes" now: every heartbeat time in the state is fresh
    # (what before's keep-alives start from; after ignores these times).
    now = datetime.now(timezone.utc)
    for n in st.last_heartbeats:
        st.last_heartbeats[n] = now
    assert writer.set_state(pickle.dumps(st), token)[2]
    for c in pipes:
        c.send("measure")
    t0 = time.monotonic()
    liveness = a.interval * a.max_attempt
    observer = Reader(open_job_dir(str(endpoint), RUN_ID), RUN_ID, liveness_s=liveness, interval_s=a.interval)
    v0 = observer.peek().version
    samples = []
    next_sample = t0 + 5.0
    while time.monotonic() - t0 < a.duration:
        # Follow like a waiting agent (every half interval); report every 5 s.
        time.sleep(min(a.interval / 2, max(0.0, t0 + a.duration - time.monotonic())))
        rec = observer.peek()
        if a.impl == "after":
            observer.live_members(rec.state)
        if time.monotonic() < next_sample and time.monotonic() - t0 < a.duration:
            continue
        next_sample += 5.0
        s = {"t": round(time.monotonic() - t0, 1), "version": rec.version, "participants": len(rec.state.participants)}
        if a.impl == "after":
            # A newcomer's view (judges everyone): needs liveness_s of watching before it may call anyone dead.
            live = observer.live_members(rec.state)
            s["observer_dead"] = len(rec.state.participants) - len(live)
            s["observer_max_age_s"] = round(max((observer.view.age(n) for n in rec.state.participants), default=0), 2)
        else:
            ages = [(datetime.now(timezone.utc) - t).total_seconds() for t in rec.state.last_heartbeats.values()]
            s["state_max_hb_age_s"] = round(max(ages, default=0), 1)
        samples.append(s)
        print(json.dumps(s), flush=True)
    elapsed = time.monotonic() - t0
    for c in pipes:
        c.send("stop")
    reports = [c.recv() for c in pipes]
    for p in procs:
        p.join(30)
    v_end = observer.peek().version
    tot = {k: sum(r[k] for r in reports) for k in reports[0] if k not in ("errors", "max_beat_gap")}
    errors = sorted({e for r in reports for e in r["errors"]})[:5]
    # The observer needs liveness_s of its own watching before a verdict counts.
    judged = [s for s in samples if s["t"] > liveness + 2 * a.interval]
    result = {
        "impl": a.impl,
        "agents": a.agents,
        "procs": a.procs,
        "duration_s": round(elapsed, 1),
        "keep_alive_interval_s": a.interval,
        "keep_alive_max_attempt": a.max_attempt,
        "poll_s": a.poll,
        "cas_writes": v_end - v0,
        "cas_writes_per_s": round((v_end - v0) / elapsed, 2),
        "cas_lost_per_s": round(tot["cas_lost"] / elapsed, 2),
        "hb_writes_per_s": round(tot["hb_writes"] / elapsed, 1),
        "max_beat_gap_s": round(max(r["max_beat_gap"] for r in reports), 2),
        "hb_reads_per_s": round(tot["hb_reads"] / elapsed, 1),
        "scans": tot["scans"],
        "get_state_per_s": round(tot["get_state"] / elapsed, 1),
        "needed_keepalives_per_s": round(a.agents / a.interval, 1),
        "keepalive_failed": tot["keepalive_failed"],
        "spurious": {k: tot[k] for k in ("waiting", "dropped", "round_changed")},
        "final_participants": samples[-1]["participants"] if samples else None,
        "observer_dead_max": max((s.get("observer_dead", 0) for s in judged), default=None),
        "errors": errors,
    }
    shutil.rmtree(base, ignore_errors=True)
    return result


def ceiling(a) -> dict:
    """Writes/s one uncontended writer gets from the shared state: torch's keep-alive, back to back.

    Each write is what torch's ``_RendezvousKeepAliveOp`` does: read the
    newest state, set one node's heartbeat, compare-and-set.  Every version
    must be read before the next can be written, so however many nodes
    share the state, this is the most keep-alives per second it can take.
    """
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _NodeDesc,
        _RendezvousState,
    )

    from fsmingle.fs.jobdir import open_job_dir

    _, backend_cls = load_impl(a.impl, a.before_rev)
    base = Path(tempfile.mkdtemp(prefix="bench-keepalive-", dir=a.dir))
    (base / "rdzv").mkdir(mode=0o700)
    st = _RendezvousState()
    st.round, st.complete = 1, True
    now = datetime.now(timezone.utc)
    nodes = [_NodeDesc("127.0.0.1", 100000 + i, 0) for i in range(a.agents)]
    for rank, n in enumerate(nodes):
        st.participants[n] = rank
        st.last_heartbeats[n] = now
    be = backend_cls(open_job_dir(str(base / "rdzv"), RUN_ID), RUN_ID)
    be.set_state(pickle.dumps(st), None)
    t0, writes = time.monotonic(), 0
    while time.monotonic() - t0 < a.duration:
        data, token = be.get_state()
        cur = pickle.loads(data)
        cur.last_heartbeats[nodes[writes % len(nodes)]] = datetime.now(timezone.utc)
        writes += bool(be.set_state(pickle.dumps(cur), token)[2])
    elapsed = time.monotonic() - t0
    size = max(p.stat().st_size for p in (base / "rdzv" / RUN_ID).glob("state-*.json"))
    shutil.rmtree(base, ignore_errors=True)
    return {
        "impl": a.impl,
        "mode": "ceiling",
        "agents": a.agents,
        "duration_s": round(elapsed, 1),
        "state_bytes": size,
        "cas_writes_per_s": round(writes / elapsed, 1),
        "needed_keepalives_per_s": round(a.agents / a.interval, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=("after", "before"), default="after")
    p.add_argument("--agents", type=int, default=1024)
    p.add_argument("--procs", type=int, default=8, help="processes the agents are spread over")
    p.add_argument("--duration", type=float, default=180.0, help="seconds of steady state (default 180)")
    p.add_argument("--interval", type=int, default=5, help="keep_alive_interval, seconds (torch's default 5)")
    p.add_argument("--max-attempt", type=int, default=3, help="keep_alive_max_attempt (torch's default 3)")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between num_nodes_waiting() of one agent")
    p.add_argument("--dir", default=None, help="parent of the run directory (default: $TMPDIR)")
    p.add_argument("--before-rev", default="d166794~1", help="git revision of the single-module backend")
    p.add_argument("--report", default=None, help="append a markdown row and the JSON to this file")
    p.add_argument("--ceiling", action="store_true", help="only measure one writer's compare-and-set rate")
    a = p.parse_args(argv)
    r = ceiling(a) if a.ceiling else run(a)
    print(json.dumps(r, indent=1))
    if a.report:
        cmd = "python benchmarks/bench_torchrun_keepalive.py " + " ".join(argv if argv is not None else sys.argv[1:])
        with open(a.report, "a") as f:
            f.write(f"\n### {a.impl}\n\n```\n{cmd}\n```\n\n```json\n{json.dumps(r, indent=1)}\n```\n")
    if a.ceiling:
        return 0
    bad = sum(r["spurious"].values()) + (r["observer_dead_max"] or 0)
    return 1 if a.impl == "after" and bad else 0


if __name__ == "__main__":
    sys.exit(main())
