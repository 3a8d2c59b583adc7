"""Rank 0's door: who may talk to it at all (the channel's authentication, issue 21).

Every connection gets a challenge on accept; its first message (a hello or an ask) must carry
an HMAC over it and the member's own nonce, keyed by this generation's secret, which only the
owner-only endpoint record holds (:mod:`fsmingle.net.channel`); from then on, everything rank 0
sends on it is sealed (:mod:`.sealing`).  Whatever fails is dropped at once and costs rank 0 nothing
more; connections that never answer go after ``probe_timeout``, and a source's unauthenticated
connections are capped (:data:`UNAUTH_PER_SOURCE`, oldest evicted first).  The threat model is in
``docs/protocol.md``.  Mixed into :class:`~fsmingle.rendezvous.rank0.coordinator.Coordinator`.
"""

from __future__ import annotations

import logging

from ...net.wire import WIRE_VERSION, mac_ok, new_nonce, new_secret, nonce_ok
from .sealing import SealedHub, Session

log = logging.getLogger("fsmingle")

# Connections that have not answered rank 0's challenge yet, per source address.  A member
# answers within one round trip, so this is the most participants of one host (rank mode: one
# per GPU or process) that can connect in the same instant without one of them having to try
# again; the cost of an unanswered connection to rank 0 is a socket and 32 bytes for at most
# probe_timeout.  When a source exceeds it, its *oldest* unauthenticated connection goes, never
# the new one: a legitimate member that shares an address with a flood still gets in (it
# authenticates within a round trip of its accept).
UNAUTH_PER_SOURCE = 64


