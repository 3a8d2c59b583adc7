"""Validation of the records' optional fields that only some writers fill: rank 0's ``vouch`` and
the scheduler asker's ``queue_word`` (:class:`fsmingle.fs.records.Beacon` documents both), and a
decision's ``jobs`` (:class:`fsmingle.fs.records.Release`).

Apart from :mod:`fsmingle.fs.records` to keep that module under the size rule; records re-exports
:func:`encode_vouch`.
"""

from __future__ import annotations

import base64
from typing import Any

from ..errors import RecordError


def encode_vouch(ranks, size: int) -> str:
    """Ranks ``0..size-1`` as a base64 bitmap (bit ``r % 8`` of byte ``r // 8``): ``size / 6`` characters."""
    bits = bytearray((size + 7) // 8)
    for r in ranks:
        if 0 <= r < size:
            bits[r >> 3] |= 1 << (r & 7)
    return base64.b64encode(bytes(bits)).decode("ascii")


def _vouch(v: Any, size: int) -> str:
    if not isinstance(v, str):
        raise RecordError(f"vouch must be a string, not {type(v).__name__}")
    if not v:
        return ""
    try:
        bits = base64.b64decode(v, validate=True)
    except ValueError as e:
        raise RecordError(f"vouch is not base64: {e}") from None
    if len(bits) > (size + 7) // 8:
        raise RecordError(f"vouch holds {len(bits) * 8} ranks, more than the world size {size}")
    return v


def queue_word(v: Any) -> dict | None:
    """The optional ``queue_word`` object: ``hold`` (bool), ``lines`` (at most 16 strings of 300
    characters), ``ended`` (a string of at most 2000).  Anything else is dropped, and a value that
    is not an object reads as None (no word): like ``scheduler`` it is never a reason to refuse a
    beacon, and a writer that does not know the field (an older version) simply gives no word."""
    if not isinstance(v, dict):
        return None
    lines = v.get("lines")
    return {
        "hold": v.get("hold") is True,
        "lines": [str(x)[:300] for x in lines[:16]] if isinstance(lines, list) else [],
        "ended": v["ended"][:2000] if isinstance(v.get("ended"), str) else "",
    }


MAX_JOBS = 4096  # scheduler jobs a decision names; a longer list is cut (it only excuses ended peers)


def job_ids(v: Any) -> tuple[str, ...]:
    """The optional ``jobs`` list of a decision: at most :data:`MAX_JOBS` printable strings of up to
    64 characters; anything else is dropped (never a reason to refuse a decision)."""
    if not isinstance(v, list):
        return ()
    return tuple(dict.fromkeys(x[:64] for x in v[:MAX_JOBS] if isinstance(x, str) and x and x.isprintable()))
