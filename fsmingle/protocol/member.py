"""A member's side of a generation: find rank 0's endpoint, connect, prove liveness, take the release.

While connected a member makes (almost) no filesystem operations: rank 0 and the member ping
each other on the connection, rank 0 pushes who is missing, and the release arrives on it.  Only
a slow heartbeat of the member's beacon remains (``Member.step``): once rank 0 has verified it,
rank 0's beacon vouches for it (``Beacon.vouch``).

A first-come member joins *asking* unless its first try won a rank (:mod:`.joining`): it holds no
rank yet, connects to rank 0 and sends ``ask``; rank 0 answers ``offer`` with one rank it believes
free, or ``wait`` when all are on offer (:mod:`.rank0.offers`); the member ``link()``s it and says
hello on the same connection.  A rank it found taken goes back in the next ``ask``.  If rank 0
knows no free rank, or the connection fails before a claim, the member lists the generation
instead -- the filesystem stays the arbiter of claims; rank 0 only saves the listing.

Every connection starts with rank 0's challenge (``{"t": "challenge", "nonce": ..., "v": 4}``);
the member answers with its ask or hello carrying its own fresh nonce (``mnonce``) and an HMAC
over both, keyed by the secret in rank 0's endpoint record (:func:`fsmingle.net.wire.auth_mac`),
and signs its ack the same way.  Authentication is mutual: everything rank 0 sends after the
challenge is sealed over both nonces and a counter (:func:`fsmingle.net.wire.seal`), and a
message without a valid seal is a lost connection (below) -- whoever holds rank 0's port
without the secret cannot hand this member a ``go``, nor anything else it acts on.

Failure rules (**no release on absence of evidence**):

* Connection refused by rank 0's address: the master process is gone -> void.
* No answer at all (timeout, no route): proves nothing either way; keep trying
  and say so -- this member can never be released without a connection.
* Connection lost (or silent) before rank 0 answered the first signed message on it -- the
  challenge never came, or rank 0 dropped it as one of too many unauthenticated connections
  from this address: proves nothing either (rank 0 may simply have shed it under a flood);
  connect again, as for an unreachable master, never void.
* Connection lost, a message without a valid seal (not rank 0 on rank 0's port), or rank 0
  silent for ``stale_after`` seconds: void the generation.  If this
  member had acknowledged the release, a release naming it may exist (the commit window): when
  the void loses the race, read the decision until it shows; a ``void`` message is read the same
  way, never obeyed on its word.
"""

from __future__ import annotations

import dataclasses
import logging

from ..errors import ConfigError, WorldSizeMismatchError
from ..fs.layout import BEACON_RE, claimed_ranks, gen_name, master_dir, master_name
from ..fs.records import RecordError, Release
from ..net.channel import Outcome, hostport
from ..net.mesh import mesh_probe
from ..net.wire import WIRE_VERSION, Unsealer, new_nonce, nonce_ok
from .decision import Placement
from .member_auth import Sealed
from .member_ending import Ending
from .member_list import MemberList
from .partition import unreachable_master
from .states import RankSet, State
from .testhooks import pause

log = logging.getLogger("fsmingle")

# Beacon heartbeats per second a whole world's connected members make at most (4 metadata
# operations each): 200 op/s at any N, where one every 22.5 s per member is 23,000 op/s at
# N = 131,072 -- more than a 5,000 op/s metadata server has (benchmarks/README.md).
MEMBER_BEACONS_PER_S = 50


