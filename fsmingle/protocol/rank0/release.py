"""Rank 0's release transaction: prepare -> acknowledge -> commit (``release.json``) -> go -> barrier.

* PREPARE: ask every member to acknowledge the release (proof of life *now*);
* COMMIT: create ``release.json`` exclusively (it races only with voids), send each member its
  :class:`~fsmingle.protocol.decision.Placement` (and, if it asked, the member list in bounded
  parts), and wait for the members to close (the barrier before exec);
* VOID: create the restart decision, tell every member, regroup.

The commit window (``docs/protocol.md``): once the create of ``release.json`` was attempted, a
release may exist, so rank 0 never says void unless it created or read a restart record (:attr:`Releasing.acked`,
:meth:`Releasing.leaving`).  Mixed into :class:`~fsmingle.protocol.rank0.coordinator.Coordinator`.
"""

from __future__ import annotations

import logging

from ...errors import FsmingleError
from ...fs.chunks import encode_release
from ...fs.layout import member_chunk_name, release_name, store_dir
from ...fs.records import Member, Release, ReleaseState
from ...net.mesh import mesh_probe
from ..decision import order_members, placements
from ..member_list import member_parts
from ..testhooks import pause

log = logging.getLogger("fsmingle")


class Releasing:
    """The release transaction (see the module doc)."""

    def _init_release(self, now: float) -> None:
        self.refused: dict[int, str] = {}  # members that acked with an error (e.g. the master port was busy)
        self.final: list[Member] = []
        self.master_slot = 0
        self.master_port: int | None = None
        self.prepared: Release | None = None
        # The commit window (docs/protocol.md, "The commit window"): from the moment rank 0 attempts
        # the create of a released release.json, a release may exist -- even if the create raised
        # (a link() that took effect and answered EIO on a soft NFS mount).  From then on rank 0
        # never says void unless it has read (or itself created) a restart record.
        self.commit_attempted = False
        self.go_sent: set[int] = set()  # connections that have their go
        self.preparing_since: float | None = None
        self.acked_ranks: set[int] = set()

    @property
    def acked(self) -> bool:
        """True once a release may exist: rank 0 attempted the create of ``release.json`` (the
        commit window).  ``Leaving.withdraw`` then reads the decision back instead of walking away."""
        return self.commit_attempted

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

    def _on_ack(self, conn: int, m: dict) -> None:
        """A member's acknowledgement of the prepare (proof of life now); the member that becomes
        rank 0 of the world (``--rank-order``) sends the master port it holds with it."""
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

    def _ack_timeout(self) -> float:
        """Seconds each member has to acknowledge: a loaded host must not void a healthy world, a
        partitioned one must not hold it long (``probe_timeout``, at least ``stale_after`` / 6; x3 with
        ``--check-mesh``, whose probes come first)."""
        t = max(self.p.timing.probe_timeout, self.p.timing.stale_after / 6)
        return t * (3 if self.p.check_mesh else 1)

    def _prepare(self, now: float) -> None:
        p = self.p
        first = min(self.arrived.values())
        slots = {0: Member(rank=0, instance=p.instance, addr=p.addr, host=p.me, arrival=self.arrived[0] - first)}
        for r in range(1, p.size):
            m = self.members[r]  # a new Member, not dataclasses.replace: O(N), and replace is 2x slower
            slots[r] = Member(
                rank=r, instance=m.instance, addr=m.addr, host=m.host, arrival=round(self.arrived[r] - first, 3)
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
        common = {"t": "prepare", "gen": p.gen}  # one dict for all: its JSON is made once (SealedHub)
        for r, conn in self.rank_conn.items():
            msg = common
            if p.check_mesh or r == self.master_slot:
                msg = dict(common)
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
            state=ReleaseState.RELEASED,
            mode=p.mode,
            size=p.size,
            master_addr=master.addr,
            master_port=self.master_port,
            members=tuple(self.final),
            writer=p.instance,
            wall_time=p.clock.time(),
            jobs=p.queue.record_jobs() if p.queue is not None else (),  # carried forward (protocol/queue.py)
        )
        header, chunks = encode_release(rel)
        p.prepare_next()  # re-runs then find their generation made before anyone looks it up
        try:
            # This generation's FolderStore directory, made before the release for the same
            # reason: a member's first lookup of it then follows its creation.  Made by each
            # rank's mkdir at once, a loser's lookup that raced the winner's mkdir kept it
            # "absent" (GlusterFS nl-cache without upcalls: EEXIST, then ENOENT for 60 s; twice
            # in a full test run).  A courtesy, as prepare_next: FolderStore makes it if missing.
            p.store.mkdir(store_dir(p.gen))
        except (OSError, FsmingleError) as e:
            log.debug("could not prepare generation %d's store directory: %s", p.gen, e)
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
            if isinstance(got, Release) and got.released and got.writer == p.instance:
                pass  # ours: the release stands
            elif isinstance(got, Release) and not got.released:
                self._end(f"voided by another participant before the release: {got.reason}", write=False)
                return None
            else:
                # Somebody's record that this node cannot read (yet): never say void over a
                # decision we have not read.  Members that acknowledged lose the connection and
                # read release.json themselves; rank 0 reads it too (DECIDING).
                self.leaving("", voided=False)
                p.enter_deciding("its own release.json create met a decision it cannot read yet")
                return None
        pause("commit")  # tests only: land a signal in the commit window (fsmingle.protocol.testhooks)
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
        if write and not p.void(why):
            # Decided first by another (a spare or a contester that saw a holder die): its reason
            # is what happened; ours (a newer generation in use, say) is only how we noticed.
            rel = p.read_release(p.gen)
            if isinstance(rel, Release) and not rel.released and rel.writer != p.instance and rel.reason:
                why = rel.reason
        self.leaving(why)
        unconnected = self._unconnected()
        later = f" (in it, {unconnected})" if unconnected else ""
        p.set_note(f"generation {p.gen} voided: {why}{later}", logging.WARNING)
        p.rejoin()
