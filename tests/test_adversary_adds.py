"""The adversary's attacks on FolderStore's delta ``add`` (fsmingle/fs/folderstore_add.py, branch "adds").

Each test is one precise sequence on a real directory (``PosixStore``): the delta add's ``link()`` loop on a
real filesystem (``_link_slots``) is a code path of its own that the fakefs model never runs (fakefs is not a
``PosixStore``: it goes through ``FolderKV._link``, a read-back per slot), so the faults are injected into the
system calls the real path makes.  Two FolderKVs in one process stand for two hosts.
"""

from __future__ import annotations

import os

try:
    from adds_harness import Os as _Os
    from adds_harness import eio_once, eio_then_retired, root
    from adds_harness import kv_at as _kv
except ImportError:  # tests/ imported as a package
    from tests.adds_harness import Os as _Os
    from tests.adds_harness import eio_once, eio_then_retired, root  # noqa: F401
    from tests.adds_harness import kv_at as _kv

from fsmingle.fs import folderstore_add as fa
from fsmingle.fs.folderstore import FolderKV


def test_an_add_whose_epoch_is_sealed_and_retired_before_its_walk_back_answers_its_value(root, monkeypatch):
    """A's delta lands in epoch 1 above B's delta; before A walks back to B's version (to learn the value its
    delta was linearized on), B's next add seals epoch 1 and retires it (renamed into the trash).  A's add took
    effect (the final value counts it) -- so it must answer, not time out: a caller that retries a timed-out add
    counts it twice.  Before a fix: FolderStoreTimeout ("v-000000000002 is listed but unreadable")."""
    a = _kv(root, 4, timeout=3.0)
    b = _kv(root, 4)
    for _ in range(3):  # epoch 0's two versions, then version 1 of epoch 1 (full): deltas go from version 2
        a.add("k", 1)
    real_slots, real_full, done = fa._link_slots, fa.full, set()

    def slots(kv, *args):
        if kv is a and "slots" not in done:
            done.add("slots")
            assert b.add("k", 1) == 4  # B's delta: version 2 of epoch 1; A's goes to version 3
        return real_slots(kv, *args)

    def full(kv, d, m, v, key, *rest):
        if kv is a and "full" not in done:
            done.add("full")
            assert b.add("k", 10) == 114  # the seal (version 4): epoch 2 made, epoch 1 retired
        return real_full(kv, d, m, v, key, *rest)

    monkeypatch.setattr(fa, "_link_slots", slots)
    monkeypatch.setattr(fa, "full", full)
    got = a.add("k", 100)
    monkeypatch.undo()
    assert done == {"slots", "full"}
    assert got == 104  # 3 + B's 1 + ours: what version 2 held, plus 100
    assert _kv(root, 4).add("k", 0) == 114


class _LostReply(_Os):
    """``os`` for folderstore_add whose first ``link()`` takes effect and then answers EEXIST (a retransmitted NFS
    LINK whose first reply was lost: the server's duplicate-request cache missed it)."""

    def __init__(self):
        self.armed = True

    def link(self, src, dst):
        os.link(src, dst)
        if self.armed:
            self.armed = False
            raise FileExistsError(17, "File exists (a retransmitted LINK)", dst)


def test_an_add_whose_lost_reply_is_followed_by_a_failed_stat_counts_once(root, monkeypatch):
    """The delta's link() into version 2 takes effect and answers EEXIST; the stat of its own temporary (the link
    count that says "ours") then fails once (EIO on a soft mount, ESTALE): ``link_count`` answers 0, which
    ``_link_slots`` takes for "lost to another writer", and links the same temporary again as version 3.  The add of
    100 is counted twice (3 -> 203, and it returns 203).  ``PosixStore.create`` reads the token back whenever the
    link count does not say 2; the delta's loop must not trust a stat that failed."""
    a = _kv(root, 32)
    for _ in range(3):
        a.add("k", 1)
    real_nlink, fails = fa.link_count, [1]

    def nlink(path, **kw):
        if fails[0]:
            fails[0] = 0
            return 0  # link_count's answer when the stat fails
        return real_nlink(path, **kw)

    monkeypatch.setattr(fa, "os", _LostReply())
    monkeypatch.setattr(fa, "link_count", nlink)
    got = a.add("k", 100)
    monkeypatch.undo()
    assert fails == [0]
    assert _kv(root, 32).add("k", 0) == 103, "the add of 100 was counted twice"
    assert got == 103


