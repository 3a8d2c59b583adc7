"""JSON files of the torchrun backend: state versions, store addresses, heartbeats, scans.

Every file is one JSON object with the fsmingle ``schema`` and a ``kind``,
parsed by :func:`fsmingle.fs.records.load_object` (one schema version for the
whole project, :data:`fsmingle.fs.records.SCHEMA_VERSION`) and then validated
field by field here.  Nothing on disk is pickled: torch hands its state to
the backend pickled, :func:`unpickle_state` decodes it with an unpickler that
admits only torch's state classes, and readers rebuild it from JSON.

Files in ``<endpoint>/<run_id>/``:

* ``state-<N>.json`` (kind ``torch-rdzv-state``): version N of torch's
  ``_RendezvousState``; N is the compare-and-set token.
* ``store-<E>-<R>.json`` (kind ``torch-rdzv-store``): where round R of lineage
  E's rank-0 agent hosts the TCPStore.
* ``hb/<key>.json`` (kind ``torch-rdzv-heartbeat``): one node's heartbeat
  counter, replaced every ``keep_alive_interval``.
* ``hb/scan.json`` (kind ``torch-rdzv-scan``): the counters one agent read
  from every member's heartbeat file (see :mod:`fsmingle.torchrun.heartbeat`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ..errors import RecordError
from ..fs.records import SCHEMA_VERSION, load_object, validate_port
from ._torch_private import DR_MODULE, NodeDesc, RendezvousState, RendezvousStateError

STATE_KIND = "torch-rdzv-state"
STORE_KIND = "torch-rdzv-store"
HEARTBEAT_KIND = "torch-rdzv-heartbeat"
SCAN_KIND = "torch-rdzv-scan"

HB_DIR = "hb"
SCAN_NAME = f"{HB_DIR}/scan.json"

STATE_RE = re.compile(r"^state-(\d{12})\.json$")
STORE_RE = re.compile(r"^store-(\d{12})-(\d{12})\.json$")
ADDR_RE = re.compile(r"^[A-Za-z0-9._:%\[\]-]{1,255}$")
MAX_NODES = 1 << 17
_EPOCH0 = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)


def state_name(version: int) -> str:
    """File name of state version ``version`` inside the run directory."""
    return f"state-{version:012d}.json"


def store_name(epoch: int, round_: int) -> str:
    """File name of the store address of round ``round_`` of lineage ``epoch``."""
    return f"store-{epoch:012d}-{round_:012d}.json"


def heartbeat_name(node: NodeDesc) -> str:
    """File name (under the run directory) of ``node``'s heartbeat.

    A hash of the node, not the node itself: addresses may hold ``:`` and
    ``%`` that some FUSE and object-store mounts refuse in names.  The file
    names its node inside, and readers check it.
    """
    h = hashlib.sha1(f"{node.addr}_{node.pid}_{node.local_id}".encode()).hexdigest()[:24]
    return f"{HB_DIR}/{h}.json"


def _dump(d: dict) -> bytes:
    # One schema version for every fsmingle file; load_object checks it.
    d = {"schema": SCHEMA_VERSION, **d}
    return (json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _writer() -> str:
    return f"{socket.gethostname()[:64]}:{os.getpid()}"


def _load(data: bytes, kind: str, run_id: str) -> dict:
    d = load_object(data, kind)
    if d.get("run_id") != run_id:
        raise RecordError(f"run_id is {d.get('run_id')!r}, expected {run_id!r}")
    return d


def _int(v: Any, what: str, lo: int = 0, hi: int = 1 << 63) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v < hi:
        raise RecordError(f"{what} {v!r} is not an integer in {lo}..{hi - 1}")
    return v


# --------------------------------------------------------------------------
# torch's pickled state, admitted only for torch's own classes
# --------------------------------------------------------------------------

_ALLOWED_GLOBALS = {
    (DR_MODULE, "_RendezvousState"),
    (DR_MODULE, "_NodeDesc"),
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


def unpickle_state(data: bytes) -> RendezvousState:
    """Decode the pickled state torch's state holder passes to ``set_state``.

    Raises:
        RendezvousStateError: ``data`` is not a pickled ``_RendezvousState``
            made of torch's classes only, or its fields have the wrong types.
    """
    try:
        obj = _StateUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # pickle raises many types on garbage
        raise RendezvousStateError(f"the rendezvous state to store is not a pickled _RendezvousState ({e})") from None
    if not isinstance(obj, RendezvousState):
        raise RendezvousStateError(f"the rendezvous state to store is a {type(obj).__name__}, not a _RendezvousState")
    try:
        # Round-trip through the validator: what we write is what we accept.
        return state_from_json(state_to_json(obj))
    except (RecordError, AttributeError, TypeError, ValueError) as e:
        raise RendezvousStateError(f"the rendezvous state to store is invalid: {e}") from None


# --------------------------------------------------------------------------
# _RendezvousState <-> JSON
# --------------------------------------------------------------------------


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


def node_json(n: NodeDesc) -> list:
    """``[addr, pid, local_id]``: the JSON form of torch's ``_NodeDesc``."""
    return [n.addr, n.pid, n.local_id]


