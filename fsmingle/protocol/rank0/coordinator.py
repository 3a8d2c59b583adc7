"""Rank 0's side of a generation: gather verified member connections, then release (or void) the world.

Rank 0 holds the master port (:class:`fsmingle.net.channel.Hub`) from before its claim until
exec.  This module is the step loop; each concern is a mixin in a module of its own:

* :mod:`.door` -- who may talk to rank 0 (challenge, HMAC, per-source cap);
* :mod:`.offers` -- free ranks for askers, as short leases;
* :mod:`.hellos` -- verifying a hello against the claim on the filesystem;
* :mod:`.membership` -- the table of verified members, and what happens when a connection drops;
* :mod:`.scan` -- listings at a bounded pace, dead claimers, housekeeping of old generations;
* :mod:`.release` -- prepare, commit (``release.json``), go, barrier; the commit window;
* :mod:`.queueing` -- peer jobs pending in the scheduler's queue (``squeue``);
* :mod:`.reach` -- a rank 0 that nobody reaches steps down (a partitioned node, issue 31).

The decision itself is :func:`fsmingle.protocol.decision.decide` (pure); :meth:`Coordinator.step`
gathers its inputs and carries out its action.
"""

from __future__ import annotations

import logging

from ...fs.layout import master_name
from ...fs.records import (
    encode,
)
from ...net.channel import EventKind
from ..decision import Action, CoordinatorView, decide
from .door import Door
from .hellos import Hellos
from .membership import Membership
from .offers import Offers
from .queueing import Queueing
from .reach import Reach
from .release import Releasing
from .scan import Scanning

log = logging.getLogger("fsmingle")


class Coordinator(Door, Offers, Hellos, Membership, Scanning, Releasing, Queueing, Reach):
    """The rank-0 role of a :class:`~fsmingle.protocol.participant.Participant` in its current generation."""

    def __init__(self, p):
        self.p = p
        self.hub = p.hub
        # Pings to N members: about PINGS_PER_S a second whatever N (Timing.ping_interval_for).
        p.hub.ping_interval = p.timing.ping_interval_for(p.size)
        now = p.clock.monotonic()
        self.inbox: list = []
        self.published = False  # the endpoint in master/ (retried by step() after an ENOENT)
        self.next_endpoint = now
        self._init_door(now)
        self._init_offers(now)
        self._init_hellos(now)
        self._init_scan(now)
        self._init_release(now)
        self._init_reach(now)
        self._init_membership(now)  # last: it reports who is present

    def delay(self) -> float:
        if self.backlog:
            return 0.0  # hellos left unverified by the last step's read budget
        return min(self.p.timing.poll_max, self.p.timing.ping_interval / 2)

    def wait(self, seconds: float) -> None:
        self.inbox.extend(self.hub.poll(seconds))

    def close(self) -> None:
        pass  # the hub belongs to the participant: it lives until exec or a rank change

    def step(self):
        p = self.p
        now = p.clock.monotonic()
        if not self.published or now >= self.next_endpoint:
            # Publish the endpoint where members look for it (a listing of master/), and
            # again every heartbeat period: a record spoiled by a broken writer heals.
            p.publish_record(master_name(p.gen, p.instance), encode(p.beacon(endpoint=True)))  # read back on an error
            self.published, self.next_endpoint = True, now + p.timing.heartbeat_period
        p.heartbeat_if_due(now)
        if self.inbox:
            # What wait() read when it woke us: the channel was polled a moment ago (a poll is
            # an epoll_wait per step for nothing); what came since wakes the next step at once.
            events, self.inbox = self.inbox, []
        else:
            events = self.hub.poll(0)
        for ev in events:
            if p.role is not self:
                break  # the generation ended while handling an earlier event
            if ev.kind is EventKind.ACCEPTED:
                self._on_accepted(ev.conn, ev.peer, now)
            elif ev.kind is EventKind.LOST:
                self._on_lost(ev.conn, ev.why)
            else:
                self._on_message(ev.conn, ev.msg, now)
        if p.role is not self:
            return None  # a fatal reject ended this generation
        self._expire_unauth(now)
        if self._housekeeping(now) or self._step_down_if_unreached(now):
            return None
        self._say_who_never_connects(now)
        self._verify_pending(now)  # most hellos: one direct read of the claim, no listing
        # A hello whose first direct read found nothing is verified only by a listing that shows
        # its claim: list again scan_gap after the last listing (within the list floor), however
        # far the quiet backoff has pushed next_scan.  An ask is answered from a listing no older
        # than scan_interval (claims drawn blind since the last one would collide with what rank 0
        # offers), within the list floor.
        again = self.last_scan + max(self.scan_gap, self._list_floor())
        asks_due = self.asks and now >= max(again, self.last_scan + self.p.timing.scan_interval)
        if now >= self.next_scan or (self.pending and now >= again) or asks_due:
            if self._scan(now):
                return None
        self._answer_asks(now)
        self._verify_pending(now)
        self._queue_step(now)  # peer jobs pending in the scheduler's queue (rank0/queueing.py)
        # Who is missing goes to every member: at once when it changed, but no more often than
        # status_gap (1 s up to N = 500, then N / 500 s: one sealed message per member each time,
        # about 500 a second whatever N; issue 31: at 8,192, 29 status messages per member cost
        # rank 0 more than all its other work), and every status_interval (at least the gap).
        if now >= self.next_status or (self.status_dirty and now >= self.last_status + p.timing.status_gap(p.size)):
            self._push_status(now)
        if now >= self.next_silence_check:
            # Who is silent matters at the scale of stale_after: look twice a second, and hand
            # the decision only the suspects (O(N) twice a second, not at every message).
            self.next_silence_check = now + min(0.5, p.timing.stale_after / 8)
            self.suspects = self.hub.silent_among(self.rank_conn, p.timing.stale_after / 2)
        view = CoordinatorView(
            size=p.size,
            connected=self.rank_conn.keys(),
            silent={r: self.hub.silent_for(c) for r, c in self.suspects if self.rank_conn.get(r) == c},
            lost=dict(self.lost),
            dead_claimers={**self.dead_claimers, **self.refused},
            preparing_for=None if self.preparing_since is None else now - self.preparing_since,
            acked=self.acked_ranks,
            stale_after=p.timing.stale_after,
            ack_timeout=self._ack_timeout(),
            spares=self.spare_ranks,
        )
        action, why = decide(view)
        if action is Action.PREPARE:
            self._prepare(now)
            if p.size == 1:
                return self._commit()
        elif action is Action.COMMIT:
            return self._commit()
        elif action is Action.VOID:
            self._hold_back_if_spared()  # unreached with a spare watching: rank 0 is the spare's (reach.py)
            self._end(why, write=True)
        return None

    def _on_message(self, conn: int, m: dict, now: float) -> None:
        if conn not in self.nonces:
            if not self._authenticate(conn, m):
                return
        elif not self._signed(conn, m):
            return
        self._on_reached()
        t = m.get("t")
        if t == "hello":
            self._on_hello(conn, m, now)
        elif t == "ask":
            self._on_ask(conn, m, now)
        elif t == "ack":
            self._on_ack(conn, m)
        else:
            log.debug("ignoring %r from connection %d", t, conn)