class _StaleAfterLostReply(_LostReply):
    """:class:`_LostReply` on an NFS client that keeps the file's cached attributes after that LINK answered EEXIST:
    a plain ``stat`` of the temporary answers the link count from before (1), as Linux's client does inside
    ``acregmin`` (``_nfs4_proc_link``, fs/nfs/nfs4proc.c, updates the attributes only when the LINK succeeded)."""

    def __init__(self):
        super().__init__()
        self.kept: dict[str, int] = {}

    def link(self, src, dst):
        if self.armed:
            self.kept[src] = os.stat(src).st_nlink  # the client's cached count, kept past the failed LINK
        super().link(src, dst)

    def stat(self, path, *a, **kw):
        st = os.stat(path, *a, **kw)
        if path in self.kept:
            return os.stat_result((*st[:3], self.kept[path], *st[4:10]))
        return st


def test_an_add_whose_lost_reply_is_followed_by_a_cached_link_count_counts_once(root, monkeypatch):
    """The delta's link() into version 2 takes effect and answers EEXIST (a retransmitted LINK), and a plain ``stat``
    of its temporary answers the cached count of 1, not 2 (NFS keeps attributes after a failed LINK).  Trusting it,
    ``_link_slots`` took the slot for another writer's and linked the same temporary again as version 3: the add of
    100 counted twice (203).  The count must be read past the attribute cache (``lookup.link_count``: ``statx``
    with ``AT_STATX_FORCE_SYNC``, which this fake leaves alone: a real system call, as a GETATTR to the server)."""
    from fsmingle.fs import lookup, store

    a = _kv(root, 32)
    for _ in range(3):
        a.add("k", 1)
    shim = _StaleAfterLostReply()
    for module in (fa, store, lookup):
        monkeypatch.setattr(module, "os", shim)
    got = a.add("k", 100)
    monkeypatch.undo()
    assert shim.kept, "the LINK whose reply was lost never came"
    assert _kv(root, 32).add("k", 0) == 103, "the add of 100 was counted twice"
    assert got == 103


def test_an_add_whose_link_took_effect_with_eio_and_whose_epoch_then_retired_counts_once(root, monkeypatch):
    """The delta's link() into version 2 takes effect and answers EIO (a soft mount's timeout); its link count cannot be
    read (0: the stat fails too); before its retry B's adds seal and retire the epoch, so the retry answers ENOENT.
    ``_link_slots`` took that for "the epoch is gone, nothing of ours in it" and the add went again into the next
    epoch: counted twice (found by the session-11 attack, with ``statx`` blocked).  The retired epoch's version 2, in
    the trash, must say it is ours."""
    a, b = _kv(root, 4), _kv(root, 4)
    for kv in (a, b, a, b):
        kv.add("k", 1)
    tries = []
    monkeypatch.setattr(fa, "os", eio_then_retired(monkeypatch, b, tries))
    monkeypatch.setattr(fa, "link_count", lambda path, **kw: 0)  # the stat fails (EIO, ESTALE, statx blocked)
    a.add("k", 100)
    monkeypatch.undo()
    assert len(tries) >= 2
    final = _kv(root, 4).add("k", 0)
    assert (final - 4 - 100) % 1000 == 0, f"the add of 100 was counted {(final - 4) % 1000 // 100} times ({final})"


def test_an_add_whose_link_took_effect_with_eio_and_a_cached_count_counts_once(root, monkeypatch):
    """The delta's link() into version 2 takes effect and answers EIO, and its link count -- even the forced read --
    answers the count from before (1: a FUSE daemon's own cache, GlusterFS md-cache, keeps it past a failed link).  The
    retry answers EEXIST; trusting the 1, ``_link_slots`` linked the same delta again as version 3: counted twice.
    After an EIO at a slot, whose version it holds is read back (the token)."""
    a = _kv(root, 32)
    for _ in range(3):
        a.add("k", 1)
    monkeypatch.setattr(fa, "os", eio_once([]))
    monkeypatch.setattr(fa, "link_count", lambda path, **kw: 1)  # the count kept from before the link
    got = a.add("k", 100)
    monkeypatch.undo()
    assert _kv(root, 32).add("k", 0) == 103, "the add of 100 was counted twice"
    assert got == 103


def test_a_delta_past_pythons_digit_limit_does_not_poison_the_key(root):
    """A value of 4,300 digits is an integer to ``int()`` (Python's default ``int_max_str_digits``); a delta of 1
    onto it makes 4,301 digits, and ``str()`` of that raises ValueError -- in every reader's walk back.  Before a
    fix: the add raises ValueError *after* linking its delta, and from then on every ``get``, ``set``, ``add`` and
    ``compare_set`` of the key raises ValueError (each resolves the newest version first): the key is dead for
    good.  (Before the delta add, the read-modify-write raised before writing anything.)  Whatever the add
    answers, the key must stay readable and writable."""
    a = _kv(root, 8)
    for _ in range(3):
        a.add("k", 1)
    big = b"9" * 4300
    a.set("k", big)
    try:
        a.add("k", 1)
    except ValueError:
        pass  # refusing an add that overflows the decimal form is fine: it must then change nothing
    b = _kv(root, 8)
    assert b.try_get("k") in (big, b"1" + b"0" * 4300)
    b.set("k", b"5")
    assert b.add("k", 1) == 6


