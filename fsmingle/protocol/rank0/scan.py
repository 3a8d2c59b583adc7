"""Rank 0's reading of its generation: listings at a bounded pace, claimers that died before
connecting, decisions by others, and the housekeeping of older generations.

A listing costs the metadata server in proportion to its entries, so rank 0 lists at most
:data:`LISTED_ENTRIES_PER_S` entries per second on average, backing off while nothing changes.
Once per generation rank 0 retires old decided generations (bounded), and every
``stale_after`` it looks for evidence that the world has moved to a newer generation (a
generation number re-created from a stale listing).  Mixed into
:class:`~fsmingle.protocol.rank0.coordinator.Coordinator`.
"""

from __future__ import annotations

import logging

from ...errors import FsmingleError, RecordError
from ...fs.layout import RELEASE, claimed_ranks, gen_name
from ...fs.records import (
    Release,
)
from ..liveness import Verdict

log = logging.getLogger("fsmingle")

# Rank 0's listings read at most this many directory entries per second on average: with the
# metadata-server cost of benchmarks/sim (2 us per entry listed) that is 4 % of one server.
# Members are verified by a direct read of their claim at their hello, so at scale the listing
# is only for decisions by others and claimers that never connect.
LISTED_ENTRIES_PER_S = 20_000


class Scanning:
    """Listings, dead claimers, housekeeping (see the module doc)."""

    def _init_scan(self, now: float) -> None:
        p = self.p
        self.listed: set[int] = set()
        self.first_listed: dict[int, float] = {}  # rank -> when a listing first showed its claim
        self.dead_claimers: dict[int, str] = {}
        self.next_scan = now
        self.last_scan = now
        self.scan_gap = p.timing.poll_min
        self.scan_quiet = p.timing.scan_interval
        self.last_listing_size = -1
        self.last_names: list[str] = []
        self.next_judge = now + p.timing.heartbeat_period
        # Housekeeping of generations (_housekeeping): one cleaning, a periodic look for newer ones.
        self.cleaned = False
        self.next_superseded_check = now + p.timing.stale_after

    def _housekeeping(self, now: float) -> bool:
        """Clean old generations once, and leave this one if a newer exists; True if it ended.

        Never while preparing or committing (the release's critical path).  Rank 0 is one
        process per generation, and every generation that releases or voids had one, so the
        cleaner runs once per generation (``cleanup.retire_decided_below``: a bounded batch, never
        this generation nor the previous one), where a joiner's ``mkdir`` hardly ever creates a
        generation (the decider of the one before made it ahead, ``Participant.prepare_next``).
        """
        p = self.p
        if self.preparing_since is not None:
            return False
        if not self.cleaned:
            self.cleaned = True
            if p.cleaner is not None:
                try:
                    p.cleaner(p.gen)
                except (OSError, FsmingleError) as e:  # a courtesy: never fail a rendezvous over it
                    log.warning("could not clean old generations: %s", e)
        if now >= self.next_superseded_check:
            return self._leave_if_superseded(now)
        return False

    def _leave_if_superseded(self, now: float) -> bool:
        """Every ``stale_after``: leave this generation if the world is waiting in a newer one.

        That happens when this generation was re-created from a stale listing after it had been
        retired, and the listing its creator made after its ``mkdir`` was still stale
        (``Joining._newer_than``).  Evidence that the world is elsewhere: two generations above
        ours (the one above ours is made before ours is decided only by a voider of ours --
        ``Participant.prepare_next`` -- so a second one above means that one was decided), or an
        endpoint in the newest one's ``master/``.  A single empty generation above ours proves
        nothing: a member that crashed between ``prepare_next`` and its void leaves one.  Then
        void ours (we hold rank 0 of it) and join the newest.  Costs one listing of the job
        directory (a few names) per ``stale_after`` per generation, and one of ``master/`` only
        while a newer generation exists.
        """
        from ...fs.layout import BEACON_RE, GEN_RE, master_dir  # here: keeps this housekeeping apart

        p = self.p
        self.next_superseded_check = now + p.timing.stale_after
        above = sorted(g for g in (int(m.group(1)) for m in map(GEN_RE.match, p.store.listdir(""))) if g > p.gen)
        if not above:
            return False
        if len(above) < 2 and not any(map(BEACON_RE.match, p.store.listdir(master_dir(above[-1])))):
            return False
        self._end(
            f"generation {above[-1]} exists and is in use, so this one ({p.gen}) was re-created from a stale "
            "listing after it had been retired; joining the newest",
            write=True,
        )
        return True

    def _scan(self, now: float) -> bool:
        """List the generation: decisions by others, new claims, claimers that died before connecting.

        Returns True if the generation ended (someone else decided it).
        """
        p = self.p
        names = p.store.listdir(gen_name(p.gen))
        self.last_scan, self.last_names = now, names  # last_names: also for reach.py (no listing of its own)
        # Rescan every scan_interval while claims keep arriving; once a listing brings
        # nothing new, back off to 8x (the listing is O(N) entries for the metadata server).
        changed = len(names) != self.last_listing_size
        self.last_listing_size = len(names)
        self.scan_quiet = p.timing.scan_interval if changed else min(8 * p.timing.scan_interval, self.scan_quiet * 2)
        self.next_scan = now + max(self.scan_quiet, self._list_floor())
        self.scan_gap = min(p.timing.scan_interval, self.scan_gap * 2)
        if RELEASE in names:
            # Listed first, read second: never a speculative lookup of the name.
            rel = p.read_release(p.gen)
            if isinstance(rel, Release):
                self._end(f"voided by another participant: {rel.reason}", write=False)
                return True
            if isinstance(rel, RecordError):
                self._end(
                    "its decision record is unusable (see the warning above); regrouping in the next generation",
                    write=False,
                )
                return True
        listed = [r for r in claimed_ranks(names) if r < p.size]
        self.listed = set(listed)
        for r in listed:
            self.first_listed.setdefault(r, now)
        if now >= self.next_judge:
            self.next_judge = now + p.timing.heartbeat_period
            pending = {m["rank"] for m, _ in self.pending.values()}
            for r in listed:
                # Judged from the filesystem: claimers that have not connected a heartbeat
                # period after their claim showed (a joiner connects within a second or so;
                # judging each one at once would read two files per joiner in a join storm).
                if r == 0 or r in self.rank_conn or r in pending:
                    continue
                if now - self.first_listed[r] < p.timing.heartbeat_period:
                    continue
                verdict, b = p.judge_holder(p.read_claim(r), now, key=f"?rank{r}")
                if verdict is Verdict.DEAD:
                    host = b.host.hostname if b else "beacon unreadable"
                    self.dead_claimers[r] = (
                        f"({host}) claimed its rank but died or stopped heartbeating before connecting to the master"
                    )
        return False

    def _list_floor(self) -> float:
        """Seconds between two listings at least, so that rank 0 reads at most
        ``LISTED_ENTRIES_PER_S`` directory entries per second on average (0.05 s at N = 512,
        13 s at N = 131,072: a listing costs the metadata server in proportion to its entries)."""
        return max(0, self.last_listing_size) / LISTED_ENTRIES_PER_S
