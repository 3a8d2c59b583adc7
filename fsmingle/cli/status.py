"""``fsmingle status``: what is in a rendezvous directory, for humans (rich tables) and scripts (JSON)."""

from __future__ import annotations

import json
import logging
import os
import time

from ..errors import ConfigError, FsmingleError, StorageError
from ..fs.jobdir import check_owned_dir
from ..fs.layout import MASTER_DIR, gen_name, validate_job_id
from ..fs.store import PosixStore
from ..protocol.cleanup import generations, inspect
from .progress import WarnOnce

log = logging.getLogger("fsmingle.status")


def judge(alive_here: bool | None, heartbeat_age: float, stale_after: float) -> str:
    """What ``status`` calls a participant, by the rendezvous's own rule.

    Same host (pid space): the process itself decides, through psutil --
    ``alive`` or ``exited`` (an ``env`` participant exits once released; that
    is not a failure).  Another host: its heartbeat's age against
    ``stale_after`` -- ``alive`` below it, ``stale`` from it on.  The age is
    the wall-clock difference to the beacon's own timestamp, which is good
    enough for a display; the rendezvous itself never uses wall clocks
    (it watches the heartbeat counter on its monotonic clock).
    """
    if alive_here is True:
        return "alive"
    if alive_here is False:
        return "exited"
    return "alive" if heartbeat_age < stale_after else "stale"


def newest_started(store: PosixStore, gens: list[int]) -> int:
    """The newest generation anyone entered.

    The participant that decides a generation makes the next one first (so that
    nobody looks its name up before it exists, see ``Participant.prepare_next``):
    an empty newest generation is "next, not started", not news.
    """
    for g in reversed(gens):
        if any(n != MASTER_DIR for n in store.listdir(gen_name(g))):
            return g
    return gens[-1]


def job_summary(base: str, job: str, stale_after: float = 30.0, warnings: WarnOnce | None = None) -> dict:
    """A JSON-ready description of one job's newest generation and its participants.

    Args:
        base (str): the rendezvous directory.
        job (str): a validated job id.
        stale_after (float): seconds (see :func:`judge`).
        warnings (WarnOnce | None): where warnings about unreadable files go.
    """
    store = PosixStore(os.path.join(base, job))
    gens = generations(store)
    if not gens:
        return {
            "job_id": job,
            "generation": None,
            "state": "empty",
            "participants": [],
            "release": None,
            "generations": [],
        }
    g = newest_started(store, gens)
    info = inspect(store, g, stale_after=0.0, warnings=warnings)
    now = time.time()
    parts = []
    # Rank 0's beacon, while fresh, vouches for the members connected to it: in a big world
    # they heartbeat their own beacons rarely (fsmingle.protocol.member, MEMBER_BEACONS_PER_S).
    rank0 = [b for b in info.beacons if b.rank == 0 and b.vouch and now - b.wall_time < stale_after]
    for b in sorted(info.beacons, key=lambda b: (b.rank is None, b.rank if b.rank is not None else 0)):
        here = info.alive.get(b.instance)
        age = max(0.0, now - b.wall_time)
        vouched = here is None and b.rank not in (None, 0) and any(r0.vouches_for(b.rank) for r0 in rank0)
        live_age = min(age, max(0.0, now - rank0[0].wall_time)) if vouched else age  # as fresh as the vouch
        parts.append(
            {
                "rank": b.rank,
                "host": b.host.hostname,
                "addr": b.addr,
                "pid": b.host.pid,
                "heartbeat": b.heartbeat,
                # wall-clock age is for display only (clocks differ); liveness never uses it
                "heartbeat_age_s": round(age, 1),
                "alive": here if here is not None else live_age < stale_after,
                "liveness": judge(here, live_age, stale_after),
                "vouched_by_rank0": vouched,
                "same_host": here is not None,
                "master_port": b.master_port,
                "instance": b.instance,
                "scheduler": dict(b.scheduler),  # this participant's job ({} if its environment has none)
                # peer jobs the scheduler says are not here yet: rank 0's, or while rank 0 is
                # missing the lowest present rank's, which asks instead (protocol/queue_relay.py)
                "queue": list(b.queue) or (b.queue_word or {}).get("lines", []),
                "asks_scheduler": b.queue_word is not None,  # the asker while rank 0 is missing
                "timeout_held": bool((b.queue_word or {}).get("hold")),
                # a spare: arrived when generation spare_for was full or released without it
                "spare_for": b.spare_for or None,
            }
        )
    rel = None
    if info.release is not None:
        r = info.release
        from .stragglers import members_of

        world = members_of(store, r) if r.released else None
        rel = {
            "state": r.state,
            "master_addr": r.master_addr,
            "master_port": r.master_port,
            "reason": r.reason,
            "members": [m["addr"] for m in world] if world else [m.addr for m in r.members],
            # rank, host, addr, arrival (seconds after the first, rank 0's monotonic clock) per member
            "world": world or [],
            "age_s": round(max(0.0, now - r.wall_time), 1),
        }
    size = info.beacons[0].size if info.beacons else (info.release.size if info.release else None)
    return {
        "job_id": job,
        "generation": g,
        "state": info.state,
        "size": size,
        "claimed": info.claims,
        "participants": parts,
        "release": rel,
        "generations": gens,
        "stale_after": stale_after,
    }