class Door:
    """Authentication of rank 0's connections (see the module doc)."""

    def _init_door(self, now: float) -> None:
        # This generation's secret, published in the endpoint record only; connections
        # challenged but not answered yet (conn -> (nonce, deadline, source), in accept order),
        # the same by source, and answered ones' nonces.
        self.secret = new_secret()
        self.unauth: dict[int, tuple[str, float, str]] = {}
        self.unauth_of: dict[str, dict[int, None]] = {}
        self.crowded: set[str] = set()  # sources over UNAUTH_PER_SOURCE since the last step
        self.nonces: dict[int, str] = {}
        # Answered connections' nonces and counters: what rank 0 sends them leaves sealed, here
        # for every mixin at once (SealedHub wraps the participant's hub for this generation).
        self.sessions: dict[int, Session] = {}
        self.hub = SealedHub(self.hub, self.sessions)
        self.refused_conns = 0  # connections dropped for failing the challenge (logged once)

    def _on_accepted(self, conn: int, peer: str, now: float) -> None:
        """Challenge a new connection; it must answer within ``probe_timeout`` (_expire_unauth)."""
        nonce = new_nonce()
        self.unauth[conn] = (nonce, now + self.p.timing.probe_timeout, peer)
        conns = self.unauth_of.setdefault(peer, {})
        conns[conn] = None
        if len(conns) > UNAUTH_PER_SOURCE:
            self.crowded.add(peer)
        # The version: a member of another wire version knows at once (it reads the endpoint
        # record's fsmingle version before it believes a challenge that nobody signed).
        self.hub.send(conn, {"t": "challenge", "nonce": nonce, "v": WIRE_VERSION})

    def _expire_unauth(self, now: float) -> None:
        """Drop unanswered connections: beyond UNAUTH_PER_SOURCE per source (oldest first), and
        any past its deadline.  Run after a whole batch of events, so that a member whose answer
        came in the same batch as a burst of accepts from its address is not evicted for them."""
        crowded, self.crowded = self.crowded, set()
        for src in crowded:
            conns = self.unauth_of.get(src, {})
            while len(conns) > UNAUTH_PER_SOURCE:
                self._refuse(next(iter(conns)), f"more than {UNAUTH_PER_SOURCE} unauthenticated connections from {src}")
        while self.unauth:
            conn, (_, deadline, src) = next(iter(self.unauth.items()))  # accept order: oldest deadline first
            if deadline > now:
                break
            self._refuse(conn, f"no answer to the challenge within {self.p.timing.probe_timeout:g} s from {src}")

    def _forget_conn(self, conn: int) -> None:
        self.nonces.pop(conn, None)
        self.sessions.pop(conn, None)
        self.waiting.pop(conn, None)
        self.offers_to.pop(conn, None)
        entry = self.unauth.pop(conn, None)
        if entry is not None:
            conns = self.unauth_of.get(entry[2])
            if conns is not None:
                conns.pop(conn, None)
                if not conns:
                    del self.unauth_of[entry[2]]

    def _refuse(self, conn: int, why: str) -> None:
        """Drop a connection that failed authentication: no answer, nothing more spent on it."""
        src = self.unauth.get(conn, (None, None, "?"))[2]
        self.hub.drop(conn)
        self._forget_conn(conn)
        self.refused_conns += 1
        if self.refused_conns == 1:
            log.warning(
                "job %s: rank 0 dropped a connection to its port that did not authenticate (%s); "
                "further ones are logged at debug level",
                self.p.job_id,
                why,
            )
        else:
            log.debug("job %s: dropped connection %d from %s: %s", self.p.job_id, conn, src, why)

    def _authenticate(self, conn: int, m: dict) -> bool:
        """The first message on a connection: a hello or an ask with the right ``mac`` over this
        connection's challenge, else the connection is dropped at once.  A real fsmingle peer of
        an older wire version is told so (the one answer an unauthenticated peer gets)."""
        entry = self.unauth.get(conn)
        t = m.get("t")
        if entry is None:  # accepted before this generation (a kept --port): not challenged by us
            self._refuse(conn, "a connection this generation did not challenge")
            return False
        v = m.get("v")
        if t in ("hello", "ask") and isinstance(v, int) and not isinstance(v, bool) and 0 < v < WIRE_VERSION:
            self._forget_conn(conn)
            self._agrees(conn, m)  # the version mismatch: a fatal reject naming both versions
            return False
        rank = m.get("rank") if t == "hello" else None
        # The member's nonce binds what rank 0 says back to this connection (sealing.py); a peer
        # that sends none gets "" (it is the member's protection, not rank 0's).
        mnonce = m.get("mnonce", "")
        if (
            t not in ("hello", "ask")
            or not (mnonce == "" or nonce_ok(mnonce))
            or not mac_ok(
                self.secret, entry[0], m.get("mac"), t, m.get("job"), m.get("gen"), m.get("inst"), rank, mnonce
            )
        ):
            self._refuse(conn, f"a {str(t)[:16]!r} without a valid mac")
            return False
        self._forget_conn(conn)
        self.nonces[conn] = entry[0]
        self.sessions[conn] = Session(self.secret, entry[0], mnonce)
        return True

    def _signed(self, conn: int, m: dict) -> bool:
        """A later hello, ask or ack on an authenticated connection carries a valid ``mac`` too."""
        t = m.get("t")
        nonce, mn = self.nonces[conn], self.sessions[conn].mnonce
        if t in ("hello", "ask"):
            rank = m.get("rank") if t == "hello" else None
            ok = mac_ok(self.secret, nonce, m.get("mac"), t, m.get("job"), m.get("gen"), m.get("inst"), rank, mn)
        elif t == "ack" and conn in self.conn_rank:
            r = self.conn_rank[conn]
            ok = mac_ok(
                self.secret, nonce, m.get("mac"), t, self.p.job_id, m.get("gen"), self.members[r].instance, r, mn
            )
        else:
            return True  # nothing rank 0 acts on
        if not ok:
            self.hub.drop(conn)
            self._on_lost(conn, f"it sent a {t!r} without a valid mac")
        return ok

    def _agrees(self, conn: int, m: dict) -> bool:
        """Check a hello's or an ask's version, world, run and generation; reject the peer if not."""
        p = self.p
        if m.get("v") != WIRE_VERSION:
            self._reject(
                conn,
                f"this master speaks fsmingle wire protocol {WIRE_VERSION}, you sent {m.get('v')!r}; "
                "run the same fsmingle version on every node",
                fatal=True,
            )
            return False
        host = m.get("host") if isinstance(m.get("host"), dict) else {}
        who = f"{host.get('hostname', '?')} ({m.get('addr')})"
        if m.get("size") != p.size or m.get("mode") != p.mode:
            # The member fails (exit 11) with this message; rank 0 keeps its
            # place and waits for members that agree with it.
            msg = (
                f"rank 0 on {p.me.hostname} ({p.addr}) expects a world of {p.size} ({p.mode} mode) but "
                f"{who} expects {m.get('size')} ({m.get('mode')} mode); give every participant the same "
                "--nnodes (or --world-size)"
            )
            log.error("job %s: %s", p.job_id, msg)
            self._reject(conn, msg, fatal=True)
            return False
        if m.get("job") != p.job_id or m.get("gen") != p.gen:
            self._reject(conn, f"this master is job {p.job_id!r} generation {p.gen}")
            return False
        rc = m.get("restart_count")
        if type(rc) is int and rc > p.restart_count and p.slurm_job_id and m.get("slurm_job_id") == p.slurm_job_id:
            # We are the leftover of a run Slurm requeued away: give the place up.  Checked after
            # the job and generation (a peer that proves nothing must not end a generation),
            # and only inside a Slurm job (outside one, "" == "" proves nothing either).
            why = (
                f"rank 0 on {p.me.hostname} belongs to an earlier run of this job "
                f"(SLURM_RESTART_COUNT {p.restart_count} < {rc})"
            )
            self._reject(conn, why)
            self._end(why, write=True)
            return False
        return True
