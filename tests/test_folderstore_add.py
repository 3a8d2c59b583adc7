"""FolderStore's add without a read-modify-write (fsmingle/fs/folderstore_add.py, issue 30 item 5): contended adds
across two cached bindfs views end exact with unique returns; a contended add's filesystem calls, counted (never
timed), stay a link() per lost race; and a compaction keeps the retired epoch's files ``retire_grace`` seconds."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import bindfs_missing, bindfs_views

from fsmingle.fs import folderstore_add, trash
from fsmingle.fs.folderstore import FolderKV, FolderStoreTimeout, key_dir
from fsmingle.fs.folderstore_log import EPOCH0, HINT_RE, hint_name, version_name
from fsmingle.fs.folderstore_wait import fast_pause
from fsmingle.fs.store import PosixStore

HERE = Path(__file__).resolve().parent
WORKER = HERE / "folderstore_worker.py"

# One process, two FolderKVs on one store: B's listings are frozen (a directory cache that lags, as NFS's
# acdirmax), A then adds LOST times, and B's add -- which must lose LOST link() races before it finds a
# free version -- is counted: every filesystem call Python's audit events show (open, link, listdir, ...).
COUNT = r"""
import json, os, sys, threading
from fsmingle.fs.folderstore import FolderKV
from fsmingle.fs.store import PosixStore

root, lost, once = sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["once"]

class Stale(PosixStore):
    frozen = None  # dir -> its listing when frozen
    stale_left = None  # once: only this many more listings lag (the add's first), then they are live

    def listdir(self, name=""):
        if Stale.stale_left is not None and Stale.stale_left <= 0:
            return super().listdir(name)
        if Stale.frozen is not None:
            if Stale.stale_left is not None and name in Stale.frozen:
                Stale.stale_left -= 1
            return Stale.frozen.setdefault(name, super().listdir(name))
        return super().listdir(name)

a, b = FolderKV(PosixStore(root)), FolderKV(Stale(root))
for kv in (a, b, a, b):  # past epoch 0 (its seal) and version 1 of epoch 1: where deltas go
    kv.add("ctr", 1)
Stale.frozen = {}
b.try_get("ctr", fresh=False)  # B's cached listing of the epoch: frozen here
for _ in range(lost):
    a.add("ctr", 1)
EVENTS = {"open", "os.listdir", "os.scandir", "os.link", "os.remove", "os.rmdir", "os.mkdir", "os.rename"}
calls, on = [0], [None]
sys.addaudithook(lambda e, args: calls.__setitem__(0, calls[0] + (e in EVENTS and on[0] == threading.get_ident())))
on[0] = threading.get_ident()
Stale.stale_left = 1 if once else None
got = b.add("ctr", 1)
on[0] = None
print(json.dumps({"got": got, "calls": calls[0], "final": a.add("ctr", 0)}))
"""


def _counted_add(tmp_path: Path, lost: int, *mode: str) -> dict:
    """COUNT's line (``got``, ``calls``, ``final``) on a fresh store, ``mode`` "once" or none; B's add checked exact."""
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    out = subprocess.run(
        [sys.executable, "-c", COUNT, str(root), str(lost), *mode], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["got"] == 4 + lost + 1 and r["final"] == 4 + lost + 1, r
    return r


def test_a_contended_add_costs_a_link_per_lost_race_not_a_reread(tmp_path):
    """Counted, not timed: an add whose view lags 20 versions behind (20 lost races) makes at most about two
    filesystem calls per lost race -- its link() and, once it has won, the read of that version back (for its
    return value).  Before (a read-modify-write: per lost race a temporary's create, link() and remove, the
    winner's read, a listing and a read) it made 124 here; the answer is exact either way."""
    lost = 20
    r = _counted_add(tmp_path, lost)
    assert r["calls"] <= 2 * lost + 15, f"{r['calls']} filesystem calls for an add that lost {lost} races"


def test_a_contended_add_answers_without_reading_back_the_versions_below_its_own(tmp_path):
    """Counted, not timed: an add whose first listing lags 20 versions behind (other adders linked 20 deltas
    since) loses one ``link()`` race, lists the epoch afresh, wins the next free version -- and computes its
    answer from the hints the 20 winners left in that listing (``a-<version>-<token>-<amount>``, one name
    each), reading none of their versions back.  Before the hints (session 4's main) it read back all 20
    (27 filesystem calls here; now 8); the answer is exact either way."""
    lost = 20
    r = _counted_add(tmp_path, lost, "once")
    assert r["calls"] <= 14, f"{r['calls']} filesystem calls for an add that started {lost} versions behind"


class _TickClock:
    """Every ``monotonic()`` one millisecond after the last (so a ``link()`` "takes" exactly 1 ms); ``sleep``
    records its pause and advances the clock by it."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self) -> float:
        self.now += 0.001
        return self.now

    def sleep(self, secs: float) -> None:
        self.sleeps.append(secs)
        self.now += secs


@pytest.mark.parametrize("count_takes", [0.0, 0.010])
def test_a_loser_pauses_after_each_lost_race_twice_as_long_each_time(tmp_path, monkeypatch, count_takes):
    """An adder of a 256-rank job whose view lags 6 versions behind loses 6 ``link()`` races in a row: after
    each it pauses about 2**(k-1) of its own ``link()`` times (1 ms each here, jittered x0.5..1.5), under its
    job's young-wait pause (160 ms), and still answers exactly.  Before session 7, it raced again at once (no pause:
    the 256 adders of a barrier on 2 cores spent most of its CPU on lost races, docs/folderstore.md).
    The forced read of the link count after each loss (``count_takes``: 10 ms in the second case, one more trip to a
    busy server) is not counted in: before session 13 it was, and every loser's pause grew with it (11x here; at 256
    ranks on cached FUSE mounts the read waits in the same daemon's queue as the ``link()``: about 2x)."""
    from fsmingle.fs import folderstore_add as fa

    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    a, clock = FolderKV(PosixStore(str(root))), _TickClock()
    b = FolderKV(PosixStore(str(root)), clock=clock, crowd=256)
    for kv in (a, b, a, b):  # past epoch 0 (its seal) and version 1 of epoch 1: where deltas go
        kv.add("ctr", 1)
    listdir, frozen = b.store.listdir, {}
    b.store.listdir = lambda name="": frozen.setdefault(name, listdir(name))  # B's listings lag from here on
    b.try_get("ctr", fresh=False)
    for _ in range(6):
        a.add("ctr", 1)
    clock.sleeps.clear()
    count = fa.link_count

    def slow_count(path, **kw):
        clock.now += count_takes
        return count(path, **kw)

    monkeypatch.setattr(fa, "link_count", slow_count)
    assert b.add("ctr", 1) == 11 and a.add("ctr", 0) == 11
    assert len(clock.sleeps) == 6, clock.sleeps
    for k, slept in enumerate(clock.sleeps, 1):
        base = min(fast_pause(b), 0.001 * 2 ** (k - 1))
        assert 0.5 * base <= slept <= 1.5 * base, (k, clock.sleeps)


