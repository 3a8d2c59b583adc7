"""The rendezvous policy: generations, rank claims, heartbeats, the release decision.

This module decides; :mod:`fsmingle.store` touches the filesystem.  The policy
takes its store, clock, liveness oracle and master prober as arguments, so the
same code runs on a real shared directory and on the in-memory, stale-reading
model used by the hypothesis tests.

Layout of one job directory (all names relative to ``<dir>/<job_id>/``)::

    gen-00000007/                       one directory per generation (mkdir: exclusive)
        beacon-<instance>.json          each participant, replaced on every heartbeat
        rank-00000.claim                owner of rank 0 (link(): exclusive, immutable)
        rank-00001.claim
        release.json                    the decision, written once (link()): released | restart

Rules (``docs/protocol.md`` has the state machine and the reasons):

1. **Join** the newest generation that has no ``release.json``; if the newest
   is decided (released to an earlier run, or voided), create the next one.
   A decided generation is never joined, so a re-run or requeue with the same
   job id never reads a previous run's state.
2. **Publish** a beacon, then **claim** a rank by exclusive creation: the given
   rank, or first-come the lowest unclaimed one.  The rank-0 holder keeps the
   master port open (see :mod:`fsmingle.netaddr`) and publishes it.
3. **Decide** once every rank is claimed: the participant that completes the
   world -- or the rank-0 coordinator, which rescans every ``scan_interval``
   seconds -- checks that no member is known dead and that the master answers
   on its port with its own instance id, and creates ``release.json``.
   Exclusive creation makes the decision unique even if two try at once.
4. **Wait** by reading ``release.json`` only (one open per poll, backoff to
   ``poll_max`` with jitter), heartbeating every ``heartbeat`` seconds and
   checking rank 0's beacon every ``heartbeat`` seconds.
5. **Recover** by voiding: whoever finds a member dead (same host: its pid is
   gone; elsewhere: its heartbeat counter unchanged for ``stale_after``
   seconds of the observer's monotonic clock; or from a run with a smaller
   ``SLURM_RESTART_COUNT``) creates ``release.json`` with state ``restart``;
   everyone live moves to the next generation and claims again.  Claims are
   never broken in place, so no two live processes can hold one rank.
6. **Leave** (timeout, interrupt) by voiding the generation too, so those left
   waiting regroup instead of being released into a world without us.
"""

from __future__ import annotations

import logging
import random
import re
import time as _time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

from .errors import (
    ConfigError,
    CorruptStateError,
    FsmingleError,
    RankConflictError,
    RecordError,
    RendezvousTimeoutError,
)
from .records import Beacon, Claim, HostId, Member, Release, decode, encode
from .store import Store

log = logging.getLogger("fsmingle")

GEN_RE = re.compile(r"^gen-(\d{8})$")
CLAIM_RE = re.compile(r"^rank-(\d{5,})\.claim$")
RELEASE = "release.json"
MAX_GENERATION = 99_999_999


def gen_name(g: int) -> str:
    return f"gen-{g:08d}"


def claim_name(g: int, r: int) -> str:
    return f"{gen_name(g)}/rank-{r:05d}.claim"


def beacon_name(g: int, instance: str) -> str:
    return f"{gen_name(g)}/beacon-{instance}.json"


def release_name(g: int) -> str:
    return f"{gen_name(g)}/{RELEASE}"


