"""Participants outside a world: contesting an explicit rank, or watching a full generation.

* **Contesting**: the rank asked for is claimed.  Its holder is judged from
  the filesystem (:mod:`fsmingle.protocol.liveness`): alive -> :class:`RankConflictError`
  (exit 6, naming the holder); dead -> void the generation and claim in the next.
* **World full** (first-come, every rank claimed): watch the holders; a dead
  one voids the generation; a release without us means we arrived late.
* **A spare** (world full, or waiting in the next generation after a release without us, with
  nobody else there yet): given ``--spare-timeout``, its ``--timeout`` is held (a spare waits for
  a world that runs for hours, not for peers that are late), bounded by ``--spare-timeout``
  instead; once another participant is present where it waits, a world forms with it, and
  ``--timeout`` starts over in full.  Without ``--spare-timeout`` a spare waits ``--timeout``
  like anyone: a re-run, or a survivor restarted by its loop, looks the same (it too finds the
  generation released without its new process), and must still fail after ``--timeout`` naming
  the ranks that never came.
* **Spares only fill places** (issue 29).  A participant given ``--spare-timeout`` that found its
  generation full or released without it is *started as a spare* (:meth:`OutsideWorld.become_spare`,
  for the life of the process); its beacon and hello say so.  Rank 0 never releases a world whose
  every rank a spare holds (:func:`fsmingle.protocol.decision.decide`): two spares of a running
  world would otherwise start a second training of the same job.  Such a world waits for a
  survivor or a re-run; one that finds it full (world full, or contesting its explicit rank)
  voids it and takes a place in the next generation.  A spare counts as backing (its ``--timeout``
  held) until a participant that is not a spare is present.  Without ``--spare-timeout`` nobody is
  a spare: a re-run, or a survivor restarted by its loop, cannot be told from a late participant,
  and a whole job re-run must still make its world; given it, a restarted survivor *is* a spare
  (give ``--spare-timeout`` to the spares' commands only, docs/slurm.md).

Mixed into :class:`fsmingle.protocol.participant.Participant`.
"""

from __future__ import annotations

import logging

from ..errors import RankConflictError, RecordError, RendezvousTimeoutError
from ..fs.layout import beacon_name, claimed_ranks, gen_name
from ..fs.records import Beacon, Release
from .decision import Placement
from .liveness import Verdict
from .parts_state import GenView, Identity, Seat, Spares, Timers, Wiring
from .states import State

log = logging.getLogger("fsmingle")