def test_a_listing_answers_the_newest_version_and_keeps_each_hint_once(tmp_path, monkeypatch):
    """``FolderKV._listed`` (session 13: the newest version found by name order, a hint kept before skipped unparsed):
    the newest version is the greatest name that IS a version -- a stray name sorting above it (13 digits, letters,
    Arabic-Indic digits: ``\\d`` matches them and they sort above "9"; the helper's attack) is not one -- and the hints
    a listing shows are kept, a later listing parsing only its new ones (each hint name is parsed once)."""
    parsed = []

    class CountingHintRE:  # HINT_RE, recording every name harvest parses
        def match(self, name):
            parsed.append(name)
            return HINT_RE.match(name)

    monkeypatch.setattr(folderstore_add, "HINT_RE", CountingHintRE())
    root = tmp_path / "s"
    d = root / "k-6b" / "e-000000000001-00000000000000ff"
    d.mkdir(mode=0o700, parents=True)
    kv = FolderKV(PosixStore(str(root)))
    for name in [version_name(m) for m in (1, 2, 3)] + [
        "v-" + "9" * 13,
        "v-00000000009x",
        "v-zzz",
        "w-1",
        "v-" + "\u0660" * 11 + "\u0661",
    ]:
        (d / name).touch()
    (d / hint_name(2, "ab" * 8, 5)).touch()
    where = "k-6b/" + d.name
    assert kv._listed(where) == 3
    assert kv._hints == {(where, 2): ("ab" * 8, 5)}
    (d / version_name(4)).touch()
    (d / hint_name(3, "cd" * 8, -7)).touch()
    assert kv._listed(where) == 4
    assert kv._hints == {(where, 2): ("ab" * 8, 5), (where, 3): ("cd" * 8, -7)}
    assert kv._listed(where) == 4
    assert parsed == [hint_name(2, "ab" * 8, 5), hint_name(3, "cd" * 8, -7)], parsed


