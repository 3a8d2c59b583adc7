"""The rendezvous driver (protocol v2): join a generation, claim a rank, then wait as rank 0 or as a member.

This module drives; :mod:`fsmingle.fs.store` touches the filesystem,
:mod:`fsmingle.net.channel` the network, :mod:`fsmingle.protocol.decision` decides the
release and :mod:`fsmingle.protocol.liveness` judges peers from their heartbeats.  The
store, clock, transport and liveness oracle are arguments, so the same code
runs on a real shared directory with TCP and on the stale in-memory filesystem
and fake network of the model tests.

The rules (``docs/protocol.md`` gives the reason for each):

1. **Join** the newest generation that has no decision; if the newest is
   decided, create the next one.  A decided generation is never joined, so a
   re-run or requeue with the same job id never reads a previous run's state.
   Directories are created (``mkdir``) before anyone looks their names up, so
   a negative lookup cache cannot hide them.
2. **Claim** a rank by exclusive creation (``link()``): the given rank, or
   first-come rank 0 if free, else a free rank chosen by this instance's hash
   (no thundering herd on the lowest free rank).  After ``EEXIST`` the claim is
   read back: a lost ``link()`` reply must not make one process hold two ranks.
3. **Rank 0** holds the master port (listening, close-on-exec) from before its
   claim until exec, and publishes its endpoint in the generation's
   ``master/`` directory.
4. **Members** find that endpoint by listing ``master/``, connect to it and
   identify themselves; rank 0 checks each identity against the claim on the
   filesystem.  While connected a member makes (almost) no filesystem
   operations: liveness travels over the connection (pings both ways).
5. **Release** (:mod:`fsmingle.protocol.rank0.coordinator`): when every rank holds a verified
   connection, rank 0 asks each member to acknowledge, creates ``release.json``
   (exclusive: it races only with voids), sends each member its placement and
   waits for them to close.  A lost, silent or unacknowledging member voids the
   generation instead: **no release on absence of evidence**.
6. **Void** by exclusively creating ``release.json`` with state ``restart``;
   everyone regroups in the next generation.  A participant never leaves a
   generation in which it holds a claim without voiding it; an ``ENOENT`` on a
   directory that was there is confirmed by listing its parent before anything
   acts on it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from ..errors import (
    FsmingleError,
    InterruptedInCommitWindow,
    RendezvousTimeoutError,
)
from ..fs.layout import (
    beacon_name,
    gen_name,
    master_dir,
    release_name,
)
from ..fs.records import Beacon, HostId, Release, ReleaseState, encode
from ..fs.store import Store
from .decision import Placement
from .genreader import GenerationReader
from .hold import DeadlineHold
from .joining import Joining
from .leaving import Leaving
from .liveness import Judge
from .outside import OutsideWorld
from .partition import Rank0Shyness
from .parts_state import GenView, Identity, Seat, Spares, Timers, Wiring, compat_properties
from .states import Progress, RankSet, State
from .testhooks import pause
from .timing import Clock, SystemClock, Timing

log = logging.getLogger("fsmingle")


# Re-exported for callers of v1 (cleanup, status, tests).
from ..fs.layout import CLAIM_RE, RELEASE  # noqa: E402,F401

__all__ = ["Participant", "Progress", "State", "SystemClock", "Timing", "Clock"]


@compat_properties
class Participant(Joining, Leaving, GenerationReader, OutsideWorld, Rank0Shyness):
    """One participant's side of the protocol, driven by :meth:`step` (or :meth:`run`).

    Args:
        store (Store): the job directory.
        job_id (str): the job id (for records and messages).
        mode (str): ``"node"`` or ``"rank"``.
        size (int): nnodes or world size.
        rank (int | None): requested rank, None for first-come.
        addr (str): IP address this participant announces (rank 0: the master address).
        instance (str): unique hex id of this process.
        me (HostId): this process's identity.
        timeout (float): seconds until :class:`RendezvousTimeoutError`.
        timing (Timing): polling and liveness settings.
        master_port (int | None): port rank 0 should hold (None: any free one).
        restart_count (int), slurm_job_id (str): ``SLURM_RESTART_COUNT`` and ``SLURM_JOB_ID``.
        scheduler (tuple[tuple[str, str], ...]): this job's scheduler identity, for the beacon.
        spare_timeout (float | None): seconds this participant may wait as a spare (it found its
            generation full, or released without it); its ``timeout`` is held meanwhile and runs
            in full once a world forms with it (:mod:`.outside`); ``math.inf``: no bound.  None: a
            spare waits ``timeout`` like anyone (nothing held).
        clock (Clock): time source.
        local_alive (Callable[[HostId, HostId], bool | None]): direct liveness
            check of a process in our pid space (see :mod:`fsmingle.net.hostinfo`).
        transport (fsmingle.net.channel.Transport): listens (rank 0) and connects (members).
        on_progress (Callable[[Progress], None] | None): progress callback.
        cleaner (Callable[[int], None] | None): called with a new generation
            number after this participant created it (removes old ones).
        rng (random.Random | None): for jitter.
        rank_order (str): how rank 0 orders first-come ranks at release: ``arrival``, ``host``,
            ``nodelist`` or ``key`` (see :func:`fsmingle.protocol.decision.order_members`); rank 0's setting rules.
        topology_key (str): this node's key for ``rank_order="key"`` (rack, switch, NVLink domain).
        nodelist (tuple[str, ...]): expanded ``SLURM_JOB_NODELIST`` for ``rank_order="nodelist"``.
        want_members (bool): ask rank 0 for the whole member list at release (hostfiles).
        check_mesh (bool): before the release every node proves it reaches its ring
            neighbours (see :mod:`fsmingle.net.mesh`); rank 0's setting rules.
    """

    # The state its parts share (fsmingle.protocol.parts_state), made here.
    ident: Identity  # who it is and what it asks for (fixed)
    wiring: Wiring  # store, transport, clock, timing, callbacks
    view: GenView  # its generation: claims, who is present, the decision read
    seat: Seat  # its state, rank, role, master port, placement
    timers: Timers  # deadline, heartbeat and check due, delay
    spares: Spares  # its standing as a spare

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
        transport,
        timing: Timing = Timing(),
        master_port: int | None = None,
        restart_count: int = 0,
        slurm_job_id: str = "",
        scheduler: tuple = (),
        queue=None,
        spare_timeout: float | None = None,
        clock: Clock = SystemClock(),
        local_alive: Callable[[HostId, HostId], bool | None] = lambda a, b: None,
        on_progress: Callable[[Progress], None] | None = None,
        cleaner: Callable[[int], None] | None = None,
        version: str = "",
        rng: random.Random | None = None,
        rank_order: str = "arrival",
        topology_key: str = "",
        nodelist: tuple[str, ...] = (),
        want_members: bool = False,
        check_mesh: bool = False,
    ):
        self.ident = Identity(
            job_id=job_id,
            mode=mode,
            size=size,
            want_rank=rank,
            addr=addr,
            instance=instance,
            me=me,
            master_port_wanted=master_port,
            restart_count=restart_count,
            slurm_job_id=slurm_job_id,
            scheduler=tuple(scheduler),
            version=version,
            rank_order=rank_order,
            topology_key=topology_key,
            nodelist=tuple(nodelist),
            want_members=want_members,
            check_mesh=check_mesh,
        )
        # queue: a protocol.queue.QueueWatch or None
        self.wiring = Wiring(store, transport, timing, clock, local_alive, rng or random.Random(), queue)
        self.wiring.on_progress, self.wiring.cleaner = on_progress, cleaner
        started = clock.monotonic()
        self.timers = Timers(started=started, timeout=timeout, deadline=started + timeout, delay=timing.poll_min)
        self.spares = Spares(DeadlineHold(spare_timeout))  # --timeout held while a spare (OutsideWorld.spare_tick)
        self.seat = Seat()
        self.view = GenView()
        self._reset_gen_state()

    # ------------------------------------------------------------------ small helpers
    def _reset_gen_state(self) -> None:
        timing = self.wiring.timing
        i = self.ident
        self.view.reset(Judge(i.me, timing.stale_after, self.wiring.local_alive, i.restart_count, i.slurm_job_id))
        self.timers.due(self.wiring.clock.monotonic(), timing.heartbeat_period)
        self.timers.delay = timing.poll_min
        if self.wiring.queue is not None:
            self.wiring.queue.forget()

    def beacon(self, endpoint: bool = False) -> Beacon:
        """This participant's beacon as of now (rank 0's carries the master port, and in the
        generation directory -- not the ``endpoint`` copy every joiner reads -- its vouch; only
        the ``endpoint`` copy carries the channel secret)."""
        i, seat, q = self.ident, self.seat, self.wiring.queue
        port = seat.hub.port if (seat.hub is not None and seat.rank == 0) else None
        vouch = getattr(seat.role, "vouch", None) if seat.rank == 0 and not endpoint else None
        # The channel secret goes in the endpoint record only (master/): see fsmingle.net.channel.
        secret = getattr(seat.role, "secret", "") if seat.rank == 0 and endpoint else ""
        return Beacon(
            job_id=i.job_id,
            generation=self.view.gen or 0,
            instance=i.instance,
            mode=i.mode,
            size=i.size,
            rank=seat.rank,
            addr=i.addr,
            master_port=port,
            heartbeat=self.timers.heartbeat,
            restart_count=i.restart_count,
            host=i.me,
            wall_time=self.wiring.clock.time(),
            version=i.version,
            slurm_job_id=i.slurm_job_id,
            scheduler=i.scheduler,
            queue=tuple(q.lines) if q is not None and seat.rank == 0 else (),
            queue_word=q.relay.word(q) if q is not None and seat.rank else None,
            spare_for=self.spare_backing(),
            spare=self.spares.spare,
            vouch=vouch() if vouch else "",
            secret=secret,
        )

    def publish_beacon(self) -> None:
        # read back on an error
        self.publish_record(beacon_name(self.view.gen, self.ident.instance), encode(self.beacon()))
        pause("beacon")  # tests only: a member whose claim and beacon are written, before its hello

    def heartbeat_if_due(self, now: float, period: float | None = None) -> None:
        if now >= self.timers.next_hb:
            # Due time first: a failing write (ENOENT from a lying cache) must
            # not be retried at every step against the metadata server.
            self.timers.next_hb = now + (period or self.wiring.timing.heartbeat_period)
            self.timers.heartbeat += 1
            self.publish_beacon()

    def prepare_next(self) -> None:
        """Create the next generation's directories *before* deciding this one.

        Whoever learns of the decision then finds the next generation already
        there, so nobody's first lookup of its name can precede its creation --
        on GlusterFS with ``nl-cache`` a lookup that raced a creation keeps the
        name "absent" on that client for 60 s even after ``mkdir`` said EEXIST
        (measured in ``tests/test_realfs.py``).  A courtesy: failures are ignored.
        """
        try:
            self.wiring.store.mkdir(gen_name(self.view.gen + 1))
            self.wiring.store.mkdir(master_dir(self.view.gen + 1))
        except (OSError, FsmingleError) as e:
            log.debug("could not prepare generation %d: %s", self.view.gen + 1, e)

    def restart_record(self, g: int, reason: str) -> bytes:
        """The encoded restart decision of generation ``g`` written by this participant."""
        rel = Release(
            job_id=self.ident.job_id,
            generation=g,
            state=ReleaseState.RESTART,
            mode=self.ident.mode,
            size=self.ident.size,
            master_addr=None,
            master_port=None,
            members=(),
            writer=self.ident.instance,
            reason=reason[:1000],
            wall_time=self.wiring.clock.time(),
            # who joined, carried forward
            jobs=self.wiring.queue.record_jobs() if self.wiring.queue is not None else (),
        )
        return encode(rel)

    def void(self, reason: str) -> bool:
        """Create this generation's restart decision; False if a decision already existed."""
        self.prepare_next()
        created = self.create_record(release_name(self.view.gen), self.restart_record(self.view.gen, reason))
        if created:
            log.warning("job %s generation %d voided: %s", self.ident.job_id, self.view.gen, reason)
        self.timers.delay = self.wiring.timing.poll_min
        return created

    def emit(self) -> None:
        if self.wiring.on_progress is None:
            return
        now = self.wiring.clock.monotonic()
        missing = None if self.view.present is None else self.view.present.missing
        self.wiring.on_progress(
            Progress(
                self.ident.job_id,
                self.view.gen or 0,
                self.ident.mode,
                self.ident.size,
                self.view.present,
                missing,
                self.seat.rank,
                now - self.timers.started,
                max(0.0, self.timers.deadline - now),
                self.seat.state.value,
                self.seat.note,
                self.spares.backs,
                **(self.wiring.queue.progress() if self.wiring.queue is not None else {}),
            )
        )

    def set_present(self, present: RankSet) -> None:
        """Record who is present now (rank 0's connections, or its last status message)."""
        gone = frozenset(present.missing)
        self.view.never_present = gone if self.view.never_present is None else self.view.never_present & gone
        if present != self.view.present:
            self.view.present = present
            self.view.missing_hint = list(present.missing)
            self.emit()

    def never_seen(self, missing: list[int]) -> list[int]:
        """The ranks of ``missing`` never present in this attempt (all of them if none qualifies)."""
        never = self.view.never_present
        return [r for r in missing if never is None or r in never] or missing

    def queue_news(self, word=None) -> None:
        """Rank 0's findings on peer jobs (``word``: its status message's ``queue``) into the note."""
        if self.wiring.queue is not None:
            if word is not None:
                self.wiring.queue.from_wire(word)
            if self.wiring.queue.lines:
                self.set_note("; ".join(self.wiring.queue.lines)[:1000])
            elif self.seat.note.startswith("missing"):
                self.seat.note = ""

    def set_note(self, note: str, level: int = logging.INFO, *, waiting: bool = False) -> None:
        """Show ``note`` (logged at ``level``); ``waiting``: it is rank 0's word on whom it waits for (``Seat``)."""
        if note != self.seat.note:
            self.seat.note = note
            self.seat.waiting_why = note if waiting else ""
            log.log(level, "job %s: %s", self.ident.job_id, note)
            self.emit()

    # ------------------------------------------------------------------ driver
    def step(self) -> Placement | None:
        """Do one unit of work; return this participant's placement once it is released.

        Returns:
            Placement | None: None means call again after :meth:`wait` (:meth:`next_delay` seconds).

        Raises:
            RankConflictError: the requested rank is held by a live process.
            WorldSizeMismatchError: rank 0 expects another world size or mode.
            CorruptStateError: a decision record stayed unusable for ``stale_after`` seconds.
            StorageError, UnsafeDirectoryError, UnsupportedFilesystemError: from the store.
            RendezvousTimeoutError: the deadline passed, or a spare waited ``spare_timeout`` (its
                generation is voided first).
        """
        try:
            now = self.wiring.clock.monotonic()
            if self.spare_tick(now):  # a spare's --timeout is held; past --spare-timeout it fails
                return self._spare_timeout()
            q = self.wiring.queue
            if q is not None:  # pending peer jobs hold the deadline; an ended one fails now
                waiting = self.seat.state is State.WAIT and not self.spares.backs
                if q.peers:  # rank 0 missing: the lowest present rank asks (queue_relay)
                    q.relay.step(q, self, now, waiting)
                q.tick(self, now, waiting)
            if self.wiring.clock.monotonic() >= self.timers.deadline:
                return self._on_timeout()
            if self.seat.state is State.JOIN:
                return self._step_join()
            if self.seat.state is State.WAIT:
                return self._step_role()
            if self.seat.state is State.DECIDING:
                return self._step_deciding()
            if self.seat.state is State.CONTEST:
                return self._step_contesting()
            if self.seat.state is State.WORLD_FULL:
                return self._step_world_full()
            raise RuntimeError(f"step() called in state {self.seat.state.value}")
        except FileNotFoundError:
            return self._on_enoent()

    def next_delay(self) -> float:
        """Seconds to wait before the next :meth:`step` (backoff with jitter)."""
        seat, t, timing = self.seat, self.timers, self.wiring.timing
        base = seat.role.delay() if (seat.state is State.WAIT and seat.role is not None) else t.delay
        if t.enoent_since is not None:
            base = max(base, t.delay)  # retrying after a (cached) ENOENT: back off, never spin
        d = base * (1 + timing.jitter * (2 * self.wiring.rng.random() - 1))
        t.delay = min(timing.poll_max, t.delay * timing.backoff)
        return max(0.0, min(d, t.deadline - self.wiring.clock.monotonic()))

    def wait(self, seconds: float) -> None:
        """Block up to ``seconds``; returns early when a message arrives on the channel."""
        if self.seat.state is State.WAIT and self.seat.role is not None:
            self.seat.role.wait(seconds)
        else:
            self.wiring.clock.sleep(seconds)

    def rejoin(self) -> None:
        """Leave the current generation (already decided or voided by us) for the next one."""
        self.seat.drop_role()
        if not (self.ident.want_rank == 0 and self.ident.master_port_wanted):
            self.seat.drop_hub()
        if self.view.gen is not None:
            self.view.left = max(self.view.left, self.view.gen)
        self.seat.rank = None
        self.seat.state = State.JOIN
        self.timers.delay = self.wiring.timing.poll_min
        self.timers.enoent_since = None

    def hold(self, r: int | None) -> Placement | None:
        """Take rank ``r`` (claimed) and its role; ``None``: a member that asks rank 0 for a free rank."""
        from .member import Member
        from .rank0.coordinator import Coordinator

        self.seat.rank = r
        if r != 0:
            self.seat.drop_hub()  # only rank 0 holds a port
        if r is not None:
            self.publish_beacon()
        self.seat.state = State.WAIT
        self.timers.delay = self.wiring.timing.poll_min
        self.seat.role = Coordinator(self) if r == 0 else Member(self)
        self.emit()
        placement = self.seat.role.step()
        # A world of one is released in its first step (Coordinator: prepare, then commit at once):
        # end it as _step_role does, or the hub keeps the master port that torch binds next (found:
        # fsmingle.worlds(nnodes=1) failed EADDRINUSE in init_process_group).
        return self._done(placement) if placement is not None else None

    def _step_role(self) -> Placement | None:
        placement = self.seat.role.step()
        if placement is not None:
            return self._done(placement)
        return None

    def _done(self, placement: Placement) -> Placement:
        self.seat.result = placement
        self.seat.rank = placement.rank  # the final rank (--rank-order may renumber first-come ranks)
        self.seat.state = State.DONE
        self.seat.drop_role()
        self.seat.drop_hub()  # torch binds this port next
        return placement

    def run(self) -> Placement:
        """Step until released; the blocking form of :meth:`step`.

        Any exception or interrupt (``KeyboardInterrupt``, e.g. from SIGTERM) withdraws
        (:meth:`Leaving.withdraw`).  Inside the commit window -- rank 0 attempted the create of
        ``release.json``, or this member acknowledged the release -- the decision is read back
        first: if it released this participant, the release stands and is returned, whatever
        the exception was (the others are starting with us; a storage error after a create
        that took effect must not split the world).

        Raises:
            As :meth:`step` (when the release does not stand).
            KeyboardInterrupt: after a clean withdrawal.
            InterruptedInCommitWindow: interrupted in the commit window and the decision could
                not be read back: a release naming this participant may stand.
        """
        try:
            while True:
                placement = self.step()
                if placement is not None:
                    return placement
                self.wait(self.next_delay())
        except BaseException as e:
            if self.seat.state not in (State.DONE, State.FAILED) and not isinstance(e, RendezvousTimeoutError):
                placement = self.withdraw(f"rank {self.seat.rank} stopped ({e.__class__.__name__})")
                if placement is not None:
                    log.warning(
                        "%s, but generation %d had already been released with this participant as rank %d; "
                        "the release stands",
                        "interrupted" if isinstance(e, KeyboardInterrupt) else f"{e.__class__.__name__}: {e}",
                        placement.generation,
                        placement.rank,
                    )
                    return placement
                if self.seat.in_doubt and isinstance(e, KeyboardInterrupt):
                    raise InterruptedInCommitWindow(
                        f"interrupted in the commit window of job {self.ident.job_id} generation {self.view.gen}: its "
                        "decision could not be read back, so a release naming this participant may stand",
                        self.ident.job_id,
                        self.view.gen,
                        self.seat.rank,
                    ) from e
            raise
