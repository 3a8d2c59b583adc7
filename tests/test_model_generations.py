"""Issues 21 and 24 on the model: generation numbers never reused, voided generations cleaned, a
busy ``--port``; peer jobs in the scheduler's queue while rank 0's is missing (:mod:`model_queue`).
"""

from __future__ import annotations

import pytest

from fsmingle.errors import (
    ConfigError,
    PeerJobEndedError,
    RendezvousTimeoutError,
)
from fsmingle.fs.layout import (
    GEN_RE,
    gen_name,
    master_dir,
    release_name,
)
from fsmingle.fs.records import Release, decode, encode
from fsmingle.protocol.joining import RETIRED_NUMBER
from fsmingle.protocol.participant import State

try:
    from model_oracles import TIMING
    from model_queue import asker_due_afresh, rank0_held
    from model_world import JOB, Host, World, _count_calls, _released_same_world
except ImportError:  # tests/ imported as a package
    from tests.model_oracles import TIMING
    from tests.model_queue import asker_due_afresh, rank0_held
    from tests.model_world import JOB, Host, World, _count_calls, _released_same_world


# ---------------------------------------------------------------------------------------------
# Issue 21: generation numbers are never reused, voided generations are cleaned, a busy --port.

ADMIN_INSTANCE = "feedfacefeedface"


def _restart(g: int) -> bytes:
    return encode(
        Release(
            job_id=JOB,
            generation=g,
            state="restart",
            mode="node",
            size=2,
            master_addr=None,
            master_port=None,
            members=(),
            writer=ADMIN_INSTANCE,
            reason="test history",
            wall_time=0.0,
        )
    )


def _history_with_retired_generations(w: World) -> None:
    """Generations 1-3 made (3 the newest, undecided); 10 s later 3 and 4 voided (5 made ahead); 2 s
    later 1-3 retired (``fsmingle clean``, or a cleaner keeping the newest decided one, 4)."""
    admin = w.fs.view("admin")
    for g in (1, 2, 3):
        admin.mkdir(gen_name(g))
        admin.mkdir(master_dir(g))
        if g < 3:
            admin.create(release_name(g), _restart(g))
    w.fs.advance(10.0)
    for g in (3, 4):
        admin.mkdir(gen_name(g + 1))
        admin.mkdir(master_dir(g + 1))
        admin.create(release_name(g), _restart(g))
    w.fs.advance(2.0)
    for g in (1, 2, 3):
        admin.retire(gen_name(g))
    w.fs.advance(1.0)


def _gens_on_disk(w: World) -> list[int]:
    return sorted(int(GEN_RE.match(d).group(1)) for d in w.fs.dirs if GEN_RE.fullmatch(d) and w.fs.dir_exists(d))


@pytest.mark.parametrize("relist_fresh", [True, False], ids=["joiner-relists", "rank0-relists"])
def test_a_stale_listing_never_resurrects_a_retired_generation(relist_fresh):
    # Issue 21 row 3: a joiner whose listing is 12 s stale sees generation 3 as the newest, but 3
    # was retired; its mkdir re-creates it.  Before: it became rank 0 of an empty old generation
    # while the world waited in 5 (a hang; with timeouts, "generation 3 decided twice").  Now the
    # joiner re-lists after creating it, marks it retired and joins 5; if that re-listing is
    # still stale (relist_fresh=False), rank 0 of 3 re-lists every stale_after and leaves it.
    w = World(2, staleness=15.0)
    _history_with_retired_generations(w)
    stale = w.start(0)
    stale.host.store.lag = 12.0  # its listing shows the job directory as it was at t0 + 1
    stale.host.store.mkdir_refreshes_listing = relist_fresh
    w.start(1)
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert rel.generation == 5 and sorted(m.instance for m in rel.members) == sorted(q.instance for q in w.procs)
    # (rank 0 of generation 5 has retired the marked generation 3 again since: read its event)
    made = [e for e in w.fs.events if e.op == "create" and e.ok and e.name == release_name(3)]
    marked = decode(made[-1].data, Release)
    assert marked.state == "restart" and marked.writer == stale.instance
    if relist_fresh:
        assert marked.reason.startswith(RETIRED_NUMBER) and took < 5, (marked.reason, took)
    else:
        assert "re-created from a stale listing" in marked.reason and took < 2 * TIMING.stale_after + 5


