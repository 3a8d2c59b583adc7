"""The adversary's enumerations of every role of FolderStore with a fault at every store step (issue 30; session 5,
"nradv"): ``tests/adversary_enum_roles.py`` over fakefs and ``tests/adversary_enum_posix_roles.py`` on a real
directory.  CI runs the ``ci`` sizes; ``FSMINGLE_ADVERSARY=big`` runs the big ones (minutes to an hour)."""

from __future__ import annotations

import os

SIZE = os.environ.get("FSMINGLE_ADVERSARY", "ci")


def test_every_role_with_a_fault_at_every_store_step_over_fakefs_is_linearizable():
    """From every start state of an epoch (seal_at 4: a delta reads versions below it back; A's listings lag 2.5 s),
    node A's add, set, compare_set (matching or not), delete or
    get, an intruder (an add, adds that seal and retire the epoch, a set, a delete) at each of A's store steps, and
    one fault -- a crash before or after the effect, a lost reply, EIO after or before the effect, a negative dentry
    (cured by ``lookup.refresh``, modelled), a lookup that lies longer, a stale listing -- at each store step of A's
    operation or of the intruder's.  Every history (crashed calls pending) Wing-Gong checked, no timeout, no
    ``refresh`` of a free slot."""
    from adversary_enum_roles import enumerate_all

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


def test_an_add_with_a_pair_of_faults_on_a_real_directory_is_linearizable():
    """Pairs (session 12): a fault on a call that can fail after its effect (EIO before or after, a lost reply, a
    count kept past it), then a second fault -- or an intruder that seals and retires the epoch -- at each of the next
    calls, where the process decides what its failure did.  One fault per run never reached there: two ways an add
    was counted twice or failed after its effect (``tests/test_adversary_adds.py``)."""
    from adversary_enum_posix_roles import enumerate_pairs

    lines = []
    runs, fails = enumerate_pairs("pairs" if SIZE == "big" else "pairs-ci", out=lines.append)
    assert runs > 1_000
    assert not fails, "\n".join(lines)


def test_a_wait_with_a_fault_at_every_store_step_answers_linearizably_within_its_bound(monkeypatch):
    """Role ``wait`` (``FolderKV.wait_for``; session 6, ``adv``): every node of a 256-process job
    (``folderstore_wait.fast_pause``: a young wait looks every 0.16 s, not every 10 ms), A's listings lagging 2.5 s,
    every fault at every step of the wait, an add, a seal, a set or a delete at every step of it.  A wait is
    checked as a get of its answer, its timeout as a get of None (so a wait that times out while the key existed
    throughout fails), and it must end within its own timeout plus one poll."""
    import adversary_enum_roles
    from adversary_enum_roles import enumerate_all

    monkeypatch.setattr(adversary_enum_roles, "CROWD", 256)
    lines = []
    runs, fails = enumerate_all("waits", out=lines.append)
    assert runs > 10_000
    assert not fails, "\n".join(lines)
