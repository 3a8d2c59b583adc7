"""Rank 0's status pace past 500 members vs. what members decide on its status (round 2 attack).

Branch ``recovery`` (fd87239) spaces rank 0's ``status`` pushes by ``Timing.status_gap`` =
``N / STATUS_PER_S`` s past 500 members (16.4 s at 8,192), "status is for people".  It is not
only: a member holds its ``--timeout`` while rank 0's word (the status' ``queue``) says that pending
peer jobs account for every missing rank (:mod:`fsmingle.protocol.queue`).  When rank 0's squeue
finds such a hold a few seconds before a member's ``--timeout``, the member hears it one gap
later: it times out, voids, and the world that was to wait for the requeued peer breaks.

The model runs worlds of 3; the gap of a big world is emulated by lowering ``STATUS_PER_S``.  With
fd87239 alone the 8,192 case fails (rank 1 exits RendezvousTimeoutError at 30 s, generation 1
voided); rank 0 now pushes a hold at once (``Queueing._queue_step``) and both pass.
"""

from __future__ import annotations

import pytest

import fsmingle.protocol.timing as timing_mod
from fsmingle.errors import RendezvousTimeoutError

try:
    from model_queue import FakeScheduler
    from model_world import World
except ImportError:  # tests/ imported as a package
    from tests.model_queue import FakeScheduler
    from tests.model_world import World


@pytest.mark.parametrize("per_s", [500, 3 / 16], ids=["3 members", "gap of 8,192 members (16 s)"])
def test_a_hold_rank0_finds_reaches_the_members_before_their_timeout(monkeypatch, per_s):
    """Ranks 0 and 1 of 3 waiting (--timeout 30 s), rank 2's job running; at 24 s it is requeued
    (PENDING): rank 0's next squeue (every 2 s) finds the missing rank accounted for and holds its
    --timeout, and every member it tells must hold too -- nobody times out, nothing is decided."""
    monkeypatch.setattr(timing_mod, "STATUS_PER_S", per_s)
    w = World(3, ranks=[0, 1, 2], staleness=1.0, pidns="pod", timeout=30.0)
    w.scheduler = sched = FakeScheduler(lambda: w.fs.now, {"j_2": "RUNNING"})
    w.start(0)
    w.start(1)
    w.tick(24.0)
    sched.say("j_2", "PENDING")
    w.tick(20.0)  # past every deadline of 30 s
    for s in (0, 1):
        q = w.current(s)
        assert not isinstance(q.error, RendezvousTimeoutError), (s, q.status, q.error, w.log[-20:])
        assert q.status not in ("exited", "done", "ended"), (s, q.status, w.log[-20:])
    assert not w.decided, {g: r.state for g, r in w.decided.items()}
    assert "timeout held: peer jobs pending" in (w.current(1).p.note + " ".join(w.current(1).p.queue.lines)) or (
        w.current(1).p.queue.hold
    )
