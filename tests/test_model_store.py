"""The ``Store`` contract on the real and the fake implementation, and the fake filesystem's own
staleness rules (what the model's :mod:`fakefs` promises, checked).
"""

from __future__ import annotations

import pytest

from fsmingle.errors import (
    RankConflictError,
)
from fsmingle.fs.store import PosixStore, Store
from fsmingle.protocol.participant import State

try:
    import fakefs
    from model_world import World
except ImportError:  # tests/ imported as a package
    from tests import fakefs
    from tests.model_world import World

Crash, FakeClock, FakeFS = fakefs.Crash, fakefs.FakeClock, fakefs.FakeFS


# ---------------------------------------------------------------------------------------------
# The Store contract, on the real and the fake implementation.


@pytest.fixture(params=["posix", "fake"])
def store(request, tmp_path):
    if request.param == "posix":
        return PosixStore(str(tmp_path))
    return FakeFS(max_staleness=0.0).view("n0")


def test_store_contract(store: Store):
    assert isinstance(store, Store)
    assert store.listdir("") == []
    assert store.listdir("nope") == []
    assert store.read("nope.json") is None
    assert store.mkdir("gen-00000001") is True
    assert store.mkdir("gen-00000001") is False
    assert store.listdir("") == ["gen-00000001"]
    assert store.listdir("gen-00000001") == []
    # publish: create or atomically replace
    store.publish("gen-00000001/beacon-a.json", b"one")
    assert store.read("gen-00000001/beacon-a.json") == b"one"
    store.publish("gen-00000001/beacon-a.json", b"two")
    assert store.read("gen-00000001/beacon-a.json") == b"two"
    # create: exclusive, the first content stays
    assert store.create("gen-00000001/rank-00000.claim", b"first") is True
    assert store.create("gen-00000001/rank-00000.claim", b"second") is False
    assert store.read("gen-00000001/rank-00000.claim") == b"first"
    # listdir: sorted, temporaries and other hidden names never shown
    assert store.listdir("gen-00000001") == ["beacon-a.json", "rank-00000.claim"]
    # a missing directory: writes raise FileNotFoundError (the protocol rejoins)
    with pytest.raises(FileNotFoundError):
        store.publish("gen-00000009/beacon-a.json", b"x")
    with pytest.raises(FileNotFoundError):
        store.create("gen-00000009/rank-00000.claim", b"x")
    # remove: absent is fine
    store.remove("gen-00000001/beacon-a.json")
    store.remove("gen-00000001/beacon-a.json")
    assert store.read("gen-00000001/beacon-a.json") is None
    assert store.listdir("gen-00000001") == ["rank-00000.claim"]
    # retire: the whole directory goes at once; a second retire finds nothing
    assert store.retire("gen-00000001") is True
    assert store.retire("gen-00000001") is False
    assert store.listdir("") == []
    assert store.read("gen-00000001/rank-00000.claim") is None
    assert store.listdir("gen-00000001") == []


def test_store_contract_hides_dot_names(tmp_path):
    posix = PosixStore(str(tmp_path))
    posix.mkdir("gen-00000001")
    (tmp_path / "gen-00000001" / ".tmp-x").write_bytes(b"partial")
    (tmp_path / "gen-00000001" / ".nfs0001").write_bytes(b"silly")
    assert posix.listdir("gen-00000001") == []
    fs = FakeFS()
    v = fs.view("n0")
    v.mkdir("gen-00000001")
    v.arm_crash(0)  # dies inside publish: only a hidden temporary is left
    with pytest.raises(Crash):
        v.publish("gen-00000001/beacon-a.json", b"x")
    assert v.listdir("gen-00000001") == [] and v.read("gen-00000001/beacon-a.json") is None
    assert [fakefs.basename(n) for n in fs.present_files("gen-00000001")] == [".tmp-n0-1"]


# ---------------------------------------------------------------------------------------------
# The fake filesystem's own staleness rules.


def test_fake_stale_reads_are_bounded_and_monotonic():
    fs = FakeFS(max_staleness=2.0)
    a, b = fs.view("a"), fs.view("b")
    b.lag = 2.0
    assert b.read("f") is None  # b caches "absent"
    a.publish("f", b"1")
    assert a.read("f") == b"1"  # read-your-writes
    assert b.read("f") is None  # negative dentry, younger than the lag
    assert fs.view("c").read("f") == b"1"  # a view that never looked sees it
    fs.advance(1.0)
    a.publish("f", b"2")
    assert b.read("f") is None
    fs.advance(1.0)
    assert b.read("f") == b"1"  # the version current 2 s ago
    fs.advance(1.0)
    assert b.read("f") == b"2"
    b.lag = 0.0
    assert b.read("f") == b"2"
    b.lag = 2.0
    assert b.read("f") == b"2"  # caches never go back
    b.lag = 99
    assert b.lag == 2.0  # clamped to the bound


def test_fake_listdir_lags_and_exclusive_create_is_linearisable():
    fs = FakeFS(max_staleness=1.0)
    a, b = fs.view("a"), fs.view("b")
    b.lag = 1.0
    a.mkdir("d")
    assert b.listdir("") == [] and b.mkdir("d") is False  # stale listing, but mkdir asks the truth
    assert b.listdir("") == ["d"]  # its own mkdir refreshed its listing
    assert b.create("d/x", b"b") is True and a.create("d/x", b"a") is False
    fs.advance(1.0)
    assert a.listdir("d") == ["x"]


def test_fake_clock_skew_and_sleep():
    fs = FakeFS()
    c1, c2 = FakeClock(fs, 5.0, 120.0), FakeClock(fs, -3.0, -120.0)
    m1, m2 = c1.monotonic(), c2.monotonic()
    c1.sleep(10)
    assert c1.monotonic() == m1  # sleeping advances nothing
    fs.advance(1.5)
    assert c1.monotonic() - m1 == c2.monotonic() - m2 == 1.5
    assert c1.time() - c2.time() == 240.0


def test_bug_old_heartbeat_change_is_not_proof_of_life():
    # liveness.py, Judge.judge: a changed counter returns ALIVE however long ago the previous
    # observation was.  B asks for rank 0, held by A; B observes A's beacon, then does not look
    # for 20 s (stalled, or its lookups failed with ENOENT -- found by the model that way).
    # Meanwhile A heartbeats once and dies.  B's next look sees the counter changed and raises
    # RankConflictError ("held by a live process") about a holder dead for 15 s, instead of
    # judging it dead after stale_after and taking its place.  Fix: keep the time of the
    # previous observation in _Seen and count a change as ALIVE only if that observation is
    # less than stale_after old (otherwise start a new observation window: UNKNOWN).
    w = World(2, ranks=[0, 1], pidns="pod")
    a = w.start(0)
    w.tick(1.0)
    b = w.start(None, rank=0)
    w.step(b)
    w.step(b)
    assert b.p.state is State.CONTEST
    w.stall(b, 20.0)
    w.tick(5.0)  # A heartbeats (every stale_after / 3)
    w.crash(a)
    w.tick(15.0)  # B's next step
    assert b.status == "running" or b.died_at >= a.died_at + 14.0  # it stepped again 15 s after A died
    assert not isinstance(b.error, RankConflictError), f"{b.error}; A died {w.fs.now - a.died_at:.0f} s ago"
