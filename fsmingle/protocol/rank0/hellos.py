"""Rank 0's verification of hellos: a member is who it says only once its claim file says so.

A member ``link()``s its claim before it says hello, so one direct read of the claim usually
verifies it, without an O(N) listing.  After a read that found nothing, only a listing that
shows the name is trusted (a name looked up too early can stay "absent" in a negative lookup
cache).  Reads are bounded per step (:data:`VERIFY_READS_PER_STEP`), oldest hellos first.  Mixed
into :class:`~fsmingle.protocol.rank0.coordinator.Coordinator`.
"""

from __future__ import annotations

import bisect
import itertools
import logging

from ...errors import RecordError
from ...fs.records import (
    Member,
    hostid_from_dict,
    instance_id,
    validate_addr,
)

log = logging.getLogger("fsmingle")

VERIFY_READS_PER_STEP = 64  # claim reads per step before rank 0 turns back to its connections


class Hellos:
    """Hello verification against the claims on the filesystem (see the module doc)."""

    def _init_hellos(self, now: float) -> None:
        self.pending: dict[int, tuple[dict, float]] = {}  # conn -> (hello, when)
        self.looked_up: set[int] = set()  # claims read directly on a hello (see _verify_pending)
        self.backlog = False  # hellos left unverified by the last step's read budget

    def _on_hello(self, conn: int, m: dict, now: float) -> None:
        p = self.p
        if conn in self.conn_rank:
            # A member says hello once per connection; a second one on a verified connection is
            # a peer that lost track of its own state: drop it, and free its rank (_reject
            # records the loss), rather than leave the rank bound to a closed connection.
            self._reject(conn, f"a second hello on the connection of verified rank {self.conn_rank[conn]}")
            return
        if not self._agrees(conn, m):
            return
        self.askers.discard(conn)
        self.waiting.pop(conn, None)
        self.offers_to.pop(conn, None)
        self._withdraw_offer(conn)  # its rank is in the hello now
        r = m.get("rank")
        if not isinstance(r, int) or isinstance(r, bool) or not 0 < r < p.size or r in self.rank_conn:
            self._reject(conn, f"rank {r!r} is not a free member rank of this world")
            return
        try:
            m = dict(
                m,
                inst=instance_id(m.get("inst")),
                addr=validate_addr(str(m.get("addr"))),
                host=hostid_from_dict(m.get("host")),
            )
        except RecordError as e:
            self._reject(conn, f"malformed hello: {e}")
            return
        self.pending[conn] = (m, now)
        self.scan_gap = p.timing.poll_min

    def _verify_pending(self, now: float) -> None:
        self.backlog = False
        if not self.pending:
            return  # most steps: nothing to verify (runs twice a step)
        p = self.p
        reads = 0
        # The oldest hellos first, a bounded batch (a join storm holds thousands); one that must
        # wait for a listing goes to the back, so it cannot hold the fresh ones up.
        for conn, (m, since) in list(itertools.islice(self.pending.items(), 4 * VERIFY_READS_PER_STEP)):
            r = m["rank"]
            holder = p.claims.get(r)
            if holder is None and reads >= VERIFY_READS_PER_STEP:
                # Back to the channel first: thousands of hellos at once would otherwise
                # keep rank 0 off its connections for as many claim reads (pings, acks).
                self.backlog = True
                break
            if holder is None and (r in self.listed or r not in self.looked_up):
                reads += 1
                # The member link()ed its claim before it said hello, so the claim is on the
                # server now: one direct read verifies it without an O(N) listing.  Only the
                # first read of a name is direct -- if it finds nothing (a cache that lies, or
                # a hello for a rank nobody claimed), this node may now hold a negative entry
                # for it, and only a listing that shows the name is trusted after that.
                self.looked_up.add(r)
                holder = p.read_claim(r)
            if holder == m["inst"]:
                del self.pending[conn]
                self.rank_conn[r], self.conn_rank[conn] = conn, r
                i = bisect.bisect_left(self.missing_sorted, r)
                if i < len(self.missing_sorted) and self.missing_sorted[i] == r:
                    del self.missing_sorted[i]
                self.members[r] = Member(rank=r, instance=m["inst"], addr=m["addr"], host=m["host"])
                self.explicit[r] = m.get("explicit") is True
                if m.get("spare") is True:  # started as a spare (outside.py): never a world of spares alone
                    self.spare_ranks.add(r)
                self.keys[r] = str(m.get("key") or "")[:256]
                self.member_jobs[r] = str(m.get("sched") or "")[:64]
                pp = m.get("probe_port")
                if isinstance(pp, int) and not isinstance(pp, bool) and 0 < pp < 65536:
                    self.probe_ports[m["inst"]] = pp
                if m.get("members") is True:
                    self.want_members.add(r)
                self.arrived.setdefault(r, now)
                self.lost.pop(r, None)
                self.hub.send(conn, {"t": "welcome", "inst": p.instance, "gen": p.gen, **self._status()})
                self.status_dirty = True
            elif holder is not None:
                self._reject(conn, f"rank {r} of generation {p.gen} is held by instance {holder}, not {m['inst']}")
            elif now - since >= p.timing.stale_after:
                self._reject(
                    conn, f"rank {r}'s claim did not show in generation {p.gen} within {p.timing.stale_after:g} s"
                )
            else:
                self.pending[conn] = self.pending.pop(conn)
