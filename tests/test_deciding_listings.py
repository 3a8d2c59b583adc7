"""A node in DECIDING lists the job directory (to see its generation retired under it: g + 2 without g) once per
``stale_after``, not at every poll (``Leaving._step_deciding``): counted on a fake store, in fake time."""

from __future__ import annotations

from deciding_harness import POLL, STALE, deciding, rejoins_within_stale_after
from fakefs import CountingListings

from fsmingle.fs.layout import gen_name
from fsmingle.protocol.states import State


def test_a_node_in_deciding_lists_the_root_once_per_stale_after():
    """3 x stale_after in DECIDING without a visible decision, a step every 50 ms: at most 4 listings of the root
    (one per stale_after), where it listed it at every step before (480); the rule still holds: once generation
    1 is retired and 3 exists, the node rejoins within stale_after."""
    fs, store, p = deciding()
    listed = CountingListings(store)
    steps = int(3 * STALE / POLL)
    for _ in range(steps):
        p.step()
        fs.advance(POLL)
    assert p.seat.state is State.DECIDING
    assert listed.root <= 4, listed.root
    fs.retire_truth(gen_name(1), None)
    fs.mkdir_truth(gen_name(3), None)
    rejoins_within_stale_after(fs, p)
    assert "retired while this node read its decision" in p.seat.note
