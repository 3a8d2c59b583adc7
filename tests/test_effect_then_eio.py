"""Issue 29 (measured 6): a create that takes effect and still reports an error (EIO).

On GlusterFS a ``mkdir`` of ``gen-00000001`` raced by four clients returned EIO although it took
effect; a soft NFS mount's timeout does the same to ``link()`` and ``rename()``.  Rank 0's
``release.json`` create already read back after such an error (``test_commit_window_model.py``);
the generation directory, the claims, the beacons, the endpoint record and the restart records
now do too (``Joining.create_record``, ``make_dir``, ``publish_record``; ``PosixStore.publish``
checks that its unique temporary name is gone): the record is read back, and the node never fails
on an operation that happened.

Replays on the model (the real ``Participant`` on :mod:`fakefs`: ``arm_io_error`` after the
effect), one per kind of record and then at every mutating store operation of a joiner, and
PosixStore-level tests that make ``os.mkdir``/``os.link``/``os.replace`` take effect and raise EIO.
"""

from __future__ import annotations

import errno
import os

import pytest

try:
    from model_oracles import GLUSTER_NEG
    from model_world import World
except ImportError:  # tests/ imported as a package
    from tests.model_oracles import GLUSTER_NEG
    from tests.model_world import World

from fsmingle.fs import readback
from fsmingle.fs.store import PosixStore, storage_error


def _one_world(w: World, *qs) -> int:
    """Everyone released, in one generation (the world's own oracles checked every step)."""
    for q in qs:
        assert q.status == "done", (q.error, q.p.note if q.p else None, w.log[-30:])
    gens = {q.result.generation for q in qs}
    assert len(gens) == 1, gens
    g = gens.pop()
    assert {m.instance for m in w.releases[g].members} == {q.instance for q in qs}
    return g


def _world_with_a_fault(match, ops, blind: float = 0.0, k: int = 0, first: bool = True):
    """A world of 2 (first-come ranks): the ``k``-th of ``ops`` on a name ``match`` accepts, by
    the first participant (``first``) or the second, takes effect and raises EIO."""
    w = World(2, staleness=1.0)
    a = w.start(0)
    victim = a
    if first:
        a.host.store.arm_io_error(k, match, ops=ops, after_effect=True, blind_for=blind)
    w.tick(0.5)
    b = w.start(1)
    if not first:
        victim = b
        b.host.store.arm_io_error(k, match, ops=ops, after_effect=True, blind_for=blind)
    w.tick(60.0, stop=lambda: a.status != "running" and b.status != "running")
    return w, a, b, victim


def test_the_generation_directory_mkdir_takes_effect_and_reports_eio():
    # FAILS before: StorageError out of Joining._step_join -> the participant exits (5).
    w, a, b, victim = _world_with_a_fault(lambda n: n == "gen-00000001", ("mkdir",))
    assert victim.host.store.io_errors == [("mkdir", "gen-00000001", True)]
    assert _one_world(w, a, b) == 1


def test_the_master_directory_mkdir_takes_effect_and_reports_eio():
    w, a, b, victim = _world_with_a_fault(lambda n: n == "gen-00000001/master", ("mkdir",))
    assert victim.host.store.io_errors == [("mkdir", "gen-00000001/master", True)]
    assert _one_world(w, a, b) == 1


@pytest.mark.parametrize("first", [True, False], ids=["rank0s-claim", "a-members-claim"])
def test_a_claim_takes_effect_and_reports_eio(first):
    # FAILS before: StorageError out of Joining.try_claim -> the participant exits (5).
    w, a, b, victim = _world_with_a_fault(lambda n: n.endswith(".claim"), ("create",), first=first)
    assert [e[0] for e in victim.host.store.io_errors] == ["create"]
    assert _one_world(w, a, b) == 1


def test_a_claim_takes_effect_reports_eio_and_the_read_back_finds_nothing():
    """The failed link() left a negative lookup entry (GlusterFS nl-cache: 61 s): the read-back
    finds nothing, the second create meets EEXIST.  Nobody fails; the world is made, in a later
    generation if it must (the claimer that cannot see its own claim is judged like a silent one)."""
    w, a, b, victim = _world_with_a_fault(lambda n: n.endswith(".claim"), ("create",), blind=GLUSTER_NEG)
    w.tick(120.0, stop=lambda: a.status != "running" and b.status != "running")
    _one_world(w, a, b)


@pytest.mark.parametrize("first", [True, False], ids=["rank0s-beacon", "a-members-beacon"])
def test_a_beacon_publish_takes_effect_and_reports_eio(first):
    # FAILS before: StorageError out of Participant.publish_beacon -> the participant exits (5).
    w, a, b, victim = _world_with_a_fault(lambda n: n.startswith("gen-00000001/beacon-"), ("publish",), first=first)
    assert [e[0] for e in victim.host.store.io_errors] == ["publish"]
    assert _one_world(w, a, b) == 1


def test_the_endpoint_publish_takes_effect_and_reports_eio():
    w, a, b, victim = _world_with_a_fault(lambda n: n.startswith("gen-00000001/master/"), ("publish",))
    assert [e[0] for e in victim.host.store.io_errors] == ["publish"]
    assert _one_world(w, a, b) == 1


