"""Issue 24, spares, on the model (the real ``Participant`` on :mod:`fakefs` and :mod:`fakenet`,
:class:`model_world.World`): a spare's ``--timeout`` is held while it waits for a place, runs in full
once a world forms with it, and ``--spare-timeout`` bounds the wait.  The world's oracles check
every step (one world, nobody left out of a release that names it) and every timeout
(``World._check_exception``: a ``--timeout`` only past the deadline, a ``--spare-timeout`` only
after that long held)."""

from __future__ import annotations

import math

try:
    from model_queue import FakeScheduler
    from model_world import World
except ImportError:  # tests/ imported as a package
    from tests.model_queue import FakeScheduler
    from tests.model_world import World

from fsmingle.errors import RendezvousTimeoutError
from fsmingle.protocol.participant import State


def _trainings_run(*qs) -> None:
    """Released processes exec their training: they are no participants any more (the world's
    one-world oracle is about the participants of one rendezvous, the spare's comes next)."""
    for q in qs:
        assert q.status == "done"
        q.status, q.result = "exited", None


def _released_world_of_two() -> World:
    w = World(2, staleness=1.0)
    a, b = w.start(0), w.start(1)
    w.tick(30.0, stop=lambda: a.status == b.status == "done")
    assert set(w.releases) == {1}
    _trainings_run(a, b)
    return w


def test_a_spare_outlives_its_timeout_and_takes_the_place_a_restart_opens():
    w = _released_world_of_two()
    spare = w.start(None, timeout=5.0, spare_timeout=math.inf)  # a third node on a host of its own
    w.tick(60.0)  # twelve times its --timeout
    p = spare.p
    assert spare.status == "running" and p.gen == 2 and p.state is State.WAIT and p.spare_backs == 1, w.log[-20:]
    assert p.spare_hold.held_for > 50 and p.deadline > p.clock.monotonic()
    # b's training died; its restart loop runs fsmingle again: the spare takes b's place.
    b2 = w.start(1)
    start = w.fs.now
    w.tick(30.0, stop=lambda: spare.status != "running" and b2.status != "running")
    assert spare.status == b2.status == "done", w.log[-30:]
    assert spare.result.generation == b2.result.generation == 2
    assert {spare.result.rank, b2.result.rank} == {0, 1}
    assert w.fs.now - start < 5.0  # within its --timeout, which runs from the moment b2 joined


def test_a_spare_whose_world_forms_gets_its_whole_timeout_then_times_out_as_usual():
    # The spare takes a place in a world that still misses a rank: --timeout runs again, in full.
    w = World(3, staleness=1.0)
    a, b, c = w.start(0), w.start(1), w.start(2)
    w.tick(30.0, stop=lambda: a.status == b.status == c.status == "done")
    _trainings_run(a, b, c)
    spare = w.start(None, timeout=5.0, spare_timeout=math.inf)
    w.tick(20.0)
    assert spare.status == "running" and spare.p.spare_backs == 1
    b2 = w.start(1)  # one survivor comes back; the third never does
    w.tick(2.0, stop=lambda: not spare.p.spare_backs)
    assert spare.p.spare_backs == 0 and "a place opened" in spare.p.note
    joined = w.fs.now
    w.tick(30.0, stop=lambda: spare.status != "running")
    assert spare.status == "exited" and isinstance(spare.error, RendezvousTimeoutError), spare.error
    assert "--spare-timeout" not in str(spare.error)
    assert 4.0 <= w.fs.now - joined <= 8.0  # its full --timeout (5 s), counted from when the world formed
    assert b2.status in ("running", "exited")


def test_a_spare_fails_after_spare_timeout_naming_the_generation_it_backs():
    w = _released_world_of_two()
    spare = w.start(None, spare_timeout=10.0)  # --timeout: never (LONG)
    w.tick(30.0, stop=lambda: spare.status != "running")
    assert spare.status == "exited" and isinstance(spare.error, RendezvousTimeoutError), spare.error
    assert "as a spare for generation 1 (--spare-timeout 10 s)" in str(spare.error)
    assert w.decided[2].state == "restart" and "--spare-timeout" in w.decided[2].reason  # it left gen 2 voided


