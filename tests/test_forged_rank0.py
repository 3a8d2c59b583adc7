"""Mutual authentication (issue 29): a member acts only on what rank 0 sealed with the generation's secret.

* With real processes: rank 0 dies, an impostor (``tests/hostile.py forger``, its own process)
  binds rank 0's port and plays rank 0 with everything that travels in clear -- the port, the
  instance id, the generation, the message formats -- but not the secret: a ``welcome``, then a
  ``prepare`` and a ``go`` naming another master, or a ``prepare`` alone, or a ``void``.  Nobody
  acts on any of it: every member treats it as a lost connection, voids generation 1 and is
  released in generation 2 with a real rank 0, as the records say.
* Unit by unit: :func:`fsmingle.net.wire.seal` and :class:`~fsmingle.net.wire.Unsealer` (missing,
  wrong, replayed, reordered, tampered seals), and a real member against a rank 0 speaking the
  wire by hand on loopback.
"""

from __future__ import annotations

import json
import secrets
import socket
import sys
import time

import pytest
from helpers import REPO, assert_one_world, gen_dir, read_json, release_of, results, wait_claimed, wait_for

from fsmingle.net.wire import WIRE_VERSION, Unsealer, decode_msg, encode_msg, new_nonce, new_secret, seal

N = 3


@pytest.mark.parametrize("what", ["go", "prepare", "void"])
def test_an_impostor_on_rank0s_port_releases_nobody(procs, d, what):
    job = f"forge-{what}"
    first = procs.env(d, job, "--nnodes", N, timeout=120, stale_after=4, name="rank0")
    wait_claimed(d, job, 1, [0], timeout=60, procs=[first])
    master = gen_dir(d, job, 1) / "master"  # its endpoint record, which members (and the impostor) read
    wait_for(lambda: any(read_json(f) for f in master.glob("beacon-*.json")), 60, "rank 0's endpoint record")
    first.kill()  # SIGKILL: its port is free, its claim and endpoint record stay
    hostile = [sys.executable, str(REPO / "tests" / "hostile.py"), "forger", str(d), job, what, str(WIRE_VERSION)]
    forger = procs.spawn(hostile, name="forger")
    wait_for(lambda: "listening" in forger.stdout() or forger.poll() is not None, 60, "the impostor")
    assert forger.poll() is None, forger.stderr()
    nodes = [procs.env(d, job, "--nnodes", N, timeout=120, stale_after=4, name=f"node{i}") for i in range(N)]
    # Whatever the impostor says, the world forms in a later generation with a real rank 0.
    res = results(nodes, timeout=150)
    said = forger.stdout()
    print(said)
    assert "hello" in said, "no member reached the impostor: the test proves nothing"
    world = assert_one_world(res, N)
    assert world["generation"] >= 2, res
    assert {r["master_addr"] for r in res} == {"127.0.0.1"}, res
    rec = release_of(d, job, 1)
    assert rec is not None and rec["state"] == "restart", rec  # voided, as from a lost connection
    assert "ack" not in said, "a member acknowledged the impostor's prepare"
    for p in nodes:
        assert "10.66.6.6" not in p.stdout() + p.stderr()
    assert any("without a mac" in p.stderr() for p in nodes), [p.stderr() for p in nodes]


# ---------------------------------------------------------------------------------------------
# The seal, unit by unit.

SECRET, NONCE, MNONCE = new_secret(), new_nonce(), new_nonce()
GO = {"t": "go", "placement": {"generation": 1, "master_addr": "10.0.0.1", "master_port": 29500}}


def _wire(m: dict) -> dict:
    """What the member decodes: every message crosses the wire as one JSON line."""
    return decode_msg(encode_msg(m).rstrip(b"\n"))


RANK0_SAYS = [
    {"t": "offer", "gen": 1, "ranks": [3]},
    {"t": "offer", "gen": 1, "ranks": [], "wait": True},
    {"t": "welcome", "inst": "ab" * 8, "gen": 1, "present": 2, "missing": [2], "nmissing": 1, "queue": {"x": [1.5]}},
    {"t": "status", "present": 3, "missing": [], "nmissing": 0},
    {"t": "prepare", "gen": 1, "mesh": [[1, "h", "127.0.0.1", 80]], "hold_port": 0},
    {"t": "members", "gen": 1, "k": 0, "n": 2, "data": "eJzLSM3JyQcABiwCFQ=="},
    GO,
    {"t": "void", "why": 'rank 3 lost: \u00e9\u4e2d "quoted"'},
    {"t": "reject", "why": "no", "fatal": True},
]


