"""Issue 24, the adversary's pass: the scheduler asker (``protocol/queue_relay.py``) and spares
(``outside.py`` spare_*, ``hold.py``) attacked on the model's stale filesystem and network
(:class:`model_world.World`: the real ``Participant``, every invariant checked at every step).

Each test is an attack kept so a later change cannot reopen it: faults at every call of a
follower, a stalled asker whose word goes stale, ``--queue-timeout`` on followers, hostile
``queue_word`` values, an ended peer relayed while rank 0 appears, a second asker from a stale
listing, a follower blind to the restart record, ``--spare-timeout`` at every step of a spare's
joining, a spare held by its queue too.  Two found bugs, fixed in ``queue_relay.Relay._follow``
(each test failed before): a follower failed (exit 13) on an ``ended`` in the asker's beacon word
(``test_a_followers_never_fails_on_an_askers_beacon_word_alone``), and held its --timeout for ever
on the word of an asker stuck on its own host
(``test_a_stuck_askers_word_on_the_same_host_does_not_hold_for_ever``).
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    from model_oracles import TIMING
    from model_queue import FakeScheduler, asker_due_afresh, rank0_held
    from model_world import World
except ImportError:  # tests/ imported as a package
    from tests.model_oracles import TIMING
    from tests.model_queue import FakeScheduler, asker_due_afresh, rank0_held
    from tests.model_world import World

from fsmingle.errors import PeerJobEndedError, RendezvousTimeoutError
from fsmingle.fs.records import Beacon, decode, encode
from fsmingle.protocol.hold import DeadlineHold
from fsmingle.protocol.queue import QueueWatch

EXAMPLES = int(os.environ.get("FSMINGLE_FUZZ_EXAMPLES", "80"))


def _follower_due(w: World, find: bool = False):
    """Rank 2, following rank 1's word: its next step reads rank 1's beacon (``find``: lists the
    generation first and reads rank 1's claim, as when it looks for the asker again)."""
    two = w.current(2)
    relay = two.p.queue.relay
    assert not relay.asking and relay.asker is not None and relay.asker[0] == 1, relay.asker
    relay.next_at = 0.0
    if find:
        relay.asker = None
        two.p.claims.pop(1, None)  # claims are cached: read it again, as at the first look
    two.wake = w.fs.now
    return two


@pytest.mark.parametrize("find", [False, True], ids=["follow", "find"])
@pytest.mark.parametrize("kind", ["interrupt", "storage"])
def test_a_fault_at_every_call_of_a_follower(kind, find):
    """An exception at each store operation of a follower's step (its read of the asker's beacon,
    then whatever its step does next): it withdraws, voiding the generation; rank 1 regroups and
    holds on, rank 2's job requeued (pending); nobody waits out --timeout on the way, and once
    rank 0 and rank 2 run the world is released."""
    for k in range(6):
        for after in (False, True):
            w, sched = rank0_held()
            w.tick(12.0)
            two = _follower_due(w, find)
            w.step(two, fault=("store", k, kind), after_effect=after)
            if two.status != "running":
                sched.say("j_2", "PENDING")
            w.tick(45.0)  # past --timeout 30 s: only the hold keeps rank 1 waiting
            one = w.current(1)
            assert one.status == "running", (k, after, one.error, w.log[-20:])
            assert one.p.queue.hold, (k, after, one.p.note)
            sched.say("j_0", "RUNNING")
            sched.say("j_2", "RUNNING")
            w.start(0)
            w.run_to_completion()


@pytest.mark.parametrize("kind", ["interrupt", "storage"])
def test_a_fault_at_every_call_of_a_follower_when_rank0s_job_ended(kind):
    """Rank 0's job is cancelled and the asker voids on it; the follower fails at each store
    operation of the step that reads the void (its read of the asker's beacon, then the restart
    record): whichever way it leaves, it never waits out --timeout, and rank 1 fails with exit 13."""
    for k in range(5):
        w, sched = rank0_held()
        w.tick(12.0)
        one = asker_due_afresh(w)
        sched.say("j_0", "CANCELLED")
        w.step(one)  # asks; the answer is taken at its next step
        one.wake = w.fs.now
        w.step(one)  # the void (ENDED_VOID), then PeerJobEndedError
        assert one.status == "exited" and isinstance(one.error, PeerJobEndedError), one.error
        two = _follower_due(w)
        w.step(two, fault=("store", k, kind), after_effect=bool(k % 2))
        w.tick(25.0)  # under --timeout
        assert two.status == "exited", (k, two.status, w.log[-20:])
        assert w.is_injected(two.error) or isinstance(two.error, PeerJobEndedError), (k, two.error)


def test_a_stalled_askers_word_does_not_hold_the_others_for_ever():
    """Rank 1 asks, says "hold", then stops stepping (SIGSTOP, swapping) with its beacon left saying
    so: rank 2 judges it dead after stale_after, asks itself, and -- rank 0's job running now but
    its process never coming -- waits out --timeout and fails naming rank 0, instead of holding on
    the stale word for ever."""
    w, sched = rank0_held()
    w.tick(12.0)
    one, two = w.current(1), w.current(2)
    assert one.p.queue.relay.asking and two.p.queue.hold
    w.stall(one, 10_000.0)
    t = w.fs.now
    w.tick(TIMING.stale_after + 3 * TIMING.heartbeat_period + 2 * sched.interval + 2 * w.fs.max_staleness)
    assert two.status == "running" and two.p.queue.relay.asking, (two.error, two.p.queue.relay.asker)
    assert "j_2" in sched.askers(since=t), sched.calls[-4:]
    sched.say("j_0", "RUNNING")  # its job started, its process does not come: no hold any more
    w.tick(30.0 + 2 * sched.interval + 1.0)
    assert two.status == "exited" and isinstance(two.error, RendezvousTimeoutError), (two.status, two.error)
    assert "--queue-timeout" not in str(two.error)


def test_queue_timeout_bounds_the_followers_hold_too():
    """Rank 0's job pending for ever, every node given --queue-timeout 60 s: the asker and its
    follower each fail (exit 7) once they held 60 s -- a follower holding on the asker's word is
    bounded like the asker, never only by the asker's own bound."""
    w = World(3, ranks=[0, 1, 2], staleness=1.0, pidns="pod", timeout=30.0)
    w.scheduler = FakeScheduler(lambda: w.fs.now, {"j_0": "PENDING"})
    for s in (1, 2):
        q = w.start(s).p.queue
        q.queue_timeout, q.held_time = 60.0, DeadlineHold(60.0)
    w.tick(60.0 + 30.0 + 5.0)
    for s in (1, 2):
        q = w.current(s)
        assert q.status == "exited" and isinstance(q.error, RendezvousTimeoutError), (s, q.status, q.error)
        assert "--queue-timeout 60 s" in str(q.error) and "missing rank 0: job j_0 PENDING" in str(q.error)


@pytest.mark.parametrize("delay", [0.0, 0.6, 2.0])
def test_an_ended_peer_relayed_while_rank0_appears(delay):
    """The scheduler tells the asker that rank 0's job was cancelled, and right after rank 0's process
    (the job requeued: running again) starts; the asker takes that answer ``delay`` seconds later.
    Three outcomes, all acceptable, never a split: the asker voids before anyone connected (both
    fail, exit 13); the asker voids while rank 2 is connected (rank 2 and rank 0 regroup and, rank
    1 gone, fail after --timeout, exit 7 -- rank 0 is alive, so its job's "cancelled" was stale and
    rank 0 rightly does not fail on it); or the asker connected first (the world is released).
    The model's oracles check every step (PeerJobEndedError only naming a job that ended)."""
    w, sched = rank0_held()
    w.tick(12.0)
    one = asker_due_afresh(w)
    sched.say("j_0", "CANCELLED")
    w.step(one)  # asks; the answer is taken at its next step
    sched.states["j_0"] = "RUNNING"
    one.wake = w.fs.now + delay
    w.start(0)
    w.tick(30.0 + 2 * TIMING.heartbeat_period + 2 * w.fs.max_staleness)
    outcomes = {q.slot: (q.status, type(q.error).__name__) for q in w.procs}
    rel = w.releases.get(1)
    if rel is not None:
        assert all(q.status == "done" for q in w.procs), outcomes
        return
    assert all(q.status == "exited" for q in w.procs), outcomes
    assert isinstance(one.error, PeerJobEndedError), outcomes
    assert all(isinstance(q.error, (PeerJobEndedError, RendezvousTimeoutError)) for q in w.procs), outcomes
    assert w.decided[1].reason.startswith("the scheduler says: peer job j_0 CANCELLED"), w.decided[1]


# ---------------------------------------------------------------------------------------------
# A hostile or broken writer's queue_word.

WORD = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True),
        st.text(max_size=400),
    ),
    lambda kids: st.one_of(st.lists(kids, max_size=20), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=30,
)
WORDS = st.one_of(
    WORD,
    st.fixed_dictionaries({}, optional={"hold": WORD, "lines": WORD, "ended": WORD, "x": WORD}),
)


