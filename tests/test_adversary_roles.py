"""The adversary's enumerations of every role of FolderStore with a fault at every store step (issue 30; session 5,
"nradv"): ``tests/adversary_enum_roles.py`` over fakefs and ``tests/adversary_enum_posix_roles.py`` on a real
directory.  CI runs the ``ci`` sizes; ``FSMINGLE_ADVERSARY=big`` runs the big ones (minutes to an hour)."""

from __future__ import annotations

import os

SIZE = os.environ.get("FSMINGLE_ADVERSARY", "ci")


def test_every_role_with_a_fault_at_every_store_step_over_fakefs_is_linearizable(monkeypatch):
    """From every start state of an epoch (seal_at 4: a delta reads versions below it back; A's listings lag 2.5 s),
    node A's add, set, compare_set (matching or not), delete or
    get, an intruder (an add, adds that seal and retire the epoch, a set, a delete) at each of A's store steps, and
    one fault -- a crash before or after the effect, a lost reply, EIO after or before the effect, a negative dentry
    (cured by ``lookup.refresh``, modelled), a lookup that lies longer, a stale listing -- at each store step of A's
    operation or of the intruder's.  Every history (crashed calls pending) Wing-Gong checked, no timeout, no
    ``refresh`` of a free slot."""
    import adversary_enum_roles
    from adversary_enum_roles import enumerate_all

    from fsmingle.fs import folderstore_add

    # An operation failing after its effect (an EIO after a delta's link(): open on main, fixed by nrb's change,
    # pinned as tests/test_adversary_nrb.py::test_an_io_error_after_a_deltas_link_never_fails_the_add) counts as
    # pending on a tree without that change (no delta hints), and as a failure with it.
    monkeypatch.setattr(adversary_enum_roles, "ERROR_AFTER_EFFECT_ALLOWED", not hasattr(folderstore_add, "harvest"))
    lines = []
    runs, fails = enumerate_all(SIZE, out=lines.append)
    assert runs > 10_000
    assert not fails, "\n".join(lines)


def test_every_role_with_a_fault_at_every_filesystem_call_on_a_real_directory_is_linearizable():
    """The same on a real directory (``PosixStore``: ``_link_slots``, ``lookup.refresh``, the trash): a fault at
    each filesystem call of A's add, set, compare_set or delete, alone or with an epoch sealed and retired there."""
    from adversary_enum_posix_roles import enumerate_all

    lines = []
    runs, fails = enumerate_all(SIZE, out=lines.append)
    assert runs > 300
    assert not fails, "\n".join(lines)
