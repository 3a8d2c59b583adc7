"""Rank 0's CPU per member (issue 31, item 3): what the cuts changed, each checked on real sockets.

* a sealed message leaves as the bytes its seal was made over, spliced (``wire.Sealer``), and a
  member's check (``wire.Unsealer``, the same as before the cut) accepts exactly those bytes;
* the hub does not re-register a connection with epoll at every send (a system call each);
* ``Hub.poll`` waits past pings: rank 0 is not stepped for a ping;
* ``Hub.silent_among`` picks what ``silent_for`` picks (gone connections included);
* ``release.json`` is the same bytes without ``dataclasses.asdict``.

Performance itself is measured by ``python -m benchmarks.swarm`` (``benchmarks/README.md``), not here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import socket
import threading
import time

from fsmingle.fs import records
from fsmingle.fs.chunks import encode_release
from fsmingle.fs.records import HostId, Member, Release
from fsmingle.net.channel import EventKind, Hub, TcpTransport
from fsmingle.net.wire import (
    WIRE_VERSION,
    Sealer,
    Unsealer,
    canonical,
    decode_msg,
    encode_msg,
    new_nonce,
    new_secret,
    seal,
)

SECRET, NONCE, MNONCE = new_secret(), new_nonce(), new_nonce()


def test_a_sealed_line_is_what_a_member_checks_and_nothing_else():
    """The wire line of a sealed message decodes to the sealed dict, passes the member's check,
    and is byte for byte what the message and its two fields encode to, in another key order."""
    s, u = Sealer(SECRET, NONCE, MNONCE), Unsealer(SECRET, NONCE, MNONCE)
    msgs = [
        {"t": "status", "present": 3, "missing": [1, 5], "nmissing": 2, "note": "é\n\"'"},
        {"t": "go", "placement": {"rank": 3, "master_addr": "::1", "x": 0.1}},
        {"t": "void", "why": ""},
    ]
    for n, m in enumerate(msgs):
        sealed = s.seal(n, m)
        assert sealed == seal(SECRET, NONCE, MNONCE, n, m)  # the function and the per-connection sealer agree
        line = sealed.wire
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        got = decode_msg(line[:-1])
        assert got == dict(sealed) and u.check(got) is None
        assert json.loads(encode_msg(dict(sealed))) == json.loads(line)
        assert line.startswith(canonical(m)[:-1])  # the signed body itself, not a re-encoding
    # The MAC is the one a member of the previous build computes (wire 4, before the Sealer):
    # HMAC-SHA256 over json.dumps([4, "rank0", nonce, mnonce, n]) + "\n" + the canonical body.
    for n in (0, 7, 10**12):
        head = json.dumps([WIRE_VERSION, "rank0", NONCE, MNONCE, n], separators=(",", ":")).encode()
        body = canonical(msgs[0])
        want = hmac.new(SECRET.encode(), head + b"\n" + body, hashlib.sha256).hexdigest()
        assert s.mac(n, body) == want
    forged = s.seal(9, {"t": "go", "placement": {}})
    assert Unsealer(SECRET, NONCE, new_nonce()).check(decode_msg(forged.wire[:-1])) is not None


def test_the_hub_registers_a_connection_for_writing_only_when_a_send_is_left_over():
    """One ``epoll_ctl`` per message sent was a system call per send for nothing: a whole message
    leaves in one ``send()``; the hub watches for writability only while bytes wait."""
    hub = Hub("127.0.0.1", 0, ping_interval=30.0)
    _, link, _ = TcpTransport(ping_interval=30.0).connect("127.0.0.1", hub.port, 5.0)
    modified = []
    real = hub.sel.modify
    hub.sel.modify = lambda *a: (modified.append(a[1]), real(*a))[1]
    try:
        conn = _accepted(hub)
        for k in range(100):
            hub.send(conn, {"t": "status", "k": k})
        assert modified == []  # before: 100
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 100 and time.monotonic() < deadline:
            got += link.poll(0.1)
        assert [m["k"] for m in got] == list(range(100))
    finally:
        link.close()
        hub.close()


def test_a_poll_that_brings_only_pings_waits_its_whole_timeout():
    """A ping is consumed by the channel and is no event: ``poll`` returned empty at once when one
    arrived, and rank 0 ran a whole coordinator step for nothing, N times a ping interval."""
    hub = Hub("127.0.0.1", 0, ping_interval=30.0)
    raw = socket.create_connection(("127.0.0.1", hub.port), timeout=5)
    try:
        conn = _accepted(hub)
        pinger = threading.Timer(0.1, lambda: raw.sendall(b'{"t":"ping"}\n' * 3))
        pinger.start()
        t0 = time.monotonic()
        assert hub.poll(1.0) == []
        assert time.monotonic() - t0 >= 0.95  # before: back after the ping, ~0.1 s
        pinger.join()
        assert hub.silent_for(conn) < 30  # the pings were read: the member is not silent
        threading.Timer(0.1, lambda: raw.sendall(b'{"t":"ping"}\n{"t":"hello"}\n')).start()
        events = []
        deadline = time.monotonic() + 30
        while not events and time.monotonic() < deadline:
            events = hub.poll(5.0)
        assert [(e.kind, e.msg) for e in events] == [(EventKind.MESSAGE, {"t": "hello"})]  # a message ends the wait
    finally:
        raw.close()
        hub.close()


def test_silent_among_picks_what_silent_for_picks():
    now = [100.0]
    hub = Hub("127.0.0.1", 0, clock=lambda: now[0], ping_interval=1000.0)
    socks = [socket.create_connection(("127.0.0.1", hub.port), timeout=5) for _ in range(3)]
    try:
        conns = []
        deadline = time.monotonic() + 30
        while len(conns) < 3 and time.monotonic() < deadline:
            conns += [e.conn for e in hub.poll(0.1) if e.kind is EventKind.ACCEPTED]
        now[0] += 10
        socks[1].sendall(b'{"t":"x"}\n')
        while not hub.poll(0.1) and time.monotonic() < deadline:
            pass
        table = {7: conns[0], 8: conns[1], 9: conns[2], 10: 12345}  # 12345: a connection the hub never had
        for seconds in (0.0, 5.0, 10.0, 20.0):
            want = [(r, c) for r, c in table.items() if hub.silent_for(c) >= seconds]
            assert hub.silent_among(table, seconds) == want
        assert hub.silent_among(table, 5.0) == [(7, conns[0]), (9, conns[2]), (10, 12345)]
    finally:
        for s in socks:
            s.close()
        hub.close()


def test_release_json_is_the_same_bytes_without_asdict():
    host = HostId(hostname="n1", boot_id="b" * 32, pidns="pid:[4026531836]", pid=42, pid_start=1.7e9 + 0.25)
    members = tuple(
        Member(rank=r, instance=f"{r:016x}", addr=f"10.0.{r // 256}.{r % 256}", host=host, arrival=r / 7)
        for r in range(5000)
    )
    rel = Release(
        job_id="j",
        generation=3,
        state="released",
        mode="node",
        size=len(members),
        master_addr=members[0].addr,
        master_port=29500,
        members=members,
        writer="ab" * 8,
        wall_time=1.7e9,
        jobs=("4242_3",),
    )
    small = dataclasses.replace(rel, size=3, members=members[:3])
    for r in (small, dataclasses.replace(small, jobs=()), rel):
        d = dataclasses.asdict(r)
        if not r.jobs:
            del d["jobs"]
        d["schema"] = records.SCHEMA_VERSION
        assert records.encode(r) == (json.dumps(d, sort_keys=True, separators=(",", ":")) + "\n").encode()
    header, chunks = encode_release(rel)
    assert len(chunks) == 2
    first = json.loads(chunks[0])
    assert first["members"][4095] == dataclasses.asdict(members[4095])


def _accepted(hub: Hub) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for e in hub.poll(0.1):
            if e.kind is EventKind.ACCEPTED:
                return e.conn
    raise AssertionError("no connection accepted within 30 s")
