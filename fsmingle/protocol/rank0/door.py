"""Rank 0's door: who may talk to it at all (the channel's authentication, issues 21 and 29).

Every connection gets a challenge on accept; its first message (a hello or an ask) must carry
an HMAC over it and the member's own nonce, keyed by this generation's secret, which only the
owner-only endpoint record holds (:mod:`fsmingle.net.channel`); from then on, everything rank 0
sends on it is sealed (:mod:`.sealing`).  Whatever fails is dropped at once and costs rank 0 nothing
more.  The threat model is in ``docs/protocol.md``.  Mixed into
:class:`~fsmingle.protocol.rank0.coordinator.Coordinator`.

Unanswered connections are capped so that no client can exhaust rank 0 (:meth:`Door._shed`):
per source address, per /24 (IPv4) or /64 (IPv6) prefix, in total, and by the descriptors the
hub may hold (``Hub.room``: the open-file limit less what the filesystem needs).  The caps grow
with the world (a whole world may knock at once from one address: one big host in rank mode, or
a NAT), and a crowd costs only connections that *failed to answer in time*: one is shed for a
crowded source, prefix or total only once it has had ``probe_timeout`` to answer, oldest first.
Answered connections are never shed, and a burst of members is never taken for a flood: an
unanswered connection that crowds nobody costs a socket, and goes only after ``stale_after``
(a member that got no answer for that long connects again anyway) -- a world arriving faster
than rank 0 reads (thousands from one host, the GIL shared with them) must not be dropped and
reconnect in a storm that keeps rank 0 behind.  Only when the descriptors run short does the
oldest unanswered connection go before its time: the choice is then between it and the
filesystem.
"""

from __future__ import annotations

import functools
import ipaddress
import logging

from ...net.wire import WIRE_VERSION, mac_ok, new_nonce, new_secret, nonce_ok
from .sealing import SealedHub, Session

log = logging.getLogger("fsmingle")

# Caps on connections that have not answered rank 0's challenge yet, for a world of up to this
# many (a bigger world raises each to its size: all of it may arrive at once from one address).
# The cost of an unanswered connection to rank 0 is a socket and 32 bytes, for at most
# stale_after; over a cap, the *oldest* unanswered connection that has had its time to answer
# (probe_timeout) goes, never a new one: a member that shares an address with a flood gets in.
UNAUTH_PER_SOURCE = 64
UNAUTH_PER_PREFIX = 256  # per /24 (IPv4) or /64 (IPv6): one host or one site's NAT
UNAUTH_TOTAL = 1024


@functools.lru_cache(maxsize=4096)
def prefix_of(addr: str) -> str:
    """The /24 (IPv4) or /64 (IPv6) network of a source address, as a string (``"10.1.2.0/24"``);
    the address itself if it is not an IP literal (a fake network's host name)."""
    try:
        ip = ipaddress.ip_address(addr.split("%")[0])
    except ValueError:
        return addr
    return str(ipaddress.ip_network(f"{ip}/{24 if ip.version == 4 else 64}", strict=False))


