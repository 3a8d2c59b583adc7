"""The on-disk record format: beacons, rank claims and release records (JSON, schema 1).

Every file fsmingle writes under ``<dir>/<job_id>/`` is one JSON object with a
``schema`` (int) and a ``kind`` (str).  Never pickle: a record is an
instruction to connect somewhere, and anyone who can write the directory could
otherwise run code in every reader.  Decoding validates every field, so a
hostile or torn file can only ever be rejected, never half-trusted.

Kinds
-----
``beacon``   one per participant (process) and generation, replaced atomically
             on every heartbeat; holds identity, address and heartbeat counter.
``claim``    ``rank-NNNNN.claim``: created exclusively, names the instance that
             owns the rank for this generation.  Immutable.
``release``  ``release.json``: created exclusively, exactly once per generation;
             ``state`` is ``"released"`` (master, port, ordered members) or
             ``"restart"`` (the generation is void; go to the next one).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..errors import RecordError
from .beacon_fields import _vouch, encode_vouch, job_ids, queue_word  # noqa: F401  (encode_vouch: re-exported)
from .endpoint import validate_addr, validate_port

SCHEMA_VERSION = 2  # 2: protocol v2 (direct channel); a v1 node must not join a v2 world
MODES = ("node", "rank")
_INSTANCE_RE = re.compile(r"^[0-9a-f]{8,64}$")
_SECRET_RE = re.compile(r"^[0-9a-f]{64}$")
_MAX_RECORD_BYTES = 1 << 20  # the guard against hostile files; big releases are chunked below it
MEMBERS_PER_CHUNK = 4096  # ~200 bytes per member: a chunk stays well below 1 MiB
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class HostId:
    """Who and where a process is, enough to check liveness directly on the same host.

    Attributes:
        hostname (str): ``socket.gethostname()``, for humans.
        boot_id (str): ``/proc/sys/kernel/random/boot_id``; differs per kernel boot.
        pidns (str): ``readlink /proc/self/ns/pid``; pids are comparable only
            inside one pid namespace (two pods on one node share the boot id
            but not the pid namespace).
        pid (int): process id.
        pid_start (float): psutil create time of the process (seconds since the
            epoch, as the local kernel reports it); guards against pid reuse.
    """

    hostname: str
    boot_id: str
    pidns: str
    pid: int
    pid_start: float

    def same_pid_space(self, other: HostId) -> bool:
        """True if ``other.pid`` names a process this host can inspect."""
        return bool(self.boot_id) and self.boot_id == other.boot_id and self.pidns == other.pidns


@dataclass(frozen=True)
class Beacon:
    """One participant's announcement in one generation.

    Attributes:
        job_id (str), generation (int): where it belongs.
        instance (str): random hex id of the participating process; unique.
        mode (str): ``"node"`` (one participant per node, ranks are node ranks)
            or ``"rank"`` (one participant per process, ranks are global ranks).
        size (int): nnodes (node mode) or world size (rank mode) it expects.
        rank (int | None): the rank it holds in this generation, once claimed.
        addr (str): its IP address (the master address if it becomes rank 0).
        master_port (int | None): the port it holds open for torch, set only
            by the rank-0 holder.
        heartbeat (int): counter bumped on every heartbeat.  Liveness is judged
            by watching it change on the *observer's* monotonic clock, never by
            comparing file times with a local clock (clocks of nodes and the
            file server disagree).
        restart_count (int): ``SLURM_RESTART_COUNT`` (0 elsewhere); a record
            with a smaller count than ours and the same ``slurm_job_id``
            belongs to a requeued-away run.
        slurm_job_id (str): ``SLURM_JOB_ID`` or "".
        host (HostId): identity for direct liveness checks on the same host.
        wall_time (float): writer's ``time.time()``; informational only.
        vouch (str): rank 0's only: a bitmap of the member ranks connected to it
            and verified when it wrote this beacon (base64, bit ``r`` of byte
            ``r // 8``; :func:`encode_vouch`).  A connected member heartbeats its
            own beacon rarely in a big world; judges of its liveness take rank
            0's live beacon instead (``GenerationReader.judge_rank``).
        secret (str): rank 0's endpoint record only (``master/``): the generation's channel
            secret (64 hex digits) that keys the HMAC of every hello, ask and ack
            (:func:`fsmingle.net.wire.auth_mac`).  Only the job's uid can read it (0600 file,
            0700 directory); never in the generation directory's copy, never printed (repr),
            left out of the JSON when empty, so older readers see the same record.
        scheduler (tuple[tuple[str, str], ...]): this participant's job as its scheduler knows
            it (``fsmingle.config.scheduler_identity``: ``slurm_job``, ``array_job``,
            ``array_task``, ``partition``, PBS/LSF ids), a JSON object in the record, left out
            when empty; readers ignore fields they do not know, so older ones read it unchanged.
        queue (tuple[str, ...]): rank 0's only: what the scheduler says about peer jobs that have
            not joined (``missing rank 3: job 4242_3 PENDING (Priority), expected start 14:05``;
            :mod:`fsmingle.protocol.queue`), for ``fsmingle status``; left out when empty.
        spare_for (int): a spare's: the generation it found full or released without it (it
            waits for a place in a later one); 0 (left out of the JSON) for everyone else.
        spare (bool): started as a spare (:mod:`fsmingle.protocol.outside`: a world is never
            made of spares alone); False (left out of the JSON) for everyone else.
        queue_word (dict | None): the scheduler asker's only, while no rank 0 endpoint is known:
            its findings on peer jobs (``{"hold", "lines", "ended"}``,
            :mod:`fsmingle.protocol.queue_relay`); None (left out) for everyone else.
    """

    job_id: str
    generation: int
    instance: str
    mode: str
    size: int
    rank: int | None
    addr: str
    master_port: int | None
    heartbeat: int
    restart_count: int
    host: HostId
    wall_time: float = 0.0
    version: str = ""
    slurm_job_id: str = ""
    vouch: str = ""
    secret: str = field(default="", repr=False)
    scheduler: tuple[tuple[str, str], ...] = ()
    queue: tuple[str, ...] = ()
    spare_for: int = 0
    queue_word: dict | None = field(default=None, compare=False)
    spare: bool = False
    kind: str = field(default="beacon", init=False)

    @functools.cached_property
    def _vouch_bits(self) -> bytes:
        # Decoded once per beacon read: a world-full watcher or `status` asks for every rank.
        return base64.b64decode(self.vouch) if self.vouch else b""

    def vouches_for(self, r: int) -> bool:
        """True if this (rank 0's) beacon says rank ``r`` was connected to it and verified when written."""
        bits = self._vouch_bits
        return r >= 0 and r >> 3 < len(bits) and bool(bits[r >> 3] & (1 << (r & 7)))


@dataclass(frozen=True)
class Claim:
    """Ownership of one rank in one generation (``rank-NNNNN.claim``)."""

    rank: int
    instance: str
    kind: str = field(default="claim", init=False)


@dataclass(frozen=True)
class Member:
    """One member of a released world, as listed in the release record.

    Attributes:
        rank (int), instance (str), addr (str), host (HostId): who and where.
        arrival (float): seconds after the first arrival at which rank 0 saw it
            (rank 0's monotonic clock): who was slow, at a glance.
    """

    rank: int
    instance: str
    addr: str
    host: HostId
    arrival: float = 0.0


class ReleaseState(StrEnum):
    """A generation's decision (``release.json``'s ``state``): a ``str``, so the JSON and older readers see the same words."""

    RELEASED = "released"  # the world is fixed: members, master address and port
    RESTART = "restart"  # voided: everyone moves to the next generation


@dataclass(frozen=True)
class Release:
    """The one decision of a generation (``release.json``).

    Attributes:
        state (ReleaseState): released or voided (restart); see :attr:`released`.
        master_addr (str | None), master_port (int | None): set when released.
        members (tuple[Member, ...]): ordered by rank, ``size`` entries, when
            released -- or empty when they are stored apart (see ``member_chunks``).
        reason (str): why a generation was restarted (for logs and status).
        writer (str): instance id of the writer.
        member_chunks (tuple[str, ...]): for worlds over :data:`MEMBERS_PER_CHUNK`,
            the SHA-256 of each member chunk file (``release-<writer>-<k>.json``,
            written before ``release.json`` is created); load them with
            :func:`attach_members`.  Keeps every file under the 1 MiB guard for
            any world size.
        jobs (tuple[str, ...]): scheduler jobs known to have joined this generation or an earlier
            one (:mod:`fsmingle.protocol.queue`: one that ended is a place for a spare to fill);
            left out of the JSON when empty (older readers ignore it).
    """

    job_id: str
    generation: int
    state: ReleaseState
    mode: str
    size: int
    master_addr: str | None
    master_port: int | None
    members: tuple[Member, ...]
    writer: str
    reason: str = ""
    wall_time: float = 0.0
    member_chunks: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()
    kind: str = field(default="release", init=False)

    @property
    def released(self) -> bool:
        """True if this decision released a world (False: a restart)."""
        return self.state == ReleaseState.RELEASED


def member_dict(m: Member) -> dict:
    """``dataclasses.asdict(m)`` built directly: its fields hold only strings and numbers (asdict
    deep-copies field by field: 0.7 s of rank 0's CPU for 2,048 members, issue 31)."""
    return {**m.__dict__, "host": dict(m.host.__dict__)}


def encode(record: Beacon | Claim | Release) -> bytes:
    """Serialise a record to UTF-8 JSON bytes with the schema version."""
    if isinstance(record, Release):  # flat fields as they are (str, numbers, tuples of str); members directly
        d = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        d["members"] = [member_dict(m) for m in record.members]
    else:
        d = dataclasses.asdict(record)
    if isinstance(record, Beacon):
        if not record.secret:
            del d["secret"]  # only rank 0's endpoint record carries one
        if record.scheduler:
            d["scheduler"] = dict(record.scheduler)
        else:
            del d["scheduler"]  # optional: a beacon without it reads as before
        if not record.queue:
            del d["queue"]
        if not record.spare_for:
            del d["spare_for"]
        if record.queue_word is None:
            del d["queue_word"]
        if not record.spare:
            del d["spare"]
    if isinstance(record, Release) and not record.jobs:
        del d["jobs"]
    d["schema"] = SCHEMA_VERSION
    return (json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _seconds(v: int | float, what: str) -> float:
    """A number of seconds as a finite float; an int past a float's range is a RecordError, not
    the OverflowError ``float()`` raises (``10**400`` is valid JSON)."""
    try:
        f = float(v)
    except OverflowError:
        raise RecordError(f"{what} is out of range") from None
    if f != f or f in (float("inf"), float("-inf")):
        raise RecordError(f"{what} is not a finite number")
    return f


def _req(d: dict, key: str, typ: type | tuple, *, optional: bool = False) -> Any:
    if key not in d:
        raise RecordError(f"field {key!r} is missing")
    v = d[key]
    if v is None and optional:
        return None
    if isinstance(v, bool) and typ is not bool:
        raise RecordError(f"field {key!r} has type bool")
    if not isinstance(v, typ):
        raise RecordError(f"field {key!r} has type {type(v).__name__}")
    return v


def hostid_from_dict(d: Any) -> HostId:
    """Validate a host identity as a beacon, a release or a hello carries it.

    Raises:
        RecordError: not an object, or a field is missing or of the wrong type.
    """
    if not isinstance(d, dict):
        raise RecordError("field 'host' is not an object")
    return HostId(
        hostname=_req(d, "hostname", str)[:255],
        boot_id=_req(d, "boot_id", str)[:64],
        pidns=_req(d, "pidns", str)[:64],
        pid=_req(d, "pid", int),
        pid_start=_seconds(_req(d, "pid_start", (int, float)), "pid_start"),
    )


def instance_id(v: Any) -> str:
    """Validate an instance id (8-64 lowercase hex digits).

    Raises:
        RecordError: otherwise.
    """
    if not isinstance(v, str) or not _INSTANCE_RE.match(v):
        raise RecordError(f"instance id {v!r} is not 8-64 lowercase hex digits")
    return v


_SCHED_KEY_RE = re.compile(r"^[a-z_]{1,32}$")


def _scheduler(v: Any) -> tuple[tuple[str, str], ...]:
    """The optional ``scheduler`` object: at most 16 short string fields, sorted; anything else is
    dropped (it is informational, never a reason to refuse a beacon)."""
    if not isinstance(v, dict):
        return ()
    out = [
        (k, val[:64])
        for k, val in v.items()
        if isinstance(k, str) and _SCHED_KEY_RE.match(k) and isinstance(val, str) and val.isprintable()
    ]
    return tuple(sorted(out)[:16])


def _secret(v: Any) -> str:
    if v == "":
        return ""
    if not isinstance(v, str) or not _SECRET_RE.match(v):
        raise RecordError("secret is not 64 lowercase hex digits")
    return v


def _nonneg(v: int, what: str) -> int:
    if v < 0:
        raise RecordError(f"{what} {v} is negative")
    return v


def load_object(data: bytes, kind: str) -> dict:
    """Parse ``data`` as one JSON object of schema :data:`SCHEMA_VERSION` and the given ``kind``.

    Shared by every fsmingle record reader (this module, the torchrun backend).

    Raises:
        RecordError: invalid UTF-8/JSON, not an object, another schema or kind.
    """
    try:
        d = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RecordError(f"not valid JSON ({e.__class__.__name__}: {e}); a torn or foreign write") from None
    if not isinstance(d, dict):
        raise RecordError("not a JSON object")
    if d.get("schema") != SCHEMA_VERSION:
        raise RecordError(
            f"unknown schema version {d.get('schema')!r} (this fsmingle reads {SCHEMA_VERSION}); "
            "run the same fsmingle version on every node"
        )
    if d.get("kind") != kind:
        raise RecordError(f"kind is {d.get('kind')!r}, expected {kind!r}")
    return d


def decode(data: bytes, expect: type) -> Any:
    """Parse and validate one record.

    Args:
        data (bytes): file contents.
        expect (type): :class:`Beacon`, :class:`Claim` or :class:`Release`.

    Returns:
        An instance of ``expect``.

    Raises:
        RecordError: invalid UTF-8/JSON (e.g. a torn write), too large, an
            unknown ``schema`` (written by another fsmingle version: upgrade all
            nodes to one version), a different ``kind``, or any field of the
            wrong type or range.
    """
    if len(data) > _MAX_RECORD_BYTES:
        raise RecordError(f"record is {len(data)} bytes, larger than {_MAX_RECORD_BYTES}")
    d = load_object(data, {Beacon: "beacon", Claim: "claim", Release: "release"}[expect])
    if expect is Claim:
        return Claim(rank=_nonneg(_req(d, "rank", int), "rank"), instance=instance_id(d.get("instance")))
    mode = _req(d, "mode", str)
    if mode not in MODES:
        raise RecordError(f"mode {mode!r} is not one of {MODES}")
    size = _req(d, "size", int)
    if size < 1:
        raise RecordError(f"size {size} is below 1")
    common = dict(
        job_id=_req(d, "job_id", str),
        generation=_nonneg(_req(d, "generation", int), "generation"),
        mode=mode,
        size=size,
        wall_time=_seconds(_req(d, "wall_time", (int, float)), "wall_time"),
    )
    if expect is Beacon:
        rank = _req(d, "rank", int, optional=True)
        if rank is not None and not 0 <= rank < size:
            raise RecordError(f"rank {rank} outside 0..{size - 1}")
        mp = _req(d, "master_port", int, optional=True)
        return Beacon(
            instance=instance_id(d.get("instance")),
            rank=rank,
            addr=validate_addr(_req(d, "addr", str)),
            master_port=None if mp is None else validate_port(mp),
            heartbeat=_nonneg(_req(d, "heartbeat", int), "heartbeat"),
            restart_count=_nonneg(_req(d, "restart_count", int), "restart_count"),
            host=hostid_from_dict(d.get("host")),
            version=str(d.get("version", ""))[:64],
            slurm_job_id=str(d.get("slurm_job_id", ""))[:64],
            vouch=_vouch(d.get("vouch", ""), size),
            secret=_secret(d.get("secret", "")),
            scheduler=_scheduler(d.get("scheduler")),
            queue=tuple(str(x)[:300] for x in d["queue"][:16]) if isinstance(d.get("queue"), list) else (),
            spare_for=d["spare_for"] if type(d.get("spare_for")) is int and d["spare_for"] > 0 else 0,
            queue_word=queue_word(d.get("queue_word")),
            spare=d.get("spare") is True,
            **common,
        )
    word = _req(d, "state", str)
    try:
        state = ReleaseState(word)
    except ValueError:
        raise RecordError(f"state {word!r} is not 'released' or 'restart'") from None
    members: list[Member] = []
    master_addr = master_port = None
    chunks: tuple[str, ...] = ()
    if state is ReleaseState.RELEASED:
        master_addr = validate_addr(_req(d, "master_addr", str))
        master_port = validate_port(_req(d, "master_port", int))
        raw_chunks = d.get("member_chunks") or []
        if not isinstance(raw_chunks, list) or not all(isinstance(c, str) and _DIGEST_RE.match(c) for c in raw_chunks):
            raise RecordError("field 'member_chunks' is not a list of SHA-256 digests")
        chunks = tuple(raw_chunks)
        if chunks:
            if len(chunks) != -(-size // MEMBERS_PER_CHUNK):
                raise RecordError(f"{len(chunks)} member chunks for size {size}")
        else:
            members = _members(_req(d, "members", list), 0)
            if len(members) != size:
                raise RecordError(f"{len(members)} members listed for size {size}")
            if members[0].addr != master_addr:
                raise RecordError("master_addr is not rank 0's address")
    return Release(
        state=state,
        master_addr=master_addr,
        master_port=master_port,
        members=tuple(members),
        writer=instance_id(d.get("writer")),
        reason=str(d.get("reason", ""))[:1000],
        member_chunks=chunks,
        jobs=job_ids(d.get("jobs")),
        **common,
    )


def _members(raw: list, first: int) -> list[Member]:
    out = []
    for i, m in enumerate(raw, start=first):
        if not isinstance(m, dict) or m.get("rank") != i:
            raise RecordError(f"member {i} is missing or out of order")
        arrival = m.get("arrival", 0.0)
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)):
            raise RecordError(f"member {i}'s arrival is not a number")
        out.append(
            Member(
                rank=i,
                instance=instance_id(m.get("instance")),
                addr=validate_addr(_req(m, "addr", str)),
                host=hostid_from_dict(m.get("host")),
                arrival=_seconds(arrival, f"member {i}'s arrival"),
            )
        )
    return out
