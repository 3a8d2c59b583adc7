"""Rank 0's side of a generation: gather verified member connections, then release (or void) the world.

Rank 0 holds the master port (:class:`fsmingle.channel.Hub`) from before its
claim until exec.  Each member connects and says who it is; rank 0 checks that
identity against the claim on the filesystem -- one direct read, since the
member linked it before saying hello; after a read that found nothing, only
once a listing shows the name, because a name looked up too early can stay
"absent" in a negative lookup cache -- and keeps the connection.  Members of a
big world without a rank ask for one (``ask``/``offer``, :mod:`fsmingle.member`),
and rank 0's beacon vouches for its verified members (``Beacon.vouch``).  The decision
itself is :func:`fsmingle.decision.decide`; this module gathers its inputs and
carries out its action:

* PREPARE: ask every member to acknowledge the release (proof of life *now*);
* COMMIT: create ``release.json`` exclusively (it races only with voids),
  send each member its :class:`~fsmingle.decision.Placement`, and wait for the
  members to close (the barrier before exec);
* VOID: create the restart decision, tell every member, regroup.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging

from .channel import WIRE_VERSION, EventKind, encode_parts, hostport, mac_ok, new_nonce, new_secret
from .decision import Action, CoordinatorView, decide, order_members, placements
from .errors import FsmingleError, RecordError
from .layout import RELEASE, claimed_ranks, gen_name, master_name, member_chunk_name, ranges, release_name
from .liveness import Verdict
from .mesh import mesh_probe
from .records import Member, Release, encode, encode_release, encode_vouch, hostid_from_dict, instance_id, validate_addr
from .states import RankSet
from .testhooks import pause

log = logging.getLogger("fsmingle")

# Rank 0's listings read at most this many directory entries per second on average: with the
# metadata-server cost of benchmarks/sim (2 us per entry listed) that is 4 % of one server.
# Members are verified by a direct read of their claim at their hello, so at scale the listing
# is only for decisions by others and claimers that never connect.
LISTED_ENTRIES_PER_S = 20_000
VERIFY_READS_PER_STEP = 64  # claim reads per step before rank 0 turns back to its connections
# Connections that have not answered rank 0's challenge yet, per source address.  A member
# answers within one round trip, so this is the most participants of one host (rank mode: one
# per GPU or process) that can connect in the same instant without one of them having to try
# again; the cost of an unanswered connection to rank 0 is a socket and 32 bytes for at most
# probe_timeout.  When a source exceeds it, its *oldest* unauthenticated connection goes, never
# the new one: a legitimate member that shares an address with a flood still gets in (it
# authenticates within a round trip of its accept).
UNAUTH_PER_SOURCE = 64
# Offers one connection may receive without ever saying hello.  A legitimate asker needs one,
# a second or third when its link() loses to a claim rank 0 could not know of; one that keeps
# asking is dropped after this many (it then lists the generation, if it is one of ours).
MAX_OFFERS_PER_CONN = 8


def member_parts(rel: Release) -> list[str]:
    """The released world's member list ``[[hostname, addr, arrival], ...]`` in rank order, as
    :func:`fsmingle.channel.encode_parts` parts (hostfiles: ``env --format hostfile|json``)."""
    return encode_parts([[m.host.hostname, m.addr, m.arrival] for m in rel.members])


class Coordinator:
    """The rank-0 role of a :class:`~fsmingle.protocol.Participant` in its current generation."""

    def __init__(self, p):
        self.p = p
        self.hub = p.hub
        now = p.clock.monotonic()
        self.rank_conn: dict[int, int] = {}
        self.conn_rank: dict[int, int] = {}
        self.members: dict[int, Member] = {}
        self.pending: dict[int, tuple[dict, float]] = {}  # conn -> (hello, when)
        self.lost: dict[int, str] = {}
        self.dead_claimers: dict[int, str] = {}
        self.refused: dict[int, str] = {}  # members that acked with an error (e.g. the master port was busy)
        self.explicit: dict[int, bool] = {}
        self.keys: dict[int, str] = {}
        self.want_members: set[int] = set()
        self.probe_ports: dict[str, int] = {}  # instance -> port its neighbours probe (--check-mesh)
        self.final: list[Member] = []
        self.master_slot = 0
        self.master_port: int | None = None
        self.listed: set[int] = set()
        self.looked_up: set[int] = set()  # claims read directly on a hello (see _verify_pending)
        self.askers: set[int] = set()  # connections of members without a rank (see _on_ask)
        self.asks: list[int] = []  # askers to answer at the end of this step
        self.known_taken: set[int] = set()  # ranks askers found claimed
        self.offered: dict[int, int] = {}  # rank -> the asker's connection it is on offer to
        self.offer_of: dict[int, int] = {}  # the same, by connection (an asker holds one offer)
        # Leases (see _answer_asks): rank -> when its offer runs out, in the order made (so the
        # oldest is first: expiring costs O(expired)); offers made per connection; askers told
        # to wait, longest-waiting first; ranks given back since the last step.
        self.offer_until: dict[int, float] = {}
        self.offers_to: dict[int, int] = {}
        self.waiting: dict[int, float] = {}
        self.returned: list[int] = []
        # The channel's authentication (fsmingle.channel): this generation's secret, published in
        # the endpoint record only; connections challenged but not answered yet (conn -> (nonce,
        # deadline, source), in accept order), the same by source, and answered ones' nonces.
        self.secret = new_secret()
        self.unauth: dict[int, tuple[str, float, str]] = {}
        self.unauth_of: dict[str, dict[int, None]] = {}
        self.crowded: set[str] = set()  # sources over UNAUTH_PER_SOURCE since the last step
        self.nonces: dict[int, str] = {}
        self.refused_conns = 0  # connections dropped for failing the challenge (logged once)
        self.missing_sorted: list[int] = list(range(1, p.size))  # member ranks not in rank_conn
        self.cursor = 1
        self.backlog = False
        self.next_silence_check = now
        self.suspects: list[tuple[int, int]] = []  # (rank, conn) silent for stale_after / 2 at the last look
        self.first_listed: dict[int, float] = {}  # rank -> when a listing first showed its claim
        self.inbox: list = []
        self.prepared: Release | None = None
        # The commit window (docs/protocol.md, "The commit window"): from the moment rank 0 attempts
        # the create of a released release.json, a release may exist -- even if the create raised
        # (a link() that took effect and answered EIO on a soft NFS mount).  From then on rank 0
        # never says void unless it has read (or itself created) a restart record.
        self.commit_attempted = False
        self.go_sent: set[int] = set()  # connections that have their go
        self.preparing_since: float | None = None
        self.acked_ranks: set[int] = set()
        self.arrived: dict[int, float] = {0: now}
        self.next_scan = now
        self.last_scan = now
        self.scan_gap = p.timing.poll_min
        self.scan_quiet = p.timing.scan_interval
        self.last_listing_size = -1
        self.next_judge = now + p.timing.heartbeat_period
        self.next_status = now + 1.0
        self.status_dirty = True
        self.published = False  # the endpoint in master/ (retried by step() after an ENOENT)
        self.next_endpoint = now
        # Housekeeping of generations (_housekeeping): one cleaning, a periodic look for newer ones.
        self.cleaned = False
        self.next_superseded_check = now + p.timing.stale_after
        p.set_present(RankSet(p.size, range(1, p.size)))

    # -------------------------------------------------------------- loop plumbing
    def delay(self) -> float:
        if self.backlog:
            return 0.0  # hellos left unverified by the last step's read budget
        return min(self.p.timing.poll_max, self.p.timing.ping_interval / 2)

    def wait(self, seconds: float) -> None:
        self.inbox.extend(self.hub.poll(seconds))

    @property
    def acked(self) -> bool:
        """True once a release may exist: rank 0 attempted the create of ``release.json`` (the
        commit window).  ``Leaving.withdraw`` then reads the decision back instead of walking away."""
        return self.commit_attempted

    def close(self) -> None:
        pass  # the hub belongs to the participant: it lives until exec or a rank change

    def leaving(self, why: str, *, voided: bool = True, released: Release | None = None) -> None:
        """Tell every member how rank 0 leaves, and let them read it before the sockets close.

        Args:
            why (str): the reason members see.
            voided (bool): a restart record for this generation was read or created by this
                process.  Only then do members hear ``void``; otherwise (in the commit window,
                with the decision unknown) they hear nothing and lose the connection, which makes
                every member that acknowledged read ``release.json`` (``member.Member._lost``).
            released (Release | None): the released decision naming this generation, read back:
                members that have no go yet get it now (no member has to read the record).

        Closing a socket with unread incoming data (a ping) makes Linux send RST,
        and the peer may lose what it had not read yet: wait for members to close first.
        """
        if released is not None:
            self._send_go(released)
        elif voided:
            self._broadcast({"t": "void", "why": why})
        self.hub.drain(min(0.5, self.p.timing.probe_timeout))
        if released is None and not voided:
            # In doubt: drop every connection now (the listener stays: its port may be the
            # released master port), so members read the decision at once, not after stale_after.
            for conn in list(self.conn_rank) + list(self.pending) + list(self.askers):
                self.hub.drop(conn)

    # -------------------------------------------------------------- the step
    def step(self):
        p = self.p
        now = p.clock.monotonic()
        if not self.published or now >= self.next_endpoint:
            # Publish the endpoint where members look for it (a listing of master/), and
            # again every heartbeat period: a record spoiled by a broken writer heals.
            p.store.publish(master_name(p.gen, p.instance), encode(p.beacon(endpoint=True)))
            self.published, self.next_endpoint = True, now + p.timing.heartbeat_period
        p.heartbeat_if_due(now)
        events, self.inbox = self.inbox + self.hub.poll(0), []
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
        if self._housekeeping(now):
            return None
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
        # Who is missing goes to every member: at once when it changed, but no more often than
        # every N / 10,000 s (1 s up to N = 10,000; 13 s at 131,072: N messages each time).
        gap = max(1.0, p.size / 10_000)
        if now >= self.next_status or (self.status_dirty and now >= self.next_status - p.timing.status_interval + gap):
            self._push_status(now)
        if now >= self.next_silence_check:
            # Who is silent matters at the scale of stale_after: look twice a second, and hand
            # the decision only the suspects (O(N) twice a second, not at every message).
            self.next_silence_check = now + min(0.5, p.timing.stale_after / 8)
            half = p.timing.stale_after / 2
            self.suspects = [(r, c) for r, c in self.rank_conn.items() if self.hub.silent_for(c) >= half]
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
        )
        action, why = decide(view)
        if action is Action.PREPARE:
            self._prepare(now)
            if p.size == 1:
                return self._commit()
        elif action is Action.COMMIT:
            return self._commit()
        elif action is Action.VOID:
            self._end(why, write=True)
        return None

    # -------------------------------------------------------------- housekeeping (generations)
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
        from .layout import BEACON_RE, GEN_RE, master_dir  # here: keeps this housekeeping apart

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

    # -------------------------------------------------------------- events
    def _on_lost(self, conn: int, why: str) -> None:
        self._forget_conn(conn)
        self.askers.discard(conn)
        self._give_back(self._withdraw_offer(conn))
        self.pending.pop(conn, None)
        r = self.conn_rank.pop(conn, None)
        if r is not None:
            if self.rank_conn.pop(r, None) is not None:
                bisect.insort(self.missing_sorted, r)
            self.lost[r] = why
            self.status_dirty = True

    def _reject(self, conn: int, why: str, fatal: bool = False) -> None:
        self.hub.send(conn, {"t": "reject", "why": why, "fatal": fatal})
        self.hub.drop(conn)
        self._forget_conn(conn)
        self.pending.pop(conn, None)
        self.askers.discard(conn)
        self._give_back(self._withdraw_offer(conn))

    # -------------------------------------------------------------- authentication
    def _on_accepted(self, conn: int, peer: str, now: float) -> None:
        """Challenge a new connection; it must answer within ``probe_timeout`` (_expire_unauth)."""
        nonce = new_nonce()
        self.unauth[conn] = (nonce, now + self.p.timing.probe_timeout, peer)
        conns = self.unauth_of.setdefault(peer, {})
        conns[conn] = None
        if len(conns) > UNAUTH_PER_SOURCE:
            self.crowded.add(peer)
        self.hub.send(conn, {"t": "challenge", "nonce": nonce})

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
        if t not in ("hello", "ask") or not mac_ok(
            self.secret, entry[0], m.get("mac"), t, m.get("job"), m.get("gen"), m.get("inst"), rank
        ):
            self._refuse(conn, f"a {str(t)[:16]!r} without a valid mac")
            return False
        self._forget_conn(conn)
        self.nonces[conn] = entry[0]
        return True

    def _signed(self, conn: int, m: dict) -> bool:
        """A later hello, ask or ack on an authenticated connection carries a valid ``mac`` too."""
        t = m.get("t")
        nonce = self.nonces[conn]
        if t in ("hello", "ask"):
            rank = m.get("rank") if t == "hello" else None
            ok = mac_ok(self.secret, nonce, m.get("mac"), t, m.get("job"), m.get("gen"), m.get("inst"), rank)
        elif t == "ack" and conn in self.conn_rank:
            r = self.conn_rank[conn]
            ok = mac_ok(self.secret, nonce, m.get("mac"), t, self.p.job_id, m.get("gen"), self.members[r].instance, r)
        else:
            return True  # nothing rank 0 acts on
        if not ok:
            self.hub.drop(conn)
            self._on_lost(conn, f"it sent a {t!r} without a valid mac")
        return ok

    def _on_message(self, conn: int, m: dict, now: float) -> None:
        if conn not in self.nonces:
            if not self._authenticate(conn, m):
                return
        elif not self._signed(conn, m):
            return
        t = m.get("t")
        if t == "hello":
            self._on_hello(conn, m, now)
        elif t == "ask":
            self._on_ask(conn, m, now)
        elif t == "ack":
            r = self.conn_rank.get(conn)
            if r is not None and m.get("gen") == self.p.gen and self.preparing_since is not None:
                if m.get("mesh_fail"):
                    self.refused[r] = str(m["mesh_fail"])[:1000]
                    return
                if r == self.master_slot and self.master_slot != 0:
                    port = m.get("port")
                    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
                        self.refused[r] = f"could not hold the master port: {m.get('error', 'no port given')}"
                        return
                    self.master_port = port
                self.acked_ranks.add(r)
        else:
            log.debug("ignoring %r from connection %d", t, conn)

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

    def _on_ask(self, conn: int, m: dict, now: float) -> None:
        """A member without a rank asks for one (``fsmingle.member``, "asking"): answered by _answer_asks."""
        if not self._agrees(conn, m):
            return
        self.askers.add(conn)
        taken = m.get("taken")
        for r in taken[:64] if isinstance(taken, list) else ():
            if isinstance(r, int) and not isinstance(r, bool) and 0 < r < self.p.size:
                self.known_taken.add(r)
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

    def _on_hello(self, conn: int, m: dict, now: float) -> None:
        p = self.p
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
        p = self.p
        reads = 0
        self.backlog = False
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
                self.keys[r] = str(m.get("key") or "")[:256]
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

    def _scan(self, now: float) -> bool:
        """List the generation: decisions by others, new claims, claimers that died before connecting.

        Returns True if the generation ended (someone else decided it).
        """
        p = self.p
        names = p.store.listdir(gen_name(p.gen))
        self.last_scan = now
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

    def vouch(self) -> str:
        """The bitmap of connected, verified members that rank 0's beacon carries (``Beacon.vouch``)."""
        return encode_vouch(self.rank_conn, self.p.size)

    def _list_floor(self) -> float:
        """Seconds between two listings at least, so that rank 0 reads at most
        ``LISTED_ENTRIES_PER_S`` directory entries per second on average (0.05 s at N = 512,
        13 s at N = 131,072: a listing costs the metadata server in proportion to its entries)."""
        return max(0, self.last_listing_size) / LISTED_ENTRIES_PER_S

    # -------------------------------------------------------------- actions
    def _broadcast(self, msg: dict) -> None:
        for conn in list(self.conn_rank) + list(self.pending) + list(self.askers):
            self.hub.send(conn, msg)

    def _push_status(self, now: float) -> None:
        p = self.p
        p.set_present(RankSet(p.size, self._missing()))
        self.next_status = now + p.timing.status_interval
        self.status_dirty = False
        msg = {"t": "status", **self._status()}
        for conn in self.conn_rank:
            self.hub.send(conn, msg)

    def _ack_timeout(self) -> float:
        """Seconds each member has to acknowledge: a loaded host must not void a healthy world, a
        partitioned one must not hold it long (``probe_timeout``, at least ``stale_after`` / 6; x3 with
        ``--check-mesh``, whose probes come first)."""
        t = max(self.p.timing.probe_timeout, self.p.timing.stale_after / 6)
        return t * (3 if self.p.check_mesh else 1)

    def _missing(self) -> list[int]:
        """Member ranks not connected (and verified) yet, ascending (kept sorted as connections
        come and go, so a welcome or status message costs O(64), not O(N); do not modify)."""
        return self.missing_sorted

    def _status(self) -> dict:
        """Who is present and missing, for members' progress lines and timeout messages."""
        missing = self._missing()
        return {"present": self.p.size - len(missing), "missing": missing[:64], "nmissing": len(missing)}

    def _prepare(self, now: float) -> None:
        p = self.p
        first = min(self.arrived.values())
        slots = {0: Member(rank=0, instance=p.instance, addr=p.addr, host=p.me, arrival=self.arrived[0] - first)}
        slots.update(
            {
                r: dataclasses.replace(self.members[r], arrival=round(self.arrived[r] - first, 3))
                for r in range(1, p.size)
            }
        )
        explicit = {r for r in range(1, p.size) if self.explicit.get(r)} | ({0} if p.want_rank is not None else set())
        keys = {**self.keys, 0: p.topology_key}
        # Final ranks: explicit ones stay, first-come ones follow --rank-order.
        self.final = order_members(slots, explicit, p.rank_order, keys, list(p.nodelist))
        self.master_slot = next(r for r, m in slots.items() if m.instance == self.final[0].instance)
        self.master_port = self.hub.port if self.master_slot == 0 else None
        self.preparing_since = now
        self.acked_ranks = set()
        ring = self._ring() if p.check_mesh else {}
        if p.check_mesh:
            failure = mesh_probe(p, ring.get(p.instance, []))
            if failure:
                self.refused[0] = failure
        for r, conn in self.rank_conn.items():
            msg = {"t": "prepare", "gen": p.gen}
            if p.check_mesh:
                msg["mesh"] = ring.get(self.members[r].instance, [])
            if r == self.master_slot:
                # This member becomes rank 0 of the world: it must hold the master port torch binds.
                msg["hold_port"] = p.master_port_wanted or 0
            self.hub.send(conn, msg)

    def _ring(self) -> dict[str, list]:
        """Each member's ring neighbours in final rank order: instance -> [[rank, host, addr, port], ...]."""
        p = self.p
        n = len(self.final)
        ports = {**self.probe_ports, p.instance: self.hub.port}
        out: dict[str, list] = {}
        for i, m in enumerate(self.final):
            nb = []
            for j in sorted({(i - 1) % n, (i + 1) % n} - {i}):
                o = self.final[j]
                nb.append([j, o.host.hostname, o.addr, ports.get(o.instance)])
            out[m.instance] = nb
        return out

    def _commit(self):
        p = self.p
        master = self.final[0]
        rel = self.prepared = Release(
            job_id=p.job_id,
            generation=p.gen,
            state="released",
            mode=p.mode,
            size=p.size,
            master_addr=master.addr,
            master_port=self.master_port,
            members=tuple(self.final),
            writer=p.instance,
            wall_time=p.clock.time(),
        )
        header, chunks = encode_release(rel)
        p.prepare_next()  # re-runs then find their generation made before anyone looks it up
        for k, chunk in enumerate(chunks):
            # Inert until release.json names its digest: written first, so the
            # decision itself stays one exclusive create at any world size.
            p.store.publish(member_chunk_name(p.gen, p.instance, k), chunk)
        # The commit window opens here: whatever happens from now on (an exception, a signal, a
        # create that takes effect and still raises), a release may exist (see ``acked``).
        self.commit_attempted = True
        try:
            created = p.store.create(release_name(p.gen), header)
        except FileNotFoundError:
            raise  # no directory, no link(): Participant._on_enoent confirms it by a listing
        except (OSError, FsmingleError) as e:
            # EIO or a timeout on a soft mount: the link() may have taken effect on the server
            # (nfs(5), "soft"), so the decision is unknown.  Read it, never guess it: members that
            # acknowledged lose their connection and read release.json too.
            log.warning(
                "job %s: creating generation %d's release.json failed (%s); reading it back", p.job_id, p.gen, e
            )
            self.leaving("", voided=False)
            p.enter_deciding(f"the create of its own release.json failed: {e}")
            return None
        if not created:
            # EEXIST: our own release if the first reply was lost (a retransmitted
            # link(), nfs(5)) -- read it back; anything else is somebody's void.
            got = p.read_release(p.gen)
            if isinstance(got, Release) and got.state == "released" and got.writer == p.instance:
                pass  # ours: the release stands
            elif isinstance(got, Release) and got.state == "restart":
                self._end(f"voided by another participant before the release: {got.reason}", write=False)
                return None
            else:
                # Somebody's record that this node cannot read (yet): never say void over a
                # decision we have not read.  Members that acknowledged lose the connection and
                # read release.json themselves; rank 0 reads it too (DECIDING).
                self.leaving("", voided=False)
                p.enter_deciding("its own release.json create met a decision it cannot read yet")
                return None
        pause("commit")  # tests only: land a signal in the commit window (fsmingle.testhooks)
        self._send_go(rel)
        slow = sorted(rel.members, key=lambda m: -m.arrival)[:3]
        log.info(
            "job %s generation %d released to %d; slowest: %s",
            p.job_id,
            p.gen,
            p.size,
            ", ".join(f"{m.host.hostname} (rank {m.rank}) +{m.arrival:.1f} s" for m in slow),
        )
        # The barrier: members close once they have the go; wait for that (bounded)
        # so nobody is left holding an unread release when rank 0 execs.
        self.hub.drain(p.timing.probe_timeout)
        self.p.released_members = tuple([m.host.hostname, m.addr, m.arrival] for m in rel.members)
        return self._placements(rel)[p.instance]

    def _placements(self, rel: Release) -> dict:
        return {
            m.instance: pl
            for m, pl in zip(rel.members, placements(list(rel.members), rel.mode, rel.master_port, rel.generation))
        }

    def _send_go(self, rel: Release) -> None:
        """Send each connected member that has none yet its placement (``go``); members that asked
        for the member list (hostfiles) get it first in bounded ``members`` parts (:func:`member_parts`):
        one line per message never nears ``MAX_LINE``, at any world size."""
        p = self.p
        mine = self._placements(rel)
        parts = member_parts(rel) if self.want_members else []
        for r, conn in self.rank_conn.items():
            if conn in self.go_sent or r not in self.members:
                continue
            self.go_sent.add(conn)
            if r in self.want_members:
                for k, data in enumerate(parts):
                    self.hub.send(conn, {"t": "members", "gen": p.gen, "k": k, "n": len(parts), "data": data})
            self.hub.send(conn, {"t": "go", "placement": mine[self.members[r].instance].as_wire()})

    def _end(self, why: str, *, write: bool) -> None:
        p = self.p
        if write:
            p.void(why)
        self.leaving(why)
        unconnected = self._unconnected()
        later = f" (in it, {unconnected})" if unconnected else ""
        p.set_note(f"generation {p.gen} voided: {why}{later}", logging.WARNING)
        p.rejoin()

    # -------------------------------------------------------------- reporting
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