@pytest.mark.root
@pytest.mark.torch
@pytest.mark.skipif(bool(bindfs_missing()), reason="NFS-like FUSE views need: " + ", ".join(bindfs_missing()))
def test_contended_adds_across_two_cached_views_are_exact_and_unique(tmp_path):
    """8 processes x 40 adds to one counter, half through each of two bindfs mounts of one directory that cache
    attributes, names and absences for 2 s (two NFS clients): the 320 returned values are exactly 1..320 (none
    twice, none lost) and the counter reads 320 through either view -- across 10 epochs sealed and retired under
    the adders."""
    pytest.importorskip("torch.distributed")
    from fsmingle.fs.folderstore_torch import folder_store_class

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    procs = []
    with bindfs_views(tmp_path, 2) as (_, mounts):
        try:
            procs = [
                subprocess.Popen(
                    [sys.executable, str(WORKER), str(mounts[i % 2] / "store"), f"w{i}", "add=40"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )  # fmt: skip
                for i in range(8)
            ]
            adds = []
            for p in procs:
                out, err = p.communicate(timeout=600)
                assert p.returncode == 0, err[-3000:]
                adds += [json.loads(x)["add"] for x in out.splitlines() if x.strip()]
            twice = sorted({a for a in adds if adds.count(a) > 1})
            assert sorted(adds) == list(range(1, 321)), (
                f"repeated {twice}, missing {sorted(set(range(1, 321)) - set(adds))}"
            )
            for m in mounts:
                assert folder_store_class()(m / "store").add("ctr", 0) == 320
        finally:
            for p in procs:
                p.kill()


def test_a_compaction_keeps_the_retired_epoch_for_its_grace(tmp_path):
    """FolderKV passes ``retire_grace`` to ``Store.retire``: with the default (LIE_LIMIT, 120 s) a retired epoch's
    versions wait in the store's trash (a stale client's link() through a cached entry meets EEXIST there); with
    ``retire_grace=0`` the retirement deletes them at once.  Fails if ``_retire`` stops passing it."""
    from fsmingle.fs import trash
    from fsmingle.fs.folderstore import FolderKV
    from fsmingle.fs.store import PosixStore

    def trashed(grace):
        root = tmp_path / f"g{grace}"
        root.mkdir(mode=0o700)
        kv = FolderKV(PosixStore(str(root))) if grace is None else FolderKV(PosixStore(str(root)), retire_grace=grace)
        kv.seal_at = 4
        for i in range(12):  # epoch 0 (2), then epochs of 4: two compactions retire epochs 1 and 2
            kv.set("k", str(i))
        assert kv.try_get("k") == b"11"
        return [f for n in os.listdir(root) if n.startswith(trash.PREFIX) for _, _, fs in os.walk(root / n) for f in fs]

    kept = trashed(None)
    assert len([f for f in kept if f.startswith("v-")]) >= 4, kept  # a whole sealed epoch, every name still taken
    assert trashed(0) == []


class _CountingClock:
    """Real time; counts the pauses (``sleep``) taken through it."""

    monotonic = staticmethod(time.monotonic)

    def __init__(self):
        self.sleeps = []

    def sleep(self, secs: float) -> None:
        self.sleeps.append(secs)
        time.sleep(secs)


def test_an_add_whose_epoch_is_retired_under_it_goes_where_the_log_went_without_a_pause_or_a_mkdir(
    tmp_path, monkeypatch
):
    """B's delta add is about to link into its epoch when A's adds seal that epoch and retire it (256 adders do it
    in milliseconds).  B's ``link()`` finds the directory gone; B lists the key, finds the newer epoch and adds
    there: exact, with no pause and no ``mkdir``.  Before (session 14's profile: 1.5 times a contended add), B
    linked a read-modify-write's version into the same gone directory, paused ``poll_min``, made the key directory
    and epoch 0 again (two ``mkdir``) and resolved fresh (a probe per epoch)."""
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    clock = _CountingClock()
    a, b = FolderKV(PosixStore(str(root))), FolderKV(PosixStore(str(root)), clock=clock)
    for kv in (a, b):
        kv.seal_at = kv.seal_first = 4
    for kv in (a, b, a, b):  # past epoch 0 (its seal) and version 1 of epoch 1: where deltas go
        kv.add("ctr", 1)
    real, mkdirs, raced = folderstore_add._link_slots, [], []

    def racing(kv, d, *args):
        if kv is b and not raced:  # A seals B's epoch and the next, retiring both (grace: out of every listing)
            raced.append(d)
            for _ in range(8):
                a.add("ctr", 1)
            mkdirs.clear()  # A's, not B's
            assert not os.path.exists(root / d), "A's adds did not retire B's epoch"
        return real(kv, d, *args)

    real_mkdir = os.mkdir
    monkeypatch.setattr(folderstore_add, "_link_slots", racing)
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: (mkdirs.append(p), real_mkdir(p, *a, **k))[1])
    assert b.add("ctr", 1) == 4 + 8 + 1
    kd = str(root / key_dir("ctr"))
    again = [m for m in mkdirs if m in (kd, f"{kd}/{EPOCH0}")]  # (a seal B makes next mkdirs its new epoch: fine)
    assert raced and again == [] and clock.sleeps == [], (raced, mkdirs, clock.sleeps)
    assert a.add("ctr", 0) == 13