def node_from_json(v: Any, what: str) -> NodeDesc:
    """Validate ``[addr, pid, local_id]`` and build the ``_NodeDesc``.

    Raises:
        RecordError: not a 3-list, an address with characters no host name
            or IP address has, or a negative / non-integer pid or local id.
    """
    if not isinstance(v, list) or len(v) != 3:
        raise RecordError(f"{what} is not [addr, pid, local_id]")
    addr, pid, local_id = v
    if not isinstance(addr, str) or not ADDR_RE.match(addr):
        raise RecordError(f"{what}: address {addr!r} is not a host name or IP address")
    for x, name in ((pid, "pid"), (local_id, "local_id")):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < (1 << 63):
            raise RecordError(f"{what}: {name} {x!r} is not a non-negative integer")
    return NodeDesc(addr, pid, local_id)


def state_to_json(st: RendezvousState) -> dict:
    """The JSON form (a dict) of torch's ``_RendezvousState``; datetimes as UTC microseconds."""
    return {
        "round": int(st.round),
        "complete": bool(st.complete),
        "deadline": _dt_to_us(st.deadline),
        "closed": bool(st.closed),
        "participants": [node_json(n) + [int(r)] for n, r in sorted(st.participants.items())],
        "wait_list": [node_json(n) for n in sorted(st.wait_list)],
        "redundancy_list": [node_json(n) for n in sorted(st.redundancy_list)],
        "last_heartbeats": [node_json(n) + [_dt_to_us(t)] for n, t in sorted(st.last_heartbeats.items())],
    }


def state_from_json(d: Any) -> RendezvousState:
    """Rebuild torch's ``_RendezvousState`` from :func:`state_to_json` output, validating every field.

    Raises:
        RecordError: a field is missing, of the wrong type or out of range.
    """
    if not isinstance(d, dict):
        raise RecordError("state is not a JSON object")
    st = RendezvousState()
    st.round = _int(d.get("round"), "round")
    for key in ("complete", "closed"):
        if not isinstance(d.get(key), bool):
            raise RecordError(f"{key} is not a boolean")
    st.complete, st.closed = d["complete"], d["closed"]
    st.deadline = _us_to_dt(d.get("deadline"), "deadline")
    lists = {}
    for key in ("participants", "wait_list", "redundancy_list", "last_heartbeats"):
        v = d.get(key)
        if not isinstance(v, list) or len(v) > MAX_NODES:
            raise RecordError(f"{key} is not a list of at most {MAX_NODES} entries")
        lists[key] = v
    for e in lists["participants"]:
        if not isinstance(e, list) or len(e) != 4:
            raise RecordError("participant is not [addr, pid, local_id, rank]")
        n = node_from_json(e[:3], "participant")
        # Ranks are 0..n-1 when a round completes; members that leave later
        # keep the others' ranks, so only the range of a node count is checked.
        r = _int(e[3], f"participant {n}: rank", hi=MAX_NODES)
        if n in st.participants:
            raise RecordError(f"participant {n} is listed twice")
        st.participants[n] = r
    st.wait_list = {node_from_json(e, "wait_list entry") for e in lists["wait_list"]}
    st.redundancy_list = {node_from_json(e, "redundancy_list entry") for e in lists["redundancy_list"]}
    for e in lists["last_heartbeats"]:
        if not isinstance(e, list) or len(e) != 4:
            raise RecordError("heartbeat is not [addr, pid, local_id, time]")
        n = node_from_json(e[:3], "heartbeat")
        t = _us_to_dt(e[3], f"heartbeat of {n}")
        if t is None:
            raise RecordError(f"heartbeat of {n} has no time")
        st.last_heartbeats[n] = t
    return st


def copy_state(st: RendezvousState) -> RendezvousState:
    """A copy of ``st`` whose containers can be changed without touching ``st``."""
    c = RendezvousState()
    c.round, c.complete, c.deadline, c.closed = st.round, st.complete, st.deadline, st.closed
    c.participants = dict(st.participants)
    c.wait_list = set(st.wait_list)
    c.redundancy_list = set(st.redundancy_list)
    c.last_heartbeats = dict(st.last_heartbeats)
    return c


# --------------------------------------------------------------------------
# state-<N>.json
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class StateRecord:
    """One decoded ``state-<N>.json``.

    Attributes:
        version (int): N, the fencing token torch sees.
        epoch (int): version at which this lineage (one run of the id) began.
        state (_RendezvousState): torch's state; shared, never modify it (see :func:`copy_state`).
    """

    version: int
    epoch: int
    state: RendezvousState


