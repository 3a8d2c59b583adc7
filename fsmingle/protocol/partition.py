"""A node that may be cut off from the network: its side of issue 31's rules (docs/protocol.md).

* After its rank 0 stepped down (nobody reached it: :mod:`fsmingle.protocol.rank0.reach`), a node
  does not race for rank 0 for a while (:class:`Rank0Shyness`).
* A member that cannot reach a rank 0 whose beacon stays fresh (:func:`unreachable_master`) keeps
  saying why, and after ``2 x stale_after`` -- longer than rank 0's own ``stale_after``, so that a
  cut rank 0 steps down first -- withdraws from its generation without voiding it.
"""

from __future__ import annotations

import logging

from ..errors import FsmingleError
from ..fs.layout import beacon_name
from .liveness import Verdict
from .parts_state import Identity, Seat, Timers, Wiring

log = logging.getLogger("fsmingle")

# Consecutive step-downs beyond which the shy delay stops growing (in units of stale_after).
MAX_SHY_FACTOR = 4


class Rank0Shyness:
    """The participant's side of the rule: after a step-down, do not race for rank 0 for a while.

    Mixed into :class:`~fsmingle.protocol.participant.Participant` (state: ``seat.stepdowns``
    and ``timers.shy_until``)."""

    seat: Seat  # stepdowns: consecutive step-downs of this node's rank 0
    timers: Timers  # shy_until: until when it leaves rank 0 to others
    ident: Identity  # reads: job_id, want_rank
    wiring: Wiring  # reads: clock, timing

    def stepped_down(self) -> None:
        """This node's rank 0 was reached by nobody: stay away from rank 0 (the module doc)."""
        self.seat.stepdowns += 1
        self.seat.rank0_held_back = False  # an explicit --node-rank 0 stays first for rank 0 (shy_of_rank0)
        factor = min(MAX_SHY_FACTOR, self.seat.stepdowns)
        self.timers.shy_until = self.wiring.clock.monotonic() + factor * self.wiring.timing.stale_after
        log.warning(
            "job %s: nobody reached this node as rank 0; it takes rank 0 again only after %g s or once it "
            "reaches a peer (a partitioned network?)",
            self.ident.job_id,
            factor * self.wiring.timing.stale_after,
        )

    def voided_unreached(self) -> None:
        """This node's rank 0 voided its generation while nobody had reached it and a spare watched
        its full world (:meth:`fsmingle.protocol.rank0.reach.Reach._hold_back_if_spared`): it holds
        back its claim of rank 0 -- even an explicit ``--node-rank 0`` -- for ``2 x stale_after``
        times the withdrawals and step-downs in a row (at most 4x), as a withdrawn member holds
        back its rank (:func:`unreachable_master`), so that the spare takes rank 0 first.  Network
        contact ends it (:meth:`contact`)."""
        self.seat.stepdowns += 1
        self.seat.rank0_held_back = True
        wait = min(MAX_SHY_FACTOR, self.seat.stepdowns) * 2 * self.wiring.timing.stale_after
        self.timers.shy_until = self.wiring.clock.monotonic() + wait
        log.warning(
            "job %s: nobody reached this node as rank 0 while a spare watched; it leaves rank 0 to the spare "
            "for %g s or until it reaches a peer (a partitioned network?)",
            self.ident.job_id,
            wait,
        )

    def contact(self) -> None:
        """Network contact (a connection made, or an authenticated message received): not shy any more."""
        self.seat.stepdowns = 0
        self.seat.rank0_held_back = False
        self.timers.shy_until = None

    def holding_back(self, r: int) -> bool:
        """True while an explicit ``--node-rank r`` waits before claiming ``r`` again: ``r`` not 0
        after it withdrew from a rank 0 it could not reach (:func:`unreachable_master`), or ``r``
        0 after its rank 0 voided unreached while a spare watched (:meth:`voided_unreached`).  It
        would otherwise re-claim ``r`` of every new generation the moment the last one is voided,
        ahead of the spare that is to take the place, and the reachable nodes never form a world
        while the cut lasts (both found by tests/test_adversary_partition.py).  Ends at
        ``shy_until`` or at network contact (:meth:`contact`)."""
        until = self.timers.shy_until
        if until is None or (r == 0 and not self.seat.rank0_held_back):
            return False
        left = until - self.wiring.clock.monotonic()
        if left <= 0:
            self.seat.rank0_held_back = False
            return False
        why = (
            "nobody reached this node as rank 0 while a spare watched"
            if r == 0
            else "cannot reach the master (withdrew from a rank 0 it could not reach)"
        )
        self.set_note(
            f"{why}: claims rank {r} again in {left:.0f} s or at network contact, leaving it to a spare "
            "meanwhile (this node's network may be cut)"
        )
        return True

    def shy_of_rank0(self) -> bool:
        """True while this node, after a step-down, leaves rank 0 to others (an explicit
        ``--node-rank 0`` never is: only it may hold rank 0, or a spare in its place, which
        :meth:`holding_back` leaves it to)."""
        until = self.timers.shy_until
        if until is None or self.ident.want_rank is not None:
            return False
        if self.wiring.clock.monotonic() >= until:
            self.timers.shy_until = None
            return False
        return True