class Member(Ending, Sealed):
    """The member role (rank > 0) of a :class:`~fsmingle.protocol.participant.Participant` in its current generation."""

    def __init__(self, p):
        self.p = p
        now = p.clock.monotonic()
        self.link = None
        self.master = None  # rank 0's beacon, from master/
        self.acked = False
        self.welcomed = False
        self.inbox: list[dict] = []
        self.look_delay = p.timing.poll_min
        self.next_look = now
        self.waiting_since = now
        self.next_decision_check = now + p.timing.heartbeat_period
        self.next_claim_check = now + p.timing.stale_after
        # --check-mesh: hold a port our ring neighbours probe at the release.
        self.probe = p.transport.listen(p.addr, 0, 4) if p.check_mesh else None
        self.asking = p.rank is None  # no rank yet: ask rank 0 for a free one (module doc)
        self.taken: list[int] = []  # offered ranks found claimed, reported in the next ask
        self.ask_again: float | None = None  # when to repeat an ask rank 0 told us to repeat
        self.member_list = MemberList(p.size)  # its parts so far (``members`` messages; hostfiles)
        self.nonce: str | None = None  # rank 0's challenge on this connection (None: not yet)
        self.mnonce = ""  # this member's own nonce on this connection (what rank 0's seals bind to)
        self.unsealer: Unsealer | None = None  # checks rank 0's seals on this connection
        self.heard = False  # rank 0 answered a signed message on this connection
        self.connected_at = now
        self.unreached_since: float | None = None  # since when rank 0's endpoint gives no answer
        self.withdrawn = False  # gave its rank up to an unreachable rank 0 (partition.unreachable_master)

    # -------------------------------------------------------------- loop plumbing
    def delay(self) -> float:
        if self.link is not None:
            return self.p.timing.ping_interval
        return max(0.0, min(self.look_delay, self.next_look - self.p.clock.monotonic()))

    def wait(self, seconds: float) -> None:
        if self.link is not None and not self.link.lost:
            self.inbox.extend(self.link.poll(seconds))
        else:
            self.p.clock.sleep(seconds)

    def leaving(self, why: str, *, voided: bool = True, released: Release | None = None) -> None:
        pass  # closing the connection tells rank 0 at once (Coordinator.leaving has the arguments' doc)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None
        if self.probe is not None:
            self.probe.close()
            self.probe = None

    # -------------------------------------------------------------- the step
    def step(self) -> Placement | None:
        p = self.p
        now = p.clock.monotonic()
        if self.link is None:
            if not self.withdrawn:
                p.heartbeat_if_due(now)
            if now >= self.next_decision_check and self._decided_elsewhere(now):
                return None
            if now >= self.next_look:
                return self._look(now)
            return None
        # Connected: the channel first (a failing filesystem must not starve it),
        # then the beacon heartbeat, which is only for status and cleaners.
        msgs, self.inbox = self.inbox + self.link.poll(0), []
        if not self.heard:
            msgs = self._before_heard(msgs, now)
            if self.link is None or p.role is not self:
                return None  # connecting again (_reconnect), or the connection was lost
        msgs, forged = self._unseal(msgs)
        if self.asking and self.ask_again is not None and now >= self.ask_again:
            self.ask_again = None
            self.link.send(self._ask())
        for m in msgs:
            done = self._on_message(m)
            if done is not None or p.role is not self:
                return done
        if forged is not None:
            # Not rank 0 (a real one seals everything), or not the rank 0 of the record we
            # read: as a lost connection, never acted on (the module doc).
            log.warning("job %s: the master's connection carried %s", p.job_id, forged)
            return self._lost(f"the process on the master port sent {forged}")
        # Our own beacon beats every 2 x stale_after (60 s: 0.067 op/s, for people reading the
        # directory), in a big world every N / 50 s (MEMBER_BEACONS_PER_S; 44 min at 131,072):
        # rank 0 holds us by the connection, and its beacon vouches for us (_beacon_period).
        p.heartbeat_if_due(now, period=self._beacon_period())
        if self.link.lost:
            return self._lost(self.link.why)
        quiet = self.link.silent_for()
        if quiet >= p.timing.stale_after:
            return self._lost(f"rank 0 was silent on the connection for {quiet:.0f} s")
        return None

    def _before_heard(self, msgs: list[dict], now: float) -> list[dict]:
        """Until rank 0 answers a signed message: wait for its challenge and answer it (the ask or
        the hello); a connection lost or silent before that proves nothing (module doc)."""
        p = self.p
        if self.nonce is None:
            for i, m in enumerate(msgs):
                nonce = m.get("nonce")
                if m.get("t") == "challenge" and nonce_ok(nonce):
                    if m.get("v") != WIRE_VERSION:
                        self._other_version(m.get("v"))
                        return []
                    self.nonce, self.mnonce = nonce, new_nonce()
                    self.unsealer = Unsealer(self.master.secret, nonce, self.mnonce)
                    self.link.send(self._ask() if self.asking else self._hello())
                    msgs = msgs[i + 1 :]
                    break
            else:
                msgs = []  # nothing before the challenge is meant for us
        if msgs:
            self.heard = True
            return msgs
        if self.link.lost:
            self._reconnect(f"the master dropped the connection before answering ({self.link.why})", now)
        elif now - self.connected_at >= p.timing.stale_after and self.link.silent_for() >= p.timing.stale_after / 2:
            self._reconnect(f"no answer from the master within {p.timing.stale_after:g} s", now)
        return []

    def _reconnect(self, why: str, now: float) -> None:
        """Close this connection and look for rank 0's endpoint again (re-read: a fresh secret)."""
        p = self.p
        log.debug("job %s: %s; connecting again", p.job_id, why)
        if self.link is not None:
            self.link.close()
            self.link = None
        self.master, self.nonce, self.heard, self.ask_again = None, None, False, None
        self.mnonce, self.unsealer = "", None
        self.look_delay = min(p.timing.poll_max, max(p.timing.poll_min, self.look_delay) * p.timing.backoff)
        # Spread: members shed together (a burst from one host over the per-source cap) must not
        # all come back in the same instant.
        self.next_look = now + self.look_delay * p.rng.uniform(0.5, 1.5)

    def _beacon_period(self) -> float:
        """Seconds between this member's own beacon heartbeats while connected (see ``step``).

        Connected means rank 0 has our hello: it never judges a member it holds a connection to
        from the filesystem, and once it has verified us its beacon vouches for us.  Beating every
        ``3/4 stale_after`` until the welcome would cost 4 x N / 22.5 s operations while rank 0
        verifies a join storm -- at N = 32,768 more than a 5,000 op/s server has, which starves the
        verification it waits for (a congestion collapse, measured in benchmarks/sim)."""
        p = self.p
        return max(2 * p.timing.stale_after, p.size / MEMBER_BEACONS_PER_S)

    def _decided_elsewhere(self, now: float) -> bool:
        """Not connected yet: a void written by someone else ends our wait (checked every heartbeat period)."""
        p = self.p
        self.next_decision_check = now + p.timing.heartbeat_period
        rel = p.read_release(p.gen)
        if rel is not None:
            why = rel.reason if isinstance(rel, Release) else f"its decision record is unusable ({rel})"
            if isinstance(rel, Release) and rel.released:
                why = "released without this participant"
            p.set_note(f"generation {p.gen} ended: {why}")
            if p.queue is not None:  # an asker (queue_relay) voided on a peer job that ended: fail on it too
                p.queue.from_void(why)
            p.rejoin()
            return True
        if self.master is None and now >= self.next_claim_check:
            # Rank 0 claimed but never published its endpoint (it died in
            # between)?  Rare: only then list the whole generation.
            self.next_claim_check = now + p.timing.heartbeat_period
            if 0 in claimed_ranks(p.store.listdir(gen_name(p.gen))) and p.void_if_dead(
                0, now, "claimed the master's place but is dead or stopped heartbeating"
            ):
                return True
        return False

    def _creator_may_take_rank0(self, now: float) -> bool:
        """The joiner that made this generation is taking rank 0 (``rank0_by_creator``): leave
        it ``scan_interval`` seconds (its endpoint takes a few operations) before racing it."""
        return self.p.rank0_by_creator and now - self.waiting_since < self.p.timing.scan_interval

    def _look(self, now: float) -> Placement | None:
        p = self.p
        listed, p.master_names = p.master_names, None  # a joiner's listing of a moment ago, once
        names = [n for n in (listed or p.store.listdir(master_dir(p.gen))) if BEACON_RE.match(n)]
        b = None
        for n in names:
            inst = BEACON_RE.match(n).group(1)
            b = p.read_beacon(master_name(p.gen, inst), inst)
            if b is not None and b.rank == 0 and b.master_port is not None:
                break
            b = None
        if b is None:
            if self.asking and 0 not in p.claims and not self._creator_may_take_rank0(now) and not p.shy_of_rank0():
                # Nobody to ask: rank 0 itself may be the free rank.  One link() tells
                # (not a listing of N names); if it is taken, its claim is read (and cached)
                # and its endpoint is on its way.  Tried again at the next look while rank 0
                # is not known taken: --port busy on this host (a peer here still holds it
                # for the generation before) proves nothing, and members holding other ranks
                # never take rank 0, so giving up after one try could leave nobody to take it.
                if p.claim_one(0):
                    self.close()
                    p.role = None
                    return p.hold(0)
            self.look_delay = min(p.timing.poll_max, self.look_delay * p.timing.backoff)
            self.next_look = now + self.look_delay
            if now - self.waiting_since >= 10 and "rank 0" not in p.note:
                p.set_note("waiting for rank 0 to appear")
            return
        if b.size != p.size or b.mode != p.mode:
            msg = (
                f"rank 0 on {b.host.hostname} ({b.addr}) expects a world of {b.size} ({b.mode} mode) but "
                f"this participant on {p.me.hostname} ({p.addr}) expects {p.size} ({p.mode} mode); give every "
                "participant the same --nnodes (or --world-size)"
            )
            self._fail_alone(msg)
            raise WorldSizeMismatchError(msg)
        if b.restart_count < p.restart_count and b.slurm_job_id == p.slurm_job_id:
            # Rank 0 is a leftover of the run Slurm requeued away: never join it.
            p.void(
                f"rank 0 on {b.host.hostname} belongs to an earlier run of this job "
                f"(SLURM_RESTART_COUNT {b.restart_count} < {p.restart_count})"
            )
            p.rejoin()
            return
        where = f"{hostport(b.addr, b.master_port)} (rank 0 on {b.host.hostname})"
        if not b.secret:
            raise ConfigError(
                f"rank 0 on {b.host.hostname} ({b.addr}) runs fsmingle {b.version or '(an older version)'}, "
                f"which does not speak wire protocol {WIRE_VERSION} (an authenticated channel); "
                "run the same fsmingle version on every node"
            )
        outcome, link, why = p.transport.connect(b.addr, b.master_port, p.timing.probe_timeout)
        if outcome is Outcome.CONNECTED:
            # Our pings cost rank 0 a message each: as rank 0's own, fewer in a big world.
            link.ping_interval = p.timing.ping_interval_for(p.size)
            self.link, self.master, self.unreached_since, self.withdrawn = link, b, None, False
            p.contact()  # this node reaches a peer: not cut off (fsmingle.protocol.partition)
            self.nonce, self.heard, self.connected_at = None, False, now
            self.mnonce, self.unsealer = "", None
            # The ask or hello goes out once rank 0's challenge is here (_before_heard).
            # Rank 0 holds us by the connection from now on (see _beacon_period); rank 0's next
            # beacon after our welcome vouches for us, within stale_after / 2.
            p.next_hb = max(p.next_hb, now + self._beacon_period())
            log.debug("job %s: connected to the master %s", p.job_id, where)
            return
        if outcome is Outcome.REFUSED:
            p.void(f"the master {where} refused the connection: it is gone")
            p.rejoin()
            return
        # No answer proves nothing: keep trying, say exactly why, withdraw after 2 x stale_after.
        unreachable_master(self, now, b, where, why)

    def _who(self) -> dict:
        """What rank 0 checks first in a hello or an ask: the same job, generation, world and version."""
        p = self.p
        return {
            "v": WIRE_VERSION,
            "job": p.job_id,
            "gen": p.gen,
            "inst": p.instance,
            "mode": p.mode,
            "size": p.size,
            "restart_count": p.restart_count,
            "slurm_job_id": p.slurm_job_id,
            "sched": p.queue.mine if p.queue is not None else "",
        }

    def _hello(self) -> dict:
        p = self.p
        return self._sign(
            {
                "t": "hello",
                **self._who(),
                "rank": p.rank,
                "addr": p.addr,
                "explicit": p.want_rank is not None,
                "spare": p.spare,  # started as a spare: rank 0 never releases spares alone
                "key": p.topology_key,
                "order": p.rank_order,
                "members": p.want_members,
                "probe_port": self.probe.port if self.probe else None,
                "host": dataclasses.asdict(p.me),
            }
        )

    def _ask(self) -> dict:
        return self._sign({"t": "ask", **self._who(), "taken": self.taken[-64:]})

    def _on_offer(self, m: dict) -> Placement | None:
        """Claim one of the ranks rank 0 offers (``link()`` decides), then say hello on this connection."""
        p = self.p
        offered = [r for r in m.get("ranks", []) if isinstance(r, int) and not isinstance(r, bool) and 0 < r < p.size]
        if m.get("gen") == p.gen and not offered and m.get("wait") is True:
            self.ask_again = p.clock.monotonic() + p.timing.scan_interval  # all free ranks on offer to others
            return None
        if m.get("gen") != p.gen or not offered:
            return self._stop_asking(f"rank 0 knows no free rank in generation {p.gen}")
        # A claim below that meets a lying cache raises FileNotFoundError (Participant.step
        # retries): ask again then, rather than wait for an offer that will not come.
        self.ask_again = p.clock.monotonic() + p.timing.scan_interval
        for r in offered:
            if p.try_claim(r):
                self.asking, p.rank = False, r
                p.publish_beacon()
                p.next_hb = max(p.next_hb, p.clock.monotonic() + self._beacon_period())
                p.emit()
                self.link.send(self._hello())
                return None
            self.taken.append(r)
        self.ask_again = None
        self.link.send(self._ask())  # all were claimed since rank 0 last looked: it offers others
        return None

    def _stop_asking(self, why: str) -> Placement | None:
        """Asking failed (no offer, or the connection): claim by listing the generation instead."""
        p = self.p
        log.debug("job %s: %s; listing generation %d to claim a rank", p.job_id, why, p.gen)
        self.close()
        p.role = None
        # JOIN until a rank is held (a lying cache or a retired generation: Participant._on_enoent
        # joins again); a beacon at once, not 2 x stale_after after our connect: a watcher of a
        # full world tells rank 0 a live peer is here without connecting (rank0/reach.py).
        p.state, p.next_hb = State.JOIN, 0.0
        return p.claim_by_listing()

    def _on_message(self, m: dict) -> Placement | None:
        p = self.p
        t = m.get("t")
        if self.asking and t not in ("offer", "reject", "void"):
            return None  # nothing else is meant for a participant without a rank
        if t == "offer":
            return self._on_offer(m) if self.asking else None
        if t == "welcome":
            if m.get("inst") != self.master.instance or m.get("gen") != p.gen:
                self._lost(f"the process on the master port is not rank 0 of generation {p.gen}")
                return None
            self.welcomed = True
            log.info(
                "job %s: connected to the master %s", p.job_id, hostport(self.master.addr, self.master.master_port)
            )
            self._on_status(m)
        elif t == "status":
            self._on_status(m)
        elif t == "prepare":
            if m.get("gen") == p.gen and self.welcomed:
                ack = {"t": "ack", "gen": p.gen}
                if isinstance(m.get("mesh"), list):
                    failure = mesh_probe(p, m["mesh"])
                    if failure:
                        ack["mesh_fail"] = failure
                if "hold_port" in m and "mesh_fail" not in ack:
                    # We become rank 0 of the world (--rank-order): hold the master port
                    # from now until exec, as rank 0 always does (close-on-exec).
                    want = m.get("hold_port")
                    want = want if type(want) is int and 0 <= want < 65536 else 0
                    try:
                        if p.hub is None:
                            p.hub = p.transport.listen(p.addr, want, 1)
                        ack["port"] = p.hub.port
                    except ConfigError as e:
                        ack["error"] = str(e)
                # The commit window opens before the ack leaves (as rank 0's before its create): a
                # signal landing between the send and this flag would leave a member rank 0 can
                # release that withdraws (void lost to the release) without reading the decision.
                self.acked = "error" not in ack and "mesh_fail" not in ack
                self.link.send(self._sign(ack))
                pause("ack")  # tests only: land a signal just after the ack left (fsmingle.protocol.testhooks)
        elif t == "members":
            if self.acked:
                self.member_list.add(m, p.gen)
        elif t == "go":
            try:
                pl = Placement.from_wire(m.get("placement") or {})
            except ValueError as e:
                self._lost(f"rank 0 sent a malformed release ({e})")
                return None
            if pl.generation != p.gen or not self.acked:
                self._lost("rank 0 sent a release for another generation")
                return None
            if p.want_members:
                members = self.member_list.result()
                if members is None:
                    # Released (the go says so), but the member list did not arrive whole: it is in
                    # release.json, which DECIDING reads (and it sets released_members).
                    p.enter_deciding("the member list did not arrive whole with the release")
                    return None
                p.released_members = members
            return pl
        elif t == "void":
            if self.acked:
                # After our acknowledgement a void proves nothing about release.json (the commit
                # window, docs/protocol.md): void-or-read it ourselves, never rejoin on a word.
                return self._lost(f"rank 0 said void after this member acknowledged ({m.get('why', '')})")
            p.set_note(f"generation {p.gen} voided: {m.get('why', '')}")
            p.rejoin()
        elif t == "reject":
            why = str(m.get("why", ""))
            if m.get("fatal"):
                self._fail_alone(why)
                raise (WorldSizeMismatchError if "expects a world" in why else ConfigError)(why)
            return self._lost(f"rank 0 rejected this participant: {why}")
        return None

    def _on_status(self, m: dict) -> None:
        p = self.p
        raw = m.get("missing")
        missing = [r for r in raw if type(r) is int and 0 < r < p.size] if isinstance(raw, list) else []
        nmissing = m.get("nmissing", len(missing))
        p.missing_hint = missing
        p.queue_news(m.get("queue"))  # rank 0's word on peer jobs in the scheduler's queue
        spares = m.get("spares", 0)
        p.present_spares = spares if type(spares) is int and spares >= 0 else 0
        if isinstance(nmissing, int) and nmissing == len(missing):
            p.set_present(RankSet(p.size, missing))
        if isinstance(m.get("why"), str) and m["why"]:
            p.set_note(f"rank 0 is {m['why'][:500]}")  # who never connects to it (rank0/reach.py)

    def _lost(self, why: str) -> Placement | None:
        p = self.p
        if self.asking:
            return self._stop_asking(f"lost the master while asking for a rank: {why}")
        r = p.rank
        if self.acked:
            if p.void(f"rank {r} lost the master after acknowledging the release: {why}"):
                p.rejoin()
            else:
                p.enter_deciding(f"lost rank 0 after acknowledging the release ({why})")
            return None
        # Not acknowledged: no release can name us (rank 0 needs every ack), so
        # void -- the others regroup at once -- and move on, whoever won.
        p.void(f"rank {r} lost its connection to the master: {why}")
        p.set_note(f"generation {p.gen}: {why}")
        p.rejoin()
        return None


__all__ = ["Member", "RecordError"]
