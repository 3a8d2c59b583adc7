"""The ``fsmingle`` torchrun rendezvous backend (the fsmingle/torchrun/ package).

Three layers:

* :class:`FsRendezvousBackend` against the semantics torch's own backend tests
  demand (mirror of ``RendezvousBackendTestMixin`` in torch's
  ``test/distributed/elastic/rendezvous/rendezvous_backend_test.py``), plus
  concurrency, pruning, run boundaries and on-disk format.
* Two handlers in one process (threads): rendezvous, the round's TCPStore,
  shutdown, and a second run with the same id.
* Real ``torchrun`` processes on loopback: two fixed nodes, an elastic 1:3 job
  that a third node joins mid-run, a worker crash with ``--max-restarts 1``,
  and the same command re-run several times with the same id.  Every launch is
  wrapped in ``timeout -k`` and torchrun's TMPDIR points into ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from helpers import REPO, torch_env

pytest.importorskip("torch")

from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousParameters,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    _NodeDesc,
    _RendezvousState,
)

from fsmingle.errors import ConfigError
from fsmingle.fs.jobdir import open_job_dir
from fsmingle.torchrun import (
    _torch_private,
    backend,
    codec,
    handler,
    heartbeat,
    storeaddr,
)

pytestmark = pytest.mark.torch

TRAIN = REPO / "examples" / "train_ddp.py"
KILL_AFTER_S = 10

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _state(round_: int = 0, closed: bool = False, members: int = 1, hb_age_s: float = 0.0) -> _RendezvousState:
    st = _RendezvousState()
    st.round = round_
    st.closed = closed
    now = datetime.now(timezone.utc) - timedelta(seconds=hb_age_s)
    for i in range(members):
        n = _NodeDesc(f"10.0.0.{i + 1}", 1000 + i, 0)
        st.participants[n] = i
        st.last_heartbeats[n] = now
    st.deadline = now + timedelta(seconds=30)
    return st


def _b(st: _RendezvousState) -> bytes:
    return pickle.dumps(st)


def _norm(data: bytes) -> dict:
    # Heartbeat times are this reader's verdicts (folded from heartbeat files
    # on every read), not stored values: compare which nodes are tracked.
    d = codec.state_to_json(pickle.loads(data))
    d["last_heartbeats"] = [e[:3] for e in d["last_heartbeats"]]
    return d


def _backend(tmp_path: Path, run_id: str = "job1", **kw) -> backend.FsRendezvousBackend:
    kw.setdefault("corrupt_grace_s", 0.2)
    kw.setdefault("retry_s", 2.0)
    return backend.FsRendezvousBackend(open_job_dir(str(tmp_path / "rdzv"), run_id), run_id, **kw)


def _state_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("state-"))


# --------------------------------------------------------------------------
# torch's RendezvousBackendTestMixin, mirrored (states are real pickled
# _RendezvousState: the backend stores JSON, so it accepts nothing else)
# --------------------------------------------------------------------------


class TestBackendSemantics:
    @pytest.fixture(autouse=True)
    def _setup(self, tmp_path):
        self.tmp = tmp_path
        self.backend = _backend(tmp_path)
        self.x, self.y, self.z = _b(_state(1)), _b(_state(2)), _b(_state(3))

    def _set_state(self, state, token=None):
        result = self.backend.set_state(state, token)
        assert result is not None
        return result

    def test_get_state_returns_backend_state(self):
        self.backend.set_state(self.x)
        result = self.backend.get_state()
        assert result is not None
        state, token = result
        assert _norm(state) == _norm(self.x)
        assert token is not None

    def test_get_state_returns_none_if_backend_state_does_not_exist(self):
        assert self.backend.get_state() is None

    def test_get_state_raises_error_if_backend_state_is_corrupt(self):
        self.backend.set_state(self.x)
        self.backend.store.publish(codec.state_name(1), b"\x80 not json")
        # Versions are immutable on disk, so a reader decodes each one once:
        # the corruption is what the next reader (another agent) meets.
        with pytest.raises(RendezvousStateError):
            _backend(self.tmp).get_state()

    def test_set_state_sets_backend_state_if_it_does_not_exist(self):
        state, token, has_set = self._set_state(self.x)
        assert state == self.x
        assert token is not None
        assert has_set

    def test_set_state_sets_backend_state_if_token_is_current(self):
        _, token1, has_set1 = self._set_state(self.x)
        state2, token2, has_set2 = self._set_state(self.y, token1)
        assert state2 == self.y
        assert token1 != token2
        assert has_set1 and has_set2

    def test_set_state_returns_current_backend_state_if_token_is_old(self):
        _, token1, _ = self._set_state(self.x)
        state2, token2, _ = self._set_state(self.y, token1)
        state3, token3, has_set = self._set_state(self.z, token1)
        assert _norm(state2) == _norm(state3)
        assert token2 == token3
        assert not has_set

    def test_set_state_returns_current_backend_state_if_token_is_none(self):
        state1, token1, _ = self._set_state(self.x)
        state2, token2, has_set = self._set_state(self.y)
        assert _norm(state1) == _norm(state2)
        assert token1 == token2
        assert not has_set

    def test_set_state_returns_current_backend_state_if_token_is_invalid(self):
        state1, token1, _ = self._set_state(self.x)
        state2, token2, has_set = self._set_state(self.y, token="invalid")
        assert _norm(state1) == _norm(state2)
        assert token1 == token2
        assert not has_set

    def test_other_backend_instance_sees_the_same_state(self):
        _, token1, _ = self._set_state(self.x)
        other = _backend(self.tmp)
        state, token = other.get_state()
        assert token == token1 and _norm(state) == _norm(self.x)


# --------------------------------------------------------------------------
# backend: format, security, concurrency, pruning, run boundaries
# --------------------------------------------------------------------------


def test_on_disk_is_owner_only_json_and_round_trips(tmp_path):
    be = _backend(tmp_path)
    st = _state(4, members=3)
    st.wait_list.add(_NodeDesc("node-7.cluster", 42, 3))
    st.last_heartbeats[_NodeDesc("node-7.cluster", 42, 3)] = datetime.now(timezone.utc)
    st.redundancy_list.add(_NodeDesc("fe80::1", 43, 0))
    be.set_state(_b(st))
    run_dir = tmp_path / "rdzv" / "job1"
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    f = run_dir / codec.state_name(1)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    d = json.loads(f.read_bytes())  # plain JSON, nothing pickled
    assert d["kind"] == codec.STATE_KIND and d["version"] == 1 and d["epoch"] == 1
    assert d["state"] == codec.state_to_json(st)  # stored as torch handed it over
    got, _ = _backend(tmp_path).get_state()
    assert _norm(got) == _norm(_b(st))
    back = pickle.loads(got)
    # Heartbeat times are the reader's verdicts: every node is new to it, so alive now.
    assert back.deadline == st.deadline and back.last_heartbeats.keys() == st.last_heartbeats.keys()
    assert all(datetime.now(timezone.utc) - t < timedelta(seconds=5) for t in back.last_heartbeats.values())


def test_set_state_refuses_pickles_of_anything_else(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > /dev/null",))

    be = _backend(tmp_path)
    for bad in (pickle.dumps(Evil()), pickle.dumps({"round": 1}), b"not a pickle"):
        with pytest.raises(RendezvousStateError):
            be.set_state(bad)
    assert _state_files(tmp_path / "rdzv" / "job1") == []


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(schema=99),
        lambda d: d.update(run_id="other"),
        lambda d: d.update(version=7),
        lambda d: d["state"].update(round=-1),
        lambda d: d["state"].update(participants=[["10.0.0.1; rm -rf /", 1, 0, 0]]),
        lambda d: d["state"].update(closed="yes"),
    ],
)
def test_invalid_state_files_are_rejected(tmp_path, mutate):
    be = _backend(tmp_path)
    be.set_state(_b(_state(1)))
    f = tmp_path / "rdzv" / "job1" / codec.state_name(1)
    d = json.loads(f.read_bytes())
    mutate(d)
    be.store.publish(codec.state_name(1), json.dumps(d).encode())
    with pytest.raises(RendezvousStateError):
        _backend(tmp_path).get_state()


def test_concurrent_compare_and_set_loses_no_update(tmp_path):
    """Threads, each with its own backend, increment state.round by CAS: no update is lost."""
    n_threads, per_thread = 4, 15
    _backend(tmp_path).set_state(_b(_state(0)))
    errors = []

    def worker():
        be = _backend(tmp_path, retry_s=10.0)
        try:
            for _ in range(per_thread):
                data, token = be.get_state()
                while True:
                    st = pickle.loads(data)
                    st.round += 1
                    data2, token2, ok = be.set_state(_b(st), token)
                    if ok:
                        break
                    data, token = data2, token2
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    data, token = _backend(tmp_path).get_state()
    assert pickle.loads(data).round == n_threads * per_thread
    assert token == 1 + n_threads * per_thread
    files = _state_files(tmp_path / "rdzv" / "job1")
    assert len(files) <= backend.KEEP_VERSIONS + 1, files  # old versions pruned
    assert files[-1] == codec.state_name(token)


def test_stalled_writer_cannot_recreate_a_pruned_version(tmp_path):
    """A writer that read version N, stalled while 31 more were written, then writes: no lost 'win'."""
    be = _backend(tmp_path)
    run_dir = tmp_path / "rdzv" / "job1"
    _, tok, _ = be.set_state(_b(_state(0)))
    stale = be.peek()  # what the stalled writer read (version 1)
    kept = {}
    for r in range(1, 32):
        _, tok, ok = be.set_state(_b(_state(r)), tok)
        assert ok
        if tok == 15:
            kept[15] = (run_dir / codec.state_name(15)).read_bytes()
    assert tok == 32 and not (run_dir / codec.state_name(16)).exists()  # pruned by the writer of 32

    def write_from(rec):
        w = _backend(tmp_path)
        real_peek = w.peek
        calls = iter([rec])
        w.peek = lambda: next(calls, None) or real_peek()  # the stall: peek() answered before the others wrote
        return w.set_state(_b(_state(99)), rec.version)

    # Its base is gone too: refused before writing.
    data, token, ok = write_from(stale)
    assert not ok and token == tok and pickle.loads(data).round == 31
    assert not (run_dir / codec.state_name(2)).exists()
    # Writers prune out of order: 16 is gone while 15 is still there.  The
    # name is free, so the create succeeds; it is taken back and reported lost.
    (run_dir / codec.state_name(15)).write_bytes(kept[15])
    data, token, ok = write_from(codec.decode_state_record(kept[15], "job1", 15))
    assert not ok and token == tok and pickle.loads(data).round == 31
    assert not (run_dir / codec.state_name(16)).exists()
    assert _backend(tmp_path).peek().version == tok


def test_reader_survives_pruning_and_stale_listing(tmp_path):
    be = _backend(tmp_path)
    _, tok, _ = be.set_state(_b(_state(0)))
    reader = _backend(tmp_path)
    reader.get_state()
    for i in range(1, 3 * backend.KEEP_VERSIONS):
        _, tok, ok = be.set_state(_b(_state(i)), tok)
        assert ok
    # The reader's last known version is long pruned: it must find the newest.
    data, token = reader.get_state()
    assert token == tok and pickle.loads(data).round == 3 * backend.KEEP_VERSIONS - 1
    # A listing that lags (files exist but are not listed) is caught up by probing.
    orig = reader.store.listdir
    reader.store.listdir = lambda name="": [n for n in orig(name) if n != codec.state_name(tok)]
    _, tok2, _ = be.set_state(_b(_state(99)), tok)
    data, token = reader.get_state()
    assert token == tok2 and pickle.loads(data).round == 99


def test_finished_run_is_hidden_and_a_fresh_lineage_starts(tmp_path):
    old = _backend(tmp_path)
    _, tok, _ = old.set_state(_b(_state(5, members=2)))
    # End of run: closed, every member left.
    _, tok, _ = old.set_state(_b(_state(6, closed=True, members=0)), tok)
    # The agent that lived in that lineage still sees it closed (torch raises
    # RendezvousClosedError from it) ...
    data, token = old.get_state()
    assert pickle.loads(data).closed and token == tok
    # ... a new agent sees no state, and starts epoch tok+1 at round 0.
    new = _backend(tmp_path)
    assert new.get_state() is None
    data, token, ok = new.set_state(_b(_state(0)), None)
    assert ok and token == tok + 1 and new.epoch == tok + 1
    # A second new agent racing with token None gets the winner's state.
    other = _backend(tmp_path)
    data2, token2, ok2 = other.set_state(_b(_state(0, members=2)), None)
    assert not ok2 and token2 == token and _norm(data2) == _norm(data)


def _beating(tmp_path, node, interval=0.2):
    """A heartbeat writer for ``node`` (an agent that is alive), started."""
    w = heartbeat.HeartbeatWriter(open_job_dir(str(tmp_path / "rdzv"), "job1"), "job1", node, interval)
    w.start()
    return w


def test_closed_run_with_live_members_is_not_finished(tmp_path):
    member = _NodeDesc("10.0.0.1", 1000, 0)  # the one member of _state(members=1)
    w = _beating(tmp_path, member)
    be = _backend(tmp_path, liveness_s=1.0)
    be.set_state(_b(_state(2, closed=True, members=1)))
    rec = _backend(tmp_path).peek()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.5:  # longer than liveness_s: its counter keeps growing
        assert rec.state.closed and not be.is_finished(rec)
        time.sleep(0.1)
    new = _backend(tmp_path, liveness_s=1.0)
    data, _ = new.get_state()
    assert pickle.loads(data).closed  # torch's ClosedError semantics while it lives
    # Once its counter stops growing for liveness_s (on the observer's clock), the run is over.
    w.stop(remove=False)
    t_stop = time.monotonic()
    while not new.is_finished(new.peek()):  # an observer following it, as a waiting agent does
        assert time.monotonic() - t_stop < 30  # a bound on waiting, not a speed: 1 s is expected
        time.sleep(0.05)
    # Not before its last beat (at most one 0.2 s interval before the stop) is 1 s old.
    assert time.monotonic() - t_stop >= 1.0 - 0.2 - 0.05
    # An agent arriving now (the handler's _wait_for_previous_run) must watch
    # the counter stay frozen for liveness_s itself; then it sees no state.
    late = _backend(tmp_path, liveness_s=1.0)
    t_late = time.monotonic()
    while not late.is_finished(late.peek()):
        assert time.monotonic() - t_late < 30  # a bound on waiting, not a speed: 1 s is expected
        time.sleep(0.05)
    assert time.monotonic() - t_late >= 1.0 - 0.05
    assert late.get_state() is None


def test_store_address_files(tmp_path):
    be = _backend(tmp_path)
    board = storeaddr.StoreAddressBoard(be.store, "job1")
    node = _NodeDesc("127.0.0.1", 1, 0)
    for r in range(storeaddr.KEEP_STORE_FILES + 3):
        board.publish(codec.StoreAddress(1, r, node, "127.0.0.1", 1000 + r))
    board.publish(codec.StoreAddress(1, 6, node, "127.0.0.1", 1006))  # idempotent
    names = sorted(p.name for p in (tmp_path / "rdzv" / "job1").iterdir() if p.name.startswith("store-"))
    assert len(names) == storeaddr.KEEP_STORE_FILES and names[-1] == codec.store_name(1, 6)
    a = storeaddr.StoreAddressBoard(be.store, "job1").wait(1, 6, node, timeout=1)
    assert (a.addr, a.port) == ("127.0.0.1", 1006)
    with pytest.raises(RendezvousStateError):
        board.publish(codec.StoreAddress(1, 6, _NodeDesc("127.0.0.2", 1, 0), "127.0.0.2", 1))
    with pytest.raises(RendezvousStateError):
        board.wait(1, 6, _NodeDesc("127.0.0.2", 1, 0), timeout=1)
    from torch.distributed.elastic.rendezvous import RendezvousTimeoutError

    t0 = time.monotonic()
    with pytest.raises(RendezvousTimeoutError):
        board.wait(1, 7, node, timeout=0.5)
    assert time.monotonic() - t0 < 30  # it gave up (a hang never returns): no speed asserted under load


# --------------------------------------------------------------------------
# registration and configuration
# --------------------------------------------------------------------------


def _params(tmp_path, run_id="job1", min_nodes=1, max_nodes=1, endpoint=None, **conf):
    conf.setdefault("addr", "127.0.0.1")
    return RendezvousParameters(
        backend="fsmingle",
        endpoint=str(tmp_path / "rdzv") if endpoint is None else endpoint,
        run_id=run_id,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        **conf,
    )


def test_entry_point_registers_the_backend(tmp_path):
    from importlib.metadata import entry_points

    from torch.distributed.elastic.rendezvous import registry

    eps = [ep for ep in entry_points(group="torchrun.handlers") if ep.name == "fsmingle"]
    assert eps, "run `pip install -e .` to register the entry point"
    creator = eps[0].load()()
    h = creator(_params(tmp_path))
    assert h.get_backend() == "fsmingle" and h.get_run_id() == "job1"
    h2 = registry.get_rendezvous_handler(_params(tmp_path, run_id="job2"))
    assert isinstance(h2, handler.FsRendezvousHandler)


@pytest.mark.parametrize("first", ["fsmingle.torchrun.backend", "fsmingle.torchrun.handler", "torch.distributed.run"])
def test_backend_registers_whichever_module_is_imported_first(first):
    # torch's registry imports the entry point while torch's rendezvous package
    # is being imported; a half-initialised fsmingle module there would only be
    # logged by torch, and the backend would be missing.
    code = (
        f"import {first}\n"
        "from torch.distributed.elastic.rendezvous import api\n"
        "assert 'fsmingle' in api.rendezvous_handler_registry._registry\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and "Exception while registering" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize(
    "kw",
    [
        {"endpoint": "relative/dir"},
        {"endpoint": "10.0.0.1:29400"},
        {"endpoint": ""},
        {"run_id": "../escape"},
        {"join_timeout": "soon"},
        {"last_call_timeout": "0"},
        {"addr": "not an address"},
        {"addr": None, "iface": "no-such-iface0"},
    ],
)
def test_bad_configuration_is_a_config_error(tmp_path, kw):
    with pytest.raises(ConfigError):
        handler.create_rdzv_handler(_params(tmp_path, **kw))


# --------------------------------------------------------------------------
# two handlers in one process
# --------------------------------------------------------------------------


def _rendezvous_threads(tmp_path, n=2, min_nodes=None, **conf):
    handlers = [
        handler.create_rdzv_handler(_params(tmp_path, min_nodes=min_nodes or n, max_nodes=n, **conf)) for _ in range(n)
    ]
    infos: list = [None] * n
    errors: list = []

    def go(i):
        try:
            infos[i] = handlers[i].next_rendezvous()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    return handlers, infos


def test_in_process_rendezvous_store_and_rerun(tmp_path):
    epochs = []
    for run in range(2):
        handlers, infos = _rendezvous_threads(tmp_path, join_timeout=60)
        assert sorted(i.rank for i in infos) == [0, 1]
        assert all(i.world_size == 2 for i in infos)
        boot = {(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in infos}
        assert len(boot) == 1 and next(iter(boot))[0] == "127.0.0.1"
        # The round's store is shared: what rank 0 sets, rank 1 reads.
        by_rank = {i.rank: i for i in infos}
        by_rank[0].store.set("k", f"run{run}")
        assert by_rank[1].store.get("k") == f"run{run}".encode()
        epochs.append(handlers[0]._fs_backend.epoch)
        assert handlers[0].num_nodes_waiting() == 0 and not handlers[0].is_closed()
        assert all(h.shutdown() for h in handlers)
        assert handlers[0].is_closed()
    assert epochs[1] > epochs[0]  # the second run started a fresh lineage
    run_dir = tmp_path / "rdzv" / "job1"
    last = json.loads((run_dir / _state_files(run_dir)[-1]).read_bytes())
    assert last["state"]["closed"] and last["state"]["participants"] == []


def test_killed_run_is_continued_after_its_members_expire(tmp_path):
    """Agents SIGKILLed: nothing closed; new agents drop the dead (heartbeat rule) and go on."""
    dead = _state(5, members=2, hb_age_s=3600)
    dead.complete = True
    be = _backend(tmp_path)
    be.set_state(_b(dead))
    handlers, infos = _rendezvous_threads(tmp_path, join_timeout=60, **FAST_HB)
    assert sorted(i.rank for i in infos) == [0, 1]
    st = handlers[0]._state_holder.state
    assert st.round == 6 and handlers[0]._fs_backend.epoch == 1  # same lineage, next round
    assert all(h.shutdown() for h in handlers)


def test_shutdown_of_a_node_that_never_joined_does_not_close_the_run(tmp_path):
    be = _backend(tmp_path)
    be.set_state(_b(_state(0, members=1)))
    h = handler.create_rdzv_handler(_params(tmp_path, min_nodes=2, max_nodes=2))
    assert h.shutdown()
    data, _ = _backend(tmp_path).get_state()
    assert not pickle.loads(data).closed


def test_closed_run_with_live_member_makes_new_agent_wait(tmp_path):
    w = _beating(tmp_path, _NodeDesc("10.0.0.1", 1000, 0))
    be = _backend(tmp_path, liveness_s=15)
    be.set_state(_b(_state(1, closed=True, members=1, hb_age_s=0)))
    h = handler.create_rdzv_handler(_params(tmp_path, join_timeout=2))
    t0 = time.monotonic()
    with pytest.raises(RendezvousClosedError):
        h.next_rendezvous()
    # Waited its join timeout (2 s) for the live member, then gave up: the upper bound only says it
    # gave up (the member beats on, so a wrong wait never ends), not how fast under load.
    assert 1.5 < time.monotonic() - t0 < 60
    w.stop()


# --------------------------------------------------------------------------
# keep-alives in heartbeat files, not in the shared state
# --------------------------------------------------------------------------

FAST_HB = {"keep_alive_interval": 1, "keep_alive_max_attempt": 2}  # liveness 2 s


def _versions(tmp_path) -> list[str]:
    return _state_files(tmp_path / "rdzv" / "job1")


def test_live_agents_stay_alive_without_writing_the_state(tmp_path):
    handlers, _infos = _rendezvous_threads(tmp_path, join_timeout=60, **FAST_HB)
    before = _versions(tmp_path)
    observer = _backend(tmp_path, liveness_s=2.0, interval_s=1.0)  # a new agent: judges everyone
    nodes = [h._this_node for h in handlers]
    t0 = time.monotonic()
    while time.monotonic() - t0 < 7:  # 3.5 x liveness: torch's rule would need 7 keep-alive writes
        for h in handlers:
            assert h.num_nodes_waiting() == 0 and not h.is_closed()
        # The observer's verdict is as of its read: measure the age from before the read, not from
        # after it (under load 20-40 get_state alone took over a second), and allow what the writers
        # themselves were late (a beat delayed past its 1 s interval by the loaded machine is late
        # for torch too, and no verdict of the observer's).  An observer that ages a node on its
        # own -- the bug this guards against -- still reports it 2 s old and more with writers on time.
        t_read = datetime.now(timezone.utc)
        data, _ = observer.get_state()
        st = pickle.loads(data)
        assert set(st.participants) == set(nodes)
        late = max(0.0, max(h._beats.max_gap for h in handlers) - 1.0)  # max_gap only grows
        ages = {n: (t_read - st.last_heartbeats[n]).total_seconds() for n in nodes}
        assert all(age < 2.0 + late for age in ages.values()), (ages, late)
        time.sleep(0.3)
    assert _versions(tmp_path) == before  # the shared state was not written once
    assert all(h._beats.writes >= 5 for h in handlers)  # the heartbeat files were
    assert all(h.shutdown() for h in handlers)
    assert not list((tmp_path / "rdzv" / "job1" / "hb").glob("[0-9a-f]*.json"))  # each removed its own


@pytest.mark.parametrize("scanning", [True, False], ids=["scan", "no-scan"])
def test_a_new_observer_never_ages_a_beating_node_past_liveness(tmp_path, scanning):
    """A new agent's verdicts on nodes that beat every interval, on a fake clock, from every phase.

    With a scanner (the smallest node), the observer reads the scan: it must
    hold every member's counter, the scanner's own included.  Without one (it
    died before scanning), the observer reads each file itself once it looks
    nearly dead; a counter first read then must not count the time before it
    as time without growth, since the next beat may be a whole interval away.
    Either way a node beating every second is never reported 2 s (liveness)
    old: torch would drop it.
    """
    interval, liveness = 1.0, 2.0
    store = open_job_dir(str(tmp_path / "rdzv"), "job1")
    nodes = [_NodeDesc("10.0.0.1", 1000, 0), _NodeDesc("10.0.0.2", 1001, 0)]
    writers = [heartbeat.HeartbeatWriter(store, "job1", n, interval) for n in nodes]
    now = [0.0]
    scanner = heartbeat.LivenessView(store, "job1", interval, liveness, clock=lambda: now[0])
    scanner.me = nodes[0]
    scanner.set_members(nodes)
    worst = 0.0
    for phase in range(20):  # the observer's first look at 0.00, 0.05, ... 0.95 s after a beat
        observer = None
        for step in range(200):  # 10 s in 50 ms steps
            now[0] = 10.0 * phase + step * 0.05
            if step % 20 == 0:
                for w in writers:
                    assert w.beat()
            if scanning and step % 10 == 0:
                scanner.scan_if_due()
            if step >= phase and (step - phase) % 6 == 0 and step < phase + 120:  # polls every 0.3 s for 6 s
                observer = observer or heartbeat.LivenessView(store, "job1", interval, liveness, clock=lambda: now[0])
                observer.set_members(nodes)
                observer.observe(nodes)
                worst = max(worst, *(observer.age(n) for n in nodes))
    if scanning:
        _writer, _seq, counts = codec.decode_scan(store.read(codec.SCAN_NAME), "job1")
        assert set(counts) == set(nodes)
    assert worst < liveness, f"a node beating every {interval} s was reported {worst:.2f} s old"


def test_dead_agent_is_dropped_after_the_heartbeat_timeout(tmp_path):
    handlers, _ = _rendezvous_threads(tmp_path, min_nodes=1, join_timeout=60, last_call_timeout=1, **FAST_HB)
    alive, dead = handlers
    assert alive._state_holder.state.complete and len(alive._state_holder.state.participants) == 2
    dead._beats.stop(remove=False)  # SIGKILL-like: no leave, the file stays with a frozen counter
    t_dead = time.monotonic()
    # The survivor re-joins (as after a worker failure).  torch's own rule
    # (_sanitize) drops the dead node only once its counter has been frozen
    # for liveness_s (2 s) on the survivor's clock; then a round of 1 completes.
    info = alive.next_rendezvous()
    assert info.world_size == 1 and info.rank == 0
    # Its last beat was at most one interval (1 s) before t_dead.
    assert time.monotonic() - t_dead >= 2.0 - 1.0
    st = alive._state_holder.state
    assert dead._this_node not in st.participants and dead._this_node not in st.last_heartbeats
    assert alive.shutdown()


# --------------------------------------------------------------------------
# private torch names
# --------------------------------------------------------------------------


def test_docs_table_is_the_declared_conf_keys():
    from fsmingle.torchrun import conf

    assert conf.markdown_table() in (REPO / "docs" / "torchrun-backend.md").read_text(), (
        "regenerate the --rdzv-conf table in docs/torchrun-backend.md from fsmingle.torchrun.conf.markdown_table()"
    )


def test_torch_private_names_exist():
    assert _torch_private.missing() == [], "torch moved names fsmingle/torchrun/_torch_private.py lists"


def test_torch_private_check_names_a_moved_member(monkeypatch):
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    monkeypatch.delattr(dr.DynamicRendezvousHandler, "_get_deadline")
    monkeypatch.delattr(dr, "_RendezvousContext")
    gone = _torch_private.missing()
    assert any(g.startswith("DynamicRendezvousHandler._get_deadline ") for g in gone), gone
    assert any("dynamic_rendezvous._RendezvousContext " in g for g in gone), gone


# --------------------------------------------------------------------------
# real torchrun processes
# --------------------------------------------------------------------------

ELASTIC_WORKER = r"""
import datetime, gc, json, os, sys, time
import torch, torch.distributed as dist
out, target = sys.argv[1], int(sys.argv[2])
env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT",
                                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