def test_a_hostile_queue_word_is_read_as_a_bounded_word_or_none():
    """Any JSON value in a beacon's ``queue_word``: the beacon still decodes (the field never refuses
    it), and a follower takes from it at most a boolean hold (True only for JSON ``true``), 16 lines
    of 300 characters and an ``ended`` of 2000 -- never an exception."""
    good = json.loads(encode(Beacon("job", 1, "ab" * 8, "node", 3, 1, "10.0.0.1", None, 3, 0, _host(), 1.7e9)))

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(word=WORDS)
    def fuzz(word):
        d = dict(good, queue_word=word)
        b = decode(json.dumps(d).encode(), Beacon)
        q = QueueWatch(("j_0", "j_1"), "j_2")
        q.from_wire(b.queue_word)
        assert q.hold is (isinstance(word, dict) and word.get("hold") is True)
        assert len(q.lines) <= 16 and all(isinstance(x, str) and len(x) <= 300 for x in q.lines)
        assert isinstance(q.ended, str) and len(q.ended) <= 2000

    fuzz()


def _host():
    from fsmingle.fs.records import HostId

    return HostId(hostname="n1", boot_id="b" * 8, pidns="pid:[1]", pid=1, pid_start=0.0)


# ---------------------------------------------------------------------------------------------
# Spares.