def test_the_add_that_creates_a_counter_seals_epoch_0_and_the_others_wait_for_its_seal(tmp_path, monkeypatch):
    """N ranks add 1 to a fresh counter at once (torch's store-based barrier).  A wins version 1 of epoch 0 (marked
    ``sealing``) and is held there; B finds epoch 0 full, its seal next, and waits; A, released at B's first pause,
    seals epoch 0 at once, naming a grown epoch (``-c128``) that holds a copy of its value; B adds there as a delta.
    B makes no epoch and retires none.  Before (session 15), each of the N-1 losers made an epoch and raced for
    epoch 0's seal (a ``mkdir``, a lost ``link()`` and a retirement each), and the counter then crossed epochs of
    32, 64 and 128 -- each crossing a wait for a seal on the barrier's critical path."""
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    clock = _CountingClock()
    a, b = FolderKV(PosixStore(str(root))), FolderKV(PosixStore(str(root)), clock=clock)
    kd = str(root / key_dir("ctr"))
    won, go, answers, made = threading.Event(), threading.Event(), {}, []
    real_link, real_mkdir, real_sleep = FolderKV._link, os.mkdir, clock.sleep

    def link(kv, d, n, *x):  # A is held just after its version 1 of epoch 0 won
        got = real_link(kv, d, n, *x)
        if kv is a and d.endswith(EPOCH0) and n == 1:
            won.set()
            assert go.wait(30), "B never waited"
        return got

    def sleep(secs):
        if not clock.sleeps:  # B's first pause (its wait for the seal): A goes on
            go.set()
            t.join(30)
        real_sleep(secs)

    def mkdir(path, *x, **k):
        if threading.current_thread() is threading.main_thread() and path not in (kd, f"{kd}/{EPOCH0}"):
            made.append(path)  # B's: an epoch of its own
        return real_mkdir(path, *x, **k)

    monkeypatch.setattr(FolderKV, "_link", link)
    monkeypatch.setattr(os, "mkdir", mkdir)
    clock.sleep = sleep
    t = threading.Thread(target=lambda: answers.__setitem__("a", a.add("ctr", 1)))
    t.start()
    try:
        assert won.wait(30)
        answers["b"] = b.add("ctr", 1)
    finally:
        go.set()
        t.join(30)
    assert answers == {"a": 1, "b": 2} and made == [], (answers, made)
    (grown,) = [e for e in os.listdir(kd) if e != EPOCH0]
    assert grown.endswith(f"-c{folderstore_add.SEAL_GROW * a.seal_at}"), grown
    assert sorted(v for v in os.listdir(f"{kd}/{grown}") if v.startswith("v-")) == [version_name(1), version_name(2)]
    assert not [n for n in os.listdir(root) if n.startswith(trash.PREFIX)], "an epoch was retired"
    assert FolderKV(PosixStore(str(root))).add("ctr", 0) == 2


@pytest.mark.parametrize("sealing", [1, 0, 1.0, None, "true", [], {}])
def test_a_version_s_sealing_field_is_a_json_boolean_or_the_version_is_foreign(sealing):
    """``sealing`` (session 15) round-trips, is False when absent (versions written before), and any other JSON
    type in its place is refused as a foreign file (``1`` too: Python's ``1 in (False, True)`` is true)."""
    from fsmingle.errors import CorruptStateError
    from fsmingle.fs.folderstore_log import Version

    v = Version("k", "set", "t0", b"1", sealing=True)
    assert Version.decode(v.encode(), "x").sealing is True
    assert Version.decode(Version("k", "set", "t0", b"1").encode(), "x").sealing is False
    head, _, value = v.encode().partition(b"\n")
    bad = json.dumps({**json.loads(head), "sealing": sealing}).encode() + b"\n" + value
    with pytest.raises(CorruptStateError, match="not a FolderStore version"):
        Version.decode(bad, "x")


def test_adders_seal_epoch_0_themselves_when_the_counter_s_creator_died_before_its_seal(tmp_path, monkeypatch):
    """A's add creates the counter (version 1, ``sealing``) and dies before its seal (its process killed: here its
    ``_seal_now`` of epoch 0 does nothing).  B finds epoch 0 full, waits ``SEAL_WAIT`` polls for A's seal, then makes
    the seal itself (a read-modify-write, as before session 15); B and C answer 2 and 3, within a second."""
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    a, b, c = (FolderKV(PosixStore(str(root)), timeout=10) for _ in range(3))
    real = folderstore_add._seal_now
    monkeypatch.setattr(folderstore_add, "_seal_now", lambda kv, kd, ep, *x: None if kv is a else real(kv, kd, ep, *x))
    assert a.add("ctr", 1) == 1
    kd = root / key_dir("ctr")
    assert sorted(os.listdir(kd / EPOCH0)) == [version_name(1)]  # no seal: A "died"
    t0 = time.monotonic()
    assert b.add("ctr", 1) == 2 and c.add("ctr", 1) == 3
    assert time.monotonic() - t0 < 1.0
    assert sorted(os.listdir(kd / EPOCH0)) == [version_name(1), version_name(2)]  # B's seal
    assert FolderKV(PosixStore(str(root))).add("ctr", 0) == 3


