"""The release record at any world size: chunked member lists under the 1 MiB guard (issue 13, "no size cliff")."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fsmingle.errors import RecordError
from fsmingle.fs.chunks import attach_members, encode_release
from fsmingle.fs.records import MEMBERS_PER_CHUNK, HostId, Member, Release, decode, encode

HOST = HostId(hostname="node0001", boot_id="b" * 36, pidns="pid:[4026531836]", pid=4242, pid_start=1.7e9)


def _release(n: int) -> Release:
    members = tuple(
        Member(
            rank=i,
            instance=f"{i:016x}",
            addr=f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}",
            host=dataclasses.replace(HOST, hostname=f"node{i:06d}", pid=1000 + i),
            arrival=i / 1000,
        )
        for i in range(n)
    )
    return Release(
        job_id="big",
        generation=7,
        state="released",
        mode="rank",
        size=n,
        master_addr=members[0].addr,
        master_port=29500,
        members=members,
        writer="ab" * 8,
    )


@pytest.mark.parametrize("n", [1, MEMBERS_PER_CHUNK, MEMBERS_PER_CHUNK + 1, 131_072])
def test_release_round_trips_at_any_size_under_the_guard(n):
    rel = _release(n)
    header, chunks = encode_release(rel)
    assert len(header) < 1 << 20 and all(len(c) < 1 << 20 for c in chunks)
    assert len(chunks) == (0 if n <= MEMBERS_PER_CHUNK else -(-n // MEMBERS_PER_CHUNK))
    got = decode(header, Release)
    assert attach_members(got, chunks) == rel


def test_a_chunk_that_does_not_match_its_digest_is_refused():
    rel = _release(MEMBERS_PER_CHUNK * 2 + 5)
    header, chunks = encode_release(rel)
    got = decode(header, Release)
    forged = json.loads(chunks[1])
    forged["members"][0]["addr"] = "203.0.113.66"  # a hostile writer redirects one member
    bad = chunks[:1] + [json.dumps(forged).encode()] + chunks[2:]
    with pytest.raises(RecordError, match="digest"):
        attach_members(got, bad)
    with pytest.raises(RecordError, match="digest"):
        attach_members(got, [chunks[1], chunks[0], chunks[2]])  # out of order


def test_the_one_mebibyte_guard_stays_for_hostile_files():
    with pytest.raises(RecordError, match="larger than"):
        decode(encode(_release(MEMBERS_PER_CHUNK)) + b" " * (1 << 20), Release)


def test_rank0_vouch_round_trips_and_bad_vouches_are_named():
    """Rank 0's beacon carries a bitmap of its verified members (``Beacon.vouch``): 131,072 ranks fit
    in 22 KiB; a vouch that is not base64, or holds more ranks than the world, is a named RecordError."""
    from fsmingle.fs.records import Beacon, HostId, decode, encode, encode_vouch

    host = HostId(hostname="h0", boot_id="b", pidns="p", pid=1, pid_start=1.0)
    n = 131_072
    ranks = set(range(1, n, 3)) | {n - 1}
    b = Beacon("job", 1, "0" * 16, "node", n, 0, "10.0.0.1", 29500, 5, 0, host, vouch=encode_vouch(ranks, n))
    data = encode(b)
    assert len(data) < 23_000
    got = decode(data, Beacon)
    assert all(got.vouches_for(r) == (r in ranks) for r in range(0, n, 997)) and got.vouches_for(n - 1)
    assert not got.vouches_for(n) and not got.vouches_for(-1)
    for bad, words in (
        ("not base64!", "not base64"),
        (encode_vouch([], n + 64), "more than the world size"),
        (7, "string"),
    ):
        d = json.loads(data)
        d["vouch"] = bad
        with pytest.raises(RecordError, match=words):
            decode(json.dumps(d).encode(), Beacon)
