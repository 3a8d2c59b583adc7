"""Joining: choosing the generation to join and claiming a rank in it, and joining again when its
directory vanished (mixed into ``Participant``).

Rules (``docs/protocol.md``): a decided generation is never joined; directories are made with
``mkdir`` before anyone looks their names up (a name looked up too early stays "absent" in a
negative lookup cache: GlusterFS nl-cache 61 s); a claim is a ``link()`` of a complete file,
read back after EEXIST (a lost reply to a retransmitted LINK, nfs(5)), and after an error too
(:meth:`Joining.create_record`: a create, a mkdir or a publish may take effect and still report
EIO -- GlusterFS answered EIO to a racing mkdir that took effect -- so the record is read back,
and the node never fails on an operation that happened); first-come joiners never
list the generation: they ask rank 0 for a free rank (or, before it exists, try rank 0 in small
worlds and an instance-hash guess in big ones), so nobody herds on the lowest free rank.
"""

from __future__ import annotations

import hashlib
import logging

from ..errors import ConfigError, CorruptStateError
from ..fs import readback
from ..fs.layout import (
    BEACON_RE,
    GEN_RE,
    MAX_GENERATION,
    RELEASE,
    claim_name,
    claimed_ranks,
    gen_name,
    master_dir,
    release_name,
)
from ..fs.records import Claim, Release, encode
from ..net.hostinfo import port_holder
from .decision import Placement
from .parts_state import GenView, Identity, Seat, Spares, Timers, Wiring
from .states import State

log = logging.getLogger("fsmingle")

SPREAD_ABOVE = 32  # world size above which a joiner with no rank 0 yet guesses by hash, not rank 0 (and free ranks above which a listing claimer spreads by hash)
# The reason a retired generation number re-created from a stale listing is marked decided with.
RETIRED_NUMBER = "retired generation number re-created from a stale listing"
BLIND_GUESSES = 1  # hash-drawn claims a joiner of a big world tries before rank 0 exists (small worlds: rank 0, once)


