"""When rank 0 is the one missing: the lowest present rank asks the scheduler, the others read its word.

Rank 0 asks the scheduler about peer jobs (:mod:`.rank0.queueing`).  With explicit ranks (array
tasks started with ``--node-rank $SLURM_ARRAY_TASK_ID``, separate jobs with ``--peer-jobs`` and
``--node-rank``) the job that would hold rank 0 may itself be the one pending, or cancelled.  So
while a member holds a rank but knows no rank 0 endpoint (not connected), and only when a
:class:`~fsmingle.protocol.queue.QueueWatch` is active (there are peer jobs):

* **The asker** is the lowest claimed rank whose holder is not known dead (its beacon, judged as
  everywhere by :class:`~fsmingle.protocol.liveness.Judge`).  It alone queries the scheduler
  (``QueueWatch.poll``: one ``squeue`` per ``--queue-poll``, in a thread), and writes its findings
  (hold, lines) into its own beacon (``queue_word``) whenever they change.
* **Everyone else** reads that one beacon, holds its timeout on its word as on rank 0's while
  the asker's heartbeat moves (a word not refreshed for ``stale_after`` -- an asker stuck with its
  process still there, which the local check never calls dead -- holds nothing), and shows its
  lines; it never fails on the word's ``ended`` (the restart record tells, below).  It lists the generation only to find the asker: at the start, when the
  asker is judged dead (the next lowest takes over), or when its beacon carries no word (an older
  version, or an asker that found a lower rank and deferred to it) -- then at most every
  ``stale_after / 2``.
* **A peer job ended**: the asker voids the generation with the reason ``ENDED_VOID`` + what
  ended, then fails (exit 13).  The others learn it from that restart record
  (``Member._decided_elsewhere`` -> ``QueueWatch.from_void``) and fail with exit 13 too, naming
  job, state and reason.  The record, not the asker's beacon: the beacon is removed as the asker
  withdraws, a read of it may come too late, and a non-asker failing on a beacon could void the
  generation first with a reason that tells nobody why; the restart record is created once and
  read by every member that is not connected anyway (every heartbeat period; a follower whose
  asker's beacon is gone reads it at once).
* **Rank 0 appears**: the members connect to it and stop (a connected member never runs this;
  rank 0's status messages carry its word); the asker rewrites its beacon without the word at once.

Cost (metadata operations, per ``period`` = the smaller of ``--queue-poll`` and the heartbeat
period, 10 s by default): the asker one listing, plus one claim and one beacon read per claimer
once per generation (their scheduler job); every other member one beacon read.  Next to the
listing of ``master/`` an unconnected member makes every ``poll_max`` (0.28 s) anyway, that is
under 3 % more (measured on the model's filesystem with the default timing: 3.78 -> 3.88
operations per second per waiting member) -- and nothing at all when there are no peer jobs or
once rank 0 is there.
"""

from __future__ import annotations

import logging

from ..fs.layout import beacon_name, claimed_ranks, gen_name
from ..fs.records import Release
from .liveness import Verdict

log = logging.getLogger("fsmingle")

ENDED_VOID = "the scheduler says: "  # the asker's restart reason on an ended peer job: then what ended


def job_of(scheduler) -> str:
    """A beacon's ``scheduler`` identity as :class:`QueueWatch` names jobs: ``4242_3`` for an array
    task, the Slurm job id otherwise ("" when unknown)."""
    d = dict(scheduler)
    if d.get("array_job") and d.get("array_task"):
        return f"{d['array_job']}_{d['array_task']}"
    return d.get("slurm_job", "")


