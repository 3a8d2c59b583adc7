"""Session 7's adversary (``adv7``): the "retired under it" rejoin of a node in DECIDING (``Leaving._step_deciding``),
reached by an enumeration world (:mod:`model_retired`) and not only by the unit tests of
``test_deciding_listings.py``.  ``python tests/adversary_retired_enum.py`` enumerates every point of every world
(minutes); CI runs the points of the hold of the 3-explicit world without the handlers' own calls."""

from __future__ import annotations

import pytest
from adversary_retired_enum import enumerate_retired
from model_enum import final_oracles
from model_retired import RETIRED_NOTE, SCENARIOS, RetiredScenario, count_points

pytestmark = pytest.mark.usefixtures("quiet_fsmingle")  # thousands of worlds: their warnings are expected


REJOINING = [sc for sc in SCENARIOS if not sc.trap_after]


@pytest.mark.parametrize("sc", REJOINING, ids=[sc.name for sc in REJOINING])
def test_a_member_held_in_deciding_meets_its_generation_retired_and_rejoins_the_final_world(sc):
    """Without a fault: rank 0 of generation 1 dies at its release, the member whose void lost is held 4 x
    stale_after in DECIDING; the others void generation 1, time out of generation 2 and retire generation 1 from
    generation 3; the held member sees 3 without 1, rejoins (the branch) and is released in generation 3."""
    _, w = count_points(sc)
    q = w.held
    assert q is not None and w.reached == 1
    assert any(f"{q.instance[:4]} rejoins: generation 1 {RETIRED_NOTE}" in line for line in w.log), w.log
    assert q.status == "done" and q.result.generation == 3, (q.status, q.error)
    assert 1 in w.retired and {x.result.generation for x in w.procs if x.result is not None} == {3}


# The CPU seconds are ~30 (2,900 runs at ~10 ms each); a loaded shared machine stretches the wall clock.
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "sc, reach", [(SCENARIOS[0], 300), (SCENARIOS[3], 0)], ids=[SCENARIOS[0].name, SCENARIOS[3].name]
)
def test_every_fault_while_a_member_is_held_in_deciding_breaks_no_oracle(sc, reach):
    """Every fault kind at every fault point of every step taken while the member is held in DECIDING (the void of
    generation 1, generation 2 and its timeout, generation 3 and its cleaner) and of the held member's own steps:
    never released into a dead or wrong master, no rank twice, everyone named released, liveness once faults stop
    (``model_enum.run_one``).  Counted: in the world whose generation 1 is voided, most runs rejoin by the branch (a
    reach that cannot vanish unnoticed); in the one whose release names the held member, that release stands."""
    rep = enumerate_retired(sc, handlers=False, hold_only=True)
    print(rep.line())
    assert rep.runs > 500 and rep.reached >= reach, rep.line()
    assert not rep.failures, "\n".join(" | ".join(f) for f in rep.failures[:20])


def test_a_member_held_in_deciding_whose_release_names_it_is_released_not_rejoined():
    """Found by ``model_retired`` (``trap_after``: rank 0 dies just after its ``release.json`` took effect).  Schedule,
    2 explicit, no other fault: generation 1 is released naming A (rank 0) and B; A dies at once; B's void lost to
    the release, so B is in DECIDING, held there 4 x stale_after (SIGSTOP, swap) before its first read.  A
    supervisor restarts A as A' (--timeout 20 s): generation 1 released without it, A' waits in generation 2 as a
    late participant and voids it at its timeout; A'' is rank 0 of generation 3, whose cleaner retired generation 1
    (``retire_decided_below``: decided and two below).  B resumed, found 3 without 1 and rejoined ("retired under
    it": "whatever it decided is over") although the release names it -- with rank 0 alive the others run without
    it (``World._note_left``).  Fix: the cleaner keeps the newest released generation (a newer release supersedes
    it), so B reads its release (into a master that died: torch fails and the job restarts, as for any member
    released with a dead peer)."""
    sc = RetiredScenario("2 explicit, rank 0 dies after its release", 2, explicit=True, trap_after=True)
    w = sc.world()
    sc.script(w)
    w.run_to_completion()
    final_oracles(w)
    q = w.held
    assert q is not None and q.status == "done" and q.result.generation == 1, (q.status, q.error)


def test_the_cleaner_keeps_the_newest_released_generation_on_a_real_directory(tmp_path):
    """``retire_decided_below`` on a ``PosixStore``: below ``g - 1``, every decided generation is retired but the newest
    released one, until a newer release supersedes it (then retired at a later call)."""
    import dataclasses

    from model_enum import Scenario

    from fsmingle.fs.layout import gen_name, release_name
    from fsmingle.fs.records import Release, decode, encode
    from fsmingle.fs.store import PosixStore
    from fsmingle.protocol.cleanup import generations, retire_decided_below

    w = Scenario("2 explicit", 2, explicit=True).world()
    w.start(0), w.start(1)
    w.tick(30.0, stop=lambda: all(q.status == "done" for q in w.procs))
    first = decode(w.fs.current(release_name(1)), Release)  # a real release record, as rank 0 wrote it

    def released(g: int) -> bytes:
        return encode(dataclasses.replace(first, generation=g))

    def restart(g: int) -> bytes:
        return w.procs[0].p.restart_record(g, "test")

    store = PosixStore(str(tmp_path))
    for g, data in ((1, released(1)), (2, restart(2)), (3, restart(3)), (4, None)):
        store.mkdir(gen_name(g))
        if data is not None:
            store.create(release_name(g), data)
    assert retire_decided_below(store, 5) == [2, 3] and generations(store) == [1, 4]  # 1: the newest release
    store.create(release_name(4), released(4))
    for g in (5, 6, 7):
        store.mkdir(gen_name(g))
    store.create(release_name(5), restart(5))
    assert retire_decided_below(store, 7) == [1, 5] and generations(store) == [4, 6, 7]  # 4 supersedes 1