def _state_word(s: dict) -> str:
    return {"restart": "voided"}.get(s["state"], s["state"])


def _render(base: str, jobs: list[str], detail: bool, stale_after: float, warnings: WarnOnce, timeline: bool = False):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if not detail:
        t = Table(title=f"fsmingle jobs in {base}")
        for c in ("job", "generation", "state", "claimed", "master"):
            t.add_column(c)
        summaries = [job_summary(base, j, stale_after, warnings) for j in jobs]
        for s in summaries:
            rel = s["release"]
            master = f"{rel['master_addr']}:{rel['master_port']}" if rel and rel["master_addr"] else "-"
            claimed = (
                f"{len(s.get('claimed', []))}/{s.get('size') or '?'}"
                if s["generation"] and s["state"] not in ("restart",)
                else "-"
            )
            t.add_row(s["job_id"], str(s["generation"] or "-"), _state_word(s), claimed, master)
        return t, summaries
    s = job_summary(base, jobs[0], stale_after, warnings)
    r = s["release"]
    if s["state"] == "restart":
        # A voided generation: its participants withdrew (or will join the next one); a claim
        # count and an empty table would suggest someone is still waiting in it.
        head = Text(
            f"job {s['job_id']} generation {s['generation']}: voided ({r['reason'] if r else 'no reason'}); "
            f"the next attempt starts generation {s['generation'] + 1}"
        )
        if not s["participants"]:
            return Group(head, Text("no participant is left in this generation")), [s]
        title = None
    else:
        head = None
        title = (
            f"job {s['job_id']} generation {s['generation']}: {_state_word(s)} "
            f"({len(s.get('claimed', []))}/{s.get('size') or '?'} claimed)"
        )
    t = Table(title=title)
    for c in ("rank", "host", "address", "pid", "heartbeat", "age", "alive"):
        t.add_column(c)
    for p in s["participants"]:
        word = p["liveness"] + ("" if p["same_host"] else " (remote)")
        spare = "spare" if p.get("spare_for") else ""
        rank = str(p["rank"]) + (f" ({spare})" if spare else "") if p["rank"] is not None else spare or "-"
        t.add_row(
            rank,
            p["host"],
            p["addr"],
            str(p["pid"]),
            str(p["heartbeat"]),
            f"{p['heartbeat_age_s']}s",
            word,
        )
    parts = [x for x in (head, t) if x is not None]
    # A spare waits for a place (fsmingle.protocol.outside): say so, rank or not.
    parts += [
        Text(
            f"{'rank ' + str(x['rank']) if x['rank'] is not None else 'a participant'} (pid {x['pid']} on "
            f"{x['host']}) is a spare for generation {x['spare_for']}: it takes a place when one opens"
        )
        for x in s["participants"]
        if x.get("spare_for")
    ]
    for x in s["participants"]:
        if x.get("asks_scheduler"):
            held = "; timeout held: peer jobs pending" if x.get("timeout_held") else ""
            parts.append(Text(f"rank 0 is missing: rank {x['rank']} asks the scheduler about peer jobs{held}"))
        parts += [Text(line) for line in x["queue"] if x["rank"] == 0 or x.get("asks_scheduler")]
    if r and r["state"] == "released":
        parts.append(
            Text(
                f"released to {len(r['members'])} members: master {r['master_addr']}:{r['master_port']} "
                f"({r['age_s']}s ago)"
            )
        )
        if r["world"]:
            from .stragglers import table
            from .stragglers import timeline as draw_timeline

            parts.append(draw_timeline(r["world"]) if timeline else table(r["world"]))
    return Group(*parts), [s]


