"""``torchrun --rdzv-backend fsmingle``: torch elastic rendezvous through a shared directory.

Usage, the same command on every node (nothing else running anywhere)::

    torchrun --rdzv-backend fsmingle --rdzv-endpoint /shared/rdzv --rdzv-id exp42 \\
        --nnodes 2:4 --nproc-per-node 2 train.py

``--rdzv-endpoint`` is an absolute path to a directory on a filesystem all nodes
share (NFS, Lustre, GPFS, ...).  torchrun finds this backend through the entry
point ``fsmingle = "fsmingle.torchrun_backend:handler"`` of the group
``torchrun.handlers`` (torch >= 2.6).

Design (details and the reasons in ``docs/torchrun-backend.md``):

* The rendezvous *policy* is torch's own :class:`DynamicRendezvousHandler`
  (elastic ``min:max``, ``last_call_timeout``, ``join_timeout``, heartbeats,
  re-rendezvous when a worker fails or a node joins), with
  :class:`FsRendezvousBackend` as its state backend.
* :class:`FsRendezvousBackend` keeps torch's rendezvous state as versioned JSON
  files ``<endpoint>/<run_id>/state-<N>.json``.  ``set_state(state, token=N)``
  exclusively creates ``state-<N+1>.json`` (``link()``-based, see
  :meth:`fsmingle.store.PosixStore.create`), so exactly one writer per version
  wins: a compare-and-set without ``flock`` and without a server.  Nothing on
  disk is pickled; the pickled state torch hands over is decoded with an
  unpickler that only admits torch's state classes, and rebuilt from validated
  JSON when read.  Old versions are pruned.
* After a round completes, the round's rank-0 agent hosts a TCPStore (the c10d
  store the agents need, also shared with the workers as ``MASTER_ADDR`` /
  ``MASTER_PORT``) and publishes its address in ``store-<E>-<R>.json``; the
  other agents read it and connect.
* Runs of the same id follow each other: an agent leaving at the end of a run
  removes itself from the state.  A state that is closed and has no live member
  belongs to a finished run, and the next agent to arrive starts a fresh
  lineage (a new *epoch*) instead of failing with ``RendezvousClosedError``
  like torch's c10d ``FileStore`` backend does.

``--rdzv-conf`` keys (all optional; times in whole seconds):

======================  =======  ===============================================
key                     default  meaning
======================  =======  ===============================================
join_timeout            600      the rendezvous must complete within this time
last_call_timeout       30       extra wait for more nodes once ``min`` joined
close_timeout           30       time to mark the run closed at shutdown
heartbeat_timeout       5        time one keep-alive write may take
keep_alive_interval     5        seconds between keep-alive heartbeats
keep_alive_max_attempt  3        missed heartbeats after which a node is dead
read_timeout            60       wait for the round's store address, and the
                                 timeout of TCPStore operations
iface                   --       network interface whose IPv4 address this
                                 node announces (NCCL-style prefix match)
addr                    --       IP address this node announces
======================  =======  ===============================================

The announced address is, first found: ``addr``, torchrun's ``--local-addr``,
the address of ``iface`` / ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME``,
the default-route interface (see :func:`fsmingle.netaddr.choose_address`).
Never the host's FQDN, which pods and compute nodes often cannot resolve.
"""

from __future__ import annotations


# The entry point comes first, before torch is imported: importing
# torch.distributed.elastic.rendezvous loads every ``torchrun.handlers`` entry
# point, so if this module is what first imports torch, torch's registry finds
# this module half-initialised.  ``handler`` and ``_create`` exist by then, and
# ``_create`` looks ``create_rdzv_handler`` up only when torchrun calls it.
def handler():
    """Entry point of group ``torchrun.handlers``: returns the handler creator.

    torch's registry calls ``handler()`` once and registers the result under
    the entry point's name, ``fsmingle``.

    Returns:
        Callable[[RendezvousParameters], RendezvousHandler]: calls
        :func:`create_rdzv_handler`.
    """
    return _create


def _create(params):
    return create_rdzv_handler(params)


import io
import ipaddress
import json
import logging
import os
import pickle
import random
import re
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psutil
import torch.distributed as dist
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousTimeout,
    _Action,
    _NodeDesc,
    _RendezvousContext,
    _RendezvousState,
)

from .config import validate_job_id
from .errors import ConfigError, RecordError, StorageError
from .netaddr import choose_address
from .records import load_object, validate_port
from .store import Store, open_job_dir

__all__ = [
    "BACKEND_NAME",
    "FsRendezvousBackend",
    "FsRendezvousHandler",
    "create_rdzv_handler",
    "handler",
]

log = logging.getLogger("fsmingle.torchrun")

BACKEND_NAME = "fsmingle"
SCHEMA_VERSION = 1
STATE_KIND = "torch-rdzv-state"
STORE_KIND = "torch-rdzv-store"

