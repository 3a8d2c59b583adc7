"""Reading one generation from a weakly consistent filesystem: claims, beacons, the decision.

Every read opens afresh (NFS close-to-open consistency), treats "absent" as
"not visible yet" rather than as proof of absence, and names an unusable file
once (polling re-reads it often).  Mixed into
:class:`fsmingle.protocol.participant.Participant`, which provides ``store``, ``gen``,
``job_id``, ``claims``, ``judge`` and ``_warned``.
"""

from __future__ import annotations

import logging

from ..errors import RecordError
from ..fs.chunks import attach_members
from ..fs.layout import beacon_name, claim_name, member_chunk_name, release_name
from ..fs.records import Beacon, Claim, Release, decode
from .liveness import Verdict
from .parts_state import GenView, Identity, Wiring

log = logging.getLogger("fsmingle")


class GenerationReader:
    """Readers of the current generation's records (see the module doc)."""

    # The state this part acts on (fsmingle.protocol.parts_state; made by Participant.__init__).
    view: GenView  # gen; caches claims, rank 0's vouch and the files warned about
    ident: Identity  # reads: job_id
    wiring: Wiring  # reads: store

    def warn_once(self, name: str, msg: str) -> None:
        """Log a problem with one file once; later repeats are only counted (polling re-reads it often)."""
        n = self.view.warned.get(name, 0)
        self.view.warned[name] = n + 1
        if n == 0:
            log.warning("ignoring %s: %s", self.store_path(name), msg)

    def store_path(self, name: str) -> str:
        return getattr(self.wiring.store, "path", lambda n: n)(name)

    def _load(self, name: str, kind: type, consequence: str = "") -> object | None | RecordError:
        """Read and decode one record: the record, None if not visible, or the error (named once)."""
        data = self.wiring.store.read(name)
        if data is None:
            return None
        try:
            return decode(data, kind)
        except RecordError as e:
            self.warn_once(name, f"{e}{consequence}")
            return e

    def read_release(self, g: int) -> Release | None | RecordError:
        """Generation ``g``'s decision: the record, None if not visible, or the error that makes it unusable."""
        name = release_name(g)
        rel = self._load(name, Release)
        if isinstance(rel, Release) and (rel.job_id != self.ident.job_id or rel.generation != g):
            rel = RecordError(f"it names job {rel.job_id!r} generation {rel.generation}")
            self.warn_once(name, str(rel))
        return rel

    def with_members(self, rel: Release) -> Release | None | RecordError:
        """``rel`` with its member list loaded from chunk files if it is stored apart; None if not visible yet."""
        if not rel.member_chunks:
            return rel
        datas = []
        for k in range(len(rel.member_chunks)):
            data = self.wiring.store.read(member_chunk_name(rel.generation, rel.writer, k))
            if data is None:
                return None
            datas.append(data)
        try:
            return attach_members(rel, datas)
        except RecordError as e:
            self.warn_once(release_name(rel.generation), str(e))
            return e

    def read_beacon(self, name: str, instance: str) -> Beacon | None:
        b = self._load(name, Beacon, "; its writer counts as silent until it writes a valid beacon")
        if (
            not isinstance(b, Beacon)
            or b.instance != instance
            or b.generation != self.view.gen
            or b.job_id != self.ident.job_id
        ):
            return None
        return b

    def read_claim(self, r: int) -> str | None:
        """Instance holding rank ``r`` (cached: claims are immutable); None if not readable."""
        if r in self.view.claims:
            return self.view.claims[r]
        c = self._load(claim_name(self.view.gen, r), Claim, "; its rank is treated as held by a silent participant")
        if not isinstance(c, Claim) or c.rank != r:
            return None
        self.view.claims[r] = c.instance
        return c.instance

    def void_if_dead(self, r: int, now: float, what: str) -> bool:
        """Judge rank ``r``'s holder from the filesystem; if dead, void the generation and regroup (True)."""
        verdict, b = self.judge_rank(r, now)
        if verdict is not Verdict.DEAD:
            return False
        self.void(f"rank {r} ({b.host.hostname if b else 'beacon unreadable'}) {what}")
        self.rejoin()
        return True

    def judge_rank(self, r: int, now: float, holder: str | None = None) -> tuple[Verdict, Beacon | None]:
        """Rank ``r``'s holder (``holder``, else its claim), judged by its own beacon and rank 0's vouch.

        A member connected to rank 0 heartbeats its own beacon rarely (``Member.step``);
        rank 0's beacon, itself judged alive or not yet judged, vouches for it: a vouched
        holder is never DEAD (UNKNOWN instead), so contesters and watchers wait rather than
        void a live world.  Returns ``(verdict, beacon)``; the beacon is the holder's own
        (None if unreadable).
        """
        verdict, b = self.judge_holder(holder or self.read_claim(r), now, key=f"?rank{r}")
        if r != 0 and verdict is Verdict.DEAD and self._rank0_vouch(r, now) is not None:
            # A vouch keeps a holder from being judged dead; it never makes one "alive" (a
            # conflict is raised only on the holder's own evidence): rank 0's beacon may be
            # up to stale_after / 2 old, and rank 0 itself alive in a later generation.  Read
            # only when it can change the verdict: rank 0's beacon is not re-read every step.
            verdict = Verdict.UNKNOWN
        return verdict, b

    def _rank0_vouch(self, r: int, now: float) -> Verdict | None:
        """Rank 0's verdict (ALIVE, or UNKNOWN before it is judged) if its beacon vouches for ``r``; else None."""
        seen = self.view.vouch_seen
        if seen is None or seen[0] != now:  # one read of rank 0's beacon per observer step
            inst0 = self.read_claim(0)
            b0 = self.read_beacon(beacon_name(self.view.gen, inst0), inst0) if inst0 else None
            seen = self.view.vouch_seen = (
                now,
                b0,
                self.view.judge.judge(inst0 or "?rank0", b0, now) if inst0 else None,
            )
        _, b0, v0 = seen
        if b0 is None or v0 in (None, Verdict.DEAD) or not b0.vouches_for(r):
            return None
        return v0

    def judge_holder(self, instance: str | None, now: float, key: str) -> tuple[Verdict, Beacon | None]:
        b = self.read_beacon(beacon_name(self.view.gen, instance), instance) if instance else None
        return self.view.judge.judge(instance or key, b, now), b