def test_voided_generations_are_cleaned_while_the_job_runs():
    # Issue 21 row 8: a member killed 8 times after connecting; each kill voids a generation.
    # Before: prepare_next() made every next generation ahead, no joiner's mkdir created one, so
    # the cleaner never ran and all 9+ generations stayed.  Now each generation's rank 0 cleans.
    w = World(4)  # slot 3 comes last: the world cannot complete during the crash loop
    w.start(0)
    w.start(1)
    for _ in range(8):
        q = w.start(2)
        w.tick(3.0)
        assert q.p.state is State.WAIT and q.p.role is not None and q.p.role.link is not None
        w.crash(q)
        w.tick(3.0)
    assert len(w.decided) >= 8
    on_disk = _gens_on_disk(w)
    assert len(on_disk) <= 3, on_disk
    w.start(2)
    w.start(3)
    w.run_to_completion()
    rel = _released_same_world(w)
    on_disk = _gens_on_disk(w)
    assert on_disk == [rel.generation - 1, rel.generation, rel.generation + 1], on_disk


def _occupy_port(w: World, host: Host, port: int) -> str:
    owner = "0bad0bad0bad0bad"
    w.net.transport(host.key, owner, 1.0).listen(host.addr, port, 1)
    return owner


def test_busy_port_on_every_host_fails_first_come_within_stale_after():
    # Issue 21 row 6: --port busy on every host (a previous run's master holds it).  Before:
    # nobody took rank 0 and everyone timed out blaming a master that "never published its
    # endpoint".  Now: a warning at once, and exit 3 (ConfigError) naming the port and its
    # holder once no rank 0 appeared for stale_after.
    w = World(2, master_port=29500, timeout=300.0)
    for s in range(2):
        _occupy_port(w, w.host(w.slot_host[s]), 29500)
    qs = [w.start(s) for s in range(2)]
    w.tick(TIMING.stale_after + 5.0)
    for q in qs:
        assert q.status == "exited" and isinstance(q.error, ConfigError), (q.status, q.error)
        msg = str(q.error)
        assert "--port 29500 is already in use" in msg and "held by fake process 0bad" in msg, msg
        assert "no other node took rank 0" in msg, msg
        assert q.died_at - w.procs[0].hid.pid_start <= TIMING.stale_after + 3.0


def test_busy_port_on_one_host_lets_another_take_rank0():
    w = World(3, master_port=29500)
    _occupy_port(w, w.host(w.slot_host[0]), 29500)
    first = w.start(0)
    w.tick(0.5)
    assert "already in use" in first.p.note and "held by fake process 0bad" in first.p.note
    w.start(1)
    w.start(2)
    w.run_to_completion()
    rel = _released_same_world(w)
    assert rel.members[0].instance != first.instance and first.status == "done"


# ---------------------------------------------------------------------------------------------
# Issue 24: peer jobs in the scheduler's queue while the one missing is rank 0's (explicit ranks,
# as array tasks started with --node-rank from the task index).


def test_missing_rank0_the_lowest_present_rank_asks_and_everyone_holds():
    w, sched = rank0_held()
    w.tick(120.0)  # four times --timeout
    one, two = w.current(1), w.current(2)
    assert one.status == two.status == "running", (one.error, two.error)
    assert sched.askers() == {"j_1"}, sched.calls  # one asker, never every node
    assert len(sched.calls) <= 120 / sched.interval + 2
    for q in (one, two):
        assert q.p.queue.hold and "missing rank 0: job j_0 PENDING (JobHeldUser)" in q.p.note, q.p.note
    # rank 0 starts: it asks from now on, the asker stops (its beacon drops the word), the world completes
    sched.states["j_0"] = "RUNNING"
    w.start(0)
    w.tick(5.0)
    t = w.fs.now
    w.run_to_completion()
    assert _released_same_world(w).generation == 1
    assert "j_1" not in sched.askers(since=t), sched.calls


def test_missing_rank0_the_asker_dies_and_the_next_lowest_takes_over():
    w, sched = rank0_held()
    w.tick(20.0)
    w.crash(w.current(1))
    t = w.fs.now
    w.tick(90.0)
    two = w.current(2)
    assert two.status == "running", two.error  # held all along: rank 1's word, then its own
    assert sched.askers(since=t + TIMING.stale_after + 2 * TIMING.heartbeat_period) == {"j_2"}, sched.calls
    assert two.p.queue.hold
    sched.states["j_0"] = "RUNNING"
    w.start(0)
    w.run_to_completion()  # restarts slot 1; rank 0 voids its dead claim, the next generation releases