def test_a_seal_slot_that_keeps_failing_does_not_hold_the_add_that_took_effect(tmp_path, monkeypatch):
    """Every ``link()`` of epoch 0's seal answers EIO (a soft mount's timeout).  The creating add took effect at its
    version 1: it answers within ``SEAL_WAIT x poll_max`` (1 s), not at its 5 s timeout (the session 15 attack: the
    add answered at its timeout); the seal is left to the next writer, who makes it once the slot heals."""
    from fsmingle.fs import store as store_module
    from fsmingle.fs.folderstore_add import SEAL_WAIT

    class EioOs:  # os for the store module: link() of epoch 0's version 2 fails while ``broken``
        broken = True

        def __getattr__(self, name):
            return getattr(os, name)

        def link(self, src, dst, *a, **kw):
            if EioOs.broken and str(dst).endswith(f"{EPOCH0}/{version_name(2)}"):
                raise OSError(errno.EIO, "Input/output error (injected)", dst)
            return os.link(src, dst, *a, **kw)

    monkeypatch.setattr(store_module, "os", EioOs())
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    a = FolderKV(PosixStore(str(root)), timeout=5)
    t0 = time.monotonic()
    assert a.add("ctr", 5) == 5
    took = time.monotonic() - t0
    assert took < SEAL_WAIT * a.poll_max + 0.5, f"the creating add answered after {took:.2f} s"
    EioOs.broken = False
    assert FolderKV(PosixStore(str(root)), timeout=5).add("ctr", 1) == 6
    assert version_name(2) in os.listdir(root / key_dir("ctr") / EPOCH0)


def test_a_quiet_counter_s_first_epoch_holds_128_and_its_next_ones_the_default(tmp_path):
    """Issue 30 item 1's bound for a counter since session 15: its creating add names a first epoch of
    ``SEAL_GROW x SEAL_AT`` (128) versions whether or not others add -- at most 2 + 2 x 128 files under the key
    while it fills -- and a quiet counter's next epochs are the default (32): back to the old bound."""
    from fsmingle.fs.folderstore import SEAL_AT

    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    kv = FolderKV(PosixStore(str(root)), retire_grace=0.0)
    kd = root / key_dir("ctr")
    top = folderstore_add.SEAL_GROW * SEAL_AT

    def files():
        return sum(len(fs) for _, _, fs in os.walk(kd))

    for _ in range(top - 2):
        kv.add("ctr", 1)
    (first,) = [e for e in os.listdir(kd) if e != EPOCH0]
    assert first.endswith(f"-c{top}") and files() <= 2 + 2 * top, (first, files())
    for _ in range(2 * SEAL_AT):
        kv.add("ctr", 1)
    newest = max((e for e in os.listdir(kd) if e != EPOCH0), key=lambda e: int(e[2:14]))
    assert "-c" not in newest[15:] and files() <= 2 + 2 * SEAL_AT, (newest, files())
    assert FolderKV(PosixStore(str(root))).add("ctr", 0) == top - 2 + 2 * SEAL_AT


@pytest.mark.parametrize("path", ["delta", "read-modify-write"])
def test_a_write_whose_epoch_is_retired_under_every_try_keeps_its_timeout(tmp_path, monkeypatch, path):
    """B (timeout 0.2 s) writes while A seals and retires B's epoch just before each of B's ``link()``s, 1,500
    times.  B raises its timeout at 0.2 s, saying the write took no effect.  Before (the session 15 attack on the
    first version of ``folderstore_link.moved_on``, whose look at where the log went has no pause to end at the
    deadline) B chased the log for about 6 s and answered, past its timeout."""
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    a, b = FolderKV(PosixStore(str(root))), FolderKV(PosixStore(str(root)), timeout=0.2)
    for kv in (a, b):
        kv.seal_at = kv.seal_max = 4  # no grown epochs: A needs few adds to seal
    for kv in (a, b, a, b, a, b):
        kv.add("ctr", 1)
    rounds, added = [], []

    def interfere(d):  # A seals (and so retires) B's epoch
        if len(rounds) < 1500:
            rounds.append(d)
            while os.path.isdir(root / d):
                added.append(a.add("ctr", 1))

    if path == "delta":
        real = folderstore_add._link_slots
        monkeypatch.setattr(
            folderstore_add, "_link_slots", lambda kv, d, *x: (kv is b and interfere(d), real(kv, d, *x))[1]
        )
    else:
        real = FolderKV._link
        monkeypatch.setattr(
            FolderKV, "_link", lambda kv, d, *x: (kv is b and "/e-" in d and interfere(d), real(kv, d, *x))[1]
        )
    t0 = time.monotonic()
    with pytest.raises(FolderStoreTimeout, match="it took no effect") as e:
        b.add("ctr", 1) if path == "delta" else b.set("ctr", b"7")
    took = time.monotonic() - t0
    assert took < 0.2 + 1.0 and len(rounds) < 1500, (took, len(rounds), str(e.value))
    assert added == list(range(7, 7 + len(added)))  # B's tries took no effect: A's adds are all there is
    assert a.add("ctr", 0) == 6 + len(added), "B's write took effect although it raised"