def encode_state_record(run_id: str, version: int, epoch: int, st: RendezvousState) -> bytes:
    """Serialise one state version to UTF-8 JSON bytes."""
    return _dump(
        {
            "kind": STATE_KIND,
            "run_id": run_id,
            "version": version,
            "epoch": epoch,
            "writer": _writer(),
            "wall_time": time.time(),
            "state": state_to_json(st),
        }
    )


def decode_state_record(data: bytes, run_id: str, version: int) -> StateRecord:
    """Parse and validate one ``state-<version>.json``.

    Raises:
        RecordError: invalid JSON, unknown schema or kind, another run id or
            version than its name says, or any invalid state field.
    """
    d = _load(data, STATE_KIND, run_id)
    if d.get("version") != version:
        raise RecordError(f"version field {d.get('version')!r} does not match the file name ({version})")
    epoch = _int(d.get("epoch"), "epoch", 1, version + 1)
    return StateRecord(version=version, epoch=epoch, state=state_from_json(d.get("state")))


# --------------------------------------------------------------------------
# store-<E>-<R>.json
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreAddress:
    """Where the round's rank-0 agent hosts the TCPStore (``store-<E>-<R>.json``)."""

    epoch: int
    round: int
    node: NodeDesc
    addr: str
    port: int


def encode_store_address(run_id: str, a: StoreAddress) -> bytes:
    """Serialise one store address to UTF-8 JSON bytes."""
    return _dump(
        {
            "kind": STORE_KIND,
            "run_id": run_id,
            "epoch": a.epoch,
            "round": a.round,
            "node": node_json(a.node),
            "addr": a.addr,
            "port": a.port,
            "wall_time": time.time(),
        }
    )


def decode_store_address(data: bytes, run_id: str, epoch: int, round_: int) -> StoreAddress:
    """Parse and validate one ``store-<E>-<R>.json``.

    Raises:
        RecordError: invalid JSON or schema, other run id/epoch/round, bad
            address or port.
    """
    d = _load(data, STORE_KIND, run_id)
    if d.get("epoch") != epoch or d.get("round") != round_:
        raise RecordError(f"epoch/round {d.get('epoch')!r}/{d.get('round')!r} do not match {epoch}/{round_}")
    addr = d.get("addr")
    if not isinstance(addr, str) or not ADDR_RE.match(addr):
        raise RecordError(f"store address {addr!r} is not a host name or IP address")
    return StoreAddress(epoch, round_, node_from_json(d.get("node"), "store node"), addr, validate_port(d.get("port")))


# --------------------------------------------------------------------------
# hb/<key>.json and hb/scan.json
# --------------------------------------------------------------------------


def encode_heartbeat(run_id: str, node: NodeDesc, count: int) -> bytes:
    """Serialise one heartbeat: ``count`` grows by one per beat; no times (clocks differ)."""
    return _dump({"kind": HEARTBEAT_KIND, "run_id": run_id, "node": node_json(node), "count": count})


def decode_heartbeat(data: bytes, run_id: str, node: NodeDesc) -> int:
    """The counter in ``node``'s heartbeat file.

    Raises:
        RecordError: invalid JSON or schema, another run id, another node
            than the file name stands for, or a counter that is not a
            non-negative integer.
    """
    d = _load(data, HEARTBEAT_KIND, run_id)
    if node_from_json(d.get("node"), "heartbeat node") != node:
        raise RecordError(f"heartbeat file of {node} names node {d.get('node')!r}")
    return _int(d.get("count"), "heartbeat count")


def encode_scan(run_id: str, writer: NodeDesc, seq: int, counts: dict[NodeDesc, int]) -> bytes:
    """Serialise one scan: the heartbeat counters ``writer`` has seen, as ``[addr, pid, local_id, count]``."""
    return _dump(
        {
            "kind": SCAN_KIND,
            "run_id": run_id,
            "writer": node_json(writer),
            "seq": seq,
            "counts": [node_json(n) + [c] for n, c in sorted(counts.items())],
        }
    )


def decode_scan(data: bytes, run_id: str) -> tuple[NodeDesc, int, dict[NodeDesc, int]]:
    """Parse ``hb/scan.json``: ``(writer, seq, counts)``.

    Raises:
        RecordError: invalid JSON or schema, another run id, or an invalid
            writer, sequence number or entry.
    """
    d = _load(data, SCAN_KIND, run_id)
    writer = node_from_json(d.get("writer"), "scan writer")
    seq = _int(d.get("seq"), "scan seq")
    entries = d.get("counts")
    if not isinstance(entries, list) or len(entries) > MAX_NODES:
        raise RecordError(f"scan counts is not a list of at most {MAX_NODES} entries")
    counts = {}
    for e in entries:
        if not isinstance(e, list) or len(e) != 4:
            raise RecordError("scan entry is not [addr, pid, local_id, count]")
        counts[node_from_json(e[:3], "scan entry")] = _int(e[3], "scan count")
    return writer, seq, counts
