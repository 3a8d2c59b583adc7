"""Deterministic scenarios of the model (issue 11): the real ``Participant`` on :mod:`fakefs` and
:mod:`fakenet` (:class:`model_world.World`), one situation each, every oracle checked at every step.
"""

from __future__ import annotations

import pytest

from fsmingle.errors import (
    RankConflictError,
    RendezvousTimeoutError,
    WorldSizeMismatchError,
)
from fsmingle.fs.layout import (
    RELEASE,
    gen_name,
    master_dir,
    release_name,
)
from fsmingle.fs.records import Claim, decode
from fsmingle.protocol.participant import State

try:
    from model_oracles import GLUSTER_NEG, TIMING
    from model_world import World, _count_calls, _released_same_world
except ImportError:  # tests/ imported as a package
    from tests.model_oracles import GLUSTER_NEG, TIMING
    from tests.model_world import World, _count_calls, _released_same_world


@pytest.mark.parametrize("mode", ["node", "rank"])
def test_four_nodes_under_staleness_release_one_world(mode):
    w = World(4, mode=mode, staleness=2.0)
    for s in range(4):
        w.start(s)
    for h in w.hosts.values():
        h.store.lag = 2.0
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert sorted(q.p.rank for q in w.procs) == [0, 1, 2, 3]
    assert rel.generation == 1 and took < 10
    assert all(q.status == "done" for q in w.procs)


def test_explicit_ranks_with_staggered_arrivals():
    w = World(3, ranks=[2, 0, 1], staleness=1.0)
    for s in range(3):
        w.start(s)
        w.tick(5.0)
    w.run_to_completion()
    rel = _released_same_world(w)
    assert [m.instance for m in rel.members] == [w.current(s).instance for s in (1, 2, 0)]


def test_dead_master_is_voided_and_replaced():
    # rank 0 claims, publishes its endpoint, then dies: its port closes with it, so the members'
    # connects are refused (the master is gone) and they void; its replacement regroups them.
    w = World(3, ranks=[0, 1, 2], staleness=1.0, pidns="pod")
    w.start(0)
    w.tick(0.5)
    w.crash(w.current(0))
    w.start(1)
    w.start(2)
    w.tick(2.0)
    assert w.decided.get(1) is not None and w.decided[1].state == "restart"
    assert "refused" in w.decided[1].reason
    w.start(0, new_host=True)
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert rel.generation >= 2 and rel.members[0].instance == w.current(0).instance
    assert took < w.bound()


def test_duplicate_explicit_rank_fails_while_holder_alive():
    w = World(2, ranks=[0, 1], staleness=1.0, pidns="pod")
    a = w.start(0)
    w.tick(3.0)
    b = w.start(None, rank=0)
    w.tick(TIMING.stale_after)
    assert b.status == "exited" and isinstance(b.error, RankConflictError)
    assert a.status == "running" and a.p.rank == 0


def test_crash_in_every_operation_of_the_last_joiner():
    # the last participant dies at each of its store operations in turn; the world always recovers
    for k in range(12):
        for after in (False, True):
            w = World(3, ranks=[None] * 3, staleness=1.0, pidns="pod")
            w.start(0)
            w.start(1)
            w.tick(2.0)
            q = w.start(2)
            w.step(q, crash_at=k, after_effect=after)
            if q.status == "running":
                w.crash(q)
            w.tick(1.0)
            w.run_to_completion()


def test_first_come_port_race_on_one_host():
    # Formerly a known bug (fixed in 5eb175e, still holds in v2).  Per-rank mode, two first-come
    # processes on one node, --port 29500.  A holds the port and is about to create
    # rank-00000.claim; B lists the directory in between, sees rank 0 free and tries to listen on
    # the same port: it must take another rank instead of dying with "port already in use".
    w = World(2, mode="rank", master_port=29500)
    a, b = w.start(0), w.start(1)
    assert a.host is b.host
    w.step(a, preempt=(6, b))  # A: listdir, mkdir gen, mkdir master, read release, beacon, listdir gen, [B] create
    assert b.error is None, f"B died: {b.error!r}"
    w.run_to_completion()
    assert {q.p.rank for q in (a, b)} == {0, 1}


