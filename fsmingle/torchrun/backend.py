"""The compare-and-set ``RendezvousBackend`` on versioned state files.

torch's ``DynamicRendezvousHandler`` keeps the rendezvous state through a
``RendezvousBackend`` (``get_state()`` / ``set_state(state, token)``,
``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``).  This one
keeps it as immutable JSON files ``<endpoint>/<run_id>/state-<N>.json``:
``set_state(s, N)`` creates ``state-<N+1>.json`` with ``link()`` (exclusive
on every NFS version, unlike ``O_EXCL`` before NFSv3; see
:meth:`fsmingle.fs.store.PosixStore.create`), so exactly one writer per version
wins, without ``flock`` and without a server.

Keep-alives are not in this state: every state torch reads has its
``last_heartbeats`` folded in from the heartbeat files
(:mod:`fsmingle.torchrun.heartbeat`), so the state is written only when
membership changes.
"""

from __future__ import annotations

import logging
import pickle
import random
import threading
import time
from typing import Any

from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

from ..errors import RecordError, StorageError
from ..fs.store import Store
from ._torch_private import NodeDesc, RendezvousState
from .codec import (
    STATE_RE,
    StateRecord,
    decode_state_record,
    encode_state_record,
    state_name,
    unpickle_state,
)
from .fold import fold_state
from .heartbeat import HeartbeatWriter, LivenessView
from .runstore import RunFiles

log = logging.getLogger("fsmingle.torchrun")

BACKEND_NAME = "fsmingle"
KEEP_VERSIONS = 16  # state files kept behind the newest one


def sleep_jitter(base: float) -> None:
    time.sleep(base * (0.5 + random.random()))


