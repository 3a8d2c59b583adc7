"""``fsmingle status``: what is in a rendezvous directory, for humans (rich tables) and scripts (JSON)."""

from __future__ import annotations

import json
import os
import time

from .cleanup import generations, inspect
from .config import validate_job_id
from .errors import ConfigError, FsmingleError
from .protocol import gen_name
from .store import PosixStore, check_owned_dir


def job_summary(base: str, job: str, stale_after: float = 0.0) -> dict:
    """A JSON-ready description of one job's newest generation and its participants."""
    store = PosixStore(os.path.join(base, job))
    gens = generations(store)
    if not gens:
        return {"job_id": job, "generation": None, "state": "empty", "participants": [], "release": None,
                "generations": []}
    g = gens[-1]
    info = inspect(store, g, stale_after=stale_after)
    now = time.time()
    parts = []
    for b in sorted(info.beacons, key=lambda b: (b.rank is None, b.rank if b.rank is not None else 0)):
        alive = info.alive.get(b.instance)
        parts.append({
            "rank": b.rank, "host": b.host.hostname, "addr": b.addr, "pid": b.host.pid,
            "heartbeat": b.heartbeat,
            # wall-clock age is for display only (clocks differ); liveness never uses it
            "heartbeat_age_s": round(max(0.0, now - b.wall_time), 1),
            "alive": alive, "master_port": b.master_port, "instance": b.instance,
        })
    rel = None
    if info.release is not None:
        r = info.release
        rel = {"state": r.state, "master_addr": r.master_addr, "master_port": r.master_port, "reason": r.reason,
               "members": [m.addr for m in r.members], "age_s": round(max(0.0, now - r.wall_time), 1)}
    size = info.beacons[0].size if info.beacons else (info.release.size if info.release else None)
    return {"job_id": job, "generation": g, "state": info.state, "size": size, "claimed": info.claims,
            "participants": parts, "release": rel, "generations": gens}


def _render(base: str, jobs: list[str], detail: bool):
    from rich.console import Group
    from rich.table import Table

    if not detail:
        t = Table(title=f"fsmingle jobs in {base}")
        for c in ("job", "generation", "state", "claimed", "master"):
            t.add_column(c)
        summaries = [job_summary(base, j) for j in jobs]
        for s in summaries:
            rel = s["release"]
            master = f"{rel['master_addr']}:{rel['master_port']}" if rel and rel["master_addr"] else "-"
            claimed = f"{len(s.get('claimed', []))}/{s.get('size') or '?'}" if s["generation"] else "-"
            t.add_row(s["job_id"], str(s["generation"] or "-"), s["state"], claimed, master)
        return t, summaries
    s = job_summary(base, jobs[0])
    t = Table(title=f"job {s['job_id']} generation {s['generation']}: {s['state']} "
                    f"({len(s.get('claimed', []))}/{s.get('size') or '?'} claimed)")
    for c in ("rank", "host", "address", "pid", "heartbeat", "age", "alive"):
        t.add_column(c)
    for p in s["participants"]:
        alive = {True: "alive", False: "stale", None: "unknown (remote)"}[p["alive"]]
        t.add_row(str(p["rank"] if p["rank"] is not None else "-"), p["host"], p["addr"], str(p["pid"]),
                  str(p["heartbeat"]), f"{p['heartbeat_age_s']}s", alive)
    parts = [t]
    if s["release"]:
        r = s["release"]
        from rich.text import Text

        if r["state"] == "released":
            parts.append(Text(f"released to {len(r['members'])} members: master {r['master_addr']}:{r['master_port']} "
                              f"({r['age_s']}s ago)"))
        else:
            parts.append(Text(f"voided: {r['reason']}"))
    return Group(*parts), [s]


def status_main(dir: str | None, job_id: str | None, as_json: bool, watch: bool, interval: float) -> int:
    """Run ``fsmingle status``; return the exit code (0: released / jobs listed, 1: otherwise)."""
    import sys

    from rich.console import Console

    base = dir or os.environ.get("FSMINGLE_DIR")
    try:
        if not base:
            raise ConfigError("no rendezvous directory: pass --dir or set FSMINGLE_DIR")
        if not os.path.isdir(base):
            raise ConfigError(f"--dir {base} does not exist or is not a directory")
        if job_id:
            validate_job_id(job_id)
            if not os.path.isdir(os.path.join(base, job_id)):
                raise ConfigError(f"no job {job_id!r} under {base}")
            check_owned_dir(os.path.join(base, job_id), "job directory")
            jobs = [job_id]
        else:
            jobs = sorted(n for n in os.listdir(base) if not n.startswith(".")
                          and os.path.isdir(os.path.join(base, n)))
    except FsmingleError as e:
        print(f"fsmingle: error: {e}", file=sys.stderr)
        return e.exit_code
    console = Console()

    def once() -> int:
        renderable, summaries = _render(base, jobs, detail=bool(job_id))
        if as_json:
            print(json.dumps(summaries[0] if job_id else summaries, indent=2, sort_keys=True))
        else:
            console.print(renderable)
        if job_id:
            return 0 if summaries[0]["state"] == "released" else 1
        return 0 if summaries else 1

    if not watch:
        return once()
    try:
        while True:
            console.clear()
            code = once()
            time.sleep(interval)
    except KeyboardInterrupt:
        return code