def test_acked_member_reads_the_decision_through_its_negative_cache():
    # Formerly "timeout withdraw misses a stale release" (v1).  B acknowledged the release; its
    # connection is reset (unread data lost) before the go arrives.  B voids, loses the race to
    # rank 0's release, and must read the decision -- which its negative cache hides for 15 s,
    # past B's deadline -- instead of leaving a world that starts with it.
    w = World(2, ranks=[0, 1], timeout=30.0)
    a, b = w.start(0), w.start(1)
    w.hosts[1].store.neg_ttl = 15.0
    w.step(b)  # joins gen 1: mkdir, read release.json (absent: cached so for 15 s), claim
    w.tick(20.0, stop=lambda: a.p.role is not None and a.p.role.preparing_since is not None)
    assert a.p.role.preparing_since is not None, "rank 0 never prepared"
    w.fs.advance(9.0)  # B's deadline is near: the release will show to B only after it
    w.step(b)  # B acknowledges
    (pipe,) = [pp for pp in w.net.open_pipes() if pp.link.owner == b.instance]
    w.step(a)  # rank 0 commits: release.json, go
    assert 1 in w.releases
    w.net.reset(pipe, lose_unread=True)  # the go never reaches B
    w.tick(40.0, stop=lambda: b.status != "running")
    assert b.status == "done" and b.result.generation == 1


def test_gluster_negative_cache_hides_a_generation_looked_up_too_early():
    # Issue 11, row 1: on a GlusterFS client with nl-cache, a name looked up before it existed
    # stays ENOENT for 61 s while listing its parent shows it.  Host 1 (e.g. `fsmingle status`
    # run there) looked gen-00000001 up before anyone made it.  Its participant must neither walk
    # away from generation 1 holding a claim nor let the others be released without it.
    w = World(3, ranks=[None] * 3)
    w.hosts.clear()
    h1 = w.host(1)
    h1.store.neg_ttl = GLUSTER_NEG
    assert h1.store.read(release_name(1)) is None  # the too-early lookup
    h1.store.neg_ttl = 0.0
    w.start(0)
    w.tick(1.0)
    w.start(1)
    w.start(2)
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert {m.instance for m in rel.members} == {q.instance for q in w.procs}
    assert took <= GLUSTER_NEG + w.bound()


def _connected_member_keeps_its_place(disturb, for_s: float) -> None:
    """Ranks 0 and 1 of 3 start and connect; ``disturb(world, rank0)``, then ``for_s`` seconds pass:
    generation 1 must stay undecided (no void), and once rank 2 arrives it is released to all."""
    w = World(3, ranks=[0, 1, 2])
    a, _b = w.start(0), w.start(1)
    w.tick(3.0)
    assert a.p.role.rank_conn.keys() == {1}
    disturb(w, a)
    w.tick(for_s)
    assert 1 not in w.decided, f"generation 1 decided: {w.decided.get(1)}"
    w.start(2)
    w.run_to_completion()
    assert _released_same_world(w).generation == 1


def test_generation_dir_enoent_on_a_waiting_member_is_confirmed_not_acted_on():
    # An ENOENT on a directory that exists (a spurious one, for 20 s) while a member waits
    # connected: it must keep its place (no void, no rejoin) and be released with the others.
    _connected_member_keeps_its_place(lambda w, a: w.hosts[1].store.blind(gen_name(1), 20.0), 25.0)


def test_silent_partition_of_rank1_at_release_time_voids():
    # Issue 11, row 2: node rank 1's link goes down (no RST, no answer) right after rank 0 asked
    # everyone to acknowledge; its filesystem stays reachable.  Rank 1's ack never arrives:
    # rank 0 must void, never release.  After the link comes back, everyone regroups.
    w = World(3, ranks=[0, 1, 2])
    a, b, _c = w.start(0), w.start(1), w.start(2)
    w.tick(10.0, stop=lambda: a.p.role is not None and a.p.role.preparing_since is not None)
    assert a.p.role.preparing_since is not None
    w.net.partition(b.host.key)
    w.tick(TIMING.probe_timeout + 1.0)
    assert not w.releases and w.decided[1].state == "restart"
    assert "did not acknowledge" in w.decided[1].reason
    w.tick(30.0)
    assert not w.releases  # still cut off: nobody is released into a world with rank 1 unreachable
    w.net.heal()
    took = w.run_to_completion()
    assert _released_same_world(w).generation >= 2 and took < w.bound()


def test_silent_partition_before_connecting_never_releases():
    w = World(2, ranks=[0, 1], partitioned={1})
    _a, b = w.start(0), w.start(1)
    w.tick(60.0)
    assert not w.releases and w.net.connect_timeouts > 0
    assert "cannot reach the master" in b.p.note
    w.run_to_completion()