def test_missing_rank0_cancelled_fails_the_asker_and_the_others_at_once():
    w, sched = rank0_held()
    w.tick(40.0)
    sched.say("j_0", "CANCELLED")
    t = w.fs.now
    w.tick(TIMING.heartbeat_period + 2 * sched.interval + 2 * w.fs.max_staleness + 1)
    for s in (1, 2):
        q = w.current(s)
        assert q.status == "exited" and isinstance(q.error, PeerJobEndedError), (s, q.status, q.error)
        assert "peer job j_0 CANCELLED (JobHeldUser) without joining" in str(q.error)
        assert q.died_at - t < TIMING.heartbeat_period + 2 * sched.interval + 2 * w.fs.max_staleness + 1
    assert w.decided[1].reason.startswith("the scheduler says: peer job j_0 CANCELLED")
    assert sched.askers() == {"j_1"}


def test_an_old_members_beacon_without_a_word_is_not_followed_for_ever(monkeypatch):
    """Rank 1 runs a version without the asker (its beacon never carries a word): rank 2 lists
    the generation again at most every stale_after / 2, and waits with --timeout (no hold, no
    scheduler call: rank 1 is present and not dead, so rank 2 is not the lowest)."""
    from fsmingle.protocol import queue_relay

    finds = _count_calls(monkeypatch, queue_relay.Relay, "_find")
    w, sched = rank0_held()
    w.current(1).p.queue = None  # an older fsmingle: no QueueWatch, no queue_word
    w.tick(25.0)
    two = w.current(2)
    assert two.status == "running" and not two.p.queue.hold and sched.calls == []
    assert two.p.queue.relay.asker[0] == 1 and not two.p.queue.relay.asking
    assert 1 <= len(finds) <= 25.0 / (TIMING.stale_after / 2) + 2, len(finds)
    w.tick(10.0)
    assert two.status == "exited" and isinstance(two.error, RendezvousTimeoutError), two.error


@pytest.mark.parametrize("kind", ["interrupt", "storage", "oserror"])
def test_a_fault_at_every_call_of_the_asker(kind):
    """An exception or interrupt at each store operation of the asker's step, and in its
    scheduler call: it withdraws (voiding the generation), the others regroup, the next lowest
    asks (the asker's job requeued: pending), nobody times out, and once every slot runs the
    world is released.  A scheduler call that fails (not an interrupt) degrades to --timeout only."""
    for k in range(8):
        w, sched = rank0_held()
        w.tick(12.0)
        one = asker_due_afresh(w)
        if k == 7:
            sched.raise_in = ("j_1", w.exc_factory(kind))
            w.step(one)
        else:
            w.step(one, fault=("store", k, kind), after_effect=bool(k % 2))
        if one.status != "running":
            sched.say("j_1", "PENDING")  # requeued (a job that ended would fail everyone: exit 13)
        w.tick(45.0)  # past --timeout 30 s: only a hold keeps the others waiting
        two = w.current(2)
        if k == 7 and kind != "interrupt":
            # A scheduler call that fails degrades, as on rank 0: one warning, then --timeout only
            # (the asker's word says no hold; nobody holds on a scheduler nobody can ask).
            assert one.p.queue.broken and not two.p.queue.hold
            assert all(isinstance(q.error, RendezvousTimeoutError) for q in (one, two)), (one.error, two.error)
            continue
        assert two.status == "running", (k, two.error, w.log[-20:])
        if one.status == "exited":
            assert two.p.queue.hold and "j_2" in sched.askers(since=w.fs.now - 20.0), (k, sched.calls[-5:])
        sched.say("j_0", "RUNNING")
        w.start(0)
        w.run_to_completion()


@pytest.mark.parametrize("kind", ["interrupt", "storage"])
def test_a_fault_at_every_call_of_the_asker_that_finds_rank0s_job_ended(kind):
    """Rank 0's job is cancelled and the asker fails at each store operation of the steps that
    find it (its listing, beacon read and word; then, taking the answer, the void's mkdirs and
    create): whichever way it leaves, rank 2 fails with exit 13 naming the job -- on the asker's
    restart record, or by asking itself in the next generation -- and never waits out --timeout."""
    for step, k in [(0, k) for k in range(4)] + [(1, k) for k in range(7)]:
        w, sched = rank0_held()
        w.tick(12.0)
        one = asker_due_afresh(w)
        sched.say("j_0", "CANCELLED")
        if step == 1:
            w.step(one)  # asks; the answer is taken at its next step (the query runs in a thread)
            assert one.status == "running" and w.fs.current(release_name(1)) is None
            one.wake = w.fs.now
        w.step(one, fault=("store", k, kind), after_effect=bool(k % 2))
        w.tick(25.0)  # under --timeout 30 s from here
        for q in (one, w.current(2)):
            assert q.status == "exited", (k, q.slot, q.status, w.log[-20:])
        two = w.current(2)
        assert isinstance(two.error, PeerJobEndedError) and "peer job j_0 CANCELLED" in str(two.error), two.error
