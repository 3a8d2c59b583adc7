"""Participants outside a world: contesting an explicit rank, or watching a full generation.

* **Contesting**: the rank asked for is claimed.  Its holder is judged from
  the filesystem (:mod:`fsmingle.rendezvous.liveness`): alive -> :class:`RankConflictError`
  (exit 6, naming the holder); dead -> void the generation and claim in the next.
* **World full** (first-come, every rank claimed): watch the holders; a dead
  one voids the generation; a release without us means we arrived late.

Mixed into :class:`fsmingle.rendezvous.participant.Participant`.
"""

from __future__ import annotations

import logging

from ..errors import RankConflictError, RecordError
from ..fs.layout import claimed_ranks, gen_name
from ..fs.records import Release
from .decision import Placement
from .liveness import Verdict
from .states import State

log = logging.getLogger("fsmingle")


class OutsideWorld:
    """Steps of a participant that holds no rank in its generation (see the module doc)."""

    def _poll_decision(self) -> Release | None:
        """Outside a world (contesting, world-full): the generation's decision if one shows."""
        rel = self.read_release(self.gen)
        now = self.clock.monotonic()
        if isinstance(rel, RecordError):
            # An unusable decision still means "decided": this generation will
            # never release us; move on (the record's writer meant to end it).
            self._bad_release(now)
            return None
        self.release_bad_since = None
        return rel

    def _step_contesting(self) -> Placement | None:
        r = self.want_rank
        rel = self._poll_decision()
        if rel is not None:
            if rel.state == "released":
                holder = rel.members[r] if r < len(rel.members) else None
                where = (
                    f"pid {holder.host.pid} on {holder.host.hostname}, {holder.addr}" if holder else "another process"
                )
                raise RankConflictError(
                    f"rank {r} of job {self.job_id} was taken by another process ({where}), which was released "
                    f"in generation {self.gen}; give each node a distinct rank, or omit the rank for first-come "
                    "assignment"
                )
            self.rejoin()
            return None
        now = self.clock.monotonic()
        self.heartbeat_if_due(now)
        holder = self.contest_holder or self.read_claim(r)
        self.contest_holder = holder
        verdict, b = self.judge_rank(r, now, holder)
        if verdict is Verdict.ALIVE:
            where = f"pid {b.host.pid} on {b.host.hostname} ({b.addr})" if b else "another process"
            self.state = State.FAILED
            raise RankConflictError(
                f"rank {r} of job {self.job_id} is already held by a live process: {where}; "
                "give each node a distinct rank, or omit the rank for first-come assignment"
            )
        if verdict is Verdict.DEAD:
            self.void(f"rank {r}'s holder is dead; replaced by pid {self.me.pid} on {self.me.hostname}")
            self.rejoin()
        return None

    def _step_world_full(self) -> Placement | None:
        rel = self._poll_decision()
        if rel is not None:
            if rel.state == "released":
                self.spare_for = self.gen
                self.set_note(
                    f"generation {self.gen} was released to {self.size} participants without this one "
                    f"(a late participant); waiting in generation {self.gen + 1} as a spare",
                    logging.WARNING,
                )
            self.rejoin()
            return None
        now = self.clock.monotonic()
        self.heartbeat_if_due(now)
        if now >= self.next_check:
            self.next_check = now + min(self.timing.heartbeat_period, 1.0)
            for r in claimed_ranks(self.store.listdir(gen_name(self.gen))):
                if r < self.size and self.void_if_dead(r, now, "is dead or stopped heartbeating"):
                    return None
        return None