class FsRendezvousBackend(RunFiles, RendezvousBackend):
    """torch ``RendezvousBackend`` keeping the rendezvous state in a shared directory.

    The state is a sequence of immutable files ``state-<N>.json`` (JSON, mode
    0600, in an owner-only directory).  The fencing token is ``N``.
    ``set_state(s, N)`` creates ``state-<N+1>.json`` exclusively: exactly one
    caller holding token ``N`` wins, the others get the winner's state back.
    ``get_state()`` returns the highest visible version (a directory listing,
    then probing ``N+1, N+2, ...`` by name, which also defeats a stale
    directory cache).  Versions older than the newest :data:`KEEP_VERSIONS`
    are removed by their writers.

    Liveness comes from the heartbeat files, not from the state: every state
    returned to torch has ``last_heartbeats`` of each node it lists replaced by
    this observer's verdict (:meth:`fold`), so torch's keep-alive rule works
    unchanged and torch never needs to write the state to stay alive.

    A state that is ``closed`` and has no live member (participant, waiting or
    redundant node whose heartbeat counter grew within ``liveness_s`` on this
    observer's clock) belongs to a finished run.  Unless this backend instance already worked in that lineage
    (then it sees the closed state, as torch intends), it reports "no state",
    and the next ``set_state(s, None)`` starts a fresh lineage (epoch) at the
    next version number.

    Args:
        store (Store): the run directory (``<endpoint>/<run_id>``), see
            :func:`fsmingle.fs.jobdir.open_job_dir`.
        run_id (str): torch's run id, written into and checked in every file.
        liveness_s (float): seconds without a new heartbeat after which a
            member counts as dead (torch's ``keep_alive_interval *
            keep_alive_max_attempt``; default 15).
        interval_s (float | None): heartbeat interval (torch's
            ``keep_alive_interval``); default ``liveness_s / 3``.
        retry_s (float): how long a read retries a state file that vanished
            under it (pruned, or a stale listing) before giving up (default 10).
        corrupt_grace_s (float): how long an unparsable newest state file is
            re-read before it is declared corrupt (default 2).
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        liveness_s: float = 15.0,
        retry_s: float = 10.0,
        corrupt_grace_s: float = 2.0,
        interval_s: float | None = None,
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._view = LivenessView(store, run_id, interval_s or liveness_s / 3, liveness_s)
        self._writer: HeartbeatWriter | None = None
        self._cache: StateRecord | None = None  # state files are immutable: decode each version once
        self._steady: tuple[int, float, bytes] | None = None  # see _folded_bytes
        self._retry_s = retry_s
        self._corrupt_grace_s = corrupt_grace_s
        self._known: int | None = None  # highest version seen; listings never move us back
        self._epoch: int | None = None  # epoch of the state last handed to torch
        self._pinned: int | None = None  # first epoch handed to torch
        self._member_epoch: int | None = None  # last epoch whose state listed self._node
        self._node: NodeDesc | None = None
        self._lock = threading.Lock()  # heartbeat thread and main thread share us

    @property
    def name(self) -> str:
        """``"fsmingle"``."""
        return BACKEND_NAME

    @property
    def store(self) -> Store:
        """The run directory's :class:`~fsmingle.fs.store.Store`."""
        return self._store

    @property
    def epoch(self) -> int | None:
        """Epoch (lineage) of the state last returned to torch; None before any."""
        return self._epoch

    @property
    def pinned_epoch(self) -> int | None:
        """The first epoch this instance returned a state of; None before any."""
        return self._pinned

    @property
    def member_epoch(self) -> int | None:
        """The last epoch whose returned state listed this node (see :meth:`set_node`)."""
        return self._member_epoch

    @property
    def view(self) -> LivenessView:
        """This observer's :class:`~fsmingle.torchrun.heartbeat.LivenessView`."""
        return self._view

    @property
    def writer(self) -> HeartbeatWriter | None:
        """This node's heartbeat writer (see :meth:`set_node`); None before."""
        return self._writer

    def set_node(self, node: NodeDesc, writer: HeartbeatWriter | None = None) -> None:
        """Tell the backend which node it serves and which writer beats for it.

        The node is tracked for :attr:`member_epoch`; with a ``writer``, this
        node counts as alive in the states it returns for as long as the
        writer's beats reach the directory.
        """
        self._node = node
        self._writer = writer
        self._view.me = node

    # -- liveness -------------------------------------------------------------

    def _own_age(self) -> float:
        w = self._writer
        return 0.0 if w is None else w.age_as_seen(self._view.liveness, self._view.interval)

    def fold(self, st: RendezvousState) -> RendezvousState:
        """``st`` with this observer's heartbeat verdicts, see :func:`fsmingle.torchrun.fold.fold_state`."""
        return fold_state(st, self._node, self._view, self._own_age())

    def live_members(self, st: RendezvousState) -> list[NodeDesc]:
        """Members of ``st`` (participants, waiting, redundant) judged alive by their heartbeat counters."""
        members = set(st.participants) | st.wait_list | st.redundancy_list
        self._view.observe(members)
        return [n for n in sorted(members) if n == self._node or self._view.is_live(n)]

    def is_finished(self, rec: StateRecord) -> bool:
        """True if ``rec`` is closed and none of its members is alive: its run is over."""
        return rec.state.closed and not self.live_members(rec.state)

    def _hidden(self, rec: StateRecord) -> bool:
        return rec.epoch != self._pinned and self.is_finished(rec)

    def _note(self, rec: StateRecord) -> None:
        self._epoch = rec.epoch
        if self._pinned is None:
            self._pinned = rec.epoch
        n = self._node
        if n is not None and (
            n in rec.state.participants or n in rec.state.wait_list or n in rec.state.redundancy_list
        ):
            self._member_epoch = rec.epoch

    # -- reading ----------------------------------------------------------------

    def _listed_max(self) -> int | None:
        try:
            # A listing may lag by up to acdirmax (NFS attribute cache) and
            # miss the newest versions: peek() probes past it by name.
            names = self._store.listdir("")
        except OSError as e:
            raise RendezvousConnectionError(f"cannot list {self._where()}: {e}") from e
        versions = [int(m.group(1)) for m in map(STATE_RE.match, names) if m]
        return max(versions, default=None)

    def peek(self) -> StateRecord | None:
        """The newest state version, or None if there is none (no side effects on pinning).

        Raises:
            RendezvousStateError: the newest version stayed unparsable for
                ``corrupt_grace_s`` seconds, or listed files stayed unreadable
                (foreign-owned, symlinks) for ``retry_s`` seconds.
            RendezvousConnectionError: the directory cannot be listed or read.
        """
        deadline = time.monotonic() + self._retry_s
        corrupt_since: float | None = None
        while True:
            listed = v = self._listed_max()
            if self._known is not None and (v is None or v < self._known):
                v = self._known
            if v is None:
                return None
            cached = self._cache is not None and self._cache.version == v == listed
            # Versions are immutable: a listed version we decoded before is
            # not read again (only probed past, below).
            data = b"" if cached else self._read(state_name(v))
            if data is None:
                # Pruned under us, or a stale listing, or untrusted: look again.
                if v == self._known:
                    self._known = None  # our memory may be what is stale
                if time.monotonic() > deadline:
                    raise RendezvousStateError(
                        f"{self._where(state_name(v))} is listed but cannot be read (see earlier warnings); "
                        f"remove {self._where()} if no job with this id is running"
                    )
                sleep_jitter(0.05)
                continue
            # Probe forward: listings may lag; names that exist can be opened.
            while True:
                nxt = self._read(state_name(v + 1))
                if nxt is None:
                    break
                v, data, cached = v + 1, nxt, False
            if cached:
                return self._cache
            try:
                rec = decode_state_record(data, self._run_id, v)
            except RecordError as e:
                now = time.monotonic()
                corrupt_since = corrupt_since if corrupt_since is not None else now
                if now - corrupt_since > self._corrupt_grace_s:
                    raise RendezvousStateError(
                        f"the rendezvous state {self._where(state_name(v))} is corrupt: {e}; "
                        f"remove {self._where()} if no job with this id is running"
                    ) from None
                sleep_jitter(0.1)
                continue
            self._known = v
            self._cache = rec
            return rec

    def get_state(self) -> tuple[bytes, int] | None:
        """See :meth:`RendezvousBackend.get_state`.

        Returns:
            tuple[bytes, int] | None: torch's pickled state and its version, or
            None if there is no state or only a finished run's state.

        Raises:
            RendezvousStateError, RendezvousConnectionError: as for :meth:`peek`.
        """
        with self._lock:
            rec = self.peek()
            if rec is None or self._hidden(rec):
                return None
            self._note(rec)
            return self._folded_bytes(rec), rec.version

    def _folded_bytes(self, rec: StateRecord) -> bytes:
        # A participant of a completed round with nobody waiting judges
        # nobody: its folded state says "everyone alive now".  Re-serving the
        # same bytes for a quarter interval keeps torchrun's 1/s polls cheap
        # (a 1,024-node state takes ~10 ms to copy and pickle); the times in
        # it are then at most interval/4 old, far from keep_alive_interval.
        st, me, now = rec.state, self._node, time.monotonic()
        steady = (
            me is not None and st.complete and me in st.participants and not st.wait_list and not st.redundancy_list
        )
        c = self._steady
        fresh = c is not None and c[0] == rec.version and now - c[1] < self._view.interval / 4
        if steady and fresh and self._own_age() == 0.0:
            return c[2]  # type: ignore[index]
        data = pickle.dumps(self.fold(st))
        self._steady = (rec.version, now, data) if steady else None
        return data

    # -- writing ----------------------------------------------------------------

    def set_state(self, state: bytes, token: Any = None) -> tuple[bytes, int, bool] | None:
        """See :meth:`RendezvousBackend.set_state`: compare-and-set on the version number.

        Args:
            state (bytes): torch's pickled ``RendezvousState``.
            token (int | None): the version the caller's state derives from;
                None to create the first state (of a fresh lineage).

        Returns:
            tuple[bytes, int, bool] | None: ``(state, new_version, True)`` if
            written; ``(current_state, current_version, False)`` if ``token``
            is not the current version (or is None while a state exists, or
            is not a version at all); None if ``token`` is given but there is
            no current state.

        Raises:
            RendezvousStateError: ``state`` is not a valid pickled state, or
                the current state is corrupt (see :meth:`peek`).
            RendezvousConnectionError: the directory cannot be written (read-only,
                full, removed, permissions) or read.
        """
        new_state = unpickle_state(state)
        with self._lock:
            cur = self.peek()
            visible = cur if cur is not None and not self._hidden(cur) else None
            valid_token = isinstance(token, int) and not isinstance(token, bool)
            if cur is not None and valid_token and token == cur.version:
                version, epoch = cur.version + 1, cur.epoch
            elif visible is not None:
                self._note(visible)
                return pickle.dumps(self.fold(visible.state)), visible.version, False
            elif token is None:
                version = 1 if cur is None else cur.version + 1
                epoch = version  # a fresh lineage
            else:
                return None
            data = encode_state_record(self._run_id, version, epoch, new_state)
            # Pruning frees old names: a writer that stalled between peek()
            # and create() while KEEP_VERSIONS newer versions were written
            # would re-create a pruned version and "win" a write nobody reads
            # (seen under load).  So its base must exist just before, and a
            # version KEEP_VERSIONS above it must not exist just after.
            won = (version == 1 or self._read(state_name(version - 1)) is not None) and self._create(version, data)
            if won and self._recreated(version):
                self._store.remove(state_name(version))  # it was due for pruning anyway
                won = False
            if won:
                rec = StateRecord(version, epoch, new_state)
                self._known = version
                self._cache = rec
                self._note(rec)
                self._prune(version)
                return state, version, True
            # Lost the race: the winner's file exists; read it (it may take a
            # moment to become visible through caches).
            self._known = max(self._known or 0, version)
            deadline = time.monotonic() + self._retry_s
            while True:
                cur = self.peek()
                if cur is not None and cur.version >= version:
                    break
                if time.monotonic() > deadline:
                    raise RendezvousConnectionError(f"{self._where(state_name(version))} exists but stays unreadable")
                sleep_jitter(0.05)
            if self._hidden(cur):
                return None
            self._note(cur)
            return pickle.dumps(self.fold(cur.state)), cur.version, False

    def _create(self, version: int, data: bytes) -> bool:
        try:
            # link() of a complete, fsynced temporary onto the name: atomic
            # and exclusive on NFS (every version), Lustre and GPFS; a link
            # count of 2 proves success when a retransmitted NFS link()
            # reports EEXIST (PosixStore.create).  One writer per version.
            return self._store.create(state_name(version), data)
        except (OSError, StorageError) as e:
            raise RendezvousConnectionError(f"cannot write the rendezvous state in {self._where()}: {e}") from e

    def _recreated(self, version: int) -> bool:
        # Version N is pruned by the writer of N + KEEP_VERSIONS, so if that
        # one exists, N had been pruned (or is about to be): a name we just
        # created then is a re-creation.  By name first (listings may lag on
        # NFS), then the listing (that version may be pruned in turn).
        above = version + KEEP_VERSIONS
        return self._read(state_name(above)) is not None or (self._listed_max() or 0) >= above

    def _prune(self, version: int) -> None:
        # The writer of N removes N-KEEP; every KEEP-th writer sweeps leftovers
        # (writers that died between create and prune).  Readers that lose a
        # file to pruning re-list and find a newer one.
        old = version - KEEP_VERSIONS
        if old >= 1:
            # unlink() of a version 16 behind: a reader that still opens it
            # gets ENOENT/ESTALE (or reads it through an open .nfsXXXX
            # silly-rename) and simply lists again.
            self._store.remove(state_name(old))
        if version % KEEP_VERSIONS == 0:
            try:
                names = self._store.listdir("")
            except OSError:
                return
            for n in names:
                m = STATE_RE.match(n)
                if m and int(m.group(1)) < old:
                    self._store.remove(n)
