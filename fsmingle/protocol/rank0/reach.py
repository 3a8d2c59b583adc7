"""Rank 0 steps down when nobody reaches it (issue 31: a partitioned node must not block recoveries).

A node whose network is cut while its shared filesystem works can claim rank 0 of a generation
through the directory.  Its peers then cannot connect ("cannot reach the master"), and a member
never voids on an unanswered connection (a partitioned host and a loaded one look the same from
outside: :mod:`fsmingle.protocol.member`).  Only rank 0 holds the evidence that separates "I am
cut" from "they are cut": whether *anybody* reaches it.  So, the rule (docs/protocol.md, "Who
cannot be reached steps down"):

* Rank 0 of a generation that has not had one authenticated message (a hello or an ask) on any
  connection, while for ``stale_after`` seconds at least one other participant of its generation
  shows a beacon whose heartbeat counter moves (alive, by :mod:`fsmingle.protocol.liveness`),
  voids its generation itself, naming its own address as the unreachable one.
* In the following generations it does not race for rank 0 (:meth:`fsmingle.protocol.partition.Rank0Shyness.shy_of_rank0`)
  for ``stale_after`` times the number of consecutive step-downs (at most 4), or until it has
  network contact again (a connection it made, or an authenticated message it received):
  a node the others can reach takes rank 0 first.

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

from ...fs.layout import BEACON_RE, beacon_name, gen_name
from ..liveness import Verdict

log = logging.getLogger("fsmingle")

# Beacons of unconnected participants rank 0 reads per look while nobody has reached it: one
# live one is all the rule needs, and a bound keeps a never-reached rank 0 of a big world from
# reading N beacons a heartbeat period (the same names each look, so counters can be compared).
BEACONS_PER_LOOK = 16


class Reach:
    """Whether anybody reaches this rank 0; steps down if nobody does (see the module doc)."""

    def _init_reach(self, now: float) -> None:
        self.reached = False  # an authenticated hello or ask arrived on some connection
        self.fresh_since: float | None = None  # since when an unconnected peer's beacon is seen alive
        self.fresh_count = 0
        self.next_reach_look = now + self.p.timing.heartbeat_period

    def _on_reached(self) -> None:
        """An authenticated message arrived: this rank 0 is reachable (and so is this node)."""
        if not self.reached:
            self.reached = True
            self.p.contact()

    def _step_down_if_unreached(self, now: float) -> bool:
        """The rule of the module doc; True if this rank 0 voided its generation.

        Costs one listing of the generation and at most ``BEACONS_PER_LOOK`` beacon reads per
        heartbeat period, and only while no participant has reached this rank 0."""
        p = self.p
        if self.reached or self.preparing_since is not None or now < self.next_reach_look:
            return False
        self.next_reach_look = now + p.timing.heartbeat_period
        names = sorted(n for n in p.store.listdir(gen_name(p.gen)) if BEACON_RE.match(n))
        alive = 0
        for n in names:
            inst = BEACON_RE.match(n).group(1)
            if inst == p.instance:
                continue
            b = p.read_beacon(beacon_name(p.gen, inst), inst)
            if b is not None and p.view.judge.judge(inst, b, now) is Verdict.ALIVE:
                alive += 1
            if alive + 1 >= BEACONS_PER_LOOK:
                break
        if not alive:
            self.fresh_since = None
            return False
        if self.fresh_since is None:
            self.fresh_since = now
        waited = now - self.fresh_since
        if waited < p.timing.stale_after:
            return False
        why = (
            f"rank 0 at {p.addr} ({p.me.hostname}) was reached by none of the {alive} live participants of "
            f"generation {p.gen} in {waited:.0f} s: its network, not theirs; it steps down and leaves rank 0 "
            "to a node the others can reach"
        )
        p.stepped_down()
        self._end(why, write=True)
        return True
