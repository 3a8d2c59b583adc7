"""Rank 0's offers: free ranks for members that ask (``ask``/``offer``), as short leases.

A first-come member of a big world (or one whose first try lost) asks rank 0 instead of listing
the generation; rank 0 offers one rank it believes free.  An offer is a lease
(:meth:`Offers._lease`): not followed by a hello in time, given up by asking again or by leaving,
it goes back -- first to the longest-waiting asker.  A connection that keeps asking without a
hello is dropped after :data:`MAX_OFFERS_PER_CONN`.  The filesystem stays the arbiter: the
asker's exclusive ``link()`` decides who holds a rank.  Mixed into
:class:`~fsmingle.protocol.rank0.coordinator.Coordinator`.
"""

from __future__ import annotations

import logging

log = logging.getLogger("fsmingle")

# Offers one connection may receive without ever saying hello.  A legitimate asker needs one,
# a second or third when its link() loses to a claim rank 0 could not know of; one that keeps
# asking is dropped after this many (it then lists the generation, if it is one of ours).
MAX_OFFERS_PER_CONN = 8
# Ranks askers reported taken (their link() met EEXIST) that rank 0 keeps from offers at once,
# at most; the oldest report goes first.  Each report is a lease (Offers._taken_lease): the
# listing shows a real claim soon after, and a report nobody's claim bears out must not keep a
# rank from offers for ever (a buggy asker's, or one of a holder of the secret).
KNOWN_TAKEN_MAX = 1024