def test_master_address_that_does_not_answer_never_releases():
    # Issue 11, row 4: `--addr 10.9.9.9` (no host has it) for rank 0.  v1 released both nodes
    # with MASTER_ADDR=10.9.9.9 when rank 0 completed the world; v2 needs the member's connection.
    w = World(2, ranks=[0, 1], addrs={0: "10.9.9.9"}, timeout=30.0)
    a, b = w.start(0), w.start(1)
    w.tick(40.0)
    assert not w.releases
    assert a.status == b.status == "exited"
    assert isinstance(a.error, RendezvousTimeoutError) and isinstance(b.error, RendezvousTimeoutError)
    assert "10.9.9.9" in str(b.error)


@pytest.mark.parametrize("ranks", [[None] * 3, [0, 1, 2]], ids=["first-come", "explicit"])
def test_lost_link_reply_on_a_claim_is_recognised(ranks):
    # Issue 11, row 6: link() took effect but its reply was lost (NFS retransmit -> EEXIST).  The
    # claimer must read the claim back and recognise its own: one rank, not two, and released.
    w = World(3, ranks=ranks)
    w.start(0)
    w.tick(1.0)
    b = w.start(1)
    b.host.store.arm_lost_reply(0, lambda n: n.endswith(".claim"))
    # first-come: b asks rank 0 and claims the rank it is offered, a round trip later
    w.tick(2.0, stop=lambda: bool(b.host.store.lost_replies))
    assert b.host.store.lost_replies, "the lost reply was not injected"
    w.start(2)
    w.run_to_completion()
    rel = _released_same_world(w)
    assert [m.instance for m in rel.members].count(b.instance) == 1
    claims = [n for n in w.fs.present_files(gen_name(1)) if n.endswith(".claim")]
    holders = [decode(w.fs.current(n), Claim).instance for n in claims]
    assert holders.count(b.instance) == 1, f"{b.instance} holds {holders.count(b.instance)} ranks"


def test_rank0_busy_with_members_connected_is_not_voided():
    # Issue 11, row 7: rank 0 does not step (a long scan, GC, swapping) for most of stale_after
    # while members wait connected: nobody may void it; the world is released when complete.
    _connected_member_keeps_its_place(lambda w, a: w.stall(a, 0.8 * TIMING.stale_after), 0.8 * TIMING.stale_after)


def test_rank0_stopped_longer_than_stale_after_is_voided_then_regrouped():
    w = World(3, ranks=[0, 1, 2])
    a, _b, _c = w.start(0), w.start(1), w.start(2)
    w.tick(0.2)
    w.stall(a, 3 * TIMING.stale_after)  # stopped before it could release (SIGSTOP, a frozen VM)
    if not w.releases:
        w.tick(3 * TIMING.stale_after)
        assert 1 in w.decided
    w.run_to_completion()


@pytest.mark.parametrize("first", [0, 1])
def test_participants_disagreeing_on_size_get_a_clear_error(first):
    # Issue 11, row 9: v1 crashed with an IndexError traceback.
    w = World(2, ranks=[0, 1], sizes=[2, 3])
    q0, q1 = w.start(0), w.start(1)
    w.step([q0, q1][first])
    w.tick(30.0)
    assert not w.releases
    errs = [q.error for q in w.procs if q.error is not None]
    assert errs and all(isinstance(e, WorldSizeMismatchError) for e in errs), errs
    assert all("2" in str(e) and "3" in str(e) for e in errs)


# ---------------------------------------------------------------------------------------------
# Protocol bugs the model found in v2 (5-7), fixed: each scenario now passes as a regression test,
# and the machine generates their situations (no KNOWN_BUGS guard left for them).  Bug 4 of v1 (a
# torn O_EXCL release) and the link=False scenarios are gone: PosixStore no longer falls back to
# O_EXCL (1f6f377).


def test_bug_lost_reply_on_release_record():
    # coordinator.py, Coordinator._commit: store.create(release.json) took effect but returned
    # False (lost link() reply).  Rank 0 reads the record back, finds its *own* "released"
    # decision, calls it "voided by another participant" and rejoins generation 2 -- while
    # release.json of generation 1 names everyone.  A member that had acknowledged and lost its
    # connection reads that release and starts alone (another world than everyone else's);
    # `status` and late arrivals read generation 1 as released.  Fix: in _commit, after the
    # create returns False, treat `got.state == "released" and got.writer == p.instance` as
    # success (the same read-back the claims do).
    w = World(2, ranks=[0, 1])
    a, b = w.start(0), w.start(1)
    a.host.store.arm_lost_reply(0, lambda n: n.endswith(RELEASE))
    w.tick(30.0)  # fails: "0002 left generation 1 although its release names it"
    assert all(q.status == "done" for q in (a, b))