def _spare_joining_a_restarted_world() -> tuple[World, object, object]:
    """A world of 2 (first-come) released in generation 1; slot 0's restart loop runs a new process
    (rank 0 of generation 2), and a spare (``--spare-timeout``) arrives 1 s later: it finds
    generation 1 released without it and joins generation 2 as a member, completing it."""
    w = World(2, ranks=[None, None], timeout=60.0)
    w.start(0), w.start(1)
    w.tick(20.0, stop=lambda: all(q.status == "done" for q in w.procs))
    assert w.releases[1].state == "released"
    # Generation 1's world trains on; the model checks one world at a time: from here, generation 2's.
    w.procs = [q for q in w.procs if q.status != "done"]
    del w.releases[1]
    again = w.start(0)
    w.tick(1.0)
    spare = w.start(None, timeout=60.0, spare_timeout=1e6)
    return w, again, spare


@pytest.mark.parametrize("k", range(10))
def test_spare_timeout_at_every_step_of_joining_a_world_never_splits_it(k):
    """The spare's --spare-timeout passes at its k-th step (the fake network is instantaneous, so
    its bound is set to the time it held so far just before that step): finding generation 1
    released, rejoining, connecting, its hello, its acknowledgement, the commit window.  It is
    either released with rank 0, or fails alone (exit 7) after withdrawing, with rank 0 not
    released -- never a release naming a participant that left (the model's oracles, every step)."""
    w, again, spare = _spare_joining_a_restarted_world()
    n = 0
    while spare.status == "running" and again.status == "running" and n <= k:
        q = min(w.running(), key=lambda x: (x.wake, x.instance))
        w.fs.now = max(w.fs.now, q.wake)
        if q is spare:
            if n == k and spare.p.spare_holding():  # its --spare-timeout passes in this step
                spare.p.spare_hold.bound = spare.p.spare_hold.held_for
            n += 1
        w.step(q)
    w.tick(70.0)
    rel = w.releases.get(2)
    if spare.status == "done":
        assert again.status == "done" and rel is not None and spare.result.generation == 2
    else:
        assert spare.status == "exited" and isinstance(spare.error, RendezvousTimeoutError), spare.error
        assert "--spare-timeout" in str(spare.error)
        assert rel is None or all(m.instance != spare.instance for m in rel.members), rel