@pytest.mark.root
@pytest.mark.skipif(bool(bindfs_missing()), reason="NFS-like FUSE views need: " + ", ".join(bindfs_missing()))
def test_a_negative_dentry_of_a_version_is_not_waited_out(tmp_path):
    """Two bindfs mounts of one directory keeping absences for 60 s (``negative_timeout``, as NFS's
    ``acdirmax`` or a FUSE client's): A looks up the next versions of a counter while they are missing (the
    lookup the kernel makes before each ``link()`` of a contended add, which another mount then fills: EEXIST,
    the negative dentry stays), B adds 1 twice, then A adds 1 with a 20 s timeout.  A must read B's versions
    (its own add's base and read-back) without waiting the 60 s out: fsmingle.fs.lookup.refresh revalidates a
    negative dentry by an exclusive create.  Before the fix: A's add raised the timeout (the versions stayed
    ENOENT through A's mount for 60 s)."""
    from fsmingle.fs.folderstore import FolderKV, key_dir
    from fsmingle.fs.folderstore_log import version_name
    from fsmingle.fs.store import PosixStore

    with bindfs_views(tmp_path, 2, cache=60) as (backing, mounts):
        a, b = (FolderKV(PosixStore(str(m)), timeout=20.0) for m in mounts)
        for _ in range(3):  # past epoch 0 (its seal) and version 1 of epoch 1: where deltas go
            b.add("ctr", 1)
        kd = backing / key_dir("ctr")
        ep = max(e for e in os.listdir(kd) if e.startswith("e-"))
        top = max(int(v[2:]) for v in os.listdir(kd / ep) if v.startswith("v-"))
        for n in range(top + 1, top + 4):  # negative dentries in A's mount, for 60 s
            assert not (mounts[0] / key_dir("ctr") / ep / version_name(n)).exists()
        assert [b.add("ctr", 1) for _ in range(2)] == [4, 5]
        assert (kd / ep / version_name(top + 2)).exists()  # B's versions went where A looked (same epoch)
        assert a.add("ctr", 1) == 6
        assert a.try_get("ctr") == b"6" and b.try_get("ctr") == b"6"


def test_the_last_delta_of_an_epoch_seals_it_at_once(tmp_path):
    """The add whose delta takes an epoch's last delta slot (version ``SEAL_AT``-1) makes the seal itself, right
    after: the next writers find the next epoch instead of each making one and racing for the seal's slot (at 256
    ranks on cached mounts ~40 seal attempts per epoch before, each a mkdir, a lost link() and a retirement).
    The seal changes nothing: the counter reads the same through it.  Before: no seal until the next write."""
    from fsmingle.fs.folderstore import FolderKV, key_dir
    from fsmingle.fs.folderstore_log import version_name
    from fsmingle.fs.store import PosixStore

    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    kv = FolderKV(PosixStore(str(root)))
    kv.seal_at = kv.seal_first = 5
    kd = root / key_dir("ctr")
    assert kv.add("ctr", 1) == 1  # creates the counter: epoch 0's version 1, and at once its seal (version 2)
    assert sorted(v for v in os.listdir(kd / EPOCH0) if v.startswith("v-")) == [version_name(1), version_name(2)]
    ep = max(e for e in os.listdir(kd) if e.startswith("e-"))
    assert sorted(v for v in os.listdir(kd / ep) if v.startswith("v-")) == [version_name(1)]  # the seal's copy
    assert [kv.add("ctr", 1) for _ in range(3)] == [2, 3, 4]  # deltas at versions 2, 3 and 4: the last slot
    eps = sorted(e for e in os.listdir(kd) if e.startswith("e-"))
    # The seal made by the 3rd add: its epoch retired (out of the key's directory), the next one holds the copy.
    assert ep not in eps and len(eps) == 2, eps
    assert sorted(v for v in os.listdir(kd / eps[-1]) if v.startswith("v-")) == [version_name(1)]
    assert FolderKV(PosixStore(str(root))).try_get("ctr") == b"4" and kv.add("ctr", 2) == 6


