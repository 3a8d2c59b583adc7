"""``Store.refresh`` and ``Store.dir_signature``: a negative lookup entry revalidated, a directory's attributes read past
the cache -- on a real directory (``PosixStore``) and in the model (``tests/fakefs.py``), which must answer alike, and
FolderStore using them through the interface (no branch on which store it runs on)."""

from __future__ import annotations

import os
import shutil

import pytest
from fakefs import AdvancingClock, CountingListings, FakeFS

from fsmingle.errors import CorruptStateError
from fsmingle.fs.folderstore import FolderKV, key_dir
from fsmingle.fs.folderstore_log import VERSION_RE, version_name
from fsmingle.fs.folderstore_wait import LIST_EVERY
from fsmingle.fs.store import PosixStore


class _Clock(AdvancingClock):
    """Sleeping advances the fake filesystem's time; at ``at`` fake seconds ``then()`` runs once."""

    def __init__(self, fs, at=None, then=None):
        super().__init__(fs)
        self.at, self.then = at, then

    def sleep(self, s):
        super().sleep(s)
        if self.at is not None and self.fs.now >= self.at:
            self.at, then = None, self.then
            then()


def _stores(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    return [("posix", PosixStore(str(real))), ("fakefs", FakeFS().view("a"))]


@pytest.mark.parametrize("which", ["posix", "fakefs"])
def test_refresh_and_dir_signature_answer_alike_on_a_real_directory_and_in_the_model(tmp_path, which):
    """The model answers as the real store: a refresh of a name that exists is done once (True, then False), of a
    name below a missing directory it is done (ENOENT: the caller's read says what is wrong); a directory's signature
    is the same while nothing in it changes, differs once an entry is made or removed, None when it is missing.
    Fails before: the fakefs had neither (the Store defaults: False, None)."""
    store = dict(_stores(tmp_path))[which]
    store.mkdir("k")
    store.mkdir("k/e")
    assert store.create("k/e/v-1", b"x")
    assert store.refresh("k/e/v-1") is True
    assert store.refresh("k/e/v-1") is False  # once: a name that exists is not looked up missing again
    assert store.refresh("gone/v-1") is True
    sig = store.dir_signature("k/e")
    assert sig is not None and store.dir_signature("k/e") == sig
    assert store.create("k/e/v-2", b"y")
    assert store.dir_signature("k/e") not in (None, sig)
    assert store.dir_signature("missing") is None


def _delta_ready(kv):
    for _ in range(3):  # past epoch 0 (its seal) and version 1 of epoch 1: where deltas go
        kv.add("ctr", 1)


def test_a_negative_entry_of_a_version_is_not_waited_out_in_the_model():
    """The model of tests/test_folderstore_add.py's bindfs case: A's view keeps absences for 60 s, A looks up the
    next versions of a counter while they are missing, B adds twice, A adds with a 20 s timeout.  A reads B's
    versions at once through ``Store.refresh``.  Fails before (FolderStore never refreshed on the fakefs:
    ``kv._posix is None``): A's add raised its timeout after 20 fake seconds."""
    fs = FakeFS()
    va, vb = fs.view("a"), fs.view("b")
    va.neg_ttl = 60.0
    a, b = (FolderKV(v, clock=_Clock(fs), timeout=20.0) for v in (va, vb))
    _delta_ready(b)
    kd = key_dir("ctr")
    ep = max(n for n in fs.listing(kd, fs.now) if n.startswith("e-"))
    top = max(int(VERSION_RE.match(n).group(1)) for n in fs.listing(f"{kd}/{ep}", fs.now) if VERSION_RE.match(n))
    for n in range(top + 1, top + 4):
        assert va.read(f"{kd}/{ep}/{version_name(n)}") is None  # negative entries in A's view, for 60 s
    assert [b.add("ctr", 1) for _ in range(2)] == [4, 5]
    t0 = fs.now
    assert a.add("ctr", 1) == 6
    assert a.try_get("ctr") == b"6" and b.try_get("ctr") == b"6"
    assert fs.now - t0 < 1.0, fs.now - t0  # no negative entry waited out


def test_a_waiter_in_the_model_lists_seldom_in_its_fast_phase():
    """As tests/test_folderstore_wait.py on a real directory, in the model: a waiter whose key is set 0.5 s into
    its wait lists at most once per ``LIST_EVERY`` meanwhile (the directory's signature unchanged) and wakes at its
    first poll after the write.  Fails before (no signature on the fakefs: one listing per 10 ms poll, about 45)."""
    fs = FakeFS()
    writer = FolderKV(fs.view("w"), clock=_Clock(fs))
    listed = CountingListings(fs.view("r"))
    seen = {}

    def set_it():
        seen["before"] = listed.n
        writer.set("done", b"1")
        seen["at"] = fs.now

    waiter = FolderKV(fs.view("r"), clock=_Clock(fs, at=fs.now + 0.5, then=set_it))
    assert waiter.wait_for(["done"], 30.0, RuntimeError) == [b"1"]
    assert seen["before"] <= 0.5 / LIST_EVERY + 3, seen["before"]
    assert fs.now == seen["at"]  # woke at the first poll after the write: no further pause


def test_a_refresh_of_a_free_name_is_undone_and_reported_on_a_real_directory(tmp_path):
    """``refresh``'s ``mkdir`` on a free name (never so for FolderStore's callers, but for a damaged store) leaves no
    directory where a version belongs and raises CorruptStateError while the name's directory is in place; in a
    directory retired meanwhile it is only done.  Fails before: the free name was undone silently (True)."""
    store = dict(_stores(tmp_path))["posix"]
    store.mkdir("k")
    store.mkdir("k/e")
    free = f"k/e/{version_name(5)}"
    with pytest.raises(CorruptStateError, match="was missing, though it existed"):
        store.refresh(free)
    assert not (tmp_path / "real" / free).exists()
    assert store.retire("k/e")
    assert store.refresh(f"k/e/{version_name(6)}") is True  # ENOENT: the directory went; nothing made
    assert store.listdir("k") == []


def test_a_store_made_again_under_a_live_folderstore_is_reported_at_once(tmp_path):
    """The store removed while in use and made again by another process: the version A wrote is gone from a live
    epoch 0, so A's read of it lands on a free name -- reported at once, nothing left there.  Fails before: A
    paused on the "lying lookup" until its 5 s timeout (a FolderStoreTimeout blaming a client cache)."""
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    a = FolderKV(PosixStore(str(root)), timeout=5.0)
    a.set("k", "x")
    shutil.rmtree(root)
    root.mkdir(mode=0o700)
    assert FolderKV(PosixStore(str(root))).try_get("k") is None  # makes the key's directory and epoch 0 again
    with pytest.raises(CorruptStateError, match="removed"):
        a.try_get("k")
    assert [f for _, ds, fs in os.walk(root) for f in ds + fs if f.startswith("v-")] == []


def test_a_statx_blocked_by_seccomp_falls_back_to_stat_and_is_remembered(tmp_path, monkeypatch):
    """A seccomp filter that answers EPERM to ``statx`` (Docker's profile before 18.04; allow-lists without it):
    ``link_count`` and ``dir_signature`` must fall back to a plain ``stat`` -- a 0 ("unknown") there disabled the
    first claim's copying-link check and, after an EIO, let a delta be added twice -- and stop calling ``statx``.
    The copying-link check still refuses a ``link()`` that copies."""
    import ctypes
    import errno
    from unittest import mock

    from fsmingle.errors import UnsupportedFilesystemError
    from fsmingle.fs import lookup

    calls = []

    def blocked(*a):
        calls.append(a)
        ctypes.set_errno(errno.EPERM)
        return -1

    monkeypatch.setattr(lookup, "_STATX", blocked)
    f, g = tmp_path / "f", tmp_path / "g"
    f.write_bytes(b"x")
    os.link(f, g)
    assert lookup.link_count(str(f)) == 2
    assert lookup._STATX is None and len(calls) == 1  # remembered: no statx again
    assert lookup.dir_signature(str(tmp_path)) is not None and lookup.link_count(str(tmp_path / "none")) == 0
    monkeypatch.setattr(lookup, "_STATX", blocked)
    (tmp_path / "store").mkdir(mode=0o700)
    store, copying = PosixStore(str(tmp_path / "store")), lambda src, dst, *a, **k: shutil.copyfile(src, dst)
    with mock.patch.object(os, "link", copying), pytest.raises(UnsupportedFilesystemError, match="count is 1, not 2"):
        store.create("rank-00000.claim", b"{}")