def test_a_stale_listing_makes_two_askers_for_a_moment_never_for_long():
    """Rank 2's view lags the staleness bound (2.5 s) and rank 1 claims just after rank 2 asked:
    rank 2 does not see rank 1's claim at first and asks too, then sees it at its next listing and
    leaves asking to rank 1 -- two askers within the staleness bound and a period, then only one,
    and nobody's --timeout runs out meanwhile (rank 0's job pending)."""
    w = World(4, ranks=[0, 1, 2, 3], staleness=2.5, pidns="pod", timeout=30.0)
    sched = w.scheduler = FakeScheduler(lambda: w.fs.now, {"j_0": "PENDING"})
    w.start(3), w.start(2)
    w.tick(3.0)
    w.current(2).host.store.lag = 2.5
    t = w.fs.now
    w.start(1)
    w.tick(3.0)
    assert sched.askers(since=t) == {"j_1", "j_2"}, sched.calls[-6:]  # the attack took: two askers
    settle = w.fs.now + w.fs.max_staleness + 2 * TIMING.heartbeat_period
    w.tick(60.0)
    assert sched.askers(since=settle) == {"j_1"}, sched.calls[-6:]
    for s in (1, 2, 3):
        assert w.current(s).status == "running" and w.current(s).p.queue.hold, (s, w.current(s).error)


def test_a_followers_never_fails_on_an_askers_beacon_word_alone():
    """A broken or hostile asker (same user: owner-only directories) whose beacon's word says a peer
    job ended although the scheduler says it is pending: a follower fails (exit 13) only on the
    asker's restart record (``ENDED_VOID``), never on the beacon -- as ``queue_relay`` documents: a
    follower failing on a beacon voids the generation first with a reason that tells nobody why."""
    w, sched = rank0_held()
    w.tick(12.0)
    one, two = w.current(1), w.current(2)
    assert one.p.queue.relay.asking
    forged = {"hold": True, "lines": ["missing rank 0: job j_0 PENDING"], "ended": "peer job j_0 CANCELLED (forged)"}
    one.p.queue.relay.word = lambda q: forged
    one.p.publish_beacon()
    w.tick(3 * TIMING.heartbeat_period + 2 * w.fs.max_staleness)
    assert two.status == "running", (two.status, two.error)
    assert two.p.queue.hold and not two.p.queue.ended, two.p.queue.as_wire()
    assert 1 not in w.decided, w.decided


def test_a_stuck_askers_word_on_the_same_host_does_not_hold_for_ever():
    """The asker (rank 2) is stuck -- a hung filesystem call, SIGSTOP -- with its process still
    there, on the follower's own host (rank mode: the local check calls it alive, so it is never
    judged dead): its word stops being refreshed (its heartbeat stands still).  The follower (rank
    3) must not hold on that stale word for ever: with rank 0's and rank 1's jobs running (their
    processes never come) its --timeout runs out and it fails (exit 7) naming them."""
    w = World(4, mode="rank", ranks=[0, 1, 2, 3], staleness=1.0, pidns="host", timeout=30.0)
    sched = w.scheduler = FakeScheduler(lambda: w.fs.now, {"j_0": "PENDING", "j_1": "PENDING"})
    two, three = w.start(2), w.start(3)
    assert two.host is three.host
    w.tick(12.0)
    assert two.p.queue.relay.asking and three.p.queue.hold
    w.stall(two, 10_000.0)
    sched.say("j_0", "RUNNING")
    sched.say("j_1", "RUNNING")
    w.tick(TIMING.stale_after + 30.0 + 2 * TIMING.heartbeat_period + 2 * w.fs.max_staleness)
    assert three.status == "exited" and isinstance(three.error, RendezvousTimeoutError), (three.status, three.error)