def test_a_contended_counter_grows_its_next_epoch_in_the_name_and_a_quiet_one_keeps_the_default(tmp_path):
    """The last delta's writer that passed a slot another adder took (contended: N ranks' barrier) names the next
    epoch with twice the capacity (``-c8`` for ``seal_at`` 4), so N adds cross fewer epochs; every process reads
    the capacity from that immutable name: a delta goes where a default epoch's seal would be (version 4), the
    seal at version 8.  A quiet adder that fills the grown epoch names the next one with the default (no suffix),
    and a fresh process reads the same value throughout.  Before: no epoch name carried a capacity (every epoch
    held 4, the contended counter crossed an epoch per 4 versions)."""
    from fsmingle.fs.folderstore import FolderKV, key_dir
    from fsmingle.fs.store import PosixStore

    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    a, b = (FolderKV(PosixStore(str(root))) for _ in range(2))
    for kv in (a, b):
        kv.seal_at = kv.seal_first = 4
    kd = root / key_dir("ctr")

    def epochs():
        return sorted((e for e in os.listdir(kd) if e.startswith("e-")), key=lambda e: int(e[2:14]))

    def versions(ep):
        return sorted(int(v[2:]) for v in os.listdir(kd / ep) if v.startswith("v-"))

    assert [a.add("ctr", 1) for _ in range(3)] == [1, 2, 3]  # epoch 0's two versions, version 1 of epoch 1
    assert b.try_get("ctr") == b"3"  # B saw epoch 1 at version 1 ...
    frozen, plain = {}, b.store.listdir
    b.store.listdir = lambda name="": list(frozen.setdefault(name, plain(name)))  # ... and its listings lag there
    b.store.listdir(f"{key_dir('ctr')}/{epochs()[-1]}")
    b.store.listdir(key_dir("ctr"))
    assert a.add("ctr", 1) == 4  # version 2, a delta
    assert b.add("ctr", 1) == 5  # B loses version 2, takes 3 (the last delta slot) and seals: contended
    b.store.listdir = plain
    grown = epochs()[-1]
    assert grown.endswith("-c8") and versions(grown) == [1], epochs()
    assert [a.add("ctr", 1) for _ in range(3)] == [6, 7, 8]  # versions 2, 3, 4: deltas, no seal at 4
    assert epochs()[-1] == grown and versions(grown) == [1, 2, 3, 4]
    assert FolderKV(PosixStore(str(root))).try_get("ctr") == b"8"  # a fresh reader walks the grown epoch (no cap set)
    assert [a.add("ctr", 1) for _ in range(3)] == [9, 10, 11]  # 5, 6, 7: the last delta, quiet: sealed at 8
    assert grown not in epochs() and "-c" not in epochs()[-1][15:], epochs()  # retired; the next at the default
    assert versions(epochs()[-1]) == [1]
    assert FolderKV(PosixStore(str(root))).try_get("ctr") == b"11" and b.add("ctr", 1) == 12


def test_an_epoch_name_says_its_capacity_and_an_old_name_the_default():
    """``epoch_cap``: the suffix ``-c<n>`` of a later epoch's name, the default for a name without one (stores
    written before: every epoch of ``SEAL_AT``); a name saying under 2 is not one fsmingle makes."""
    from fsmingle.errors import CorruptStateError
    from fsmingle.fs.folderstore_log import EPOCH_RE, epoch_cap, new_epoch_name

    assert epoch_cap("e-000000000003-0123456789abcdef", 32) == 32 and epoch_cap("e-000000000000", 32) == 32
    grown = new_epoch_name(3, 128)
    assert EPOCH_RE.match(grown) and epoch_cap(grown, 32) == 128 and epoch_cap(new_epoch_name(3), 32) == 32
    with pytest.raises(CorruptStateError):
        epoch_cap("e-000000000003-0123456789abcdef-c1", 32)
    assert not EPOCH_RE.match("e-000000000003-0123456789abcdef-c0128") and not EPOCH_RE.match("e-000000000003-c8")


class _Lagging(PosixStore):
    """A client whose directory cache lags from :meth:`freeze` on: each directory lists what it listed then, and a
    version made since reads as absent (a lookup that lies) -- while its own ``link()`` calls reach the server."""

    frozen: dict | None = None

    def freeze(self) -> None:
        self.frozen = {}

    def listdir(self, name=""):
        if self.frozen is None:
            return super().listdir(name)
        return self.frozen.setdefault(name, super().listdir(name))

    def read(self, name):
        d, _, base = name.rpartition("/")
        if self.frozen is not None and base.startswith("v-") and base not in self.listdir(d):
            return None
        return super().read(name)