def test_a_void_takes_effect_and_reports_eio():
    """Rank 1's holder dies before the release; rank 0 voids generation 1 and its create of the
    restart record takes effect and reports EIO: read back (ours), rank 0 goes on to generation 2
    and is released there with the member's restart."""
    w = World(2, staleness=1.0)
    a = w.start(0)
    w.tick(0.5)
    b = w.start(1)
    w.tick(5.0, stop=lambda: b.p.rank == 1)
    assert b.p.rank == 1, w.log[-20:]
    w.crash(b)
    a.host.store.arm_io_error(0, lambda n: n == "gen-00000001/release.json", ops=("create",), after_effect=True)
    w.tick(30.0, stop=lambda: w.decided.get(1) is not None)
    assert w.decided[1].state == "restart" and a.status == "running", (a.error, w.log[-20:])
    b2 = w.start(1)
    w.tick(60.0, stop=lambda: a.status != "running" and b2.status != "running")
    assert _one_world(w, a, b2) >= 2


# Rank 0 (the first) makes 6 mutating operations before its world is released: its generation's
# two directories, its claim, its beacon, its endpoint, release.json (whose read-back the commit
# window tests cover); a member (the second) 4: two mkdirs (of directories made ahead: an EIO that
# took no effect), its claim, its beacon.
EVERY_OP = [(True, k) for k in range(6)] + [(False, k) for k in range(4)]


@pytest.mark.parametrize("first,k", EVERY_OP, ids=[f"{'rank0' if f else 'member'}-op{k}" for f, k in EVERY_OP])
def test_effect_then_eio_at_every_mutating_operation_of_a_joiner(first, k):
    """The ``k``-th mkdir, create or publish of one participant takes effect and reports EIO:
    nobody fails, one world is released (the world's oracles check every step)."""
    w, a, b, victim = _world_with_a_fault(None, ("mkdir", "create", "publish"), k=k, first=first)
    assert victim.host.store.io_errors, "the fault never fired"
    _one_world(w, a, b)


# ---------------------------------------------------------------- PosixStore, on a real directory


def _effect_then_eio(monkeypatch, name: str):
    real = getattr(os, name)
    calls = []

    def op(*args, **kw):
        real(*args, **kw)
        calls.append(args)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, name, op)
    return calls


def test_posix_publish_whose_rename_takes_effect_and_reports_eio(tmp_path, monkeypatch):
    # FAILS before: StorageError "cannot publish ...: Input/output error".
    s = PosixStore(str(tmp_path))
    s.publish("beacon", b"old")
    calls = _effect_then_eio(monkeypatch, "replace")
    s.publish("beacon", b"new")
    assert calls and s.read("beacon") == b"new"
    assert [n for n in os.listdir(tmp_path) if n != "beacon"] == []  # no temporary left behind


def test_posix_create_whose_link_takes_effect_and_reports_eio(tmp_path, monkeypatch):
    s = PosixStore(str(tmp_path))
    calls = _effect_then_eio(monkeypatch, "link")
    assert s.create("rank-00000.claim", b"mine") is True
    assert calls and s.read("rank-00000.claim") == b"mine"
    assert s.create("rank-00000.claim", b"theirs") is False  # EEXIST is still a lost race


@pytest.mark.parametrize(
    ("err", "unknown"), [(errno.ENOTCONN, True), (errno.ECONNRESET, True), (errno.EROFS, False), (errno.EACCES, False)]
)
def test_a_create_whose_link_reply_was_lost_says_its_effect_is_unknown(tmp_path, monkeypatch, err, unknown):
    """A GlusterFS client whose brick disconnects mid-``link()`` answers ENOTCONN (a JuiceFS client killed: the
    same): the LINK may have reached the server, and the error is not retried (the node fails at once: the client
    is gone).  Before, its StorageError read like a refusal ("cannot create ...: Transport endpoint is not
    connected"), and a FolderStore ``add`` that raised it said nothing of having maybe counted (session 11's
    open item).  A refusal (read-only, permission) took no effect and must not say so."""
    from fsmingle.errors import StorageError

    s = PosixStore(str(tmp_path))

    def link(src, dst, *a, **k):
        raise OSError(err, os.strerror(err), dst)

    monkeypatch.setattr(os, "link", link)
    with pytest.raises(StorageError) as ei:
        s.create("rank-00000.claim", b"mine")
    assert str(ei.value).startswith("cannot create ") and ei.value.errno == err
    assert ("whether it took effect is unknown" in str(ei.value)) is unknown, str(ei.value)


def test_posix_mkdir_that_takes_effect_and_reports_eio(tmp_path, monkeypatch):
    s = PosixStore(str(tmp_path))
    calls = _effect_then_eio(monkeypatch, "mkdir")
    assert s.mkdir("gen-00000001") is False  # there (made by us or another: unknown), not an error
    assert calls and (tmp_path / "gen-00000001").is_dir()


def test_a_publish_whose_read_back_fails_too_publishes_once_more(tmp_path, monkeypatch):
    """GlusterFS nfs60 (the full suite, test_realfs's create race): in a directory whose racing mkdir
    had answered EIO, a beacon's publish and then its read-back answered EIO on that client, and the
    read-back's error failed the node.  A publish is idempotent: a read-back that fails decides
    nothing, one more publish does.  FAILS before: StorageError out of the read-back."""
    s = PosixStore(str(tmp_path))
    real_publish, real_read = s.publish, s.read
    left = {"publish": 1, "read": 1}
    eio = OSError(errno.EIO, os.strerror(errno.EIO))

    def publish(name, data):
        if left["publish"]:
            left["publish"] -= 1
            raise storage_error(eio, "publish", str(tmp_path / name))
        real_publish(name, data)

    def read(name):
        if left["read"]:
            left["read"] -= 1
            raise storage_error(eio, "read", str(tmp_path / name))
        return real_read(name)

    monkeypatch.setattr(s, "publish", publish)
    monkeypatch.setattr(s, "read", read)
    readback.publish(s, "beacon-node1", b"node1")
    assert left == {"publish": 0, "read": 0} and real_read("beacon-node1") == b"node1"