def test_a_spare_in_a_queue_held_world_is_held_once_and_bounded():
    """A spare (``--spare-timeout``) that is rank 0 of the next generation, alone, while the
    restarted world's jobs are pending in the scheduler (its queue says hold): only the spare hold
    moves its deadline (never both: one second waited is one second held), and it counts against
    --spare-timeout alone; once a member connects it is no longer a spare, its --timeout starts over
    in full, and from then the pending job holds it, counted against --queue-timeout."""
    w = World(3, ranks=[None, None, None], timeout=30.0)
    sched = w.scheduler = FakeScheduler(lambda: w.fs.now)
    for s in range(3):
        w.start(s)
    w.tick(20.0, stop=lambda: all(q.status == "done" for q in w.procs))
    assert w.releases[1].state == "released"
    # Generation 1's world trains on; the model checks one world at a time: from here, generation 2's.
    w.procs = [q for q in w.procs if q.status != "done"]
    del w.releases[1]
    for s in range(3):
        sched.say(f"j_{s}", "PENDING")  # requeued: the world restarts once they run
    spare = w.start(None, timeout=30.0, spare_timeout=1000.0)
    spare.p.queue.queue_timeout, spare.p.queue.held_time = 200.0, DeadlineHold(200.0)
    w.tick(5.0)
    p = spare.p
    assert p.rank == 0 and p.spare_backs == 1 and p.queue.hold, (p.rank, p.spare_backs, p.queue.as_wire())
    t0, d0, s0 = w.fs.now, p.deadline, p.spare_hold.held_for
    w.tick(100.0)
    assert spare.status == "running", spare.error
    held = p.spare_hold.held_for - s0
    assert abs((p.deadline - d0) - held) < 1e-6 and abs(held - (w.fs.now - t0)) < 1.0, (p.deadline - d0, held)
    assert p.queue.held_time.held_for == 0.0  # the queue's hold never counted while the spare's did
    sched.say("j_0", "RUNNING")
    again = w.start(0)
    w.tick(3.0, stop=lambda: p.spare_backs == 0)
    assert p.spare_backs == 0 and again.status == "running" and p.deadline >= w.fs.now + 30.0 - 3.0
    w.tick(100.0)  # past --timeout: j_1, j_2 pending hold it now, against --queue-timeout
    assert spare.status == again.status == "running", (spare.error, again.error)
    assert 90.0 < p.queue.held_time.held_for < 110.0, p.queue.held_time.held_for
    w.tick(150.0)
    assert spare.status == "exited" and "--queue-timeout 200 s" in str(spare.error), spare.error


@pytest.mark.parametrize("neg_ttl", [3.0, 15.0, 60.0])
def test_a_follower_blind_to_the_askers_restart_record_still_fails_on_the_ended_peer(neg_ttl):
    """Rank 2's host keeps a failed lookup "absent" for ``neg_ttl`` seconds (an NFS lookup cache,
    GlusterFS nl-cache): it looked for the decision before the asker voided on rank 0's cancelled
    job, so it cannot see the restart record for a while.  It still fails with exit 13 naming the
    job -- from the record once visible, or, its asker's beacon gone for stale_after, by asking
    the scheduler itself -- and never waits out --timeout (30 s)."""
    w, sched = rank0_held()
    w.tick(12.0)
    two = w.current(2)
    two.host.store.neg_ttl = neg_ttl
    one = asker_due_afresh(w)
    sched.say("j_0", "CANCELLED")
    w.tick(TIMING.stale_after + 3 * TIMING.heartbeat_period + 2 * sched.interval + 2 * w.fs.max_staleness)
    assert one.status == "exited" and isinstance(one.error, PeerJobEndedError), one.error
    assert two.status == "exited" and isinstance(two.error, PeerJobEndedError), (two.status, two.error)
    assert "peer job j_0 CANCELLED" in str(two.error)
