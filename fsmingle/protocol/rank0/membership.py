"""Rank 0's table of members: which verified connection holds which rank, who is missing, and
what rank 0 does when a member's connection drops (:meth:`Membership._on_lost`).

A verified member is in ``rank_conn``/``conn_rank``; when its connection drops, it leaves the
table, its rank goes back to the sorted list of missing ranks, and the drop is recorded in
``lost`` -- which :func:`fsmingle.protocol.decision.decide` turns into a void (no release on
absence of evidence).  Its offer, if it was an asker, goes back to the pool.  Who is missing
goes to every member (``status``) and into timeout messages.  Mixed into
:class:`~fsmingle.protocol.rank0.coordinator.Coordinator`.
"""

from __future__ import annotations

import bisect
import logging

from ...fs.layout import ranges
from ...fs.records import (
    Member,
    encode_vouch,
)
from ...net.channel import hostport
from ..states import RankSet

log = logging.getLogger("fsmingle")


class Membership:
    """The table of verified members (see the module doc)."""

    def _init_membership(self, now: float) -> None:
        p = self.p
        self.rank_conn: dict[int, int] = {}
        self.conn_rank: dict[int, int] = {}
        self.members: dict[int, Member] = {}
        self.lost: dict[int, str] = {}
        self.explicit: dict[int, bool] = {}
        # Present ranks held by participants started as spares, rank 0 included if it is one
        # (decision.decide never releases a world of spares alone; members hear the count).
        self.spare_ranks: set[int] = {0} if p.spare else set()
        self.keys: dict[int, str] = {}
        self.member_jobs: dict[int, str] = {}  # rank -> its scheduler job ("4242_3"), from the hello
        self.want_members: set[int] = set()
        self.probe_ports: dict[str, int] = {}  # instance -> port its neighbours probe (--check-mesh)
        self.missing_sorted: list[int] = list(range(1, p.size))  # member ranks not in rank_conn
        self.next_silence_check = now
        self.suspects: list[tuple[int, int]] = []  # (rank, conn) silent for stale_after / 2 at the last look
        self.arrived: dict[int, float] = {0: now}
        self.next_status = now + 1.0
        self.last_status = now + 1.0 - p.timing.status_interval  # the first push: at the first step
        self.status_dirty = True
        p.present_spares = len(self.spare_ranks)
        p.set_present(RankSet(p.size, range(1, p.size)))

    def _on_lost(self, conn: int, why: str) -> None:
        self._forget_conn(conn)
        self.askers.discard(conn)
        self._give_back(self._withdraw_offer(conn))
        self.pending.pop(conn, None)
        self._unbind(conn, why)

    def _unbind(self, conn: int, why: str) -> None:
        """A verified member's connection is gone: its rank is missing again, and the loss is
        recorded (``lost``: the decision voids the generation).  Nothing if ``conn`` held no rank."""
        r = self.conn_rank.pop(conn, None)
        if r is not None:
            if self.rank_conn.pop(r, None) is not None:
                bisect.insort(self.missing_sorted, r)
            self.lost[r] = why
            self.spare_ranks.discard(r)
            self.status_dirty = True

    def _reject(self, conn: int, why: str, fatal: bool = False) -> None:
        self.hub.send(conn, {"t": "reject", "why": why, "fatal": fatal})
        self.hub.drop(conn)
        self._forget_conn(conn)
        self.pending.pop(conn, None)
        self.askers.discard(conn)
        self._give_back(self._withdraw_offer(conn))
        # A verified member's connection dropped here is lost like any other (issue 29: its rank
        # stayed bound to the closed connection, looked silent for stale_after, then voided).
        self._unbind(conn, f"rank 0 rejected it: {why}")

    def _broadcast(self, msg: dict) -> None:
        for conn in list(self.conn_rank) + list(self.pending) + list(self.askers):
            self.hub.send(conn, msg)

    def _push_status(self, now: float) -> None:
        p = self.p
        p.present_spares = len(self.spare_ranks)
        p.set_present(RankSet(p.size, self._missing()))
        self.last_status = now
        self.next_status = now + p.timing.status_period(p.size)
        self.status_dirty = False
        msg = {"t": "status", **self._status()}
        for conn in self.conn_rank:
            self.hub.send(conn, msg)

    def _missing(self) -> list[int]:
        """Member ranks not connected (and verified) yet, ascending (kept sorted as connections
        come and go, so a welcome or status message costs O(64), not O(N); do not modify)."""
        return self.missing_sorted

    def _status(self) -> dict:
        """Who is present and missing, for members' progress lines and timeout messages."""
        missing = self._missing()
        st = {"present": self.p.size - len(missing), "missing": missing[:64], "nmissing": len(missing)}
        if self.spare_ranks:
            st["spares"] = len(self.spare_ranks)  # of the present: spares alone make no world (outside.py)
        if self.p.queue is not None:
            st["queue"] = self.p.queue.as_wire()  # peer jobs in the scheduler's queue (rank0/queueing.py)
        if self.p.waiting_why:
            st["why"] = self.p.waiting_why[:500]  # who never connects (rank0/reach.py): members say it too
        return st

    def vouch(self) -> str:
        """The bitmap of connected, verified members that rank 0's beacon carries (``Beacon.vouch``)."""
        return encode_vouch(self.rank_conn, self.p.size)

    def missing_description(self) -> str:
        p = self.p
        who = "node ranks" if p.mode == "node" else "ranks"
        missing = list(self._missing())
        p.missing_hint = missing
        absent = [r for r in missing if r not in self.listed]
        absent = p.never_seen(absent)  # the never-seen ones are the news
        parts = []
        if absent:
            parts.append(
                f"missing {who} {ranges(absent)} ({len(absent)} of {p.size})"
                if len(absent) <= 64
                else f"{len(absent)} of {p.size} {who} missing"
            )
        unconnected = self._unconnected()
        if unconnected:
            parts.append(unconnected)
        first = min(self.arrived.values())
        seen = sorted((t - first, r) for r, t in self.arrived.items() if r == 0 or r in self.rank_conn)
        hosts = {0: p.me.hostname, **{r: m.host.hostname for r, m in self.members.items()}}
        present = ", ".join(f"{r} ({hosts.get(r, '?')}) +{dt:.1f} s" for dt, r in seen[:16])
        more = f" and {len(seen) - 16} more" if len(seen) > 16 else ""
        parts.append(f"present ({len(seen)} of {p.size}, seconds after the first arrival): {present}{more}")
        return "; ".join(parts)

    def _unconnected(self) -> str:
        """Ranks that claimed a place on the filesystem but never connected: the unreachable ones, named."""
        p = self.p
        who = "node ranks" if p.mode == "node" else "ranks"
        unconnected = sorted(r for r in self.listed if r != 0 and r not in self.members)
        if not unconnected:
            return ""
        return (
            f"{who} {ranges(unconnected[:64])} claimed a place but never connected to the master at "
            f"{hostport(p.addr, self.hub.port)} (check their --iface/--addr, routes and firewalls)"
        )