def test_bug_master_dir_enoent_leaves_rank0_without_a_role():
    # protocol.py, Participant._hold sets state WAIT, then Coordinator.__init__ publishes the
    # endpoint in master/; an ENOENT there (a lookup of gen-N/master cached as absent, or a
    # spurious one) propagates to step()'s handler, which keeps state WAIT with self.role None:
    # the next step raises AttributeError ('NoneType' object has no attribute 'step').  Fix:
    # publish the endpoint from Coordinator.step() until it succeeds (a `published` flag), so
    # ENOENT is retried like any other.
    w = World(2, ranks=[0, 1])
    a = w.start(0)
    # a's first step: listdir, mkdir gen, mkdir master, read release, beacon, claim, beacon, [master/ endpoint]
    a.host.store.arm_hook(7, lambda: a.host.store.blind(master_dir(1), 5.0))
    w.step(a)
    w.start(1)
    w.tick(10.0)
    assert a.error is None, f"rank 0 died: {a.error!r}"
    w.run_to_completion()


def test_bug_enoent_retry_does_not_spin():
    # protocol.py, Participant.heartbeat_if_due bumps next_hb only after publish_beacon()
    # succeeded, and next_delay() takes the role's delay in WAIT, ignoring the backoff that
    # _on_enoent set.  A member not yet connected whose generation directory is cached as absent
    # (61 s on GlusterFS) retries its heartbeat at every step with a zero delay: a busy loop of
    # failing writes against the metadata server for the whole cache lifetime; once connected,
    # every step fails before reading the channel, so it stops answering pings and rank 0 voids.
    # Fix: set next_hb before publishing, and in next_delay() use max(role.delay(), self.delay)
    # while _enoent_since is set.
    w = World(2, ranks=[0, 1])
    b = w.start(1)
    w.step(b)
    b.host.store.blind(gen_name(1), 5.0)
    w.fs.advance(TIMING.heartbeat_period)
    w.tick(1.0)
    assert w.spins == 0, f"{w.spins} zero-delay retries in 1 s"


@pytest.mark.parametrize("arrivals", ["staggered", "together"])
def test_big_first_come_world_asks_rank0_instead_of_listing(monkeypatch, arrivals):
    """48 first-come nodes (above SPREAD_ABOVE): joiners whose 3 guesses collide ask rank 0 and
    claim what it offers; the generation directory is listed by rank 0's scans, not by joiners."""
    from fsmingle.protocol import joining
    from fsmingle.protocol.rank0 import coordinator

    asks = _count_calls(monkeypatch, coordinator.Coordinator, "_on_ask")
    listings = _count_calls(monkeypatch, joining.Joining, "claim_by_listing")
    n = 48
    assert n > joining.SPREAD_ABOVE
    w = World(n, staleness=1.0)
    for s in range(n):
        w.start(s)
        if arrivals == "staggered":
            w.tick(0.2)
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert sorted(m.rank for m in rel.members) == list(range(n))
    assert rel.generation == 1 and took < w.bound()
    assert asks, "no joiner asked rank 0: the test no longer drives the asking path"
    # Listing fallbacks: only before rank 0 published its endpoint or when it offered nothing.
    assert len(listings) <= 3, f"{len(listings)} joiners listed the generation"


def test_connected_members_with_rare_heartbeats_live_by_rank0s_vouch(monkeypatch):
    """In a big world a connected member heartbeats its beacon rarely (member.MEMBER_BEACONS_PER_S);
    rank 0's beacon vouches for it.  A contester for its rank must not judge it dead and void the
    generation -- long after the member's own beacon went stale -- and learns of the conflict when
    the world is released."""
    from fsmingle.protocol import member

    monkeypatch.setattr(member, "MEMBER_BEACONS_PER_S", 1e-6)  # a member's own beacon: never again
    w = World(4, ranks=[0, 1, 2, 3], staleness=1.0, pidns="pod")
    for s in range(3):  # rank 3 comes last: the world waits
        w.start(s)
    w.tick(5.0)
    w.tick(2 * TIMING.stale_after)  # the members' own beacons are stale by now
    intruder = w.start(None, rank=1, new_host=True)
    w.tick(2 * TIMING.stale_after)
    assert w.decided.get(1) is None, f"generation 1 voided: {w.decided.get(1)}"
    assert intruder.status == "running" and intruder.p.state is State.CONTEST
    w.start(3)
    w.tick(10.0)
    assert w.releases.get(1) is not None
    assert intruder.status == "exited" and isinstance(intruder.error, RankConflictError), intruder.error
    assert "released" in str(intruder.error)