def status_main(
    dir: str | None,
    job_id: str | None,
    as_json: bool,
    watch: bool,
    interval: float,
    stale_after: float = 30.0,
    timeline: bool = False,
    plot: str | None = None,
) -> int:
    """Run ``fsmingle status``; return the exit code (0: released / jobs listed, 1: otherwise).

    ``timeline``: draw the released members' arrivals on a time axis instead of the arrival table.
    ``plot``: also write them as a PNG picture there (:func:`fsmingle.cli.stragglers.plot`).

    Other codes: 3 (no ``dir``, an invalid or unknown job id, ``--timeline``/``--plot`` without
    JOB_ID, ``--plot`` without matplotlib or of a job not released), 4 (a job directory that is not
    yours), 5 (``dir`` missing or not a directory, ``--plot`` file not writable).
    """
    import sys

    from rich.console import Console

    base = dir or os.environ.get("FSMINGLE_DIR")
    try:
        if not base:
            raise ConfigError("no rendezvous directory: pass --dir or set FSMINGLE_DIR")
        if not os.path.isdir(base):
            raise StorageError(
                f"--dir {base} does not exist or is not a directory; check --dir (and that the "
                "shared filesystem is mounted on this node)"
            )
        if (timeline or plot) and not job_id:
            raise ConfigError(f"{'--timeline' if timeline else '--plot'} shows one job's arrivals: give its JOB_ID")
        if job_id:
            validate_job_id(job_id)
            if not os.path.isdir(os.path.join(base, job_id)):
                raise ConfigError(f"no job {job_id!r} under {base}")
            check_owned_dir(os.path.join(base, job_id), "job directory")
            jobs = [job_id]
        else:
            jobs = sorted(n for n in os.listdir(base) if not n.startswith(".") and os.path.isdir(os.path.join(base, n)))
    except FsmingleError as e:
        print(f"fsmingle: error: {e}", file=sys.stderr)
        return e.exit_code
    console = Console()
    warnings = WarnOnce(log)

    def once() -> int:
        renderable, summaries = _render(base, jobs, bool(job_id), stale_after, warnings, timeline=timeline)
        if as_json:
            print(json.dumps(summaries[0] if job_id else summaries, indent=2, sort_keys=True))
        else:
            console.print(renderable)
        if job_id:
            return 0 if summaries[0]["state"] == "released" else 1
        return 0 if summaries else 1

    if not watch:
        code = once()
        warnings.flush()
        if plot:
            s = job_summary(base, jobs[0], stale_after)
            try:
                if not (s["release"] and s["release"]["world"]):
                    raise ConfigError(
                        f"--plot: job {jobs[0]} generation {s['generation']} is not released (no arrivals to draw yet)"
                    )
                from .stragglers import plot as draw_plot

                draw_plot(s["release"]["world"], plot, f"job {jobs[0]} generation {s['generation']}: arrivals")
            except FsmingleError as e:
                print(f"fsmingle: error: {e}", file=sys.stderr)
                return e.exit_code
            print(f"fsmingle: wrote {plot}", file=sys.stderr)
        return code
    code = 1
    try:
        while True:
            console.clear()
            code = once()
            time.sleep(interval)
    except KeyboardInterrupt:
        warnings.flush()
        return code