def test_every_preemption_point_and_fault_of_an_add_over_fakefs_is_linearizable():
    """Enumerated, not sampled (tests/adversary_enum.py): from every start state of an epoch (seal_at 3 and 4), at
    every one of A's store operations an intruder on another node (add, adds that seal and retire the epoch, set,
    a set of a non-integer, compare_set, delete, an add and then a seal 0-4 operations later), times every fault of
    A's first three creates (none, a lost reply, EIO after or before the effect, versions unreadable a while):
    every call and return, and the final value, checked by the Wing-Gong checker.  On adds@0931470, 87,670 runs
    (seal_at 3, 4, 6; A's lag 0 and 2.5 s): 538 not linearizable -- a create that took effect (lost reply, EIO
    after the effect) whose epoch is sealed and retired before its read-back is taken for "epoch gone" and
    written again (the add counted twice: main has it too, 494 runs, in FolderKV._link) -- and 84 adds that
    time out though counted (the walk back of a delta into a retired epoch)."""
    from adversary_enum import enumerate_all

    lines = []
    runs, fails = enumerate_all(seal_ats=(3, 4), lags=(0.0,), out=lines.append)
    assert runs > 10_000
    assert not fails, "\n".join(lines)


def test_an_eio_after_the_effect_then_the_epoch_retired_counts_the_add_once():
    """The enumeration's first case left on adds@ec89309 (tests/adversary_enum.py, seal_at 3): B adds 1; A's add
    (epoch 1 named by epoch 0's seal) creates version 1 of epoch 1 -- it takes effect, the create answers EIO (a soft
    mount's timeout); A pauses to create it again with the same token, and meanwhile C adds 10 and B's four adds
    seal epoch 1 and retire it.  A's retry meets ENOENT, which ``FolderKV._link`` took for "the epoch is gone,
    nothing of ours in it": A wrote its add again on top (answered 417, counted twice; 14 is right: its first write
    came after C's 11).  ec89309 reads a retired epoch's version back from the trash after EEXIST, not after EIO."""
    from adversary_enum import one

    bad, _ = one(3, 1, 1, "add-seal4", "eio-after", 0)
    assert bad is None, bad


def test_a_seal_whose_retirement_listing_fails_still_answers_the_write(root, monkeypatch):
    """Found by tests/adversary_enum_posix.py (EIO before the effect at every filesystem call of an add on a real
    directory: 12 of 13,066 runs, all this): A's add is the seal of epoch 1 (seal_at 3); it is linked, the copy into
    epoch 2 is made, then the listing of the key's directory that finds the epochs to retire fails with EIO.  The
    add took effect, yet ``_sealed`` let the StorageError out of it: a caller that retries counts it twice (main
    has the same: set, compare_set and the read-modify-write add too).  A failed retirement is left to a later
    seal, as a failed copy already is."""
    import inspect

    from fsmingle.errors import StorageError

    a, b = _kv(root, 3), _kv(root, 3)
    for _ in range(4):  # epoch 0 (two versions), epoch 1: versions 1 and 2 -- A's add is the seal, version 3
        b.add("k", 1)
    real = FolderKV._epochs

    def epochs(self, kd):
        if self is a and inspect.stack()[1].function == "_sealed":
            err = StorageError(f"cannot list {kd}: Input/output error")
            err.errno = 5
            raise err
        return real(self, kd)

    monkeypatch.setattr(FolderKV, "_epochs", epochs)
    got = a.add("k", 10)
    monkeypatch.undo()
    assert got == 14
    assert b.add("k", 0) == 14


def test_an_add_survives_another_threads_walk_clearing_the_cache(root, monkeypatch):
    """Two threads share one FolderStore (NCCL's monitor thread and the training loop: ``FolderKV._saw`` says
    so).  A's delta lands above B's; A's walk back fills ``_vals`` with the value below its delta -- and another
    thread's walk, finding the cache over ``CACHE`` entries, clears it whole before A reads ``_vals[(d, m - 1)]``.
    Before a fix: KeyError out of an add that took effect (a retry counts it twice)."""
    a, b = _kv(root, 32), _kv(root, 32)
    for _ in range(3):
        a.add("k", 1)
    a.try_get("k")  # A's view stands at version 1 of epoch 1
    b.add("k", 1)  # version 2: A's delta goes to version 3
    real_full, cleared = fa.full, []

    def full(kv, *args, **kw):
        out = real_full(kv, *args, **kw)
        if kv is a and not cleared:
            cleared.append(1)
            kv._vals.clear()  # what the other thread's full() does when len(_vals) > CACHE
        return out

    monkeypatch.setattr(fa, "full", full)
    got = a.add("k", 100)
    monkeypatch.undo()
    assert cleared and got == 104  # 3 + B's 1 + 100
    assert b.add("k", 0) == 104