class Relay:
    """One participant's part in asking the scheduler while rank 0 is missing (see the module doc);
    held by its QueueWatch, reset with it at every new generation."""

    def __init__(self):
        self.gen: int | None = None
        self.asking = False  # this participant is the asker: its beacon carries the word
        self.asker: tuple[int, str] | None = None  # (rank, instance) of the asker we follow
        self.next_at = 0.0  # next listing (asker) or read of the asker's beacon (the others)
        self.next_find = 0.0  # earliest next listing for a follower whose asker gives no word
        self.present: set[str] = set()  # scheduler jobs of the claimed ranks (the asker's)
        self.nmissing = 0
        self.jobs: dict[str, str] = {}  # instance -> its scheduler job (beacons read once)

    def word(self, q) -> dict | None:
        return q.as_wire() if self.asking else None

    def step(self, q, p, now: float, waiting: bool) -> None:
        """Every step of ``p`` (before its deadline is judged): act while it is a member that holds
        a rank and knows no rank 0 endpoint; stop asking (and say so in the beacon) otherwise."""
        role = p.role
        active = waiting and bool(p.rank) and getattr(role, "link", 0) is None and getattr(role, "master", 0) is None
        if not active:
            if self.asking and waiting:
                self.asking = False
                p.publish_beacon()  # rank 0 is here: nobody may hold on this beacon's old word
            return
        if self.gen != p.gen:
            self.__init__()
            self.gen = p.gen
        before = (q.hold, tuple(q.lines), q.ended, self.asking)
        if now >= self.next_at:
            self.next_at = now + min(q.interval, p.timing.heartbeat_period)
            if self.asking or self.asker is None:
                self._find(p, now)
            else:
                self._follow(q, p, now)
        if self.asking:
            q.poll(now, self.present, self.nmissing)
            if q.ended:
                # The record first (the others fail on it); QueueWatch.tick raises right after.
                p.void(f"{ENDED_VOID}{q.ended}")
                return
        if (q.hold, tuple(q.lines), q.ended, self.asking) != before:
            if self.asking or before[3]:
                p.publish_beacon()
            p.queue_news()

    def _find(self, p, now: float) -> None:
        """List the generation: the lowest claimed rank not known dead asks (maybe this one)."""
        claimed = claimed_ranks(p.store.listdir(gen_name(p.gen)))
        for r in claimed:
            if r >= p.rank:
                break
            inst = p.read_claim(r)
            verdict, _ = p.judge_holder(inst, now, key=f"?rank{r}")
            if verdict is not Verdict.DEAD:
                if self.asking or self.asker is None or self.asker[0] != r:
                    log.debug("job %s: rank %d asks the scheduler about peer jobs while rank 0 is missing", p.job_id, r)
                self.asking, self.asker = False, (r, inst or "")
                return
        if not self.asking:
            log.info(
                "job %s: rank 0 is missing; this node (rank %d) asks the scheduler about peer jobs", p.job_id, p.rank
            )
        self.asking, self.asker = True, (p.rank, p.instance)
        self.nmissing = p.size - len(set(claimed) | {p.rank})
        for r in claimed:
            inst = p.read_claim(r) if r != p.rank else None
            if inst and inst not in self.jobs:
                b = p.read_beacon(beacon_name(p.gen, inst), inst)
                if b is not None:
                    self.jobs[inst] = job_of(b.scheduler)
        self.present = {p.queue.mine} | {self.jobs.get(p.claims.get(r, ""), "") for r in claimed} - {""}

    def _follow(self, q, p, now: float) -> None:
        """Read the asker's beacon (one read): take its word, or find the asker again."""
        r, inst = self.asker
        verdict, b = p.judge_holder(inst or None, now, key=f"?rank{r}")
        if verdict is Verdict.DEAD:
            log.info("job %s: rank %d, which asked the scheduler, is dead; finding who asks now", p.job_id, r)
            self._find(p, now)
        elif b is not None and b.queue_word is not None:
            # Hold and lines only: a follower fails on an ended peer by the asker's restart record
            # alone (module doc); failing on a word -- stale, or a broken writer's -- would void the
            # generation with a reason that tells the others nothing.
            word = dict(b.queue_word, ended=q.ended)
            seen = p.judge.seen.get(inst)
            if seen is None or now - seen.changed_at >= p.timing.stale_after:
                # A word not refreshed for stale_after (an asker stuck in a hung filesystem call,
                # or stopped, on this host: the local check never calls it dead) holds nothing:
                # a live asker beats every heartbeat period, and a stale word must not hold the
                # --timeout for ever.
                word["hold"] = False
            q.from_wire(word)
        elif b is None and isinstance(rel := p.read_release(p.gen), Release) and not rel.released:
            q.from_void(rel.reason)  # its beacon is gone: it withdrew; on an ended peer job, fail now
        else:
            if b is not None:  # it gives no word (rank 0 is there, a lower rank asks, an older version)
                q.hold, q.lines = False, []  # so nothing holds this timeout on its word any more
            if now >= self.next_find:
                self.next_find = now + p.timing.stale_after / 2
                self._find(p, now)
