"""Ending a wait: reading a decision after losing rank 0, timing out, withdrawing (mixed into ``Participant``).

A participant never walks away from a generation in which it holds a claim without voiding it;
if its void loses the race to a release that names it (it had acknowledged), the release stands.
"""

from __future__ import annotations

import logging

from .decision import Placement
from .errors import CorruptStateError, FsmingleError, RecordError, RendezvousTimeoutError
from .layout import beacon_name, gen_name, ranges, release_name
from .records import Release
from .states import State

log = logging.getLogger("fsmingle")


class Leaving:
    """DECIDING, timeouts and withdrawal (see the module doc)."""

    def decision_for_me(self, rel: Release) -> Placement | None:
        """My placement in a released record, or None if it does not name this instance at this rank."""
        from .decision import placements

        if rel.state != "released":
            return None
        mine = [k for k, m in enumerate(rel.members) if m.instance == self.instance]
        if not mine:
            return None
        self.released_members = tuple([m.host.hostname, m.addr, m.arrival] for m in rel.members)
        return placements(list(rel.members), rel.mode, rel.master_port, rel.generation)[mine[0]]

    def enter_deciding(self, why: str) -> None:
        """We acknowledged a release and lost rank 0 before its go: read the decision until it shows."""
        self.state = State.DECIDING
        self.set_note(f"lost rank 0 after acknowledging the release ({why}); reading generation {self.gen}'s decision")
        if self.role is not None:
            self.role.close()
            self.role = None

    def _step_deciding(self) -> Placement | None:
        rel = self.read_release(self.gen)
        now = self.clock.monotonic()
        if isinstance(rel, RecordError):
            self._bad_release(now)
            return None
        if isinstance(rel, Release):
            rel = self.with_members(rel)
        if isinstance(rel, RecordError):
            self._bad_release(now)
            return None
        if rel is None:
            return None  # exists (our void lost the race) but not visible here yet: read again
        self.release_bad_since = None
        mine = self.decision_for_me(rel)
        if mine is not None:
            return self._done(mine)
        self.set_note(f"generation {self.gen} voided: {rel.reason or 'released without this participant'}")
        self.rejoin()
        return None

    def _bad_release(self, now: float) -> None:
        if self.release_bad_since is None:
            self.release_bad_since = now
        elif now - self.release_bad_since >= self.timing.stale_after:
            raise CorruptStateError(
                f"{self.store_path(release_name(self.gen))} has stayed unusable for "
                f"{self.timing.stale_after:.0f} s (see the warning above); remove it or run "
                f"`fsmingle clean --dir ... {self.job_id}` and start again"
            )

    def _on_timeout(self) -> Placement | None:
        if self.state is State.DECIDING and not self._grace:
            # A decision exists that our (cached) view cannot show yet: it may
            # name us.  Keep reading it for stale_after more seconds instead of
            # leaving a world that is about to start with us in it.
            self._grace = True
            self.deadline = self.clock.monotonic() + self.timing.stale_after
            log.info(
                "deadline passed, but generation %d has a decision this node cannot read yet; "
                "waiting up to %g s for it",
                self.gen,
                self.timing.stale_after,
            )
            return None
        why = self.role.missing_description() if self.role is not None else None
        placement = self.withdraw(f"rank {self.rank} timed out after {self.timeout:g} s")
        if placement is not None:
            return placement
        if self.state is State.DECIDING or why is None:
            missing = self.missing_hint
            who = "node ranks" if self.mode == "node" else "ranks"
            if self.state is State.DECIDING:
                why = (
                    f"generation {self.gen} has a decision this node could not read within "
                    f"{self.timing.stale_after:g} s (filesystem caches?)"
                )
            elif missing:
                missing = self.never_seen(missing)
                why = (
                    f"missing {who} {ranges(missing)} ({len(missing)} of {self.size})"
                    if len(missing) <= 64
                    else f"{len(missing)} of {self.size} {who} missing"
                )
            else:
                why = f"no complete world of {self.size} formed"
        note = f"; {self.note}" if self.note else ""
        raise RendezvousTimeoutError(
            f"rendezvous for job {self.job_id} timed out after {self.timeout:g} s in generation {self.gen}: "
            f"{why}{note}. Directory: {self.store_path(gen_name(self.gen) if self.gen else '')}. "
            "Start the missing participants with the same --dir and --job-id (or raise --timeout); "
            "the directory is left ready for a retry",
            missing=list(self.missing_hint or []),
            present=len(self.present or ()),
        )

    def withdraw(self, reason: str) -> Placement | None:
        """Leave the rendezvous (timeout, interrupt): void our generation so others regroup.

        Returns:
            Placement | None: this participant's placement if it turned out to
            be released already (rank 0 committed after our acknowledgement).
        """
        acked = self.state is State.DECIDING or (self.role is not None and getattr(self.role, "acked", False))
        active = self.gen is not None and self.state not in (State.DONE, State.FAILED)
        mine = None
        if active and self.rank is not None:
            # Void first, then close: the decision record then says why we left (not
            # "lost its connection", which rank 0 would write on seeing it drop).
            try:
                if not self.void(f"{reason}; it left") and acked:
                    rel = self.read_release(self.gen)
                    rel = self.with_members(rel) if isinstance(rel, Release) else rel
                    mine = self.decision_for_me(rel) if isinstance(rel, Release) else None
            except (OSError, FsmingleError) as e:
                log.warning("could not withdraw cleanly: %s", e)
        if self.role is not None:
            self.role.leaving(f"{reason}; it left")
            self.role.close()  # rank 0 sees the connection drop at once
            self.role = None
        if self.hub is not None:
            self.hub.close()
            self.hub = None
        if mine is not None:
            self.result, self.state = mine, State.DONE
            return mine
        if not active:
            return self.result
        try:
            self.store.remove(beacon_name(self.gen, self.instance))
        except (OSError, FsmingleError) as e:
            log.warning("could not remove this participant's beacon: %s", e)
        self.state = State.FAILED
        return None
