"""The member list at release (``env --format hostfile|json``), on the wire in bounded parts.

Members that asked for it get ``[[hostname, addr, arrival], ...]`` in rank order before their
``go``: compact JSON, zlib-compressed once by rank 0 and cut into base64 parts
(:func:`fsmingle.net.wire.encode_parts`), so no line nears ``MAX_LINE`` at any N (5,000 members:
6 parts).  A member inflates at most :data:`MEMBER_ENTRY_BYTES` per member and takes at most
:data:`MAX_MEMBER_PARTS` parts; a list that does not arrive whole is read from ``release.json``.
Both sides of the format are here: :func:`member_parts` (rank 0) and :class:`MemberList` (members).
"""

from __future__ import annotations

from ..fs.records import Release
from ..net.wire import MAX_LINE, decode_parts, encode_parts

MEMBER_ENTRY_BYTES = 400  # a hostname is at most 253 bytes, an address 45, an arrival a few
MAX_MEMBER_PARTS = 1 + (1 << 20) * MEMBER_ENTRY_BYTES // MAX_LINE


def member_parts(rel: Release) -> list[str]:
    """The released world's member list in rank order, as the parts of ``members`` messages."""
    return encode_parts([[m.host.hostname, m.addr, m.arrival] for m in rel.members])


class MemberList:
    """A member's collection of the parts rank 0 streams before the go.

    Args:
        size (int): the world size (the list must have exactly this many entries).
    """

    def __init__(self, size: int):
        self.size = size
        self.parts: list | None = None

    def add(self, m: dict, gen: int | None) -> None:
        """Take one ``{"t": "members", "gen", "k", "n", "data"}`` message; malformed ones are ignored
        (a list left incomplete is then read from ``release.json``)."""
        k, n = m.get("k"), m.get("n")
        if not (m.get("gen") == gen and type(k) is int and type(n) is int and 0 <= k < n):
            return
        if n > MAX_MEMBER_PARTS or (self.parts is not None and len(self.parts) != n):
            self.parts = None
            return
        if self.parts is None:
            self.parts = [None] * n
        self.parts[k] = m.get("data")

    def result(self) -> tuple | None:
        """The list ``((hostname, addr, arrival), ...)``; None if incomplete or invalid."""
        if self.parts is None or any(x is None for x in self.parts):
            return None
        members = decode_parts(self.parts, max_bytes=MEMBER_ENTRY_BYTES * self.size)
        ok = (
            isinstance(members, list)
            and len(members) == self.size
            and all(
                isinstance(x, list)
                and len(x) == 3
                and isinstance(x[0], str)
                and isinstance(x[1], str)
                and type(x[2]) in (int, float)
                for x in members
            )
        )
        return tuple(members) if ok else None