def test_a_spare_outlives_the_peer_job_it_replaces_and_makes_the_world_with_the_survivor():
    """Issue 29 (measured 8): separate jobs j_0 and j_1 (``--peer-jobs``), released in generation 1;
    a spare waits as rank 0 of generation 2; j_1 ends (NODE_FAIL).  j_1 joined generation 1 (the
    release names it): its place is the spare's to fill, not a fatal "ended without joining".  The
    spare keeps waiting; the survivor's restart makes the world with it."""
    w = World(2, staleness=1.0)
    sched = w.scheduler = FakeScheduler(lambda: w.fs.now)
    a, b = w.start(0), w.start(1)
    w.tick(30.0, stop=lambda: a.status == b.status == "done")
    assert set(w.releases) == {1} and w.releases[1].jobs == ("j_0", "j_1")
    _trainings_run(a, b)
    spare = w.start(None, timeout=5.0, spare_timeout=math.inf)
    w.tick(10.0)
    assert spare.p.rank == 0 and spare.p.gen == 2 and spare.p.spare_backs == 1, w.log[-20:]
    sched.say("j_1", "NODE_FAIL")  # the very job the spare is there to replace
    w.tick(30.0)
    assert spare.status == "running", spare.error
    assert "job j_1 NODE_FAIL (JobHeldUser) after it joined" in spare.p.note, spare.p.note
    a2 = w.start(0)  # j_0's restart loop runs fsmingle again
    w.tick(30.0, stop=lambda: spare.status != "running" and a2.status != "running")
    assert spare.status == a2.status == "done", (spare.error, a2.error, w.log[-30:])
    assert spare.result.generation == a2.result.generation and {spare.result.rank, a2.result.rank} == {0, 1}


def test_two_spares_alone_are_never_released_and_a_survivor_makes_the_world_with_one():
    """Issue 29 (measured 7): a world of 2 released and training, nobody dead; two nodes started as
    spares (``--spare-timeout inf``) wait in generation 2.  They are never released together (that
    would be a second training of the running job); both keep waiting as spares, --timeout held.
    The survivor's restart (b's training died) takes a place: it finds generation 2 full of spares,
    voids it, and is released with one spare; the other waits on."""
    w = _released_world_of_two()
    c = w.start(None, timeout=5.0, spare_timeout=math.inf)
    d = w.start(None, timeout=5.0, spare_timeout=math.inf)
    w.tick(60.0)  # twelve times their --timeout
    assert set(w.releases) == {1}, {g: [m.instance for m in r.members] for g, r in w.releases.items()}
    for q in (c, d):
        assert q.status == "running" and q.p.spare and q.p.spare_backs, (q.error, q.p.note, w.log[-20:])
    assert {c.p.rank, d.p.rank} == {0, 1} and c.p.gen == d.p.gen  # they fill a generation, and wait there
    b2 = w.start(1)  # not a spare: a survivor restarted by its loop
    w.tick(30.0, stop=lambda: b2.status != "running")
    assert b2.status == "done", (b2.error, w.log[-30:])
    g = b2.result.generation
    world = {m.instance for m in w.releases[g].members}
    assert b2.instance in world and len(world & {c.instance, d.instance}) == 1, world
    assert "held by spares" in w.decided[g - 1].reason or g == 2, w.decided[g - 1].reason


