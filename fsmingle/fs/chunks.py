"""The release of a big world, stored in chunks: ``release.json`` names the digests of member files.

A world over :data:`~fsmingle.fs.records.MEMBERS_PER_CHUNK` members would make one record over
the 1 MiB guard, so its members go into chunk files written first (inert until ``release.json``
names their SHA-256 digests) and the decision itself stays one exclusive create at any N.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from ..errors import RecordError
from .records import (
    _MAX_RECORD_BYTES,
    MEMBERS_PER_CHUNK,
    SCHEMA_VERSION,
    Member,
    Release,
    _members,
    _req,
    encode,
    load_object,
    member_dict,
)


def encode_release(rel: Release) -> tuple[bytes, list[bytes]]:
    """``release.json``'s bytes and, for worlds over :data:`MEMBERS_PER_CHUNK`, the member chunk files' bytes.

    Write the chunks first (they are inert until ``release.json`` names their
    digests), then create ``release.json`` exclusively: the decision stays one
    atomic create whatever the world size.
    """
    if not rel.released or len(rel.members) <= MEMBERS_PER_CHUNK:
        return encode(rel), []
    chunks = []
    for k in range(0, len(rel.members), MEMBERS_PER_CHUNK):
        body = {
            "schema": SCHEMA_VERSION,
            "kind": "members",
            "job_id": rel.job_id,
            "generation": rel.generation,
            "writer": rel.writer,
            "first": k,
            "members": [member_dict(m) for m in rel.members[k : k + MEMBERS_PER_CHUNK]],
        }
        chunks.append((json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode())
    digests = tuple(hashlib.sha256(c).hexdigest() for c in chunks)
    return encode(dataclasses.replace(rel, members=(), member_chunks=digests)), chunks


def attach_members(rel: Release, chunks: list[bytes]) -> Release:
    """The release with its members loaded from chunk files (see :func:`encode_release`).

    Args:
        rel (Release): a decoded header with ``member_chunks``.
        chunks (list[bytes]): the chunk files' contents, in order.

    Raises:
        RecordError: a chunk does not match its digest (torn, foreign or stale),
            or its members are invalid or out of order.
    """
    if not rel.member_chunks:
        return rel
    members: list[Member] = []
    for k, (digest, data) in enumerate(zip(rel.member_chunks, chunks)):
        if len(data) > _MAX_RECORD_BYTES or hashlib.sha256(data).hexdigest() != digest:
            raise RecordError(f"member chunk {k} does not match the digest in release.json")
        d = load_object(data, "members")
        if d.get("first") != len(members) or d.get("generation") != rel.generation:
            raise RecordError(f"member chunk {k} is out of place")
        members += _members(_req(d, "members", list), len(members))
    if len(members) != rel.size or members[0].addr != rel.master_addr:
        raise RecordError(f"{len(members)} members in chunks for size {rel.size}")
    return dataclasses.replace(rel, members=tuple(members), member_chunks=())