def test_everything_rank0_says_survives_the_wire_sealed():
    u = Unsealer(SECRET, NONCE, MNONCE)
    for n, m in enumerate(RANK0_SAYS):
        got = _wire(seal(SECRET, NONCE, MNONCE, n, m))
        assert u.check(got) is None, m
        assert {k: v for k, v in got.items() if k not in ("seq", "mac")} == m
        assert "seq" not in m and "mac" not in m  # the broadcast's shared dict is not changed


@pytest.mark.parametrize(
    "how",
    ["missing", "wrong-secret", "another-members-nonce", "another-challenge", "tampered", "seq-bool", "seq-str"],
)
def test_a_message_without_a_valid_seal_is_refused(how):
    good = seal(SECRET, NONCE, MNONCE, 0, GO)
    bad = {
        "missing": {k: v for k, v in good.items() if k != "mac"},
        "wrong-secret": seal(new_secret(), NONCE, MNONCE, 0, GO),
        # Recorded on another member's connection (the same challenge replayed by an impostor):
        "another-members-nonce": seal(SECRET, NONCE, new_nonce(), 0, GO),
        "another-challenge": seal(SECRET, new_nonce(), MNONCE, 0, GO),
        "tampered": {**good, "placement": {**GO["placement"], "master_addr": "10.66.6.6"}},
        "seq-bool": {**good, "seq": False},
        "seq-str": {**good, "seq": "0"},
    }[how]
    u = Unsealer(SECRET, NONCE, MNONCE)
    assert u.check(_wire(bad)) is not None
    assert u.check(_wire(good)) is None  # a refused message moved nothing: the real one still passes


def test_a_sealed_message_is_not_accepted_twice_nor_out_of_order():
    u = Unsealer(SECRET, NONCE, MNONCE)
    m0, m1, m2 = (_wire(seal(SECRET, NONCE, MNONCE, n, {"t": "status", "present": n})) for n in range(3))
    assert u.check(m0) is None and u.check(m1) is None
    assert "replayed" in u.check(m1)  # the same message again
    assert "replayed" in u.check(m0)  # an older one after a newer
    m5 = _wire(seal(SECRET, NONCE, MNONCE, 5, {"t": "go"}))
    assert u.check(m5) is None  # a gap: a message interrupted before it left, never a forgery
    assert u.check(m2) is not None


def test_seal_refuses_a_message_that_uses_its_fields():
    with pytest.raises(ValueError):
        seal(SECRET, NONCE, MNONCE, 0, {"t": "x", "seq": 1})


# ---------------------------------------------------------------------------------------------
# A real member against a rank 0 spoken by hand (the secret known or not).


def _member_and_rank0(tmp_path):
    """A real member (explicit rank 1 of 2) connected to a hand-made rank 0 on loopback, its hello read."""
    from fsmingle.fs.layout import claim_name, gen_name, master_dir, master_name
    from fsmingle.fs.records import Beacon, Claim, encode
    from fsmingle.fs.store import PosixStore
    from fsmingle.net.channel import TcpTransport
    from fsmingle.net.hostinfo import this_process
    from fsmingle.protocol.member import Member
    from fsmingle.protocol.participant import Participant
    from fsmingle.protocol.timing import Timing

    root = str(tmp_path)
    store, inst, secret = PosixStore(root), secrets.token_hex(8), new_secret()
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    port = lsock.getsockname()[1]
    store.mkdir(gen_name(1))
    store.mkdir(master_dir(1))
    store.create(claim_name(1, 0), encode(Claim(0, inst)))
    b = Beacon("j", 1, inst, "node", 2, 0, "127.0.0.1", port, 1, 0, this_process(), time.time(), secret=secret)
    store.publish(master_name(1, inst), encode(b))
    timing = Timing(poll_min=0.005, poll_max=0.02, stale_after=30.0, scan_interval=0.05, probe_timeout=1.0)
    p = Participant(
        store,
        job_id="j",
        mode="node",
        size=2,
        rank=1,
        addr="127.0.0.1",
        instance=secrets.token_hex(8),
        me=this_process(),
        timeout=60.0,
        timing=timing,
        transport=TcpTransport(ping_interval=timing.ping_interval),
    )
    for _ in range(100):
        p.step()
        if isinstance(p.role, Member) and p.role.link is not None:
            break
        p.wait(0.002)
    lsock.settimeout(2)
    conn, _ = lsock.accept()
    conn.settimeout(2)
    nonce = new_nonce()
    conn.sendall(encode_msg({"t": "challenge", "nonce": nonce, "v": WIRE_VERSION}))
    for _ in range(5):
        p.step()
        p.wait(0.002)
    hello = json.loads(conn.recv(65536).split(b"\n")[0])
    assert hello["t"] == "hello" and len(hello["mnonce"]) == 32, hello
    return p, conn, lsock, (secret, nonce, hello["mnonce"], inst)


