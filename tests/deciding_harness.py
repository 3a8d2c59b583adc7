"""A node held in DECIDING on a fake store, in fake time, for the tests of its root listings
(``tests/test_deciding_listings.py``, ``tests/test_adversary_s6.py``): :func:`deciding` builds it,
:func:`rejoins_within_stale_after` steps it until it rejoins (``fakefs.CountingListings`` counts its listings)."""

from __future__ import annotations

from fakefs import FakeClock, FakeFS
from fakenet import FakeNet

from fsmingle.fs.layout import gen_name
from fsmingle.net.hostinfo import this_process
from fsmingle.protocol.participant import Participant
from fsmingle.protocol.states import State
from fsmingle.protocol.timing import Timing

STALE = 8.0  # stale_after (seconds)
POLL = 0.05  # fake seconds between the steps


def deciding():
    """(fs, its store, a Participant of rank 1 in DECIDING of generation 1, whose decision it does not see)."""
    fs = FakeFS()
    store = fs.view("h0")
    timing = Timing(poll_min=POLL, poll_max=0.5, stale_after=STALE)
    p = Participant(store, job_id="j", mode="node", size=2, rank=1, addr="10.0.0.1", instance="i1",
                    me=this_process(), timeout=600.0, timing=timing, clock=FakeClock(fs),
                    transport=FakeNet(lambda: fs.now, fs.advance).transport("h0", "i1", timing.ping_interval))  # fmt: skip
    store.mkdir(gen_name(1))
    p.view.gen, p.seat.state, p.seat.rank = 1, State.DECIDING, 1  # acknowledged; the decision not visible here
    return fs, store, p


def rejoins_within_stale_after(fs, p) -> None:
    """Step ``p`` (in DECIDING, its generation just retired) every POLL: it must rejoin within STALE + POLL."""
    t0 = fs.now
    while p.seat.state is State.DECIDING:
        assert fs.now - t0 <= STALE + POLL, "still reading a retired generation's decision"
        p.step()
        fs.advance(POLL)
    assert p.seat.state is State.JOIN