class Door:
    """Authentication of rank 0's connections (see the module doc)."""

    def _init_door(self, now: float) -> None:
        # This generation's secret, published in the endpoint record only; connections
        # challenged but not answered yet (conn -> (nonce, accepted at, source, prefix), in
        # accept order), the same by source and by prefix, and answered ones' nonces.
        self.secret = new_secret()
        size = self.p.size
        self.caps = {
            "source": max(UNAUTH_PER_SOURCE, size),
            "prefix": max(UNAUTH_PER_PREFIX, size),
            "total": max(UNAUTH_TOTAL, 2 * size),
        }
        self.unauth: dict[int, tuple[str, float, str, str]] = {}
        self.unauth_of: dict[str, dict[int, None]] = {}  # a source address or a prefix -> conns
        self.crowded: set[str] = set()  # sources and prefixes over their cap (until under it)
        self.nonces: dict[int, str] = {}
        # Answered connections' nonces and counters: what rank 0 sends them leaves sealed, here
        # for every mixin at once (SealedHub wraps the participant's hub for this generation).
        self.sessions: dict[int, Session] = {}
        self.hub = SealedHub(self.hub, self.sessions)
        self.refused_conns = 0  # connections dropped for failing the challenge (logged once)
        self.shed_conns = 0  # of which shed for a crowd or for descriptors (logged once)

    def _answer_time(self) -> float:
        """Seconds an unanswered connection may not be shed for a crowd (``probe_timeout``): a
        member answers within a round trip of reading the challenge."""
        return self.p.timing.probe_timeout

    def _on_accepted(self, conn: int, peer: str, now: float) -> None:
        """Challenge a new connection; it must answer in time (_expire_unauth)."""
        nonce = new_nonce()
        net = prefix_of(peer)
        self.unauth[conn] = (nonce, now, peer, net)
        for key, cap in ((peer, self.caps["source"]), (net, self.caps["prefix"])):
            conns = self.unauth_of.setdefault(key, {})
            conns[conn] = None
            if len(conns) > cap:
                self.crowded.add(key)
        # The version: a member of another wire version knows at once (it reads the endpoint
        # record's fsmingle version before it believes a challenge that nobody signed).
        self.hub.send(conn, {"t": "challenge", "nonce": nonce, "v": WIRE_VERSION})

    def _expire_unauth(self, now: float) -> None:
        """Drop unanswered connections past ``stale_after``, and shed crowds (:meth:`_shed`).
        Run after a whole batch of events, so that a member whose answer came in the same batch
        as a burst of accepts from its address is not shed for them."""
        deadline = now - self.p.timing.stale_after
        while self.unauth:
            conn, (_, since, src, _net) = next(iter(self.unauth.items()))  # accept order: oldest first
            if since > deadline:
                break
            self._refuse(conn, f"no answer to the challenge within {self.p.timing.stale_after:g} s from {src}")
        self._shed(now)

    def _shed(self, now: float) -> None:
        """Shed unanswered connections, oldest first: of a crowded source or prefix, and beyond the
        total, those that had :meth:`_answer_time` to answer; and as many as it takes, whatever
        their age, to keep the hub room to accept (``Hub.room``: descriptors kept for the store)."""
        if not self.unauth:
            return  # every step runs this: nothing unanswered, nothing to shed
        answered_by = now - self._answer_time()
        for key in list(self.crowded):
            conns = self.unauth_of.get(key, {})
            cap = self.caps["prefix" if "/" in key else "source"]
            while len(conns) > cap:
                conn = next(iter(conns))
                if self.unauth[conn][1] > answered_by:
                    break  # the rest are younger still: their time to answer is not up
                self._shed_one(conn, f"more than {cap} unanswered connections from {key}")
            if len(conns) <= cap:
                self.crowded.discard(key)
        while len(self.unauth) > self.caps["total"]:
            conn, entry = next(iter(self.unauth.items()))
            if entry[1] > answered_by:
                break
            self._shed_one(conn, f"more than {self.caps['total']} unanswered connections in all")
        room = getattr(self.hub, "room", None)  # the model's fake networks have no descriptors
        if room is None:
            return
        # Keep room for a burst: a 16th of the hub's limit (at least 8), so that a flood parked
        # at the limit cannot keep the next member waiting in the kernel's backlog.
        want = max(8, getattr(self.hub, "limit", 128) // 16)
        short = want - room()
        while short > 0 and self.unauth:
            self._shed_one(next(iter(self.unauth)), "rank 0's open-file room is taken by unanswered connections")
            short -= 1

    def _shed_one(self, conn: int, why: str) -> None:
        self.shed_conns += 1
        if self.shed_conns == 1:
            log.warning(
                "job %s: rank 0 is shedding connections to its port that did not answer its challenge "
                "(%s; a flood, or a world arriving faster than rank 0 reads)",
                self.p.job_id,
                why,
            )
        self._refuse(conn, why)

    def _forget_conn(self, conn: int) -> None:
        self.nonces.pop(conn, None)
        self.sessions.pop(conn, None)
        self.waiting.pop(conn, None)
        self.offers_to.pop(conn, None)
        entry = self.unauth.pop(conn, None)
        if entry is not None:
            for key in entry[2:]:
                conns = self.unauth_of.get(key)
                if conns is not None:
                    conns.pop(conn, None)
                    if not conns:
                        del self.unauth_of[key]
                        self.crowded.discard(key)

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
