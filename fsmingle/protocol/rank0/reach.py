"""Rank 0 steps down when nobody reaches it (issue 31: a partitioned node must not block recoveries).

A node whose network is cut while its shared filesystem works can claim rank 0 of a generation
through the directory.  Its peers then cannot connect ("cannot reach the master"), and a member
never voids on an unanswered connection (a partitioned host and a loaded one look the same from
outside: :mod:`fsmingle.protocol.member`).  Only rank 0 holds the evidence that separates "I am
cut" from "they are cut": whether *anybody* reaches it.  So, the rule (docs/protocol.md, "Who
cannot be reached steps down"):

* Rank 0 of a generation that holds no verified member's connection and has had no
  authenticated message (a hello, an ask) on any connection for ``stale_after`` seconds, while
  for ``stale_after`` seconds at least one other participant of its generation shows a beacon
  whose heartbeat counter moves (alive, by :mod:`fsmingle.protocol.liveness`), voids its
  generation itself, naming its own address as the unreachable one.
* In the following generations it does not race for rank 0 (:meth:`fsmingle.protocol.partition.Rank0Shyness.shy_of_rank0`)
  for ``stale_after`` times the number of consecutive step-downs (at most 4), or until it has
  network contact again (a connection it made, or an authenticated message it received):
  a node the others can reach takes rank 0 first.
* A rank 0 kept from stepping down only by a spare watching its full world, that then voids its
  generation before anybody reached it, holds back rank 0 -- an explicit ``--node-rank 0`` too --
  so that the spare takes it (:meth:`Reach._hold_back_if_spared`).

Never a "too few connected" rule: a rank 0 that is slow, loaded or starved of the GIL in a world
of thousands still gets *some* hellos, and one is enough to keep it.  A healthy rank 0 with one
cut member is reached by the others and stays.  Only in a world where every other participant
is cut off from rank 0 (two nodes, one side cut) does a healthy rank 0 step down too; the next
generation then goes to whoever is not shy, and nobody is ever released without a connection to
its master, so the worst case is a ping-pong of voided generations, never a wrong release.

Mixed into :class:`~fsmingle.protocol.rank0.coordinator.Coordinator`.
"""

from __future__ import annotations

import logging

from ...fs.layout import BEACON_RE, beacon_name
from ..liveness import Verdict

log = logging.getLogger("fsmingle")

# Beacons of unconnected participants rank 0 reads per look while nobody has reached it: one
# live one is all the rule needs, and a bound keeps a never-reached rank 0 of a big world from
# reading N beacons a heartbeat period (the same names each look, so counters can be compared).
BEACONS_PER_LOOK = 16