KEEP_VERSIONS = 16  # state files kept behind the newest one
KEEP_STORE_FILES = 4  # store-address files kept (newest rounds)

_STATE_RE = re.compile(r"^state-(\d{12})\.json$")
_STORE_RE = re.compile(r"^store-(\d{12})-(\d{12})\.json$")
_ADDR_RE = re.compile(r"^[A-Za-z0-9._:%\[\]-]{1,255}$")
_MAX_NODES = 1 << 17
_EPOCH0 = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)

KNOWN_CONF_KEYS = frozenset(
    {
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "heartbeat_timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
        "read_timeout",
        "iface",
        "addr",
        "timeout",  # added by torchrun's LaunchConfig for etcd; not used here
    }
)


def state_name(version: int) -> str:
    """File name of state version ``version`` inside the run directory."""
    return f"state-{version:012d}.json"


def store_name(epoch: int, round_: int) -> str:
    """File name of the store address of round ``round_`` of lineage ``epoch``."""
    return f"store-{epoch:012d}-{round_:012d}.json"


# --------------------------------------------------------------------------
# torch's _RendezvousState <-> JSON
# --------------------------------------------------------------------------

_DR_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_ALLOWED_GLOBALS = {
    (_DR_MODULE, "_RendezvousState"),
    (_DR_MODULE, "_NodeDesc"),
    ("datetime", "datetime"),
    ("datetime", "timezone"),
    ("datetime", "timedelta"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
}


class _StateUnpickler(pickle.Unpickler):
    # Only torch's own state classes: even bytes handed to us in-process never
    # get to name an arbitrary callable.
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not part of a rendezvous state")


def unpickle_state(data: bytes) -> _RendezvousState:
    """Decode the pickled state torch's state holder passes to ``set_state``.

    Raises:
        RendezvousStateError: ``data`` is not a pickled ``_RendezvousState``
            made of torch's classes only, or its fields have the wrong types.
    """
    try:
        obj = _StateUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # pickle raises many types on garbage
        raise RendezvousStateError(f"the rendezvous state to store is not a pickled _RendezvousState ({e})") from None
    if not isinstance(obj, _RendezvousState):
        raise RendezvousStateError(f"the rendezvous state to store is a {type(obj).__name__}, not a _RendezvousState")
    try:
        # Round-trip through the validator: what we write is what we accept.
        return state_from_json(state_to_json(obj))
    except (RecordError, AttributeError, TypeError, ValueError) as e:
        raise RendezvousStateError(f"the rendezvous state to store is invalid: {e}") from None


def _dt_to_us(dt: datetime | None) -> int | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return (dt - _EPOCH0) // _US


def _us_to_dt(us: Any, what: str) -> datetime | None:
    if us is None:
        return None
    if isinstance(us, bool) or not isinstance(us, int):
        raise RecordError(f"{what} is not an integer number of microseconds")
    try:
        return _EPOCH0 + us * _US
    except OverflowError:
        raise RecordError(f"{what} is out of range") from None


def _node_json(n: _NodeDesc) -> list:
    return [n.addr, n.pid, n.local_id]


def _node(v: Any, what: str) -> _NodeDesc:
    if not isinstance(v, list) or len(v) != 3:
        raise RecordError(f"{what} is not [addr, pid, local_id]")
    addr, pid, local_id = v
    if not isinstance(addr, str) or not _ADDR_RE.match(addr):
        raise RecordError(f"{what}: address {addr!r} is not a host name or IP address")
    for x, name in ((pid, "pid"), (local_id, "local_id")):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < (1 << 63):
            raise RecordError(f"{what}: {name} {x!r} is not a non-negative integer")
    return _NodeDesc(addr, pid, local_id)


def state_to_json(st: _RendezvousState) -> dict:
    """The JSON form (a dict) of torch's ``_RendezvousState``; datetimes as UTC microseconds."""
    return {
        "round": int(st.round),
        "complete": bool(st.complete),
        "deadline": _dt_to_us(st.deadline),
        "closed": bool(st.closed),
        "participants": [_node_json(n) + [int(r)] for n, r in sorted(st.participants.items())],
        "wait_list": [_node_json(n) for n in sorted(st.wait_list)],
        "redundancy_list": [_node_json(n) for n in sorted(st.redundancy_list)],
        "last_heartbeats": [_node_json(n) + [_dt_to_us(t)] for n, t in sorted(st.last_heartbeats.items())],
    }


def state_from_json(d: Any) -> _RendezvousState:
    """Rebuild torch's ``_RendezvousState`` from :func:`state_to_json` output, validating every field.

    Raises:
        RecordError: a field is missing, of the wrong type or out of range.
    """
    if not isinstance(d, dict):
        raise RecordError("state is not a JSON object")
    st = _RendezvousState()
    rnd = d.get("round")
    if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 0:
        raise RecordError(f"round {rnd!r} is not a non-negative integer")
    st.round = rnd
    for key in ("complete", "closed"):
        if not isinstance(d.get(key), bool):
            raise RecordError(f"{key} is not a boolean")
    st.complete, st.closed = d["complete"], d["closed"]
    st.deadline = _us_to_dt(d.get("deadline"), "deadline")
    lists = {}
    for key in ("participants", "wait_list", "redundancy_list", "last_heartbeats"):
        v = d.get(key)
        if not isinstance(v, list) or len(v) > _MAX_NODES:
            raise RecordError(f"{key} is not a list of at most {_MAX_NODES} entries")
        lists[key] = v
    for e in lists["participants"]:
        if not isinstance(e, list) or len(e) != 4:
            raise RecordError("participant is not [addr, pid, local_id, rank]")
        n, r = _node(e[:3], "participant"), e[3]
        # Ranks are 0..n-1 when a round completes; members that leave later
        # keep the others' ranks, so only the range of a node count is checked.
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < _MAX_NODES:
            raise RecordError(f"participant {n}: rank {r!r} is out of range")
        if n in st.participants:
            raise RecordError(f"participant {n} is listed twice")
        st.participants[n] = r
    st.wait_list = {_node(e, "wait_list entry") for e in lists["wait_list"]}
    st.redundancy_list = {_node(e, "redundancy_list entry") for e in lists["redundancy_list"]}
    for e in lists["last_heartbeats"]:
        if not isinstance(e, list) or len(e) != 4:
            raise RecordError("heartbeat is not [addr, pid, local_id, time]")
        n = _node(e[:3], "heartbeat")
        t = _us_to_dt(e[3], f"heartbeat of {n}")
        if t is None:
            raise RecordError(f"heartbeat of {n} has no time")
        st.last_heartbeats[n] = t
    return st


@dataclass(frozen=True)
class StateRecord:
    """One decoded ``state-<N>.json``.

    Attributes:
        version (int): N, the fencing token torch sees.
        epoch (int): version at which this lineage (one run of the id) began.
        state (_RendezvousState): torch's state.
    """

    version: int
    epoch: int
    state: _RendezvousState


def encode_state_record(run_id: str, version: int, epoch: int, st: _RendezvousState) -> bytes:
    """Serialise one state version to UTF-8 JSON bytes."""
    d = {
        "schema": SCHEMA_VERSION,
        "kind": STATE_KIND,
        "run_id": run_id,
        "version": version,
        "epoch": epoch,
        "writer": f"{socket.gethostname()[:64]}:{os.getpid()}",
        "wall_time": time.time(),
        "state": state_to_json(st),
    }
    return (json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _load_json(data: bytes, kind: str, run_id: str) -> dict:
    d = load_object(data, kind)
    if d.get("run_id") != run_id:
        raise RecordError(f"run_id is {d.get('run_id')!r}, expected {run_id!r}")
    return d


def decode_state_record(data: bytes, run_id: str, version: int) -> StateRecord:
    """Parse and validate one ``state-<version>.json``.

    Raises:
        RecordError: invalid JSON, unknown schema or kind, another run id or
            version than its name says, or any invalid state field.
    """
    d = _load_json(data, STATE_KIND, run_id)
    if d.get("version") != version:
        raise RecordError(f"version field {d.get('version')!r} does not match the file name ({version})")
    epoch = d.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 1 <= epoch <= version:
        raise RecordError(f"epoch {epoch!r} is not in 1..{version}")
    return StateRecord(version=version, epoch=epoch, state=state_from_json(d.get("state")))


@dataclass(frozen=True)
class StoreAddress:
    """Where the round's rank-0 agent hosts the TCPStore (``store-<E>-<R>.json``)."""

    epoch: int
    round: int
    node: _NodeDesc
    addr: str
    port: int


def encode_store_address(run_id: str, a: StoreAddress) -> bytes:
    d = {
        "schema": SCHEMA_VERSION,
        "kind": STORE_KIND,
        "run_id": run_id,
        "epoch": a.epoch,
        "round": a.round,
        "node": _node_json(a.node),
        "addr": a.addr,
        "port": a.port,
        "wall_time": time.time(),
    }
    return (json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n").encode()


def decode_store_address(data: bytes, run_id: str, epoch: int, round_: int) -> StoreAddress:
    """Parse and validate one ``store-<E>-<R>.json``.

    Raises:
        RecordError: invalid JSON or schema, other run id/epoch/round, bad
            address or port.
    """
    d = _load_json(data, STORE_KIND, run_id)
    if d.get("epoch") != epoch or d.get("round") != round_:
        raise RecordError(f"epoch/round {d.get('epoch')!r}/{d.get('round')!r} do not match {epoch}/{round_}")
    addr = d.get("addr")
    if not isinstance(addr, str) or not _ADDR_RE.match(addr):
        raise RecordError(f"store address {addr!r} is not a host name or IP address")
    return StoreAddress(epoch, round_, _node(d.get("node"), "store node"), addr, validate_port(d.get("port")))


# --------------------------------------------------------------------------
# The backend: compare-and-set on versioned files
# --------------------------------------------------------------------------


def _sleep_jitter(base: float) -> None:
    time.sleep(base * (0.5 + random.random()))


class FsRendezvousBackend(RendezvousBackend):
    """torch ``RendezvousBackend`` keeping the rendezvous state in a shared directory.

    The state is a sequence of immutable files ``state-<N>.json`` (JSON, mode
    0600, in an owner-only directory).  The fencing token is ``N``.
    ``set_state(s, N)`` creates ``state-<N+1>.json`` exclusively: exactly one
    caller holding token ``N`` wins, the others get the winner's state back.
    ``get_state()`` returns the highest visible version (a directory listing,
    then probing ``N+1, N+2, ...`` by name, which also defeats a stale
    directory cache).  Versions older than the newest :data:`KEEP_VERSIONS`
    are removed by their writers.

    A state that is ``closed`` and has no live member (participant, waiting or
    redundant node with a heartbeat younger than ``liveness_s``) belongs to a
    finished run.  Unless this backend instance already worked in that lineage
    (then it sees the closed state, as torch intends), it reports "no state",
    and the next ``set_state(s, None)`` starts a fresh lineage (epoch) at the
    next version number.

    Args:
        store (Store): the run directory (``<endpoint>/<run_id>``), see
            :func:`fsmingle.store.open_job_dir`.
        run_id (str): torch's run id, written into and checked in every file.
        liveness_s (float): seconds after its last heartbeat that a member
            counts as dead (torch's ``keep_alive_interval *
            keep_alive_max_attempt``; default 15).
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
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._liveness = timedelta(seconds=liveness_s)
        self._retry_s = retry_s
        self._corrupt_grace_s = corrupt_grace_s
        self._known: int | None = None  # highest version seen; listings never move us back
        self._epoch: int | None = None  # epoch of the state last handed to torch
        self._pinned: int | None = None  # first epoch handed to torch
        self._member_epoch: int | None = None  # last epoch whose state listed self._node
        self._node: _NodeDesc | None = None
        self._lock = threading.Lock()  # heartbeat thread and main thread share us

    @property
    def name(self) -> str:
        """``"fsmingle"``."""
        return BACKEND_NAME

    @property
    def store(self) -> Store:
        """The run directory's :class:`~fsmingle.store.Store`."""
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

    def set_node(self, node: _NodeDesc) -> None:
        """Tell the backend which node it serves, to track :attr:`member_epoch`."""
        self._node = node

    # -- liveness of a lineage ------------------------------------------------

    def live_members(self, st: _RendezvousState, now: datetime | None = None) -> list[_NodeDesc]:
        """Members of ``st`` whose last heartbeat is younger than ``liveness_s``."""
        now = now or datetime.now(timezone.utc)
        members = set(st.participants) | st.wait_list | st.redundancy_list
        out = []
        for n in sorted(members):
            hb = st.last_heartbeats.get(n)
            if hb is not None and hb >= now - self._liveness:
                out.append(n)
        return out

    def is_finished(self, rec: StateRecord) -> bool:
        """True if ``rec`` is closed and none of its members is alive: its run is over."""
        return rec.state.closed and not self.live_members(rec.state)

    def _hidden(self, rec: StateRecord) -> bool:
        return self.is_finished(rec) and rec.epoch != self._pinned

    def _note(self, rec: StateRecord) -> None:
        self._epoch = rec.epoch
        if self._pinned is None:
            self._pinned = rec.epoch
        n = self._node
        if n is not None and (n in rec.state.participants or n in rec.state.wait_list or n in rec.state.redundancy_list):
            self._member_epoch = rec.epoch

    # -- reading ----------------------------------------------------------------

    def _listed_max(self) -> int | None:
        try:
            names = self._store.listdir("")
        except OSError as e:
            raise RendezvousConnectionError(f"cannot list {self._where()}: {e}") from e
        versions = [int(m.group(1)) for m in map(_STATE_RE.match, names) if m]
        return max(versions, default=None)

    def _read(self, name: str) -> bytes | None:
        try:
            return self._store.read(name)
        except OSError as e:
            raise RendezvousConnectionError(f"cannot read {self._where(name)}: {e}") from e

    def _where(self, name: str = "") -> str:
        p = getattr(self._store, "path", None)
        return p(name) if callable(p) else f"{self._run_id}/{name}"

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
            v = self._listed_max()
            if self._known is not None and (v is None or v < self._known):
                v = self._known
            if v is None:
                return None
            data = self._read(state_name(v))
            if data is None:
                # Pruned under us, or a stale listing, or untrusted: look again.
                if v == self._known:
                    self._known = None  # our memory may be what is stale
                if time.monotonic() > deadline:
                    raise RendezvousStateError(
                        f"{self._where(state_name(v))} is listed but cannot be read (see earlier warnings); "
                        f"remove {self._where()} if no job with this id is running"
                    )
                _sleep_jitter(0.05)
                continue
            # Probe forward: listings may lag; names that exist can be opened.
            while True:
                nxt = self._read(state_name(v + 1))
                if nxt is None:
                    break
                v, data = v + 1, nxt
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
                _sleep_jitter(0.1)
                continue
            self._known = v
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
            return pickle.dumps(rec.state), rec.version

    # -- writing ----------------------------------------------------------------

    def set_state(self, state: bytes, token: Any = None) -> tuple[bytes, int, bool] | None:
        """See :meth:`RendezvousBackend.set_state`: compare-and-set on the version number.

        Args:
            state (bytes): torch's pickled ``_RendezvousState``.
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
                return pickle.dumps(visible.state), visible.version, False
            elif token is None:
                version = 1 if cur is None else cur.version + 1
                epoch = version  # a fresh lineage
            else:
                return None
            data = encode_state_record(self._run_id, version, epoch, new_state)
            try:
                won = self._store.create(state_name(version), data)
            except (OSError, StorageError) as e:
                raise RendezvousConnectionError(f"cannot write the rendezvous state in {self._where()}: {e}") from e
            if won:
                rec = StateRecord(version, epoch, new_state)
                self._known = version
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
                    raise RendezvousConnectionError(
                        f"{self._where(state_name(version))} exists but stays unreadable"
                    )
                _sleep_jitter(0.05)
            if self._hidden(cur):
                return None
            self._note(cur)
            return pickle.dumps(cur.state), cur.version, False

    def _prune(self, version: int) -> None:
        # The writer of N removes N-KEEP; every KEEP-th writer sweeps leftovers
        # (writers that died between create and prune).  Readers that lose a
        # file to pruning re-list and find a newer one.
        old = version - KEEP_VERSIONS
        if old >= 1:
            self._store.remove(state_name(old))
        if version % KEEP_VERSIONS == 0:
            try:
                names = self._store.listdir("")
            except OSError:
                return
            for n in names:
                m = _STATE_RE.match(n)
                if m and int(m.group(1)) < old:
                    self._store.remove(n)

    # -- store address files --------------------------------------------------

    def publish_store_address(self, a: StoreAddress) -> None:
        """Create ``store-<E>-<R>.json`` (once) and prune old ones.

        Raises:
            RendezvousStateError: the file exists and names another node or address.
            RendezvousConnectionError: the directory cannot be written.
        """
        name = store_name(a.epoch, a.round)
        try:
            created = self._store.create(name, encode_store_address(self._run_id, a))
        except (OSError, StorageError) as e:
            raise RendezvousConnectionError(f"cannot write {self._where(name)}: {e}") from e
        if not created:
            data = self._read(name)
            try:
                other = decode_store_address(data or b"", self._run_id, a.epoch, a.round)
            except RecordError as e:
                raise RendezvousStateError(f"{self._where(name)} exists and is invalid: {e}") from None
            if other != a:
                raise RendezvousStateError(
                    f"{self._where(name)} already names {other.node} at {other.addr}:{other.port}, not this node"
                )
            return
        try:
            names = self._store.listdir("")
        except OSError:
            return
        keys = sorted((int(m.group(1)), int(m.group(2)), n) for n in names if (m := _STORE_RE.match(n)))
        for _, _, n in keys[:-KEEP_STORE_FILES]:
            self._store.remove(n)

    def wait_store_address(self, epoch: int, round_: int, node: _NodeDesc, timeout: float) -> StoreAddress:
        """Wait until the rank-0 agent ``node`` has published round ``round_``'s store address.

        Args:
            epoch (int), round_ (int): the lineage and round.
            node (_NodeDesc): the round's rank-0 node.
            timeout (float): seconds to wait.

        Raises:
            RendezvousTimeoutError: nothing valid appeared within ``timeout`` seconds.
            RendezvousStateError: the file names another node than ``node``.
            RendezvousConnectionError: the directory cannot be read.
        """
        name = store_name(epoch, round_)
        deadline = time.monotonic() + timeout
        delay = 0.02
        last_err = "not published yet"
        while True:
            data = self._read(name)
            if data is not None:
                try:
                    a = decode_store_address(data, self._run_id, epoch, round_)
                except RecordError as e:
                    last_err = str(e)
                else:
                    if a.node != node:
                        raise RendezvousStateError(
                            f"{self._where(name)} names {a.node}, but rank 0 of round {round_} is {node}"
                        )
                    return a
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"rank 0 ({node}) did not publish the store address {self._where(name)} within "
                    f"{timeout:g} s ({last_err}); raise --rdzv-conf read_timeout if it is slow to start"
                )
            _sleep_jitter(delay)
            delay = min(delay * 2, 0.5)


# --------------------------------------------------------------------------
# The handler: torch's policy, our store and run boundaries
# --------------------------------------------------------------------------


class _GuardedCloseOp:
    """torch's close operation, limited to the lineage this node was a member of."""

    def __init__(self, backend: FsRendezvousBackend) -> None:
        self._backend = backend

    def __call__(self, ctx: _RendezvousContext, deadline: float) -> _Action:
        if ctx.state.closed:
            return _Action.FINISH
        member = self._backend.member_epoch
        if member is None or self._backend.epoch != member:
            # We never joined this lineage (or a newer run took over): not ours to close.
            return _Action.FINISH
        if time.monotonic() > deadline:
            return _Action.ERROR_TIMEOUT
        return _Action.MARK_RENDEZVOUS_CLOSED


class _LeaveOp:
    """Remove this node from the state: its agent is exiting."""

    def __call__(self, ctx: _RendezvousContext, deadline: float) -> _Action:
        s, n = ctx.state, ctx.node
        if n in s.participants:
            action = _Action.REMOVE_FROM_PARTICIPANTS
        elif n in s.wait_list:
            action = _Action.REMOVE_FROM_WAIT_LIST
        elif n in s.redundancy_list:
            action = _Action.REMOVE_FROM_REDUNDANCY_LIST
        else:
            return _Action.FINISH
        if n not in s.last_heartbeats:
            # torch's removal actions delete the heartbeat entry too.
            s.last_heartbeats[n] = datetime.now(timezone.utc)
        if time.monotonic() > deadline:
            return _Action.ERROR_TIMEOUT
        return action


def _server_connect_host(addr: str) -> str:
    """The host the TCPStore master connects its own client to.

    The server listens on all interfaces; the master object also connects to
    it.  An announced IP that is not assigned here (``addr=`` behind NAT, a
    pod or load-balancer IP) is unreachable from this host itself, so that
    connection goes through loopback instead.
    """
    try:
        ip = ipaddress.ip_address(addr.split("%")[0])
    except ValueError:
        return addr  # a host name from --local-addr: the user vouches for it
    local = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    if str(ip) in local:
        return addr
    return "::1" if ip.version == 6 else "127.0.0.1"


class FsRendezvousHandler(DynamicRendezvousHandler):
    """torch's ``DynamicRendezvousHandler`` on :class:`FsRendezvousBackend`, with its own c10d store.

    Differences from torch's c10d backend, each documented in ``docs/torchrun-backend.md``:

    * :meth:`next_rendezvous` waits for a *previous* run with the same id that
      is closed but still has live members to drain (bounded by
      ``join_timeout``), then starts a fresh lineage.
    * The c10d store of a round is a TCPStore hosted by the round's rank-0
      agent at its announced address, found through ``store-<E>-<R>.json``;
      the same server is shared with the workers (``MASTER_ADDR`` /
      ``MASTER_PORT``) unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``.
      Every round gets a new server on a new port: the workers of a
      restarted group must never read keys (gloo addresses) that the
      previous group's workers left in the store.  ``MASTER_ADDR`` /
      ``MASTER_PORT`` are therefore exchanged again every round.
    * :meth:`shutdown` closes the rendezvous (as torch does) only if this node
      was a member of the current lineage, and then removes this node from
      the state so that the run can be recognised as finished.

    Create it with :func:`create_rdzv_handler`.
    """

    _fs_backend: FsRendezvousBackend
    _read_timeout: float
    _server: Any
    _client: Any

    def _fs_setup(self, backend: FsRendezvousBackend, read_timeout: float) -> None:
        self._fs_backend = backend
        self._read_timeout = float(read_timeout)
        self._server = None
        self._client = None
        backend.set_node(self._this_node)

    # -- rendezvous -------------------------------------------------------------

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round (see ``RendezvousHandler.next_rendezvous``).

        Returns:
            RendezvousInfo: the round's store (prefixed per lineage and round),
            this node's rank, the number of nodes, and ``MASTER_ADDR`` /
            ``MASTER_PORT`` for the workers.

        Raises:
            RendezvousClosedError: the run is closed (another agent of it
                exited), or an earlier run with this id stayed closed with live
                members for ``join_timeout`` seconds.
            RendezvousTimeoutError: the round did not complete within
                ``join_timeout`` seconds, or rank 0's store address did not
                appear within ``read_timeout`` seconds.
            RendezvousGracefulExitError: this node was redundant (``max``
                reached) and the run closed.
            RendezvousStateError: the state on disk is corrupt.
            RendezvousConnectionError: the directory cannot be read or written,
                or rank 0's TCPStore cannot be reached.
        """
        if self._fs_backend.pinned_epoch is None:
            self._wait_for_previous_run()
        # A new round gets a new store server (see _get_store), so torch's
        # cached MASTER_ADDR/PORT of the first round must not be reused: let
        # it exchange them again through this round's store.  (Rank 0 may
        # also change between rounds: ranks follow the sorted node list.)
        self._bootstrap_store_info = None
        self._shared_tcp_store_server = None
        self._server = self._client = None
        return super().next_rendezvous()

    def _wait_for_previous_run(self) -> None:
        deadline = time.monotonic() + self._settings.timeout.join.total_seconds()
        warned = False
        while True:
            rec = self._fs_backend.peek()
            if rec is None or not rec.state.closed or self._fs_backend.is_finished(rec):
                return
            live = self._fs_backend.live_members(rec.state)
            if time.monotonic() > deadline:
                raise RendezvousClosedError(
                    f"the rendezvous '{self._settings.run_id}' is closed and its members "
                    f"{', '.join(map(repr, live))} are still alive; a run with this id is still ending"
                )
            if not warned:
                log.warning(
                    "rendezvous '%s' is closed but %d member(s) of that run are still alive (%s); waiting "
                    "for them to exit or to miss their heartbeats before starting a new run",
                    self._settings.run_id, len(live), ", ".join(map(repr, live)),
                )
                warned = True
            _sleep_jitter(1.0)

    def _get_store(self) -> Any:
        state = self._state_holder.state
        epoch = self._fs_backend.epoch or 0
        rnd = state.round
        rank = state.participants[self._this_node]
        leaders = [n for n, r in sorted(state.participants.items()) if r == 0]
        if len(leaders) != 1:
            raise RendezvousStateError(
                f"round {rnd} of '{self._settings.run_id}' has {len(leaders)} nodes of rank 0; "
                "rank 0 left before the round could start"
            )
        leader = leaders[0]
        timeout = timedelta(seconds=self._read_timeout)
        if rank == 0:
            server = self._new_server()
            self._fs_backend.publish_store_address(
                StoreAddress(epoch, rnd, self._this_node, self._this_node.addr, server.port)
            )
            base = server
        else:
            a = self._fs_backend.wait_store_address(epoch, rnd, leader, self._read_timeout)
            try:
                base = dist.TCPStore(a.addr, a.port, is_master=False, multi_tenant=True, timeout=timeout)
            except (RuntimeError, ValueError, TimeoutError) as e:
                raise RendezvousConnectionError(
                    f"cannot connect to rank 0's store at {a.addr}:{a.port} ({e}); is that address "
                    "reachable from this node? choose it with --rdzv-conf iface=... or addr=..."
                ) from e
            self._client = base
        return dist.PrefixStore(f"torch.rendezvous.{self._settings.run_id}.{epoch}.{rnd}", base)

    def _new_server(self) -> Any:
        # One server per round, on a fresh ephemeral port.  torch's workers
        # use the agent's server without a per-attempt prefix ("we create a
        # new TCPStore for every retry", torch/distributed/rendezvous.py), so
        # reusing one server across rounds lets restarted workers read the
        # previous group's gloo addresses and fail with "connection refused".
        try:
            self._server = dist.TCPStore(
                host_name=_server_connect_host(self._this_node.addr),
                port=0,
                is_master=True,
                multi_tenant=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=self._read_timeout),
            )
        except (RuntimeError, ValueError) as e:
            raise RendezvousConnectionError(f"cannot host the rendezvous TCPStore ({e})") from e
        log.info("hosting the rendezvous TCPStore at %s:%d", self._this_node.addr, self._server.port)
        return self._server

    def _create_tcp_store_server(self, master_addr: str, master_port: int) -> Any:
        # torch's handler asks rank 0 for a store server to share with the
        # workers: it is the one this agent hosts for the round.
        return self._server if self._server is not None else self._new_server()

    # -- closing ----------------------------------------------------------------

    def _close(self) -> None:
        deadline = self._get_deadline(self._settings.timeout.close)
        self._op_executor.run(_GuardedCloseOp(self._fs_backend), deadline)

    def set_closed(self) -> None:
        """Mark the run closed: agents still joining or re-joining get ``RendezvousClosedError``.

        Only a lineage this node was a member of is closed.

        Raises:
            RendezvousTimeoutError: not written within ``close_timeout`` seconds.
            RendezvousStateError, RendezvousConnectionError: as for :meth:`next_rendezvous`.
        """
        super().set_closed()

    def shutdown(self) -> bool:
        """Close the run (see :meth:`set_closed`) and remove this node from the state.

        Called by torchrun when the agent exits (not when it dies from a signal).

        Returns:
            bool: True if both steps were written, False if one failed with a
            ``RendezvousError`` (logged as a warning).
        """
        self._stop_heartbeats()
        try:
            with self._heartbeat_lock:
                self._close()
                self._op_executor.run(_LeaveOp(), self._get_deadline(self._settings.timeout.close))
            return True
        except (RendezvousError, KeyError) as ex:
            log.warning(
                "node %s failed to shut down the rendezvous '%s': %s: %s",
                self._this_node, self._settings.run_id, type(ex).__name__, ex,
            )
            return False


# --------------------------------------------------------------------------
# Creation and registration
# --------------------------------------------------------------------------


def _conf_int(params: RendezvousParameters, key: str, default: int | None, minimum: int) -> int | None:
    try:
        v = params.get_as_int(key, default)
    except ValueError:
        raise ConfigError(f"--rdzv-conf {key}={params.get(key)!r} is not an integer") from None
    if v is not None and v < minimum:
        raise ConfigError(f"--rdzv-conf {key}={v} must be at least {minimum}")
    return v


def _local_addr(params: RendezvousParameters) -> str:
    addr = params.get("addr")
    iface = params.get("iface")
    if addr:
        return choose_address(addr=str(addr))
    if params.local_addr:
        if not _ADDR_RE.match(params.local_addr):
            raise ConfigError(f"--local-addr {params.local_addr!r} is not a host name or IP address")
        return params.local_addr
    return choose_address(iface=str(iface) if iface else None)


def create_rdzv_handler(params: RendezvousParameters) -> FsRendezvousHandler:
    """Create the ``fsmingle`` rendezvous handler from torchrun's parameters.

    Args:
        params (RendezvousParameters): ``endpoint`` is the shared directory
            (absolute path), ``run_id`` the job id, ``min_nodes``/``max_nodes``
            from ``--nnodes``, ``local_addr`` from ``--local-addr``, and the
            ``--rdzv-conf`` keys listed in the module documentation.

    Returns:
        FsRendezvousHandler: whose ``get_backend()`` is ``"fsmingle"``.

    Raises:
        ConfigError: the endpoint is missing or not an absolute path, the run
            id is not a safe directory name, a ``--rdzv-conf`` value is not an
            integer or out of range, or ``addr``/``iface`` is invalid.
        StorageError: the endpoint's parent does not exist (shared filesystem
            not mounted?) or the directory cannot be created or written.
        UnsafeDirectoryError: the endpoint is world-writable without the
            sticky bit, or the run directory is not owned by you, is a
            symlink, or is group/world-writable.
    """
    endpoint = (params.endpoint or "").strip()
    if not endpoint:
        raise ConfigError("--rdzv-endpoint is required: a directory on the filesystem all nodes share, e.g. /shared/rdzv")
    if not os.path.isabs(endpoint):
        raise ConfigError(
            f"--rdzv-endpoint {endpoint!r} is not an absolute path; the fsmingle backend takes a directory "
            "on the filesystem all nodes share, e.g. /shared/rdzv (not host:port)"
        )
    run_id = validate_job_id(params.run_id)
    unknown = sorted(set(params.config) - KNOWN_CONF_KEYS)
    if unknown:
        log.warning("ignoring --rdzv-conf keys the fsmingle backend does not know: %s", ", ".join(unknown))

    timeouts = {}
    for key in ("join", "last_call", "close", "heartbeat"):
        v = _conf_int(params, f"{key}_timeout", None, 1)
        timeouts[key] = None if v is None else timedelta(seconds=v)
    keep_alive_interval = _conf_int(params, "keep_alive_interval", 5, 1)
    keep_alive_max_attempt = _conf_int(params, "keep_alive_max_attempt", 3, 1)
    read_timeout = _conf_int(params, "read_timeout", 60, 1)
    local_addr = _local_addr(params)

    store = open_job_dir(endpoint, run_id)
    backend = FsRendezvousBackend(
        store, run_id, liveness_s=float(keep_alive_interval * keep_alive_max_attempt)  # type: ignore[operator]
    )
    h = FsRendezvousHandler.from_backend(
        run_id,
        None,  # type: ignore[arg-type]  # the store is made per round, see _get_store
        backend,
        params.min_nodes,
        params.max_nodes,
        local_addr,
        RendezvousTimeout(**timeouts),
        keep_alive_interval=keep_alive_interval,  # type: ignore[arg-type]
        keep_alive_max_attempt=keep_alive_max_attempt,  # type: ignore[arg-type]
    )
    assert isinstance(h, FsRendezvousHandler)
    h._fs_setup(backend, read_timeout)  # type: ignore[arg-type]
    return h