def test_an_add_that_took_effect_says_so_when_its_answer_times_out(tmp_path):
    """B's add loses its race to A's delta (B's listing lags), links its own delta in the next version, and then
    cannot read A's -- the version below its own, needed for its answer -- until its 1 s timeout: the timeout must
    say that the add took effect (a caller that adds again would count it twice), and the count holds it.  Before:
    "Timeout after 1 s adding to 'ctr': ... is listed but unreadable ...", which reads as an add that did nothing."""
    from fsmingle.fs.folderstore_log import FolderStoreTimeout

    lag = _Lagging(str(tmp_path))
    a, b = FolderKV(PosixStore(str(tmp_path))), FolderKV(lag, timeout=1.0, clock=_TickClock())
    for kv in (a, b, a, b):  # past epoch 0 (its seal) and version 1 of epoch 1: where deltas go
        kv.add("ctr", 1)
    lag.freeze()
    assert b.try_get("ctr", fresh=False) == b"4"  # B's listings stop here
    assert a.add("ctr", 1) == 5
    with pytest.raises(FolderStoreTimeout, match=r"the add took effect as .*v-\d+; only its answer is missing"):
        b.add("ctr", 1)
    assert a.add("ctr", 0) == 6  # B's add is counted once


def test_a_write_whose_effect_stays_unknown_says_so_at_its_timeout(tmp_path):
    """Every create of a version answers EIO after it took effect (a soft mount whose replies are lost): ``set``
    creates it again with the same token until its 1 s timeout, and the timeout must say that whether the write
    took effect is unknown (read the key before writing again).  Before: only "creating ... keeps failing"."""
    import errno

    from fsmingle.fs.folderstore_log import FolderStoreTimeout
    from fsmingle.fs.store import storage_error

    class LostReplies(PosixStore):
        def create(self, name, data, fsync=True):
            if "/v-" in name:
                super().create(name, data, fsync)  # the effect: made, or EEXIST for the same token's earlier try
                raise storage_error(OSError(errno.EIO, "Input/output error"), "create", self.path(name))
            return super().create(name, data, fsync)

    kv = FolderKV(LostReplies(str(tmp_path)), timeout=1.0, clock=_TickClock())
    with pytest.raises(FolderStoreTimeout, match=r"keeps failing: .* \(whether it took effect is unknown"):
        kv.set("k", b"v")
    assert FolderKV(PosixStore(str(tmp_path))).try_get("k") == b"v"  # it did, here


def test_a_delta_whose_link_keeps_failing_says_its_effect_is_unknown_at_its_timeout(tmp_path, monkeypatch):
    """Every ``link()`` of a delta answers EIO (a soft mount's timeout): ``_link_slots`` links again until the 1 s
    timeout, and that timeout must say that whether the add took effect is unknown -- a reply lost after the server
    linked it, with a link count that could not be read, looks the same from here.  Before: only "linking ... keeps
    failing", which reads as an add that did nothing (a caller that retries counts it twice)."""
    import errno

    from fsmingle.fs import folderstore_add
    from fsmingle.fs.folderstore_log import FolderStoreTimeout

    class EioLinks:
        def __getattr__(self, name):
            return getattr(os, name)

        def link(self, src, dst, **kw):
            if "/v-" in dst:
                raise OSError(errno.EIO, "Input/output error", dst)
            return os.link(src, dst, **kw)

    a, b = FolderKV(PosixStore(str(tmp_path))), FolderKV(PosixStore(str(tmp_path)), timeout=1.0, clock=_TickClock())
    for kv in (a, b, a, b):  # past epoch 0 (its seal) and version 1 of epoch 1: where deltas go
        kv.add("ctr", 1)
    monkeypatch.setattr(folderstore_add, "os", EioLinks())
    with pytest.raises(FolderStoreTimeout, match=r"linking .*keeps failing: .* \(whether it took effect is unknown"):
        b.add("ctr", 1)
    monkeypatch.undo()
    assert a.add("ctr", 0) == 4  # here it did not


def test_an_add_that_took_effect_says_so_when_its_answer_stays_unreadable_past_the_lie_limit(tmp_path, monkeypatch):
    """As ``test_an_add_that_took_effect_says_so_when_its_answer_times_out``, with a timeout longer than
    ``LIE_LIMIT`` (lowered here to 0.5 s): the version below B's stays unreadable until ``CorruptStateError``, which
    must still say that the add took effect.  Before: "... has been listed but unreadable for 120 s; was the store
    removed?", naming neither the add nor its effect."""
    from fsmingle.errors import CorruptStateError
    from fsmingle.fs import folderstore

    monkeypatch.setattr(folderstore, "LIE_LIMIT", 0.5)
    lag = _Lagging(str(tmp_path))
    a, b = FolderKV(PosixStore(str(tmp_path))), FolderKV(lag, timeout=60.0, clock=_TickClock())
    for kv in (a, b, a, b):
        kv.add("ctr", 1)
    lag.freeze()
    assert b.try_get("ctr", fresh=False) == b"4"
    assert a.add("ctr", 1) == 5
    with pytest.raises(CorruptStateError, match=r"After 0.5 s adding .*the add took effect as .*v-\d+.*do not add"):
        b.add("ctr", 1)
    assert a.add("ctr", 0) == 6