def test_a_spare_alone_never_makes_a_world_of_one():
    """A world of one (a single node training): a spare that arrives holds rank 0 of generation 2
    and is complete on its own -- never released; the survivor's restart takes the place."""
    w = World(1, staleness=1.0)
    a = w.start(0)
    w.tick(10.0, stop=lambda: a.status == "done")
    _trainings_run(a)
    spare = w.start(None, timeout=5.0, spare_timeout=math.inf)
    w.tick(30.0)
    assert set(w.releases) == {1} and spare.status == "running" and spare.p.rank == 0, w.log[-20:]
    a2 = w.start(0)
    w.tick(30.0, stop=lambda: a2.status != "running")
    assert a2.status == "done" and a2.result.generation > 2, (a2.error, w.log[-20:])
    assert set(w.releases) == {1, a2.result.generation}
    assert spare.status == "running"  # a spare still, for the next place


def test_without_spare_timeout_late_participants_are_no_spares_and_a_rerun_still_makes_its_world():
    """A whole job re-run with the same job id (nobody given --spare-timeout) finds generation 1
    released without it, exactly as spares do: it is no spare, and makes its world as before."""
    w = _released_world_of_two()
    a2, b2 = w.start(0), w.start(1)
    w.tick(30.0, stop=lambda: a2.status == b2.status == "done")
    assert a2.status == b2.status == "done" and not a2.p.spare and not b2.p.spare
    assert a2.result.generation == b2.result.generation == 2


def test_decide_never_prepares_nor_commits_a_world_of_spares_alone():
    from fsmingle.protocol.decision import SPARES_ALONE, Action, CoordinatorView, decide

    full = dict(size=2, connected={1})
    assert decide(CoordinatorView(**full, spares={0, 1}))[0] is Action.WAIT
    assert decide(CoordinatorView(**full, spares={0}))[0] is Action.PREPARE  # a spare with a survivor
    assert decide(CoordinatorView(**full, spares={1}))[0] is Action.PREPARE
    assert decide(CoordinatorView(**full, spares={0, 1}, preparing_for=0.1, acked={1})) == (Action.VOID, SPARES_ALONE)
    assert decide(CoordinatorView(size=1, connected=set(), spares={0}))[0] is Action.WAIT


def test_a_spares_beacon_says_so_and_older_readers_see_the_same_record():
    import dataclasses

    from fsmingle.fs.records import Beacon, HostId, decode, encode

    h = HostId("node9", "boot", "pid:[1]", 4242, 1.0)
    plain = Beacon("exp", 2, "ab" * 8, "node", 2, 0, "10.0.0.9", None, 1, 0, h)
    assert b"spare" not in encode(plain) and decode(encode(plain), Beacon).spare is False
    spare = dataclasses.replace(plain, spare=True, spare_for=1)
    assert decode(encode(spare), Beacon).spare is True
    assert decode(encode(spare).replace(b'"spare":true', b'"spare":"yes"'), Beacon).spare is False  # only true


def test_spares_given_explicit_ranks_alone_are_never_released_and_a_survivor_contesting_one_takes_it():
    """Explicit node ranks: two spares given ranks 0 and 1 fill generation 2 and wait (never
    released); the survivor restarted as rank 0 finds its rank held by a live spare: not a conflict
    (exit 6) but a place -- it voids generation 2 and is released with the spare of rank 1."""
    w = World(2, ranks=[0, 1], staleness=1.0)
    a, b = w.start(0), w.start(1)
    w.tick(30.0, stop=lambda: a.status == b.status == "done")
    _trainings_run(a, b)
    c = w.start(None, rank=0, timeout=5.0, spare_timeout=math.inf)
    d = w.start(None, rank=1, timeout=5.0, spare_timeout=math.inf)
    w.tick(30.0)
    assert set(w.releases) == {1} and c.status == d.status == "running" and (c.p.rank, d.p.rank) == (0, 1)
    a2 = w.start(0)
    w.tick(30.0, stop=lambda: a2.status != "running")
    assert a2.status == "done" and a2.result.rank == 0, (a2.error, w.log[-20:])
    w.tick(5.0)
    assert d.status == "done" and d.result.generation == a2.result.generation and d.result.rank == 1
    assert "held by a spare" in w.decided[2].reason and c.status == "running"  # c waits for the next place
