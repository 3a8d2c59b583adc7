"""Reading one generation from a weakly consistent filesystem: claims, beacons, the decision.

Every read opens afresh (NFS close-to-open consistency), treats "absent" as
"not visible yet" rather than as proof of absence, and names an unusable file
once (polling re-reads it often).  Mixed into
:class:`fsmingle.protocol.Participant`, which provides ``store``, ``gen``,
``job_id``, ``claims``, ``judge`` and ``_warned``.
"""

from __future__ import annotations

import logging

from .errors import RecordError
from .layout import beacon_name, claim_name, member_chunk_name, release_name
from .liveness import Verdict
from .records import Beacon, Claim, Release, attach_members, decode

log = logging.getLogger("fsmingle")


class GenerationReader:
    """Readers of the current generation's records (see the module doc)."""

    def warn_once(self, name: str, msg: str) -> None:
        """Log a problem with one file once; later repeats are only counted (polling re-reads it often)."""
        n = self._warned.get(name, 0)
        self._warned[name] = n + 1
        if n == 0:
            log.warning("ignoring %s: %s", self.store_path(name), msg)

    def store_path(self, name: str) -> str:
        return getattr(self.store, "path", lambda n: n)(name)

    def read_release(self, g: int) -> Release | None | RecordError:
        """Generation ``g``'s decision: the record, None if not visible, or the error that makes it unusable."""
        name = release_name(g)
        data = self.store.read(name)
        if data is None:
            return None
        try:
            rel = decode(data, Release)
        except RecordError as e:
            self.warn_once(name, str(e))
            return e
        if rel.job_id != self.job_id or rel.generation != g:
            e = RecordError(f"it names job {rel.job_id!r} generation {rel.generation}")
            self.warn_once(name, str(e))
            return e
        return rel

    def with_members(self, rel: Release) -> Release | None | RecordError:
        """``rel`` with its member list loaded from chunk files if it is stored apart; None if not visible yet."""
        if not rel.member_chunks:
            return rel
        datas = []
        for k in range(len(rel.member_chunks)):
            data = self.store.read(member_chunk_name(rel.generation, rel.writer, k))
            if data is None:
                return None
            datas.append(data)
        try:
            return attach_members(rel, datas)
        except RecordError as e:
            self.warn_once(release_name(rel.generation), str(e))
            return e

    def read_beacon(self, name: str, instance: str) -> Beacon | None:
        data = self.store.read(name)
        if data is None:
            return None
        try:
            b = decode(data, Beacon)
        except RecordError as e:
            self.warn_once(name, f"{e}; its writer counts as silent until it writes a valid beacon")
            return None
        if b.instance != instance or b.generation != self.gen or b.job_id != self.job_id:
            return None
        return b

    def read_claim(self, r: int) -> str | None:
        """Instance holding rank ``r`` (cached: claims are immutable); None if not readable."""
        if r in self.claims:
            return self.claims[r]
        name = claim_name(self.gen, r)
        data = self.store.read(name)
        if data is None:
            return None
        try:
            c = decode(data, Claim)
        except RecordError as e:
            self.warn_once(name, f"{e}; its rank is treated as held by a silent participant")
            return None
        if c.rank != r:
            return None
        self.claims[r] = c.instance
        return c.instance

    def judge_holder(self, instance: str | None, now: float, key: str) -> tuple[Verdict, Beacon | None]:
        b = self.read_beacon(beacon_name(self.gen, instance), instance) if instance else None
        return self.judge.judge(instance or key, b, now), b

