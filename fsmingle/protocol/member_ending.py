"""How a member's wait ends short of a release: what it says at a timeout, and failing alone.

Mixed into :class:`fsmingle.protocol.member.Member` (apart to keep that module under the size
rule); ``self.p`` is the participant, ``self.master`` rank 0's endpoint once connected.
"""

from __future__ import annotations

from ..net.channel import hostport


class Ending:
    def _fail_alone(self, why: str) -> None:
        """Before failing on a disagreement (world size, version): only a rank holder voids -- its
        claim would hold the world up.  A participant without a rank fails alone and leaves the
        world as it was: under a restart loop, one misconfigured node must not void every new
        generation (voids on evidence of death, ``OutsideWorld``, are another matter)."""
        if self.p.rank is not None:
            self.p.void(why)

    def missing_description(self) -> str | None:
        """What kept the world from completing, as this member knows it (for the timeout message)."""
        p = self.p
        if self.master is None:
            if p.missing_hint:
                return None  # rank 0 of an earlier generation of this attempt said who is missing
            if p.note.startswith("cannot reach"):
                return "this node never got a connection to the master"  # the note says where and why
            who = "node ranks" if p.mode == "node" else "ranks"
            return (
                f"missing {who} 0 (the master): it never published its endpoint in generation {p.gen} "
                "(other ranks are not known to a member before it connects)"
            )
        if not self.welcomed:
            return (
                f"connected to the master {hostport(self.master.addr, self.master.master_port)} but it never "
                "confirmed this participant's claim"
            )
        return None  # rank 0's last status (p.missing_hint) names the missing ranks