class Joining:
    """JOIN: pick the generation, publish the beacon, claim a rank (see the module doc)."""

    # The state this part acts on (fsmingle.protocol.parts_state; made by Participant.__init__).
    view: GenView  # chooses gen (and left), records claims, whether the maker takes rank 0
    seat: Seat  # takes a rank (rank 0: the hub first), or CONTEST / WORLD_FULL
    timers: Timers  # enoent_since (a lying cache), busy_since (--port busy), delay
    spares: Spares  # a spare after finding its generation released without it
    ident: Identity  # reads: job_id, instance, size, want_rank, master_port_wanted, addr
    wiring: Wiring  # reads: store, transport, clock, timing, queue

    def _step_join(self) -> Placement | None:
        names = self.wiring.store.listdir("")
        gens = [int(m.group(1)) for m in map(GEN_RE.match, names) if m]
        g = max([*gens, self.view.left + 1, 1])
        created = False
        if g - 1 in gens and g - 1 > self.view.left:
            # The newest generation was made ahead by the decider of the one before it:
            # say so if that one was released (a late participant, or a re-run).
            before = self.read_release(g - 1)
            self._note_released(g - 1, before)
            if before is None and self._abandoned_ahead(g):
                g -= 1
        while True:
            if g > MAX_GENERATION:
                raise CorruptStateError(f"job {self.ident.job_id} exhausted generation numbers; run `fsmingle clean`")
            # mkdir before any lookup of the name: a name looked up before it
            # exists can stay "absent" in a negative cache (GlusterFS nl-cache:
            # 61 s measured).  mkdir goes to the server and is exclusive.
            created = self.make_dir(gen_name(g))
            self.make_dir(master_dir(g))
            rel = self.read_release(g)
            if rel is None and created:
                newer = self._newer_than(g)
                if newer is not None:
                    # Our listing was stale and g had been retired: its name was free, and
                    # we just made an empty old generation while the world waits in a newer
                    # one.  Mark it retired (nobody can join it) and go to the newest.
                    self._mark_retired_number(g, newer)
                    self.view.left = max(self.view.left, g)
                    gens.append(newer)
                    g = newer
                    continue
            if rel is None:
                break
            self._note_released(g, rel)
            g += 1
        self.view.gen = g
        # The one whose mkdir made the generation tries rank 0 first; the others ask it for a
        # rank rather than race for rank 0 (each loser of that race costs the metadata server
        # four operations: 60 when 16 nodes start in the same instant).  A generation that was
        # in our listing (made ahead by a decider, or by an earlier joiner) has no such creator.
        self.view.rank0_by_creator = not created and g not in gens
        self._reset_gen_state()
        self.seat.rank = None
        # No beacon yet: the first one is written once the rank is known (hold()), so a
        # joiner writes it once, not twice (4 metadata operations per participant).  Until
        # then nobody judges us: a claim whose holder's beacon is not visible yet counts as
        # unreadable, which proves nothing for stale_after (fsmingle.protocol.liveness).
        self.timers.enoent_since = None
        return self._claim(created)  # which reports progress (hold(), or a note): after the first write

    def _abandoned_ahead(self, g: int) -> bool:
        """True if generation ``g`` (the newest) has no claim while ``g - 1`` is undecided: join ``g - 1``.

        ``g`` is made before ``g - 1`` is decided only by a decider of ``g - 1``
        (``Participant.prepare_next``), whose record follows at once -- unless it died or met an
        error in between (found by the fault enumeration: a member's SIGTERM handler dying inside
        its void).  Then ``g - 1``'s members wait there for ever for whoever joins ``g``.  Joining
        an undecided generation is always safe (every decision is an exclusive record, read by
        all its members); if the decision follows after all, this joiner moves on as they do.
        One listing of ``g`` (names the directory listing already showed, so no lookup of a name
        that may not exist yet), asked only while ``g - 1`` is undecided by name; then one listing
        of ``g - 1``, because "undecided by name" may be a negative lookup cache's answer: this
        host's earlier participant looked ``release.json`` up before it existed, and bindfs's
        ``negative_timeout``, NFS's lookupcache and GlusterFS's nl-cache keep that "absent" for
        their timeout, while a listing is answered by the server.  Found in CI: a re-run on a
        cached view took the released generation for an abandoned one, met its own rank claimed
        there, and failed with RankConflictError instead of joining the next generation.
        """
        if claimed_ranks(self.wiring.store.listdir(gen_name(g))):
            return False
        return RELEASE not in self.wiring.store.listdir(gen_name(g - 1))

    def _on_enoent(self) -> None:
        # ENOENT on our generation directory: either it was retired (cleaned as
        # stale) or a negative lookup cache lies about it.  A listing of the
        # parent is answered from the server (GlusterFS nl-cache and NFS
        # lookupcache hide a looked-up-too-early name for up to their timeout,
        # while readdir shows it at once), so only a listing may confirm it.
        g = self.view.gen
        if g is not None and gen_name(g) in self.wiring.store.listdir(""):
            now = self.wiring.clock.monotonic()
            if self.timers.enoent_since is None:
                self.timers.enoent_since = now
            self.set_note(
                f"generation {g} exists but this node's filesystem cache says it does not; retrying "
                f"(for {now - self.timers.enoent_since:.0f} s so far)"
            )
            self.timers.delay = min(
                self.wiring.timing.poll_max,
                max(self.timers.delay, self.wiring.timing.poll_min) * self.wiring.timing.backoff,
            )
            return None
        self.timers.enoent_since = None
        if self.seat.state is State.WAIT and self.seat.rank is not None:
            log.info(
                "job %s: generation %s was removed while this node waited in it; joining again", self.ident.job_id, g
            )
        self.rejoin()
        return None

    def _newer_than(self, g: int) -> int | None:
        """The newest generation above ``g`` in a fresh listing of the job directory, or None.

        Asked only by the joiner whose ``mkdir`` just created ``g`` (one per generation, so one
        listing of a few names per generation, whatever N).  That listing is fresh: a client's
        own create in a directory changes the directory, and the Linux NFS client drops its
        cached listing when it sees its own change (the post-operation attributes of the
        directory, "weak cache consistency", carry the new change attribute; ``nfs(5)``:
        "the client drops all cached LOOKUP results" on a directory change; in the kernel,
        ``nfs_wcc_update_inode`` marks a directory's data invalid); FUSE does the same for its
        kernel cache (``fuse_dir_changed``).  Should a cache still answer stale, rank 0 of the
        re-created generation leaves it later (``Coordinator._leave_if_superseded``).
        """
        gens = [int(m.group(1)) for m in map(GEN_RE.match, self.wiring.store.listdir("")) if m]
        newest = max(gens, default=0)
        return newest if newest > g else None

    def _mark_retired_number(self, g: int, newer: int) -> None:
        """Mark generation ``g``, re-created from a stale listing, as decided: nobody joins it again.

        Not a void: nobody holds a rank in ``g`` (we made it a moment ago, and no release of it
        can still be wanted: its old decision was retired), so this is no rank holder's
        decision.  An exclusive create, as every decision: should a stale joiner have claimed
        rank 0 in it meanwhile, it reads this record in its next scan and moves on too.
        """
        made = self.create_record(
            release_name(g), self.restart_record(g, f"{RETIRED_NUMBER}; generation {newer} exists")
        )
        log.info(
            "job %s: generation %d had been retired and this node's stale listing re-created it; %s; "
            "joining generation %d",
            self.ident.job_id,
            g,
            "marked it retired" if made else "someone else decided it already",
            newer,
        )

    def _note_released(self, g: int, rel) -> None:
        if isinstance(rel, Release) and self.wiring.queue is not None:
            # Jobs that joined an earlier generation: one that ended left a place for a spare or a
            # re-run, it did not "end without joining" (protocol/queue.py; every decision carries them).
            self.wiring.queue.learn_jobs(rel.jobs)
        if isinstance(rel, Release) and rel.released and self.spare_of(g, rel):
            self.spares.spare_for = g  # a spare: takes a place when the running world comes back for one
            self.become_spare()
            self.set_note(
                f"generation {g} was already released to {rel.size} participant(s) before this one "
                f"arrived; waiting in generation {g + 1} as a spare (a late participant, or a re-run)"
            )

    def _ensure_hub(self) -> None:
        if self.seat.hub is None:
            try:
                self.seat.hub = self.wiring.transport.listen(
                    self.ident.addr, self.ident.master_port_wanted or 0, self.ident.size
                )
            except ConfigError as e:
                if not self.ident.master_port_wanted or "already in use" not in str(e):
                    raise
                # Name what holds the port (a previous run's torch master, most often).
                raise ConfigError(f"{e} (held by {self._port_holder(self.ident.master_port_wanted)})") from None

    def _port_holder(self, port: int) -> str:
        """Who holds ``port`` on this host (psutil; the model's transport answers for its fake hosts)."""
        ask = getattr(self.wiring.transport, "port_holder", None) or port_holder
        return ask(port)

    def _claim(self, created: bool) -> Placement | None:
        if self.ident.want_rank is not None:
            r = self.ident.want_rank
            if self.holding_back(r):
                return None  # withdrew from an unreachable rank 0: a spare first (partition.py)
            if r == 0:
                self._ensure_hub()  # fail on a busy --port before claiming anything
            if self.try_claim(r):
                return self.hold(r)
            self.seat.state = State.CONTEST
            self.view.contest_holder = self.read_claim(r)
            self.view.contest_life = False
            self.set_note(
                f"rank {r} is already claimed in generation {self.view.gen}; checking whether its holder is alive"
            )
            return self._step_contesting()
        # First-come joiners never list the generation to claim (a listing is O(N) entries
        # for every joiner, O(N^2) in all, and simultaneous joiners herd on the lowest free
        # rank).  Rank 0, once its endpoint is published, hands out free ranks in the order
        # joiners ask (fsmingle.protocol.member, "asking") on the connection every member opens
        # anyway: one listing of master/ (a name or two) tells.  Before that: the joiner
        # whose mkdir made the generation tries rank 0; a small world's joiner tries rank 0
        # too (ranks then follow arrival order at rank 0), unless the generation's maker is
        # taking it just now; a big world's joiner claims a rank drawn from its instance
        # hash.  If that collides, it asks.
        self.view.master_names = self.wiring.store.listdir(master_dir(self.view.gen))
        if not any(BEACON_RE.match(n) for n in self.view.master_names):
            big = self.ident.size > SPREAD_ABOVE
            guesses = [
                int(hashlib.sha1(f"{self.ident.instance}:{i}".encode()).hexdigest(), 16) % self.ident.size
                for i in range(BLIND_GUESSES if big else 0)
            ]
            # A node whose rank 0 nobody reached a moment ago leaves rank 0 to others (partition.py).
            shy = self.shy_of_rank0()
            rank0 = [0] if (created or not (big or self.view.rank0_by_creator)) and not shy else []
            for r in dict.fromkeys(rank0 + guesses):
                if self.claim_one(r):
                    return self.hold(r)
            self.view.master_names = None  # stale by now: the member lists master/ itself
        return self.hold(None)

    def claim_by_listing(self) -> Placement | None:
        """List the generation and claim a free rank: rank 0 could not say which (module doc)."""
        taken = set(claimed_ranks(self.wiring.store.listdir(gen_name(self.view.gen))))
        free = [r for r in range(self.ident.size) if r not in taken]
        rest = [r for r in free if r != 0]
        # Rank 0 first if free: the master is what everyone waits for.  Small
        # worlds fill ranks in order (what users expect to see).  In big ones
        # each joiner starts at a place given by its instance hash, so N
        # simultaneous joiners spread over the free ranks instead of all racing
        # for the lowest one (O(N) link() attempts in all, not O(N^2)).
        k = (
            int(hashlib.sha1(self.ident.instance.encode()).hexdigest(), 16) % len(rest)
            if len(rest) > SPREAD_ABOVE
            else 0
        )
        order = ([0] if 0 in free else []) + rest[k:] + rest[:k]
        if 0 in free and self.shy_of_rank0():
            order = order[1:] + [0]  # rank 0 last after a step-down (partition.py): only if nothing else is free
        for r in order:
            if self.claim_one(r):
                return self.hold(r)
        self.seat.state = State.WORLD_FULL
        self.become_spare()
        self.set_note(f"all {self.ident.size} ranks of generation {self.view.gen} are claimed; watching their holders")
        return None

    def claim_one(self, r: int) -> bool:
        """Try to claim rank ``r`` first-come; rank 0 opens the master port first.

        Raises:
            ConfigError: ``--port`` has been busy on this host for ``stale_after`` seconds and no
                rank 0 appeared in that time (``_port_busy``).
        """
        if r == 0:
            try:
                self._ensure_hub()
            except ConfigError as e:
                # --port busy on this host: a first-come peer on this node may be about to
                # take rank 0 with it, or another host with a free port may; try another rank.
                if self.ident.size == 1:
                    raise
                self._port_busy(e)
                return False
        if self.try_claim(r):
            return True
        if r == 0:
            self.seat.drop_hub()
        return False

    def _port_busy(self, e: ConfigError) -> None:
        """``--port`` is busy here: say so at once; fail once no rank 0 appeared for ``stale_after``.

        A first-come world needs somebody whose port is free.  If nobody took rank 0 within
        ``stale_after`` of our first meeting the busy port (a bounded grace: a peer of this host
        or another host may take rank 0 meanwhile; then this joiner is asked no more), the port
        is what keeps the world from forming: exit 3 naming the port and its holder, rather
        than a timeout that blames a master that "never published its endpoint".  A joiner
        that fails here holds no rank: it just exits.
        """
        now = self.wiring.clock.monotonic()
        if self.timers.busy_since is None or self.timers.busy_gen != self.view.gen:
            self.timers.busy_since, self.timers.busy_gen = now, self.view.gen
            # A warning at once -- unless the holder is an fsmingle peer of this host, which
            # is taking rank 0 with it (rank mode: several processes per host share --port).
            peer = "fsmingle" in str(e).rsplit("(held by", 1)[-1]
            self.set_note(
                f"{e}; this node cannot be rank 0 (the master) of generation {self.view.gen}: waiting up to "
                f"{self.wiring.timing.stale_after:g} s (--stale-after) for another node to take rank 0",
                logging.INFO if peer else logging.WARNING,
            )
            return
        if now - self.timers.busy_since < self.wiring.timing.stale_after:
            return
        # Before failing, one listing of the generation: has somebody claimed rank 0 whose
        # endpoint we have not seen yet (a lagging listing of master/)?  Then wait for it after
        # all.  A listing, not a read of the claim: a lookup may meet a negative cache entry
        # (NFS lookupcache, GlusterFS nl-cache) and a read that finds nothing proves nothing,
        # while a listing is answered by the server.  A generation directory that a lying cache
        # hides lists as empty, though it always holds master/ (made with it): that proves
        # nothing either, so wait (--timeout still bounds it).  Found by the model: a peer of
        # this host held --port as rank 0 while this host was blind to the generation for longer
        # than --stale-after, and this joiner exited 3 with the master alive.
        names = self.wiring.store.listdir(gen_name(self.view.gen))
        if 0 in self.view.claims or not names or 0 in claimed_ranks(names):
            return
        raise ConfigError(
            f"{e}; no other node took rank 0 (the master) of generation {self.view.gen} within "
            f"{self.wiring.timing.stale_after:g} s (--stale-after), so the job cannot start: free port "
            f"{self.ident.master_port_wanted} on the hosts (a previous run's master?) or pass another --port"
        )

    # ------------------------------------------------------------------ writes that may take effect and fail
    # (fsmingle.fs.readback: read back after an error, so a node never fails on an operation that
    # happened; methods here so the model's enumeration counts them as this role's store operations)
    def create_record(self, name: str, data: bytes) -> bool:
        """:func:`fsmingle.fs.readback.create` on this job's store (same Raises)."""
        return readback.create(self.wiring.store, name, data, f"job {self.ident.job_id}")

    def make_dir(self, name: str) -> bool:
        """:func:`fsmingle.fs.readback.make_dir` on this job's store (same Raises)."""
        return readback.make_dir(self.wiring.store, name, f"job {self.ident.job_id}")

    def publish_record(self, name: str, data: bytes) -> None:
        """:func:`fsmingle.fs.readback.publish` on this job's store (same Raises)."""
        readback.publish(self.wiring.store, name, data, f"job {self.ident.job_id}")

    def try_claim(self, r: int) -> bool:
        if self.create_record(claim_name(self.view.gen, r), encode(Claim(r, self.ident.instance))):
            self.view.claims[r] = self.ident.instance
            return True
        # EEXIST: maybe ours -- link() can report failure after succeeding (a
        # retransmitted NFS request whose first reply was lost).  Read it back.
        return self.read_claim(r) == self.ident.instance