ws = int(env["WORLD_SIZE"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
t = torch.ones(1)
dist.all_reduce(t)
env["allreduce"] = t.item()
env["pid"] = os.getpid()
p = os.path.join(out, "w-%d.json" % os.getpid())
with open(p + ".tmp", "w") as f:
    json.dump(env, f)
os.replace(p + ".tmp", p)
if ws < target:
    time.sleep(180)   # until the agent restarts us for the new membership
    sys.exit(1)
gc.collect()
dist.barrier()
dist.destroy_process_group()
"""

CRASH_ONCE = r"""
import os, runpy, sys, time
out = sys.argv[1]
with open(os.path.join(out, "start-%d.json" % os.getpid()), "w") as f:
    f.write('{"group_rank": %s, "restart_count": %s}' % (os.environ["GROUP_RANK"],
                                                         os.environ["TORCHELASTIC_RESTART_COUNT"]))
if os.environ["GROUP_RANK"] == "1":
    try:
        os.close(os.open(os.path.join(out, "crashed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        pass
    else:
        print("crash_once: crashing on purpose", flush=True)
        sys.exit(3)
sys.argv = [sys.argv[2]] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class Node:
    """One ``torchrun`` (one "node") under ``timeout -k``."""

    def __init__(
        self,
        tmp_path: Path,
        name: str,
        args: list[str],
        secs: int,
        endpoint: Path,
        run_id: str,
        nnodes: str,
        nproc: int = 1,
        conf: str = "",
        extra: list[str] | None = None,
    ):
        self.log = tmp_path / f"{name}.log"
        rdzv_conf = "addr=127.0.0.1,join_timeout=120" + ("," + conf if conf else "")
        cmd = [
            "timeout",
            "-k",
            str(KILL_AFTER_S),
            str(secs),
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--rdzv-backend",
            "fsmingle",
            "--rdzv-endpoint",
            str(endpoint),
            "--rdzv-id",
            run_id,
            "--nnodes",
            nnodes,
            "--nproc-per-node",
            str(nproc),
            "--rdzv-conf",
            rdzv_conf,
            "--monitor-interval",
            "0.5",
            *(extra or []),
            *args,
        ]
        self._f = open(self.log, "wb")  # closed in wait()
        self.proc = subprocess.Popen(
            cmd, stdout=self._f, stderr=subprocess.STDOUT, env=torch_env(tmp_path), cwd=str(tmp_path)
        )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._f.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _finish(nodes: list[Node], timeout: float) -> list[int]:
    rcs = [n.wait(timeout) for n in nodes]
    if any(rcs):
        tails = "\n".join(f"--- {n.log.name} rc={rc}\n{n.text()[-4000:]}" for n, rc in zip(nodes, rcs, strict=True))
        pytest.fail(f"torchrun exit codes {rcs}\n{tails}")
    return rcs


def _worker(tmp_path: Path, name: str, code: str) -> tuple[Path, Path]:
    """Write the worker script ``name``; returns (the output directory it writes into, the script)."""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / name
    script.write_text(code)
    return out, script


def _rank_records(out: Path) -> dict[int, dict]:
    return {json.loads(p.read_text())["rank"]: json.loads(p.read_text()) for p in out.glob("rank*.json")}


@pytest.mark.slow
def test_torchrun_two_fixed_nodes(tmp_path):
    out = tmp_path / "out"
    args = [str(TRAIN), "--steps", "3", "--out", str(out)]
    nodes = [Node(tmp_path, f"node{i}", args, 240, tmp_path / "rdzv", "fixed", "2", nproc=2) for i in range(2)]
    _finish(nodes, 260)
    recs = _rank_records(out)
    assert sorted(recs) == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["ranks_agree"] for r in recs.values())
    assert {r["MASTER_ADDR"] for r in recs.values()} == {"127.0.0.1"}
    assert len({r["MASTER_PORT"] for r in recs.values()}) == 1
    assert {r["node_rank"] for r in recs.values()} == {"0", "1"}


@pytest.mark.slow
def test_torchrun_agents_store_in_the_directory(tmp_path):
    """``--rdzv-conf store=folder``: the agents' c10d store is a FolderStore of the round in the run directory
    (issue 23); the workers still get MASTER_ADDR/MASTER_PORT and train."""
    out = tmp_path / "out"
    args = [str(TRAIN), "--steps", "2", "--out", str(out)]
    nodes = [
        Node(tmp_path, f"node{i}", args, 240, tmp_path / "rdzv", "fstore", "2", nproc=1, conf="store=folder")
        for i in range(2)
    ]
    _finish(nodes, 260)
    recs = _rank_records(out)
    assert sorted(recs) == [0, 1] and all(r["world_size"] == 2 and r["ranks_agree"] for r in recs.values())
    stores = list((tmp_path / "rdzv" / "fstore").glob("agentstore-*"))
    assert len(stores) == 1 and any(p.name.startswith("k-") for p in stores[0].iterdir())
    assert not list((tmp_path / "rdzv" / "fstore").glob("store-*.json"))  # no TCPStore address was published


def test_old_agent_stores_are_pruned(tmp_path):
    from fsmingle.fs.store import PosixStore
    from fsmingle.torchrun.handler import KEEP_AGENT_STORES, agent_store_name, prune_agent_stores

    st = PosixStore(str(tmp_path))
    names = [agent_store_name(3, r) for r in range(8)]
    for n in names:
        st.mkdir(n)
    prune_agent_stores(st, names[-1])
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert left == names[-KEEP_AGENT_STORES:]  # the current round's and the newest older ones


def test_store_conf_key_is_checked(tmp_path):
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from fsmingle.errors import ConfigError
    from fsmingle.torchrun import conf

    params = RendezvousParameters("fsmingle", str(tmp_path), "j", 1, 1, store="redis", addr="127.0.0.1")
    with pytest.raises(ConfigError, match="store='redis'"):
        conf.parse(params)
    params = RendezvousParameters("fsmingle", str(tmp_path), "j", 1, 1, store="folder", addr="127.0.0.1")
    assert conf.parse(params).store == "folder"


@pytest.mark.slow
def test_torchrun_elastic_third_node_joins_mid_run(tmp_path):
    out, script = _worker(tmp_path, "elastic_worker.py", ELASTIC_WORKER)
    kw = {"endpoint": tmp_path / "rdzv", "run_id": "elastic", "nnodes": "1:3", "conf": "last_call_timeout=1"}
    nodes = [Node(tmp_path, f"node{i}", [str(script), str(out), "3"], 280, **kw) for i in range(2)]
    # Wait until the first two nodes train (world size 1 or 2), then add a third.
    deadline = time.monotonic() + 150
    while not list(out.glob("w-*.json")):
        assert time.monotonic() < deadline, nodes[0].text()[-3000:]
        assert all(n.proc.poll() is None for n in nodes), nodes[0].text()[-3000:]
        time.sleep(0.5)
    nodes.append(Node(tmp_path, "node2", [str(script), str(out), "3"], 240, **kw))
    _finish(nodes, 300)
    recs = [json.loads(p.read_text()) for p in out.glob("w-*.json")]
    sizes = [int(r["WORLD_SIZE"]) for r in recs]
    final = [r for r in recs if r["WORLD_SIZE"] == "3"]
    assert len(final) == 3 and sorted(r["RANK"] for r in final) == ["0", "1", "2"]
    assert all(r["allreduce"] == 3.0 for r in final)
    assert min(sizes) < 3  # the first workers ran with fewer nodes, then were restarted
    assert len({r["MASTER_PORT"] for r in final}) == 1
    # Membership changes are not failures: the restart count stays 0.
    assert {r["TORCHELASTIC_RESTART_COUNT"] for r in recs} == {"0"}


@pytest.mark.slow
def test_torchrun_worker_crash_once_then_completes(tmp_path):
    out, script = _worker(tmp_path, "crash_once.py", CRASH_ONCE)
    args = [str(script), str(out), str(TRAIN), "--steps", "3", "--out", str(out)]
    nodes = [
        Node(tmp_path, f"node{i}", args, 280, tmp_path / "rdzv", "crash", "2", extra=["--max-restarts", "1"])
        for i in range(2)
    ]
    _finish(nodes, 300)
    assert (out / "crashed").exists()
    recs = _rank_records(out)
    assert sorted(recs) == [0, 1] and all(r["world_size"] == 2 and r["ranks_agree"] for r in recs.values())
    starts = [json.loads(p.read_text()) for p in out.glob("start-*.json")]
    assert any(s["restart_count"] == 1 for s in starts), starts  # the crashed node restarted its worker
    assert "crashing on purpose" in "".join(n.text() for n in nodes)


@pytest.mark.slow
def test_torchrun_rerun_same_id(tmp_path):
    """The same command, same endpoint and id, run again and again (torch's c10d FileStore fails the 2nd).

    ``FSMINGLE_RERUNS=100`` makes it the 100-in-a-row check (default 3).
    """
    runs = int(os.environ.get("FSMINGLE_RERUNS", "3"))
    endpoint = tmp_path / "rdzv"
    script = tmp_path / "worker.py"
    script.write_text(ELASTIC_WORKER)
    for k in range(runs):
        out = tmp_path / f"out{k}"
        out.mkdir()
        nodes = [
            Node(tmp_path, f"run{k}-node{i}", [str(script), str(out), "2"], 200, endpoint, "exp42", "2")
            for i in range(2)
        ]
        t0 = time.monotonic()
        _finish(nodes, 220)
        recs = [json.loads(p.read_text()) for p in out.glob("w-*.json")]
        assert sorted(r["RANK"] for r in recs) == ["0", "1"], k
        assert all(r["WORLD_SIZE"] == "2" and r["allreduce"] == 2.0 for r in recs), k
        print(f"run {k + 1}/{runs} ok in {time.monotonic() - t0:.1f} s", flush=True)
        for n in nodes:  # keep tmp_path small over many runs
            n.log.unlink()
    run_dir = endpoint / "exp42"
    files = _state_files(run_dir)
    assert len(files) <= backend.KEEP_VERSIONS + 1
    assert len([p for p in run_dir.iterdir() if p.name.startswith("store-")]) <= storeaddr.KEEP_STORE_FILES
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".tmp-")]
    last = json.loads((run_dir / files[-1]).read_bytes())
    assert last["state"]["closed"] and last["state"]["participants"] == []


def test_a_spare_agent_waits_in_the_redundancy_list_and_replaces_a_dead_member(tmp_path):
    """Issue 24: more live agents than --nnodes max never close the rendezvous or count as
    waiting (torch's redundancy_list); when a member dies, the spare is in the next round."""
    conf = dict(join_timeout=60, last_call_timeout=1, **FAST_HB)
    handlers, _ = _rendezvous_threads(tmp_path, **conf)
    alive, dead = handlers
    spare = handler.create_rdzv_handler(_params(tmp_path, min_nodes=2, max_nodes=2, **conf))
    got: dict = {}
    threading.Thread(target=lambda: got.update(spare=spare.next_rendezvous()), daemon=True).start()
    time.sleep(3)
    assert "spare" not in got
    st = pickle.loads(_backend(tmp_path).get_state()[0])
    assert spare._this_node in st.redundancy_list and not st.closed
    assert alive.num_nodes_waiting() == 0 and not alive.is_closed()  # no restart of the members' workers
    dead._beats.stop(remove=False)  # SIGKILL-like
    t_dead = time.monotonic()
    threading.Thread(target=lambda: got.update(alive=alive.next_rendezvous()), daemon=True).start()
    wait_until = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < wait_until:
        time.sleep(0.05)
    took = time.monotonic() - t_dead
    print(f"spare in the next round {took:.2f} s after the member's death (liveness 2 s)")
    assert sorted(i.rank for i in got.values()) == [0, 1] and all(i.world_size == 2 for i in got.values())
    assert alive.shutdown() and spare.shutdown()
