"""Session 6's adversary (``adv``): holes found in session 5's rendezvous changes, each pinned where it is open.

Each test says the schedule that breaks the rule and is ``xfail(strict=True)`` while the hole is open, so that the
fix makes it XPASS (then drop the mark).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("torch")


def test_a_cut_host_with_two_agents_of_the_job_sits_out(monkeypatch):
    """torchrun/reach (``reaches_any``, d1b4a85) and ``FsRendezvousHandler._leave_round``: a node that reaches no other
    member sits the round out (the members that reach each other complete the next round without it).

    Schedule: two agents of the job run on host 10.0.0.1 (two torchrun per node, or a test cluster on one host);
    its link is cut; the round is lost ("redo").  ``_leave_round`` builds its targets from every other node of the
    state -- ``_NodeDesc`` differs by pid, so the second agent of 10.0.0.1 is "another member" -- and drops only
    rank 0's address when it is this node's.  A connect to this host's own address never leaves the host (the
    kernel answers it through loopback: accepted or RST, both "reachable"), so whenever the sample holds it (here:
    3 targets, all sampled) the cut agent concludes it reaches someone, joins the next round at once, cannot
    confirm again, and the rounds are lost for as long as the cut lasts.  Wrong answer: no sit-out.  Fix: leave
    out every target at this node's own address, as is done for rank 0's."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    from fsmingle.torchrun import handler, reach

    me = _NodeDesc("10.0.0.1", 100, 0)
    twin = _NodeDesc("10.0.0.1", 101, 0)  # the other agent of this host
    peer = _NodeDesc("10.0.0.2", 200, 0)
    state = SimpleNamespace(participants={me: 0, twin: 1, peer: 2}, wait_list=set(), redundancy_list=set())
    probed: list[tuple[str, int]] = []

    def reachable(addr: str, port: int, timeout_s: float = 2.0) -> bool:
        probed.append((addr, port))
        return addr == me.addr  # the cut: only this host's own address answers (loopback)

    monkeypatch.setattr(reach, "reachable", reachable)
    sat: list[str] = []
    monkeypatch.setattr(handler, "sit_out", lambda targets, closed, why: sat.append(why))
    left: list[object] = []
    fake = SimpleNamespace(
        _round=(1, 3, "10.0.0.3", 29500),
        _state_holder=SimpleNamespace(state=state),
        _this_node=me,
        _op_executor=SimpleNamespace(run=lambda op, deadline: left.append(op)),
        _get_deadline=lambda t: 0.0,
        _settings=SimpleNamespace(timeout=SimpleNamespace(close=None)),
        _fs_backend=SimpleNamespace(peek=lambda: None),
    )
    handler.FsRendezvousHandler._leave_round(fake, "round 3: redo")
    assert sat and left, f"the cut agent joins the next round at once (it probed {sorted(set(probed))})"


def test_retired_check_carried_into_a_later_generation_still_sees_a_retirement_within_stale_after():
    """dbd9cfe (``Timers.retired_check``), the brief's question "is the timer reset per generation?": no, and it
    need not be -- it is an absolute time, so a node in DECIDING lists the root at most once and at least once per
    ``stale_after`` (plus a poll) whatever generation it reads.  Schedule: DECIDING in generation 1 lists the root
    (the timer is set ``stale_after`` ahead); the node moves on and is in DECIDING in generation 3 a poll later;
    generation 3 is retired and 5 made at once.  Pinned: it rejoins within ``stale_after`` + a poll of the
    retirement, and never lists twice within ``stale_after``.  Passes on dbd9cfe (not a hole)."""
    from deciding_harness import POLL, deciding, rejoins_within_stale_after
    from fakefs import CountingListings

    from fsmingle.fs.layout import gen_name
    from fsmingle.protocol.states import State

    fs, store, p = deciding()
    listed = CountingListings(store)
    p.step()  # generation 1: lists the root, retired_check = now + STALE
    assert listed.root == 1
    fs.advance(POLL)
    fs.mkdir_truth(gen_name(2), None)
    fs.mkdir_truth(gen_name(3), None)
    p.view.gen, p.seat.state = 3, State.DECIDING  # acknowledged generation 3's release; lost rank 0
    fs.retire_truth(gen_name(3), None)
    fs.mkdir_truth(gen_name(5), None)
    rejoins_within_stale_after(fs, p)
    assert "generation 3 was decided and retired" in p.seat.note
    assert listed.root == 2, listed.root
