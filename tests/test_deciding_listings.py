"""A node in DECIDING lists the job directory (to see its generation retired under it: g + 2 without g) once per
``stale_after``, not at every poll (``Leaving._step_deciding``): counted on a fake store, in fake time."""

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


class _Counting:
    """Wraps a FakeStore's ``listdir``: counts the listings of the job directory (its root)."""

    def __init__(self, store):
        self.root, self._list = 0, store.listdir
        store.listdir = self

    def __call__(self, name=""):
        self.root += name == ""
        return self._list(name)


def _deciding():
    fs = FakeFS()
    store = fs.view("h0")
    timing = Timing(poll_min=POLL, poll_max=0.5, stale_after=STALE)
    p = Participant(store, job_id="j", mode="node", size=2, rank=1, addr="10.0.0.1", instance="i1",
                    me=this_process(), timeout=600.0, timing=timing, clock=FakeClock(fs),
                    transport=FakeNet(lambda: fs.now, fs.advance).transport("h0", "i1", timing.ping_interval))  # fmt: skip
    store.mkdir(gen_name(1))
    p.view.gen, p.seat.state, p.seat.rank = 1, State.DECIDING, 1  # acknowledged; the decision not visible here
    return fs, store, p


def test_a_node_in_deciding_lists_the_root_once_per_stale_after():
    """3 x stale_after in DECIDING without a visible decision, a step every 50 ms: at most 4 listings of the root
    (one per stale_after), where it listed it at every step before (480); the rule still holds: once generation
    1 is retired and 3 exists, the node rejoins within stale_after."""
    fs, store, p = _deciding()
    listed = _Counting(store)
    steps = int(3 * STALE / POLL)
    for _ in range(steps):
        p.step()
        fs.advance(POLL)
    assert p.seat.state is State.DECIDING
    assert listed.root <= 4, listed.root
    fs.retire_truth(gen_name(1), None)
    fs.mkdir_truth(gen_name(3), None)
    t0 = fs.now
    while p.seat.state is State.DECIDING:
        assert fs.now - t0 <= STALE + POLL, "still reading a retired generation's decision"
        p.step()
        fs.advance(POLL)
    assert p.seat.state is State.JOIN and "retired while this node read its decision" in p.seat.note