class OutsideWorld:
    """Steps of a participant that holds no rank in its generation (see the module doc)."""

    # The state this part acts on (fsmingle.protocol.parts_state; made by Participant.__init__).
    seat: Seat  # CONTEST and WORLD_FULL; FAILED on a live holder
    spares: Spares  # the spare's standing and its held --timeout
    view: GenView  # the contested holder, the decision read, who is present
    timers: Timers  # deadline (a place opened: --timeout runs again), next_check of the holders
    ident: Identity  # reads: job_id, instance, want_rank, me, size, restart_count, slurm_job_id
    wiring: Wiring  # reads: store, clock, timing

    def _poll_decision(self) -> Release | None:
        """Outside a world (contesting, world-full): the generation's decision if one shows."""
        rel = self.read_release(self.view.gen)
        now = self.wiring.clock.monotonic()
        if isinstance(rel, RecordError):
            # An unusable decision still means "decided": this generation will
            # never release us; move on (the record's writer meant to end it).
            self._bad_release(now)
            return None
        self.view.release_bad_since = None
        return rel

    def _step_contesting(self) -> Placement | None:
        r = self.ident.want_rank
        rel = self._poll_decision()
        if rel is not None:
            if rel.released:
                return self._released_while_contesting(r, rel)
            self.rejoin()
            return None
        now = self.wiring.clock.monotonic()
        self.heartbeat_if_due(now)
        holder = self.view.contest_holder or self.read_claim(r)
        self.view.contest_holder = holder
        if holder == self.ident.instance:
            # The claim is ours: our create took effect, reported an error, and a negative lookup
            # entry left by that error hid it from the read-back and after the EEXIST of the retry
            # (Joining.create_record).  Found by the model: this node judged its own beacon alive
            # and failed itself with RankConflictError.
            log.info(
                "job %s: rank %d of generation %d was claimed by this node after all",
                self.ident.job_id,
                r,
                self.view.gen,
            )
            return self.hold(r)
        verdict, b = self.judge_rank(r, now, holder)
        if r != 0 and self._rank0_vouch(r, now) is Verdict.ALIVE:
            self.view.contest_life = True  # rank 0 heartbeats, vouching for the holder: a world forms
        if verdict is Verdict.ALIVE and self._displaces(b):
            self.void(
                f"rank {r} is held by a spare (pid {b.host.pid} on {b.host.hostname}); pid {self.ident.me.pid} on "
                f"{self.ident.me.hostname}, not a spare, takes a place: a world is never made of spares alone"
            )
            self.rejoin()
            return None
        if verdict is Verdict.ALIVE:
            where = f"pid {b.host.pid} on {b.host.hostname} ({b.addr})" if b else "another process"
            self.seat.state = State.FAILED
            raise RankConflictError(
                f"rank {r} of job {self.ident.job_id} is already held by a live process: {where}; "
                "give each node a distinct rank, or omit the rank for first-come assignment" + self._conflict_hint(b)
            )
        if verdict is Verdict.DEAD:
            self.void(f"rank {r}'s holder is dead; replaced by pid {self.ident.me.pid} on {self.ident.me.hostname}")
            self.rejoin()
        return None

    def _conflict_hint(self, holder: Beacon | None) -> str:
        """What to add to a rank conflict whose cause is not "two nodes were given one rank".

        A spare holding the rank (its beacon says so) replaced this node while it was away: cut
        off, stopped, or late (:mod:`fsmingle.protocol.partition`, protocol rule 11; found by the
        partition adversary: an explicit rank 0 cut off, then healed, failed with a message that
        sent the user to look for a duplicated ``--node-rank``).  Without the holder's beacon, a
        node that stepped down or withdrew and has had no network contact since was most likely
        cut off while its rank went elsewhere."""
        if holder is not None and holder.spare:
            return (
                "; but that process is a spare that took this node's place while this node was away (cut off, "
                "stopped or late): nothing is duplicated -- the world runs without this node; restart it without "
                "a rank to wait as a spare (--spare-timeout)"
            )
        n = self.seat.stepdowns
        if not n:
            return ""
        return (
            f"; but this node reached none of its peers before (it stepped down or withdrew {n} time(s) since its "
            "last network contact): its rank most likely went to another node while this one was cut off -- "
            "check this node's network (--iface/--addr, routes, firewalls), then restart it without a rank"
        )

    def _released_while_contesting(self, r: int, rel: Release) -> None:
        """Generation ``gen``, where rank ``r`` is claimed by another, shows released.

        Named a duplicate (exit 6) only if this contester saw that world alive: the holder's beacon
        changed between two looks, or rank 0's did while it vouched for the holder
        (``contest_life``; a world forming with two nodes given rank ``r``).  Otherwise the world was released
        before this participant could tell, and it is a late one -- a re-run, or a restart --
        which joins the next generation as a late first-come participant would (and is a spare
        there, given ``--spare-timeout``).  A re-run reaches here when a negative lookup cache
        (bindfs ``negative_timeout``, NFS lookupcache, GlusterFS nl-cache) answered the previous
        run's ``release.json`` "absent" by name and a lagging listing did not show it either
        (found by the re-run enumeration, ``tests/model_rerun.py``: before, it failed with
        RankConflictError although its rank's holder had ended with the previous run).

        Raises:
            RankConflictError: the holder of rank ``r`` is alive and was released with it.
        """
        holder = rel.members[r] if r < len(rel.members) else None
        where = f"pid {holder.host.pid} on {holder.host.hostname}, {holder.addr}" if holder else "another process"
        now = self.wiring.clock.monotonic()
        verdict, hb = self.judge_rank(r, now, holder.instance if holder else None)
        if (
            self.view.contest_life
            or verdict is Verdict.ALIVE
            or (r != 0 and self._rank0_vouch(r, now) is Verdict.ALIVE)
        ):
            self.seat.state = State.FAILED
            raise RankConflictError(
                f"rank {r} of job {self.ident.job_id} was taken by another process ({where}), which was released "
                f"in generation {self.view.gen}; give each node a distinct rank, or omit the rank for first-come "
                "assignment" + self._conflict_hint(hb)
            )
        self.set_note(
            f"generation {self.view.gen} was released with rank {r} held by {where} before this participant could see "
            f"it alive: joining generation {self.view.gen + 1} (a re-run or a restart; if not, two nodes were given "
            f"rank {r})"
        )
        self._note_released(self.view.gen, rel)  # a spare now, given --spare-timeout (its note wins)
        self.rejoin()

    def _step_world_full(self) -> Placement | None:
        rel = self._poll_decision()
        if rel is not None:
            if rel.released and self.spare_of(self.view.gen, rel):
                self.spares.spare_for = self.view.gen
                self.set_note(
                    f"generation {self.view.gen} was released to {self.ident.size} participants without this one "
                    f"(a late participant); waiting in generation {self.view.gen + 1} as a spare",
                    logging.WARNING,
                )
            self.rejoin()
            return None
        now = self.wiring.clock.monotonic()
        self.heartbeat_if_due(now)
        if now >= self.timers.next_check:
            self.timers.next_check = now + min(self.wiring.timing.heartbeat_period, 1.0)
            spares: list[Beacon] = []
            for r in claimed_ranks(self.wiring.store.listdir(gen_name(self.view.gen))):
                if r >= self.ident.size:
                    continue
                verdict, b = self.judge_rank(r, now)
                if verdict is Verdict.DEAD:
                    self.void(
                        f"rank {r} ({b.host.hostname if b else 'beacon unreadable'}) is dead or stopped heartbeating"
                    )
                    self.rejoin()
                    return None
                if self._displaces(b):
                    spares.append(b)
            if len(spares) >= self.ident.size:
                # Every rank held by a live spare: that world waits for one like us (decision.decide
                # never releases it).  Void it; the next generation is made with us in it.
                self.void(
                    f"all {self.ident.size} ranks of generation {self.view.gen} are held by spares; pid {self.ident.me.pid} on "
                    f"{self.ident.me.hostname}, not a spare, takes a place: a world is never made of spares alone"
                )
                self.rejoin()
        return None

    def _displaces(self, holder: Beacon | None) -> bool:
        """Whether this participant, not a spare, may void a generation for ``holder``'s rank: the
        holder's own beacon says it was started as a spare (a spare never displaces a spare)."""
        return not self.spares.spare and holder is not None and holder.spare

    # ------------------------------------------------------------------ spares
    def become_spare(self) -> None:
        """This participant found its generation full or released without it: given
        ``--spare-timeout``, it is a spare from now on, for the life of the process (module doc)."""
        if self.spares.hold.bound is not None and not self.spares.spare:
            self.spares.spare = True
            log.info(
                "job %s: started as a spare: it takes a place, never makes a world with spares alone", self.ident.job_id
            )

    def spare_of(self, g: int, rel: Release) -> bool:
        """Whether generation ``g``, released (``rel``) without this participant, makes it a spare.

        Not when that world is a later run of this same job (a Slurm requeue: its rank 0's beacon
        names this job with a higher ``SLURM_RESTART_COUNT``, the rule of
        :class:`~fsmingle.protocol.liveness.Judge`): this process is a leftover of the run that
        was requeued away, which no world will come back for, so its ``--timeout`` runs (then it
        fails, exit 7).  One read, once per released generation found; unreadable: a spare.
        """
        if not rel.members:
            return True  # members in chunk files: rank 0 unknown without reading them; a spare
        b = self._load(beacon_name(g, rel.members[0].instance), Beacon)
        later_run = isinstance(b, Beacon) and b.restart_count > self.ident.restart_count
        if later_run and b.slurm_job_id == self.ident.slurm_job_id:
            self.set_note(
                f"generation {g} was released to run {b.restart_count} of this job (SLURM_RESTART_COUNT); "
                f"this process belongs to run {self.ident.restart_count}, requeued away: not a spare, --timeout runs",
                logging.WARNING,
            )
            return False
        return True

    def spare_backing(self) -> int:
        """The generation this participant backs as a spare now, 0 if it is not one (module doc).

        Returns:
            int: the generation found full (world full), or released without it (``spare_for``)
            while it waits where nobody else is present yet; 0 otherwise.
        """
        if self.seat.state is State.WORLD_FULL:
            return self.view.gen or 0
        if not self.spares.spare_for or self.seat.state not in (State.JOIN, State.WAIT):
            return 0
        # Rank 0 counts itself present; a member hears who is present from rank 0, itself included.
        # A spare backs until one that is not a spare is present (spares alone make no world).
        others = (
            0
            if self.view.present is None
            else len(self.view.present) - (self.view.present_spares if self.spares.spare else 0)
        )
        return self.spares.spare_for if others <= (0 if self.spares.spare else 1) else 0

    def spare_holding(self) -> int:
        """:meth:`spare_backing` while its ``--timeout`` is held, 0 otherwise.

        Held only when given ``--spare-timeout``: without it a spare waits ``--timeout`` like
        anyone (today's rule).  A re-run, or a survivor restarted by its loop, finds the last
        generation released without it too and cannot be told from a spare: holding by default
        would let a re-run whose peers never come wait until its job's time limit instead of
        failing after ``--timeout``, naming them.
        """
        return self.spare_backing() if self.spares.hold.bound is not None else 0

    def spare_tick(self, now: float) -> bool:
        """Hold ``--timeout`` while this participant is a spare; say so when that starts or ends.

        Args:
            now (float): monotonic seconds.

        Returns:
            bool: True once it waited ``--spare-timeout`` as a spare (:meth:`_spare_timeout`).
        """
        backs = self.spare_holding()
        was, self.spares.backs = self.spares.backs, backs
        if backs and not was:
            bound = self.spares.hold.bound
            limit = f"up to --spare-timeout {bound:g} s" if bound is not None else "with no limit (--spare-timeout)"
            held = f"a spare for generation {backs}: --timeout is held while it waits for a place, {limit}"
            self.set_note(f"{self.seat.note}; {held}" if self.seat.note else held)
        elif was and not backs:
            # A place opened: peers wait for this one now, so it gets the whole --timeout from here.
            self.timers.deadline = max(self.timers.deadline, now + self.timers.timeout)
            self.set_note(
                f"no longer a spare for generation {was}: a place opened; --timeout ({self.timers.timeout:g} s) runs from now"
            )
        return self.spares.hold.tick(self.timers, now, True, bool(backs))

    def _spare_timeout(self) -> Placement | None:
        """``--spare-timeout`` passed: leave (voiding a generation it holds a rank in), then fail.

        Raises:
            RendezvousTimeoutError: naming the generation it backed (exit 7).
        """
        backs, bound, gen = self.spares.backs, self.spares.hold.bound, self.view.gen
        placement = self.withdraw(f"a spare for generation {backs} waited --spare-timeout {bound:g} s")
        if placement is not None:
            return placement  # released with it after all (the commit window): the release stands
        raise RendezvousTimeoutError(
            f"rendezvous for job {self.ident.job_id}: waited {self.spares.hold.held_for:.0f} s as a spare for generation "
            f"{backs} (--spare-timeout {bound:g} s) and no place opened: the world of generation {backs} neither "
            f"lost a member nor came back for one. Directory: {self.store_path(gen_name(gen) if gen else '')}. "
            "Raise --spare-timeout, or start the spare again when the world needs one",
            present=len(self.view.present or ()),
        )
