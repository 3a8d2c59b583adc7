"""What a join forgets, pinned (issue 32 item 7, attacked in round 2).

The typed state (:mod:`fsmingle.protocol.parts_state`) replaced ``Participant._reset_gen_state``'s
list of assignments by :meth:`GenView.reset`: a field that a join used to forget and no longer
does (or the reverse) changes behaviour only in a second generation -- a re-run, a rejoin after a
void -- where the enumeration's fault-free runs rarely look.  These are the two lists of the code
before the refactor (8150ef9's ``_reset_gen_state`` and ``__init__``), checked field by field: a
new :class:`GenView` field fails here until it is put in one of them, deliberately.  Also checked:
no two participants share a mutable default (claims, files warned about), as a class attribute
would.
"""

from __future__ import annotations

import dataclasses

from fsmingle.protocol.parts_state import GenView

# Forgotten on every join (8150ef9: Participant._reset_gen_state).
FORGOTTEN = {"claims", "judge", "vouch_seen", "contest_holder", "release_bad_since", "present", "present_spares"}
# Kept across joins: the generation (chosen anew by the join itself), the highest left, the
# attempt's history for a timeout's message, the files warned about once, the joiner's listing and
# its maker's flag (set by every first-come claim), and contest_life (set when a contest starts).
KEPT = {
    "gen",
    "left",
    "master_names",
    "rank0_by_creator",
    "missing_hint",
    "never_present",
    "warned",
    "contest_life",
}


def _all_set() -> GenView:
    v = GenView()
    marks = {
        "gen": 7,
        "left": 6,
        "claims": {1: "a"},
        "judge": object(),
        "vouch_seen": (1.0, None, None),
        "contest_holder": "b",
        "contest_life": True,
        "release_bad_since": 3.0,
        "present": object(),
        "present_spares": 2,
        "master_names": ["x"],
        "rank0_by_creator": True,
        "missing_hint": [2],
        "never_present": frozenset({2}),
        "warned": {"f": 1},
    }
    assert set(marks) == {f.name for f in dataclasses.fields(GenView)}, "a GenView field without a mark here"
    for k, val in marks.items():
        setattr(v, k, val)
    return v


def test_every_genview_field_is_either_forgotten_or_kept_by_a_join():
    fields = {f.name for f in dataclasses.fields(GenView)}
    assert fields == FORGOTTEN | KEPT and not FORGOTTEN & KEPT, (fields - FORGOTTEN - KEPT, FORGOTTEN & KEPT)
    before, judge = _all_set(), object()
    after = dataclasses.replace(before)
    after.reset(judge)
    changed = {f for f in fields if getattr(after, f) is not getattr(before, f)}
    assert changed == FORGOTTEN, (changed - FORGOTTEN, FORGOTTEN - changed)
    assert after.judge is judge and after.claims == {} and after.present is None and after.present_spares == 0


def test_no_two_views_share_a_mutable_default():
    a, b = GenView(), GenView()
    a.claims[0] = "x"
    a.warned["f"] = 1
    assert b.claims == {} and b.warned == {}
    a.reset(object())
    assert a.claims is not b.claims