@dataclass(frozen=True)
class Timing:
    """Polling and liveness settings, all in seconds.

    Defaults keep a waiting participant under 4 filesystem metadata operations
    per second (``1/poll_max`` release reads + 2 per heartbeat + 1 rank-0 check
    per heartbeat), whatever the world size; sites whose metadata servers need
    less raise ``poll_max`` and ``stale_after``.

    Attributes:
        poll_min (float): first delay between release reads after a change.
        poll_max (float): steady-state delay between release reads.
        backoff (float): factor from one delay to the next (> 1).
        jitter (float): each delay is scaled by a random factor in ``1 ± jitter``.
        stale_after (float): a remote participant whose heartbeat counter did
            not change for this long (observer's monotonic clock) is dead.
            Must exceed the mount's attribute-cache timeout (NFS ``actimeo``)
            several times over.
        heartbeat (float | None): heartbeat period; default ``stale_after / 3``.
        scan_interval (float): how often the rank-0 coordinator lists the
            generation directory.
        status_interval (float): how often a non-coordinator lists it, for
            progress reports only.
        probe_timeout (float): TCP connect timeout when probing the master.
    """

    poll_min: float = 0.01
    poll_max: float = 0.28
    backoff: float = 1.6
    jitter: float = 0.1
    stale_after: float = 30.0
    heartbeat: float | None = None
    scan_interval: float = 1.0
    status_interval: float = 30.0
    probe_timeout: float = 2.0

    def __post_init__(self):
        for name in ("poll_min", "poll_max", "stale_after", "scan_interval", "status_interval", "probe_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.poll_max < self.poll_min:
            raise ConfigError("poll_max must be at least poll_min")
        if self.heartbeat is not None and not 0 < self.heartbeat < self.stale_after:
            raise ConfigError("heartbeat must be positive and below stale_after")

    @property
    def heartbeat_period(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.stale_after / 3


class Clock(Protocol):
    """Time source; tests pass a fake one."""

    def monotonic(self) -> float: ...
    def time(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock (``time.monotonic``, ``time.time``, ``time.sleep``)."""

    monotonic = staticmethod(_time.monotonic)
    time = staticmethod(_time.time)
    sleep = staticmethod(_time.sleep)


@dataclass(frozen=True)
class Progress:
    """What a waiting participant knows, for progress displays.

    Attributes:
        job_id (str), generation (int), mode (str), size (int): the world.
        present (tuple[int, ...] | None): ranks claimed, if known (None until
            this participant has listed the directory).
        missing (tuple[int, ...] | None): ranks not claimed, if known.
        rank (int | None): the rank this participant holds.
        elapsed (float): seconds since the rendezvous started.
        remaining (float): seconds until the timeout.
        state (str): ``joining``, ``waiting``, ``contesting``, ``world-full``.
        note (str): the latest notable event ("generation 3 voided: ...").
    """

    job_id: str
    generation: int
    mode: str
    size: int
    present: tuple[int, ...] | None
    missing: tuple[int, ...] | None
    rank: int | None
    elapsed: float
    remaining: float
    state: str
    note: str = ""


@dataclass
class _Seen:
    counter: int
    changed_at: float
    missing_since: float | None = None


class Participant:
    """One participant's side of the protocol, driven by :meth:`step`.

    Args:
        store (Store): the job directory.
        job_id (str): the job id (for records and messages).
        mode (str): ``"node"`` or ``"rank"``.
        size (int): nnodes or world size.
        rank (int | None): requested rank, None for first-come.
        addr (str): IP address this participant announces.
        instance (str): unique hex id of this process.
        me (HostId): this process's identity.
        timeout (float): seconds until :class:`RendezvousTimeoutError`.
        timing (Timing): polling and liveness settings.
        master_port (int | None): port the master should hold (None: any free one).
        restart_count (int): ``SLURM_RESTART_COUNT`` of this run.
        clock (Clock): time source.
        local_alive (Callable[[HostId, HostId], bool | None]): direct liveness
            check of a process in our pid space (see :mod:`fsmingle.hostinfo`).
        probe (Callable[[str, int, str, float], bool | None]): master prober
            (see :func:`fsmingle.netaddr.probe_master`).
        reserve_port (Callable[[int, str], object]): returns an object with
            ``.port`` and ``.close()`` holding the master port.
        on_progress (Callable[[Progress], None] | None): progress callback.
        cleaner (Callable[[int], None] | None): called with a new generation
            number after this participant created it (removes old ones).
        rng (random.Random | None): for jitter.
    """

    def __init__(
        self,
        store: Store,
        *,
        job_id: str,
        mode: str,
        size: int,
        rank: int | None,
        addr: str,
        instance: str,
        me: HostId,
        timeout: float,
        timing: Timing = Timing(),
        master_port: int | None = None,
        restart_count: int = 0,
        slurm_job_id: str = "",
        clock: Clock = SystemClock(),
        local_alive: Callable[[HostId, HostId], bool | None] = lambda a, b: None,
        probe: Callable[[str, int, str, float], bool | None] = lambda *a: None,
        reserve_port: Callable[[int, str], object] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        cleaner: Callable[[int], None] | None = None,
        version: str = "",
        rng: random.Random | None = None,
    ):
        self.store, self.job_id, self.mode, self.size = store, job_id, mode, size
        self.want_rank, self.addr, self.instance, self.me = rank, addr, instance, me
        self.timing, self.master_port_wanted, self.restart_count = timing, master_port, restart_count
        self.slurm_job_id = slurm_job_id
        self.clock, self.local_alive, self.probe = clock, local_alive, probe
        self.reserve_port, self.on_progress, self.cleaner = reserve_port, on_progress, cleaner
        self.version = version
        self.rng = rng or random.Random()
        self.started = clock.monotonic()
        self.deadline = self.started + timeout
        self.timeout = timeout
        self.state = "join"
        self.gen: int | None = None
        self.rank: int | None = None
        self.heartbeat = 0
        self.reservation = None
        self.result: Release | None = None
        self.delay = timing.poll_min
        self._reset_gen_state()
        self.note = ""
        self._last_progress: tuple | None = None
        self.ever_present: set[int] = set()  # ranks seen claimed in any generation of this attempt
        self._warned: set[str] = set()
        self._grace = False  # deadline extended once to read a decision that exists

    # ------------------------------------------------------------------ helpers
    def _reset_gen_state(self) -> None:
        self.claims: dict[int, str] = {}  # rank -> instance; claims are immutable within a generation
        self.beacons: dict[str, Beacon] = {}
        self.seen: dict[str, _Seen] = {}
        self.contest_holder: str | None = None
        self.contest_since = 0.0
        self.release_bad_since: float | None = None
        self.present: tuple[int, ...] | None = None
        now = self.clock.monotonic()
        self.next_hb = now + self.timing.heartbeat_period
        self.next_scan = now + self.timing.scan_interval
        self.next_check = now + self.timing.heartbeat_period
        self.next_status = now + self.timing.status_interval
        self.delay = self.timing.poll_min

    def _beacon(self) -> Beacon:
        held = self.reservation.port if (self.reservation is not None and self.rank is not None) else None
        port = held if self.rank == 0 else None
        return Beacon(
            job_id=self.job_id, generation=self.gen or 0, instance=self.instance, mode=self.mode,
            size=self.size, rank=self.rank, addr=self.addr, master_port=port, heartbeat=self.heartbeat,
            restart_count=self.restart_count, host=self.me, wall_time=self.clock.time(), version=self.version,
            slurm_job_id=self.slurm_job_id, probe_port=held,
        )

    def _publish_beacon(self) -> None:
        self.store.publish(beacon_name(self.gen, self.instance), encode(self._beacon()))

    def _read_release(self, g: int) -> Release | None | bool:
        """Release of generation g; None if absent; False if present but unusable."""
        data = self.store.read(release_name(g))
        if data is None:
            return None
        try:
            rel = decode(data, Release)
        except RecordError as e:
            log.warning("unusable %s: %s", release_name(g), e)
            return False
        if rel.job_id != self.job_id or rel.generation != g:
            log.warning("%s names job %r generation %d; ignored", release_name(g), rel.job_id, rel.generation)
            return False
        return rel

    def _warn_once(self, name: str, msg: str) -> None:
        # Polling re-reads the same bad file many times a second: say it once.
        if name not in self._warned:
            self._warned.add(name)
            log.warning("ignoring %s: %s", self.store_path(name), msg)

    def _read_beacon(self, instance: str) -> Beacon | None:
        name = beacon_name(self.gen, instance)
        data = self.store.read(name)
        if data is None:
            return None
        try:
            b = decode(data, Beacon)
        except RecordError as e:
            # A torn write can't happen (atomic rename); what stays unusable is named.
            self._warn_once(name, f"{e}; its holder counts as silent until it writes a valid beacon")
            return None
        if b.instance != instance or b.generation != self.gen or b.job_id != self.job_id:
            return None
        self.beacons[instance] = b
        return b

    def _read_claim(self, r: int) -> str | None:
        if r in self.claims:
            return self.claims[r]
        data = self.store.read(claim_name(self.gen, r))
        if data is None:
            return None
        try:
            c = decode(data, Claim)
        except RecordError as e:
            self._warn_once(claim_name(self.gen, r), f"{e}; its rank is treated as held by a silent participant")
            return None
        if c.rank != r:
            return None
        self.claims[r] = c.instance
        return c.instance

    def _judge(self, instance: str | None, now: float, key: str | None = None) -> str:
        """'alive', 'dead' or 'unknown' for the holder ``instance`` (None: claim unreadable, tracked under ``key``)."""
        key = instance or key or "?"
        b = self._read_beacon(instance) if instance else None
        s = self.seen.get(key)
        if b is None:
            if s is None:
                s = self.seen[key] = _Seen(-1, now, now)
            if s.missing_since is None:
                s.missing_since = now
            return "dead" if now - s.missing_since >= self.timing.stale_after else "unknown"
        if b.restart_count < self.restart_count and b.slurm_job_id == self.slurm_job_id:
            return "dead"  # a beacon of the run Slurm requeued away (same job, earlier incarnation)
        verdict = self.local_alive(self.me, b.host)
        if s is None:
            s = self.seen[key] = _Seen(b.heartbeat, now)
        s.missing_since = None
        changed = False
        if b.heartbeat != s.counter:
            # Appearing after being unreadable is not evidence of a heartbeat.
            changed = s.counter != -1
            s.counter, s.changed_at = b.heartbeat, now
        if verdict is not None:
            return "alive" if verdict else "dead"
        if now - s.changed_at >= self.timing.stale_after:
            return "dead"
        return "alive" if changed else "unknown"

    def _void(self, reason: str) -> bool:
        """Create the generation's restart decision; False if a decision already existed."""
        rel = Release(job_id=self.job_id, generation=self.gen, state="restart", mode=self.mode, size=self.size,
                      master_addr=None, master_port=None, members=(), writer=self.instance, reason=reason,
                      wall_time=self.clock.time())
        created = self.store.create(release_name(self.gen), encode(rel))
        if created:
            log.warning("job %s generation %d voided: %s", self.job_id, self.gen, reason)
        self.delay = self.timing.poll_min
        return created

    def _emit(self) -> None:
        if self.on_progress is None:
            return
        now = self.clock.monotonic()
        missing = None if self.present is None else tuple(r for r in range(self.size) if r not in self.present)
        p = Progress(self.job_id, self.gen or 0, self.mode, self.size, self.present, missing, self.rank,
                     now - self.started, max(0.0, self.deadline - now), self.state, self.note)
        self.on_progress(p)

    def _set_present(self, present: tuple[int, ...]) -> None:
        self.ever_present.update(present)
        if present != self.present:
            self.present = present
            self._emit()

    # ------------------------------------------------------------------ steps
    def step(self) -> Release | None:
        """Do one unit of work; return the release once this participant is released.

        Returns:
            Release | None: the release record naming this participant, or None
            (call again after :meth:`next_delay` seconds).

        Raises:
            RankConflictError: the requested rank is held by a live process.
            ConfigError: another participant declared a different world size or mode.
            CorruptStateError: the release record stayed unusable for ``stale_after`` seconds.
            StorageError, UnsafeDirectoryError: from the store.
            RendezvousTimeoutError: the deadline passed (the generation is voided first).
        """
        try:
            if self.clock.monotonic() >= self.deadline:
                return self._on_timeout()
            return getattr(self, "_step_" + self.state.replace("-", "_"))()
        except FileNotFoundError:
            # Our generation directory was retired under us (cleaned as stale):
            # the world we were in no longer exists; join afresh.
            log.info("generation %s disappeared; joining again", self.gen)
            self._rejoin()
            return None

    def next_delay(self) -> float:
        """Seconds to wait before the next :meth:`step` (backoff with jitter)."""
        d = self.delay * (1 + self.timing.jitter * (2 * self.rng.random() - 1))
        self.delay = min(self.timing.poll_max, self.delay * self.timing.backoff)
        return max(0.0, min(d, self.deadline - self.clock.monotonic()))

    def _rejoin(self) -> None:
        if self.reservation is not None and self.want_rank != 0:
            self.reservation.close()
            self.reservation = None
        self.rank = None
        self.state = "join"
        self.delay = self.timing.poll_min

    def _step_join(self) -> None:
        names = self.store.listdir("")
        gens = [int(m.group(1)) for m in map(GEN_RE.match, names) if m]
        g = max(gens) if gens else 1
        if self.gen is not None and g <= self.gen:
            g = self.gen + 1  # never rejoin a generation we left
        created = False
        while True:
            if g > MAX_GENERATION:
                raise CorruptStateError(f"job {self.job_id} exhausted generation numbers; run `fsmingle clean`")
            created = self.store.mkdir(gen_name(g))
            rel = self._read_release(g)
            if rel is None:
                break
            if rel and rel.state == "released":
                self.note = (f"generation {g} was already released to {rel.size} participant(s) before this one "
                             f"arrived; waiting in generation {g + 1} (a late participant, or a re-run)")
                log.info("job %s: %s", self.job_id, self.note)
            g += 1
        self.gen = g
        self._reset_gen_state()
        self.rank = None
        if created and self.cleaner is not None:
            try:
                self.cleaner(g)
            except FsmingleError as e:  # cleaning is a courtesy; never fail a join over it
                log.warning("could not clean old generations: %s", e)
        self._publish_beacon()
        self.state = "claim"
        self._emit()
        return self._step_claim()

    def _ensure_reservation(self) -> None:
        if self.reservation is None and self.reserve_port is not None:
            self.reservation = self.reserve_port(self.master_port_wanted or 0, self.instance)

    def _step_claim(self) -> Release | None:
        if self.want_rank is not None:
            r = self.want_rank
            if r == 0:
                self._ensure_reservation()  # fail on a busy --port before claiming anything
            if self.store.create(claim_name(self.gen, r), encode(Claim(r, self.instance))) or \
                    self._read_claim(r) == self.instance:
                return self._hold(r)
            self.claims.pop(r, None)
            self.state = "contesting"
            self.contest_holder = self._read_claim(r)
            self.contest_since = self.clock.monotonic()
            self.note = f"rank {r} is already claimed in generation {self.gen}; checking whether its holder is alive"
            log.info("job %s: %s", self.job_id, self.note)
            self._emit()
            return self._step_contesting()
        taken = {int(m.group(1)) for m in map(CLAIM_RE.match, self.store.listdir(gen_name(self.gen))) if m}
        for r in range(self.size):
            if r in taken:
                continue
            if r == 0:
                try:
                    self._ensure_reservation()
                except ConfigError:
                    # --port busy on this host: most likely a first-come peer on
                    # this node is about to take rank 0 with it; try rank 1 on.
                    if self.size == 1:
                        raise
                    continue
            if self.store.create(claim_name(self.gen, r), encode(Claim(r, self.instance))):
                return self._hold(r)
            if r == 0 and self.reservation is not None:
                self.reservation.close()
                self.reservation = None
        self.state = "world-full"
        self.note = f"all {self.size} ranks of generation {self.gen} are claimed; watching their holders"
        self._emit()
        return None

    def _hold(self, r: int) -> Release | None:
        self.rank = r
        self.claims[r] = self.instance
        if r != 0 and self.reservation is not None and self.master_port_wanted:
            self.reservation.close()  # the --port is for rank 0 only
            self.reservation = None
        if r != 0 and self.reservation is None and self.reserve_port is not None:
            # Every rank holder listens, so the participant completing the
            # world can prove each remote member alive right before releasing.
            self.reservation = self.reserve_port(0, self.instance)
        self._publish_beacon()
        self.state = "waiting"
        self.delay = self.timing.poll_min
        if r != 0:
            self._check_master(self.clock.monotonic(), first=True)
        self._scan(self.clock.monotonic(), liveness=False)  # we may be the one completing the world
        self._emit()
        return None

    def _poll(self) -> Release | None | bool:
        rel = self._read_release(self.gen)
        now = self.clock.monotonic()
        if rel is False:
            if self.release_bad_since is None:
                self.release_bad_since = now
            elif now - self.release_bad_since >= self.timing.stale_after:
                raise CorruptStateError(
                    f"{self.store_path(release_name(self.gen))} has stayed unusable for "
                    f"{self.timing.stale_after:.0f} s (see the warning above); remove it or run "
                    f"`fsmingle clean --dir ... {self.job_id}` and start again"
                )
            return None
        self.release_bad_since = None
        return rel

    def store_path(self, name: str) -> str:
        return getattr(self.store, "path", lambda n: n)(name)

    def _heartbeat_if_due(self, now: float) -> None:
        if now >= self.next_hb:
            self.heartbeat += 1
            self._publish_beacon()
            self.next_hb = now + self.timing.heartbeat_period

    def _step_waiting(self) -> Release | None:
        rel = self._poll()
        if rel is not None:
            if rel.state == "released":
                if rel.members[self.rank].instance == self.instance:
                    return self._done(rel)
                raise CorruptStateError(f"generation {self.gen} was released without this participant at rank {self.rank}")
            self.note = f"generation {self.gen} voided: {rel.reason}"
            log.info("job %s: %s; joining generation %d", self.job_id, self.note, self.gen + 1)
            self._rejoin()
            return None
        now = self.clock.monotonic()
        self._heartbeat_if_due(now)
        if self.rank == 0:
            if now >= self.next_scan:
                liveness = now >= self.next_check
                if liveness:
                    self.next_check = now + self.timing.heartbeat_period
                self._scan(now, liveness=liveness)
                self.next_scan = now + self.timing.scan_interval
        else:
            if now >= self.next_check:
                self._check_master(now)
                self.next_check = now + self.timing.heartbeat_period
            if now >= self.next_status and self.on_progress is not None:
                self._count(now)
        self._emit_periodic(now)
        return None

    def _emit_periodic(self, now: float) -> None:
        key = (self.gen, self.present, self.state, int(now - self.started) // 10)
        if key != self._last_progress:
            self._last_progress = key
            self._emit()

    def _count(self, now: float) -> None:
        names = self.store.listdir(gen_name(self.gen))
        self._set_present(tuple(sorted(int(m.group(1)) for m in map(CLAIM_RE.match, names) if m)))
        self.next_status = now + self.timing.status_interval

    def _check_master(self, now: float, first: bool = False) -> None:
        inst = self._read_claim(0)
        if inst is None:
            return
        verdict = self._judge(inst, now)
        b = self.beacons.get(inst)
        if b is not None and (b.size != self.size or b.mode != self.mode):
            self._void(f"rank 0 expects {b.mode} mode with size {b.size}; rank {self.rank} expects {self.mode} mode with size {self.size}")
            raise ConfigError(
                f"this participant expects a world of {self.size} ({self.mode} mode) but rank 0 on "
                f"{b.host.hostname} expects {b.size} ({b.mode} mode); give every node the same --nnodes/--world-size"
            )
        if verdict == "dead":
            self._void(f"master (rank 0, {b.host.hostname if b else 'unknown host'}) is dead or stopped heartbeating")

    def _scan(self, now: float, liveness: bool) -> None:
        names = self.store.listdir(gen_name(self.gen))
        if RELEASE in names:
            return  # decided; the next poll reads it
        listed = sorted(r for r in (int(m.group(1)) for m in map(CLAIM_RE.match, names) if m) if r < self.size)
        if not liveness and len(listed) < self.size:
            # Incomplete and no liveness round due: the listing is all we need.
            # Reading every claim here would make N joiners read O(N^2) files.
            self._set_present(tuple(listed))
            return
        unreadable = [r for r in listed if self._read_claim(r) is None]
        for r in unreadable:
            # A claim that exists but cannot be read blocks its rank: judge it
            # like a silent holder, so it is voided after stale_after.
            if self._judge(None, now, key=f"?rank{r}") == "dead":
                self._void(f"rank {r}'s claim stayed unreadable for {self.timing.stale_after:g} s")
                return
        present = tuple(sorted(r for r in self.claims if r < self.size))
        self._set_present(present)
        complete = len(present) == self.size
        if not (liveness or complete):
            return
        for r, inst in sorted(self.claims.items()):
            if inst == self.instance:
                continue
            if self._judge(inst, now) == "dead":
                b = self.beacons.get(inst)
                self._void(f"rank {r} ({b.host.hostname if b else 'beacon unreadable'}) is dead or stopped heartbeating")
                return
        if not complete:
            return
        members = []
        for r in range(self.size):
            b = self.beacons.get(self.claims[r]) if self.claims[r] != self.instance else self._beacon()
            if b is None:
                return  # not visible here yet; the coordinator will retry
            if b.size != self.size or b.mode != self.mode:
                log.error("rank %d on %s expects size %d (%s mode), this one %d (%s mode); not releasing",
                          r, b.host.hostname, b.size, b.mode, self.size, self.mode)
                return
            members.append(Member(rank=r, instance=b.instance, addr=b.addr, host=b.host))
        master = self._beacon() if self.rank == 0 else self.beacons[self.claims[0]]
        if master.master_port is None:
            return  # rank 0 has not published its port yet
        if self.rank != 0:
            # Never release into a dead master: it must answer on its port, now.
            answer = self.probe(master.addr, master.master_port, master.instance, self.timing.probe_timeout)
            if answer is False:
                self._void(f"master {master.addr}:{master.master_port} ({master.host.hostname}) does not answer")
                return
            if answer is None:
                log.warning("cannot reach the master at %s:%d from this node (firewall? wrong --iface?); "
                            "leaving the release to rank 0", master.addr, master.master_port)
                return
        if not self._probe_members(members):
            return
        rel = Release(job_id=self.job_id, generation=self.gen, state="released", mode=self.mode, size=self.size,
                      master_addr=master.addr, master_port=master.master_port, members=tuple(members),
                      writer=self.instance, wall_time=self.clock.time())
        self.store.create(release_name(self.gen), encode(rel))
        self.delay = self.timing.poll_min

    def _probe_members(self, members: list[Member]) -> bool:
        """Check, right before releasing, that every remote non-master member answers; void if one is gone.

        Same-host members were already checked directly (psutil); the master
        was probed above.  Heartbeats alone cannot show that a member died in
        the last ``stale_after`` seconds; its listener can.
        """
        todo = []
        for m in members[1:]:
            b = self.beacons.get(m.instance)
            if m.instance == self.instance or b is None or b.probe_port is None:
                continue
            if self.local_alive(self.me, b.host) is None:
                todo.append((m.rank, b))
        if not todo:
            return True
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(32, len(todo))) as pool:
            answers = list(pool.map(
                lambda rb: self.probe(rb[1].addr, rb[1].probe_port, rb[1].instance, self.timing.probe_timeout), todo))
        dead = [(r, b) for (r, b), a in zip(todo, answers) if a is False]
        if dead:
            r, b = dead[0]
            self._void(f"rank {r} ({b.host.hostname}, {b.addr}) does not answer on its probe port: it is gone")
            return False
        unreachable = [r for (r, _), a in zip(todo, answers) if a is None]
        if unreachable:
            log.warning("cannot reach ranks %s from this node (firewall? wrong --iface?)%s", _ranges(unreachable),
                        "" if self.rank == 0 else "; leaving the release to rank 0")
            return self.rank == 0
        return True

    def _step_contesting(self) -> Release | None:
        r = self.want_rank
        rel = self._poll()
        if rel is not None:
            if rel.state == "released":
                holder = rel.members[r]
                raise RankConflictError(
                    f"rank {r} of job {self.job_id} was taken by another process (pid {holder.host.pid} on "
                    f"{holder.host.hostname}, {holder.addr}), which was released in generation {self.gen}; "
                    "give each node a distinct rank, or omit the rank for first-come assignment"
                )
            self._rejoin()
            return None
        now = self.clock.monotonic()
        self._heartbeat_if_due(now)
        holder = self.contest_holder or self._read_claim(r)
        self.contest_holder = holder
        verdict = self._judge(holder, now)
        b = self.beacons.get(holder) if holder else None
        if verdict == "alive":
            where = f"pid {b.host.pid} on {b.host.hostname} ({b.addr})" if b else "another process"
            self.state = "failed"
            raise RankConflictError(
                f"rank {r} of job {self.job_id} is already held by a live process: {where}; "
                "give each node a distinct rank, or omit the rank for first-come assignment"
            )
        if verdict == "dead":
            self._void(f"rank {r}'s holder is dead; replaced by pid {self.me.pid} on {self.me.hostname}")
            self._rejoin()
        return None

    def _step_world_full(self) -> Release | None:
        rel = self._poll()
        if rel is not None:
            if rel.state == "released":
                self.note = (f"generation {self.gen} was released to {self.size} participants without this one "
                             f"(a late participant); waiting in generation {self.gen + 1}")
                log.warning("job %s: %s", self.job_id, self.note)
            self._rejoin()
            return None
        now = self.clock.monotonic()
        self._heartbeat_if_due(now)
        if now >= self.next_check:
            self.next_check = now + min(self.timing.heartbeat_period, 1.0)
            self._scan(now, liveness=True)
        return None

    def _done(self, rel: Release) -> Release:
        self.result = rel
        self.state = "done"
        if self.reservation is not None:
            self.reservation.close()  # torch binds this port next
            self.reservation = None
        return rel

    def _on_timeout(self) -> Release | None:
        if self.rank is not None and self.gen is not None and self.state == "waiting" and not self._grace:
            if not self._void(f"rank {self.rank} timed out after {self.timeout:g} s; it left") and \
                    not self._read_release(self.gen):
                # A decision exists that our (cached) view cannot show yet: it may
                # name us.  Keep polling it for stale_after more seconds instead
                # of leaving a world that is about to start with us as a member.
                self._grace = True
                self.deadline = self.clock.monotonic() + self.timing.stale_after
                log.info("deadline passed, but generation %d has a decision this node cannot read yet; "
                         "waiting up to %g s for it", self.gen, self.timing.stale_after)
                return None
        rel = self.withdraw(f"rank {self.rank} timed out after {self.timeout:g} s")
        if rel is not None:
            return rel
        missing, present = self._missing()
        never = [r for r in missing if r not in self.ever_present]
        if never:
            # Ranks that never showed up in any generation are the news; ranks
            # that did and then left (voided generations) are not.
            missing = never
        who = "node ranks" if self.mode == "node" else "ranks"
        if missing:
            what = (f"missing {who} {_ranges(missing)} ({len(missing)} of {self.size})"
                    if len(missing) <= 64 else f"{len(missing)} of {self.size} {who} missing")
        else:
            what = f"all {self.size} {who} were claimed but no release was written (an unreachable master?)"
        note = f"; {self.note}" if self.note else ""
        raise RendezvousTimeoutError(
            f"rendezvous for job {self.job_id} timed out after {self.timeout:g} s in generation {self.gen}: "
            f"{what}{note}. Directory: {self.store_path(gen_name(self.gen) if self.gen else '')}. "
            "Start the missing participants with the same --dir and --job-id (or raise --timeout); "
            "the directory is left ready for a retry",
            missing=missing, present=len(present),
        )

    def _missing(self) -> tuple[list[int], list[int]]:
        if self.gen is None:
            return list(range(self.size)), []
        for g in (self.gen, self.gen + 1):
            names = self.store.listdir(gen_name(g))
            present = sorted(int(m.group(1)) for m in map(CLAIM_RE.match, names) if m)
            self.ever_present.update(present)
            if g == self.gen or present:
                best = present
        return [r for r in range(self.size) if r not in best], best

    def withdraw(self, reason: str) -> Release | None:
        """Leave the rendezvous (timeout, interrupt): void our generation so others regroup.

        Returns:
            Release | None: the release, if it turned out this participant had
            already been released (the void lost the race to a release).
        """
        if self.reservation is not None:
            self.reservation.close()
            self.reservation = None
        if self.gen is None or self.state in ("done",):
            return self.result
        try:
            if self.rank is not None:
                self._void(f"{reason}; it left")
                rel = self._read_release(self.gen)
                if rel and rel.state == "released" and rel.members[self.rank].instance == self.instance:
                    self.result = rel
                    self.state = "done"
                    return rel
            self.store.remove(beacon_name(self.gen, self.instance))
        except (OSError, FsmingleError) as e:
            log.warning("could not withdraw cleanly: %s", e)
        self.state = "failed"
        return None

    def run(self) -> Release:
        """Step until released; the blocking form of :meth:`step`. Raises as :meth:`step` does."""
        try:
            while True:
                rel = self.step()
                if rel is not None:
                    return rel
                self.clock.sleep(self.next_delay())
        except BaseException as e:
            if self.state not in ("done", "failed") and not isinstance(e, RendezvousTimeoutError):
                self.withdraw(f"rank {self.rank} stopped ({e.__class__.__name__})")
            raise


def _ranges(nums: list[int]) -> str:
    """``[0,1,2,5]`` -> ``"0-2, 5"``."""
    out, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}" if j > i + 1 else f"{nums[i]}, {nums[j]}")
        i = j + 1
    return ", ".join(out)