class Reach:
    """Whether anybody reaches this rank 0; steps down if nobody does (see the module doc)."""

    def _init_reach(self, now: float) -> None:
        self.last_reached: float | None = None  # when an authenticated message last arrived
        self.fresh_since: float | None = None  # since when an unconnected peer's beacon is seen alive
        self.spared = False  # the step-down's evidence held, but a spare watched (_hold_back_if_spared)
        self.next_reach_look = now + self.p.timing.heartbeat_period
        self.seen_alive: set[str] = set()  # instances whose beacon was seen beating (not since DEAD)
        self.first_looked: dict[str, float] = {}  # instance -> when this rank 0 first read its beacon
        self.next_unconnected_note = now + self.p.timing.stale_after
        self.started_at = now

    def _on_reached(self) -> None:
        """An authenticated message arrived: this rank 0 is reachable (and so is this node)."""
        self.last_reached = self.p.clock.monotonic()
        self.fresh_since = None
        self.spared = False
        self.seen_alive.clear()
        self.p.contact()

    def _hold_back_if_spared(self) -> None:
        """This rank 0 voids its generation (a claim judged dead, say): if, while nobody reached
        it, a live participant had waited ``stale_after`` unreached and only a spare's watch kept
        it from stepping down (``spared``), it leaves rank 0 to the spare in the next generations,
        even as an explicit ``--node-rank 0`` (:meth:`fsmingle.protocol.partition.Rank0Shyness.voided_unreached`).

        Why (docs/protocol.md rule 11; found by tests/test_adversary_partition.py): a cut rank 0 of
        a full world outlives its members' patience (they withdraw after ``2 x stale_after``),
        judges their claims dead and voids; as the writer of the void it is first into the next
        generation, where an explicit rank 0 was never shy, and the reachable nodes waited 19-21
        ``stale_after`` for the spare to win rank 0.  A live claimer that never reached us while a
        spare watched, then withdrew, is the evidence the exemption had set aside."""
        if self.spared:
            self.spared = False
            self.p.voided_unreached()

    def _step_down_if_unreached(self, now: float) -> bool:
        """The rule of the module doc; True if this rank 0 voided its generation.

        Costs no listing (the scan's last one) and at most ``BEACONS_PER_LOOK`` beacon reads per
        heartbeat period, and only while no participant has reached this rank 0 for ``stale_after``
        and no verified member holds a connection to it (a member cut off after its hello is judged
        by its silence on that connection, :func:`fsmingle.protocol.decision.decide`)."""
        p = self.p
        if self.rank_conn or self.preparing_since is not None or now < self.next_reach_look:
            return False  # a verified member holds a connection (judged by its silence), or releasing
        if self.last_reached is not None and now - self.last_reached < p.timing.stale_after:
            return False
        self.next_reach_look = now + p.timing.heartbeat_period
        # The scan's last listing (rank0/scan.py, at its own bounded pace): no listing of our own.
        names = sorted(n for n in self.last_names if BEACON_RE.match(n))
        looked, watching = 0, False
        full = len(self.listed) >= p.size  # every rank claimed (the scan's listing)
        for n in names:
            inst = BEACON_RE.match(n).group(1)
            if inst == p.instance or looked >= BEACONS_PER_LOOK:
                continue
            looked += 1
            b = p.read_beacon(beacon_name(p.gen, inst), inst)
            self.first_looked.setdefault(inst, now)
            verdict = p.view.judge.judge(inst, b, now)
            # One look that saw no beat (a look between two beats) is not death: a peer seen alive
            # stays so until the judge says DEAD (its counter still for stale_after).
            if verdict is Verdict.ALIVE:
                self.seen_alive.add(inst)
            elif verdict is Verdict.DEAD:
                self.seen_alive.discard(inst)
            # Holding no rank while every rank is claimed: a watcher of a full world (a spare), which
            # never connects, so it could reach us without trying: with it here, our unreached
            # claimers are no evidence against our network (a cut claimer withdraws: partition.py).
            watching = watching or (full and b is not None and b.rank is None and verdict is not Verdict.DEAD)
        listed = {BEACON_RE.match(n).group(1) for n in names}
        self.seen_alive &= listed
        alive = len(self.seen_alive)
        if not alive:
            self.fresh_since = None
            return False
        if self.fresh_since is None:
            # Its counter moved since our first look at it: it was alive since then.
            self.fresh_since = min(self.first_looked[i] for i in self.seen_alive)
        waited = now - self.fresh_since
        if watching:
            # Not a step-down (a spare watches: the module doc), but remembered until someone
            # reaches us: should this generation end in our void, we hold back rank 0 (_hold_back_if_spared).
            self.spared = self.spared or waited >= p.timing.stale_after
            return False
        if waited < p.timing.stale_after:
            p.set_note(
                f"no participant reached this rank 0 at {p.addr} while {alive} live one(s) wait in generation "
                f"{p.gen} (they cannot reach it, or this node's network is cut); it steps down after "
                f"{p.timing.stale_after:g} s of that"
            )
            return False
        why = (
            f"rank 0 at {p.addr} ({p.me.hostname}) was reached by none of the {alive} live participants of "
            f"generation {p.gen} in {waited:.0f} s: its network, not theirs; it steps down and leaves rank 0 "
            "to a node the others can reach"
        )
        p.stepped_down()
        self._end(why, write=True)
        return True

    def _say_who_never_connects(self, now: float) -> None:
        """Every heartbeat period: name the claimers listed ``stale_after`` ago or more that have
        not connected (alive on the filesystem, so not judged dead: likely cut off from us), so a
        rank 0 that waits on them says why (its members are told who is missing as before)."""
        p = self.p
        if now < self.next_unconnected_note or self.fresh_since is not None:
            return  # (the step-down's own note says more while nobody reaches this rank 0)
        self.next_unconnected_note = now + p.timing.heartbeat_period
        late = [r for r, t in self.first_listed.items() if now - t >= p.timing.stale_after and r not in self.rank_conn]
        if any(r != 0 for r in late):
            self._waiting_note(f"waiting: {self._unconnected()}")
            return
        # Participants without a rank (askers) that never connect: beacons beyond those connected.
        beacons = sum(1 for n in self.last_names if BEACON_RE.match(n))
        unseen = beacons - 1 - len(self.rank_conn) - len(self.pending)
        if unseen > 0 and len(self.rank_conn) < p.size - 1 and now - self.started_at >= p.timing.stale_after:
            self._waiting_note(
                f"waiting for {p.size - 1 - len(self.rank_conn)} more member(s): {unseen} participant(s) of "
                f"generation {p.gen} on the filesystem never connected to the master at {p.addr} (they cannot "
                "reach it? check their --iface/--addr, routes and firewalls)"
            )

    def _waiting_note(self, note: str) -> None:
        """Rank 0's note on who it waits for; changed, it goes to the members with the next status."""
        if note != self.p.note:
            self.p.set_note(note, waiting=True)
            self.status_dirty = True
