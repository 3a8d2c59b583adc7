"""Ending a wait: reading a decision after losing rank 0, timing out, withdrawing (mixed into ``Participant``).

A participant never walks away from a generation in which it holds a claim without voiding it;
if its void loses the race to a release that names it (it had acknowledged), the release stands.
"""

from __future__ import annotations

import logging

from ..errors import CorruptStateError, FsmingleError, RecordError, RendezvousTimeoutError
from ..fs.layout import GEN_RE, beacon_name, gen_name, ranges, release_name
from ..fs.records import Release
from .decision import Placement
from .parts_state import GenView, Identity, Seat, Timers, Wiring
from .states import State

log = logging.getLogger("fsmingle")


class Leaving:
    """DECIDING, timeouts and withdrawal (see the module doc)."""

    # The state this part acts on (fsmingle.protocol.parts_state; made by Participant.__init__).
    seat: Seat  # DECIDING, DONE or FAILED; closes the role and the hub; in_doubt, result
    view: GenView  # the decision read (release_bad_since), the missing ranks for a timeout
    timers: Timers  # timeout; the deadline's one grace to read a decision; retired_check (the root listed)
    ident: Identity  # reads: instance, job_id, mode, size
    wiring: Wiring  # reads: store, clock, timing

    def decision_for_me(self, rel: Release) -> Placement | None:
        """My placement in a released record, or None if it does not name this instance at this rank."""
        from .decision import placements

        if not rel.released:
            return None
        mine = [k for k, m in enumerate(rel.members) if m.instance == self.ident.instance]
        if not mine:
            return None
        self.seat.released_members = tuple([m.host.hostname, m.addr, m.arrival] for m in rel.members)
        return placements(list(rel.members), rel.mode, rel.master_port, rel.generation)[mine[0]]

    def enter_deciding(self, why: str) -> None:
        """Inside the commit window with the decision unknown (a member lost rank 0 after its ack,
        rank 0's create of release.json failed): read the decision until it shows."""
        self.seat.state = State.DECIDING
        self.set_note(f"{why}; reading generation {self.view.gen}'s decision")
        self.seat.drop_role()

    def _step_deciding(self) -> Placement | None:
        rel = self.read_release(self.view.gen)
        now = self.wiring.clock.monotonic()
        if isinstance(rel, RecordError):
            self._bad_release(now)
            return None
        if isinstance(rel, Release):
            rel = self.with_members(rel)
        if isinstance(rel, RecordError):
            self._bad_release(now)
            return None
        if rel is None:
            if now < self.timers.retired_check:
                return None  # the root was listed less than stale_after ago (below): read the decision again
            # Once per stale_after, not per poll: the listing is of the whole job directory (every
            # generation, beacon and claim of a big world), and stale_after is the bound the rule
            # below answers within anyway (a member stalled that long in its commit window).
            self.timers.retired_check = now + self.wiring.timing.stale_after
            names = self.wiring.store.listdir("")
            gens = [int(m.group(1)) for m in map(GEN_RE.match, names) if m]
            if gen_name(self.view.gen) not in names and max(gens, default=0) >= self.view.gen + 2:
                # Retired under us: only decided generations two below one being joined are
                # (cleanup.retire_decided_below), never the newest released one, so a world
                # formed after this one's decision and another generation began; whatever it
                # decided is over (a release naming us is kept while no newer one exists).  Reading on would
                # wait for the --timeout (a member stopped in its commit window: SIGSTOP, swap).
                # One listing (a snapshot of the directory) shows g + 2 without g only once g
                # is gone: a listing that lags shows neither.
                self.set_note(f"generation {self.view.gen} was decided and retired while this node read its decision")
                self.rejoin()
            return None  # exists (our void lost the race) but not visible here yet: read again
        self.view.release_bad_since = None
        mine = self.decision_for_me(rel)
        if mine is not None:
            return self._done(mine)
        self.set_note(f"generation {self.view.gen} voided: {rel.reason or 'released without this participant'}")
        self.rejoin()
        return None

    def _bad_release(self, now: float) -> None:
        if self.view.release_bad_since is None:
            self.view.release_bad_since = now
        elif now - self.view.release_bad_since >= self.wiring.timing.stale_after:
            raise CorruptStateError(
                f"{self.store_path(release_name(self.view.gen))} has stayed unusable for "
                f"{self.wiring.timing.stale_after:.0f} s (see the warning above); remove it or run "
                f"`fsmingle clean --dir ... {self.ident.job_id}` and start again"
            )

    def _on_timeout(self) -> Placement | None:
        if self.seat.state is State.DECIDING and not self.timers.grace:
            # A decision exists that our (cached) view cannot show yet: it may
            # name us.  Keep reading it for stale_after more seconds instead of
            # leaving a world that is about to start with us in it.
            self.timers.grace = True
            self.timers.deadline = self.wiring.clock.monotonic() + self.wiring.timing.stale_after
            log.info(
                "deadline passed, but generation %d has a decision this node cannot read yet; "
                "waiting up to %g s for it",
                self.view.gen,
                self.wiring.timing.stale_after,
            )
            return None
        why = self.seat.role.missing_description() if self.seat.role is not None else None
        placement = self.withdraw(f"rank {self.seat.rank} timed out after {self.timers.timeout:g} s")
        if placement is not None:
            return placement
        if self.seat.state is State.DECIDING or why is None:
            missing = self.view.missing_hint
            who = "node ranks" if self.ident.mode == "node" else "ranks"
            if self.seat.state is State.DECIDING:
                why = (
                    f"generation {self.view.gen} has a decision this node could not read within "
                    f"{self.wiring.timing.stale_after:g} s (filesystem caches?)"
                )
            elif missing:
                missing = self.never_seen(missing)
                why = (
                    f"missing {who} {ranges(missing)} ({len(missing)} of {self.ident.size})"
                    if len(missing) <= 64
                    else f"{len(missing)} of {self.ident.size} {who} missing"
                )
            else:
                why = f"no complete world of {self.ident.size} formed"
        note = f"; {self.seat.note}" if self.seat.note else ""
        raise RendezvousTimeoutError(
            f"rendezvous for job {self.ident.job_id} timed out after {self.timers.timeout:g} s in generation {self.view.gen}: "
            f"{why}{note}. Directory: {self.store_path(gen_name(self.view.gen) if self.view.gen else '')}. "
            "Start the missing participants with the same --dir and --job-id (or raise --timeout); "
            "the directory is left ready for a retry",
            missing=list(self.view.missing_hint or []),
            present=len(self.view.present or ()),
        )

    def withdraw(self, reason: str) -> Placement | None:
        """Leave the rendezvous (timeout, interrupt, error): void our generation so others regroup.

        The commit window (``docs/protocol.md``): once this participant acknowledged a release
        (a member) or attempted the create of ``release.json`` (rank 0), a release naming it may
        exist.  It then never says void unless it created or read a restart record: its void is
        an exclusive create that races only with the release; if it loses, the decision is read
        back (:meth:`_read_decision_in_doubt`), and a release that names it stands -- rank 0
        sends the members their go and returns its placement.  A decision that cannot be read
        leaves this participant *in doubt* (``self.seat.in_doubt``): it says nothing to anyone, and
        every member that acknowledged reads ``release.json`` itself.

        Returns:
            Placement | None: this participant's placement if the release stands with it in it.
        """
        acked = self.seat.state is State.DECIDING or (
            self.seat.role is not None and getattr(self.seat.role, "acked", False)
        )
        active = self.view.gen is not None and self.seat.state not in (State.DONE, State.FAILED)
        self.seat.in_doubt = False
        decided: Release | None = None  # the decision read back (or our own void)
        voided = False
        if active and self.seat.rank is not None:
            # Void first, then close: the decision record then says why we left (not
            # "lost its connection", which rank 0 would write on seeing it drop).
            try:
                voided = self.void(f"{reason}; it left")
            except (OSError, FsmingleError) as e:
                log.warning("could not withdraw cleanly: %s", e)
            if not voided and acked:
                decided = self._read_decision_in_doubt()
                self.seat.in_doubt = decided is None
        mine = self.decision_for_me(decided) if decided is not None else None
        if self.seat.role is not None:
            try:
                if mine is not None:
                    self.seat.role.leaving("", released=decided)
                else:
                    # "void" on the wire only where no release can exist: nothing acknowledged, or
                    # a restart record created by us or read back.
                    self.seat.role.leaving(f"{reason}; it left", voided=voided or not acked or decided is not None)
            except (OSError, FsmingleError) as e:
                # Telling the others is a courtesy: what this participant is, the record says (a
                # released rank 0 whose go could not leave still starts; the members that miss it
                # lose the connection and read release.json).  Found by the fault enumeration.
                log.warning("could not tell the others how this participant leaves: %s", e)
            self.seat.drop_role()  # rank 0 sees the connection drop at once
        self.seat.drop_hub()  # released: torch binds the master port next
        if mine is not None:
            self.seat.result, self.seat.state = mine, State.DONE
            return mine
        if not active:
            return self.seat.result
        if self.seat.in_doubt:
            log.warning(
                "job %s: could not read generation %d's decision after acknowledging its release; a release "
                "naming this participant (rank %s) may stand, and the others then start without it",
                self.ident.job_id,
                self.view.gen,
                self.seat.rank,
            )
        else:
            try:
                self.wiring.store.remove(beacon_name(self.view.gen, self.ident.instance))
            except (OSError, FsmingleError) as e:
                log.warning("could not remove this participant's beacon: %s", e)
        self.seat.state = State.FAILED
        return None

    def _read_decision_in_doubt(self, attempts: int = 8) -> Release | None:
        """Read this generation's decision after our void lost the race: the record (members
        loaded), or None if it stayed unreadable or invisible for ``attempts`` reads spread over
        up to ``stale_after`` seconds.  Before each read again, one listing of the generation: our
        own joining looked ``release.json`` up before it existed, and GlusterFS nl-cache keeps
        that "absent" for its timeout (61 s, over the default ``--stale-after``) unless a listing
        shows the name (it links the inode, which nl-cache consults first; measured, see
        ``fsmingle.fs.store.stat_existing``).  Found by the re-run enumeration: such a member
        exited in doubt while the release named it."""
        end = self.wiring.clock.monotonic() + self.wiring.timing.stale_after
        delay = self.wiring.timing.poll_min
        for k in range(attempts):
            try:
                rel = self.read_release(self.view.gen)
                rel = self.with_members(rel) if isinstance(rel, Release) else rel
            except (OSError, FsmingleError) as e:
                log.debug("reading generation %d's decision: %s", self.view.gen, e)
                rel = None
            if isinstance(rel, Release):
                return rel
            if k + 1 == attempts or self.wiring.clock.monotonic() + delay > end:
                return None
            self.wiring.clock.sleep(delay)
            try:
                self.wiring.store.listdir(gen_name(self.view.gen))  # the cure (docstring); its names are not needed
            except (OSError, FsmingleError) as e:
                log.debug("listing generation %d: %s", self.view.gen, e)
            delay = min(2 * delay * self.wiring.timing.backoff, max(0.0, end - self.wiring.clock.monotonic()))
        return None