def unreachable_master(m, now: float, b, where: str, why: str) -> None:
    """A :class:`~fsmingle.protocol.member.Member` found rank 0's endpoint but no answer came
    (timeout, no route): say exactly why nothing happens, and withdraw after ``2 x stale_after``.

    No answer proves nothing (a partitioned host and a loaded one look alike), so the member never
    voids for it: one cut member would otherwise void every generation of a healthy majority.  But
    a member *holding a rank* that cannot reach a rank 0 whose endpoint record keeps beating for
    ``2 x stale_after`` (longer than the ``stale_after`` after which a rank 0 that nobody reaches
    steps down, :mod:`fsmingle.protocol.rank0.reach`: a cut rank 0 goes first) withdraws: it
    removes its beacon and stops heartbeating, so that rank 0 judges its claim dead within
    ``stale_after`` and regroups without it (a spare or a later arrival takes the place), and it
    leaves rank 0 to others for ``2 x stale_after`` (it may be the one cut off).  It stays in
    its generation, unconnected, until the decision shows (``Member._decided_elsewhere``), so it
    can never be released.  An asker (no rank yet) holds nothing that blocks anyone; it keeps
    trying.

    Args:
        m: the member; now (float): monotonic seconds; b (Beacon): rank 0's endpoint record;
        where (str): rank 0's address for messages; why (str): what the connect attempt met.
    """
    p = m.p
    stale = p.timing.stale_after
    m.look_delay = max(p.timing.poll_max, 1.0)
    m.next_look = now + m.look_delay
    if m.unreached_since is None:
        m.unreached_since = now
    waited = now - m.unreached_since
    fresh = p.view.judge.judge(f"master:{b.instance}", b, now) is not Verdict.DEAD
    advice = (
        "check --iface/--addr on both nodes, routes and firewalls (a node is never released without a "
        "connection to its master)"
    )
    if p.rank is None or m.withdrawn:
        state = "holding no rank" if p.rank is None else f"withdrawn from rank {p.rank}"
        p.set_note(
            f"cannot reach the master {where} from this node: {why}; {state}, "
            f"waiting for generation {p.gen} to be decided; {advice}",
            logging.WARNING,
        )
        return
    if not fresh or waited < 2 * stale:
        p.set_note(f"cannot reach the master {where} from this node: {why}; {advice}", logging.WARNING)
        return
    # Withdraw: no beacon, no heartbeat (Member.step skips it once withdrawn).  The claim stays
    # (claims are immutable: readers cache them); rank 0 judges it by the beacon we remove.
    m.withdrawn = True
    # Each withdrawal in a row (no contact between) backs off longer: the voids that let a spare
    # in take a generation or two (a spare holding an explicit owner's rank is voided too).
    p.seat.stepdowns += 1
    p.timers.shy_until = now + min(MAX_SHY_FACTOR, p.seat.stepdowns) * 2 * stale
    try:
        p.store.remove(beacon_name(p.gen, p.instance))
    except (OSError, FsmingleError) as e:
        log.warning("could not remove this participant's beacon: %s", e)
    p.set_note(
        f"cannot reach the master {where} from this node for {waited:.0f} s while its beacon is fresh: {why}; "
        f"rank {p.rank} withdrawn (its beacon removed: rank 0 regroups without this node), waiting for "
        f"generation {p.gen} to be decided; {advice}",
        logging.WARNING,
    )