class Offers:
    """Rank offers to askers, as leases (see the module doc)."""

    def _init_offers(self, now: float) -> None:
        self.askers: set[int] = set()  # connections of members without a rank (see _on_ask)
        self.asks: list[int] = []  # askers to answer at the end of this step
        self.known_taken: dict[int, float] = {}  # ranks askers found claimed -> until when (report order)
        self.offered: dict[int, int] = {}  # rank -> the asker's connection it is on offer to
        self.offer_of: dict[int, int] = {}  # the same, by connection (an asker holds one offer)
        # Leases (see _answer_asks): rank -> when its offer runs out, in the order made (so the
        # oldest is first: expiring costs O(expired)); offers made per connection; askers told
        # to wait, longest-waiting first; ranks given back since the last step.
        self.offer_until: dict[int, float] = {}
        self.offers_to: dict[int, int] = {}
        self.waiting: dict[int, float] = {}
        self.returned: list[int] = []
        self.cursor = 1

    def _on_ask(self, conn: int, m: dict, now: float) -> None:
        """A member without a rank asks for one (``fsmingle.protocol.member``, "asking"): answered by _answer_asks."""
        if conn in self.conn_rank:  # a verified member has its rank: a peer that lost track (cf. _on_hello)
            self._reject(conn, f"an ask on the connection of verified rank {self.conn_rank[conn]}")
            return
        if not self._agrees(conn, m):
            return
        self.askers.add(conn)
        taken = m.get("taken")
        until = now + self._taken_lease()
        for r in taken[:64] if isinstance(taken, list) else ():
            if isinstance(r, int) and not isinstance(r, bool) and 0 < r < self.p.size:
                self.known_taken.pop(r, None)  # a fresh report goes to the end: the oldest stays first
                self.known_taken[r] = until
        while len(self.known_taken) > KNOWN_TAKEN_MAX:
            del self.known_taken[next(iter(self.known_taken))]
        self.asks.append(conn)  # answered after this step's listing, if one is due (step())

    def _lease(self) -> float:
        """Seconds an offer, or an unverified hello for a rank no listing shows, holds its rank.

        A legitimate asker says hello a link() and a beacon write after the offer (well under a
        second on a loaded metadata server); twice ``scan_interval`` is also twice the pace at
        which askers told to wait ask again.  A lease that runs out early costs one failed
        link() of the next asker (EEXIST: it reports the rank taken), never a wrong claim:
        the filesystem stays the arbiter.
        """
        return max(1.0, 2 * self.p.timing.scan_interval)

    def _taken_lease(self) -> float:
        """Seconds a rank an asker reported taken is kept from offers: two leases, time for at
        least two listings, either of which shows a real claim (then the listing keeps it)."""
        return 2 * self._lease()

    def _answer_asks(self, now: float) -> None:
        """Offer each asker of this step one free rank (or tell it to wait, or that none is known).

        Offers are leases (``_lease``): one not followed by a hello in time goes back to the
        pool.  A rank given back -- a lease that ran out, an asker that asked again or went --
        goes first to the askers told to wait, longest-waiting first, without waiting for them
        to ask again.  An asker that asks again while holding an offer gives that offer up and
        queues behind those who wait, so it cannot keep a rank from them; one that has had
        ``MAX_OFFERS_PER_CONN`` offers without ever saying hello is dropped.
        """
        while self.offer_until:
            r, until = next(iter(self.offer_until.items()))  # offered in this order: oldest first
            if until > now:
                break
            self._give_back(self._withdraw_offer(self.offered[r]))
        while self.known_taken:
            r, until = next(iter(self.known_taken.items()))  # reported in this order: oldest first
            if until > now:
                break
            del self.known_taken[r]
        if not self.asks and not (self.returned and self.waiting):
            self.returned = []
            return
        pending = self._pending_ranks(now)  # once per step, not per ask: O(N) in a join storm
        asks, self.asks = self.asks, []
        asked: dict[int, None] = {}
        for conn in asks:
            if conn not in self.askers or conn in asked:
                continue
            if self.offers_to.get(conn, 0) >= MAX_OFFERS_PER_CONN:
                self._reject(conn, f"asked for a rank {MAX_OFFERS_PER_CONN} times without saying hello")
                continue
            held = self._withdraw_offer(conn)
            if held is not None:  # asked again while holding an offer: it goes back, first to who waits
                self._give_back(held)
                self.waiting.pop(conn, None)
            asked[conn] = None
        given = self._hand_out_returned(pending, now)
        # Then free ranks, in queue order: who waits longest first, then this step's new askers.
        exhausted = False
        for conn in [*self.waiting, *(c for c in asked if c not in self.waiting)]:
            if conn in given:
                continue
            r = None if exhausted else self._free_rank(conn, pending, now)
            exhausted = r is None
            if r is not None:
                self.waiting.pop(conn, None)
                self.hub.send(conn, {"t": "offer", "gen": self.p.gen, "ranks": [r]})
            elif conn in asked:
                msg = {"t": "offer", "gen": self.p.gen, "ranks": []}
                if self.offered:
                    msg["wait"] = True  # every free rank is on offer to another asker: ask again soon
                    self.waiting.setdefault(conn, now)
                else:
                    self.waiting.pop(conn, None)  # it lists the generation itself now
                self.hub.send(conn, msg)

    def _hand_out_returned(self, pending: set[int], now: float) -> set[int]:
        """Offer the ranks given back to the longest-waiting askers; returns the connections offered one."""
        given: set[int] = set()
        returned, self.returned = self.returned, []
        for r in returned:
            if not self.waiting:
                break
            if r in self.offered or not self._offerable(r, pending):
                continue
            conn = next(iter(self.waiting))
            del self.waiting[conn]
            self._offer(conn, r, now)
            self.hub.send(conn, {"t": "offer", "gen": self.p.gen, "ranks": [r]})
            given.add(conn)
        return given

    def _pending_ranks(self, now: float) -> set[int]:
        """Ranks of hellos not verified yet that still hold their rank from offers: for
        ``_lease`` seconds, or as long as a listing shows their claim (then the listing itself
        keeps the rank from offers).  A hello for a claim nobody can see -- an invented identity,
        or a claim not on the server -- stops blocking the rank then: an asker's exclusive link()
        settles who holds it.  The hello itself is still verified against the claim file, until
        ``stale_after`` (_verify_pending)."""
        lease = self._lease()
        return {m["rank"] for m, since in self.pending.values() if now - since < lease}

    def _offerable(self, r: int, pending: set[int]) -> bool:
        p = self.p
        return not (r in self.rank_conn or r in p.claims or r in self.listed or r in self.known_taken or r in pending)

    def _offer(self, conn: int, r: int, now: float) -> None:
        self.offered[r], self.offer_of[conn] = conn, r
        self.offer_until.pop(r, None)
        self.offer_until[r] = now + self._lease()
        self.offers_to[conn] = self.offers_to.get(conn, 0) + 1

    def _free_rank(self, conn: int, pending: set[int], now: float) -> int | None:
        """A member rank nobody is known to hold or to be claiming, offered to ``conn`` alone.

        A cursor walks the ranks cyclically, so a world of N costs O(N) per pass in all, not
        per ask.  "Known": claims read, the last listing, connections, hellos (for their lease,
        ``_pending_ranks``), ranks askers found taken, ranks on offer (until their asker says
        hello, asks again or goes, or the lease runs out).  A claim made since the last listing
        may still collide; the asker's link() settles it.
        """
        p = self.p
        self._give_back(self._withdraw_offer(conn))
        for _ in range(p.size - 1):
            r = self.cursor
            self.cursor = self.cursor % (p.size - 1) + 1
            if not self._offerable(r, pending) or r in self.offered:
                continue
            self._offer(conn, r, now)
            return r
        return None

    def _withdraw_offer(self, conn: int) -> int | None:
        """Take back the offer ``conn`` holds, if any; returns its rank."""
        r = self.offer_of.pop(conn, None)
        if r is not None:
            del self.offered[r]
            self.offer_until.pop(r, None)
        return r

    def _give_back(self, r: int | None) -> None:
        """A rank whose offer was withdrawn goes to the askers told to wait (next _answer_asks)."""
        if r is not None:
            self.returned.append(r)