def _steps(p, n=8):
    for _ in range(n):
        pl = p.step()
        if pl is not None or p.role is None:
            return pl
        p.wait(0.005)
    return None


@pytest.mark.parametrize("forgery", ["unsealed", "replayed-from-another-member", "replayed-on-this-connection"])
def test_a_member_treats_a_forged_go_as_a_lost_connection(tmp_path, forgery):
    from fsmingle.protocol.member import Member

    p, conn, lsock, (secret, nonce, mnonce, inst) = _member_and_rank0(tmp_path)
    try:
        k = iter(range(100))
        sealed = [
            seal(secret, nonce, mnonce, next(k), {"t": "welcome", "inst": inst, "gen": 1, "present": 2, "missing": []}),
            seal(secret, nonce, mnonce, next(k), {"t": "prepare", "gen": 1}),
        ]
        conn.sendall(b"".join(encode_msg(m) for m in sealed))
        assert _steps(p) is None
        assert isinstance(p.role, Member) and p.role.acked  # sealed: welcomed, prepared, acknowledged
        ack = json.loads(conn.recv(65536).split(b"\n")[0])
        assert ack["t"] == "ack" and "mac" in ack
        pl = {"generation": 1, "master_addr": "10.66.6.6", "master_port": 29999, "mode": "node", "size": 2}
        pl.update(rank=1, node_rank=1, nnodes=2, local_rank=0, local_world_size=1)
        go = {"t": "go", "placement": pl}
        forged = {
            "unsealed": go,
            # Sealed by the real rank 0 for another member's connection (its own nonce), same counter:
            "replayed-from-another-member": seal(secret, nonce, new_nonce(), next(k), go),
            "replayed-on-this-connection": sealed[1],  # the prepare again
        }[forgery]
        conn.sendall(encode_msg(forged))
        assert _steps(p) is None, "released on a forged go"
        # Lost after its acknowledgement: it voided generation 1 itself (nobody released it).
        assert p.gen == 2 or p.read_release(1) is not None, p.note
        assert p.read_release(1).state == "restart"
    finally:
        if p.role is not None:
            p.role.close()
        conn.close()
        lsock.close()


def test_a_member_takes_a_sealed_go(tmp_path):
    p, conn, lsock, (secret, nonce, mnonce, inst) = _member_and_rank0(tmp_path)
    try:
        pl = {"generation": 1, "master_addr": "127.0.0.1", "master_port": 29999, "mode": "node", "size": 2}
        pl.update(rank=1, node_rank=1, nnodes=2, local_rank=0, local_world_size=1)
        says = [
            {"t": "welcome", "inst": inst, "gen": 1, "present": 2, "missing": []},
            {"t": "prepare", "gen": 1},
            {"t": "go", "placement": pl},
        ]
        conn.sendall(
            encode_msg(seal(secret, nonce, mnonce, 0, says[0])) + encode_msg(seal(secret, nonce, mnonce, 1, says[1]))
        )
        assert _steps(p) is None
        conn.sendall(encode_msg(seal(secret, nonce, mnonce, 7, says[2])))  # a gap in the counter is no forgery
        got = _steps(p)
        assert got is not None and got.master_addr == "127.0.0.1" and got.rank == 1, p.note
    finally:
        if p.role is not None:
            p.role.close()
        conn.close()
        lsock.close()
