"""Other parties on rank 0's port (issue 21, row 4), driven as users and intruders would.

Real ``fsmingle env`` processes form a first-come world of 4 on 127.0.0.1; a hostile client
(``tests/hostile.py``, its own process) finds rank 0's port in the endpoint record under
``gen-00000001/master/`` and misbehaves there before the 4th node arrives.  The legitimate
world must be released within a few seconds of the 4th node's arrival.  The intruders here
share the members' source address (127.0.0.1): the per-source cap on unauthenticated
connections must not lock the members out either.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from dataclasses import replace as dataclasses_replace

import pytest
from helpers import REPO, assert_one_world, make_gen_dir, read_json, results, run_cli, wait_claimed, wait_for

N = 4
# Seconds from the 4th node's start to every node's release.  A quiet world of 4 takes about
# 1 s here (python start-up included); the lease rules add at most one lease (2 s).
WITHIN = 8.0


def _three_then_fourth(procs, d, job, hostile_args, *, hostile_head_start=1.5):
    """Start 3 nodes, wait for their claims, start the hostile client, then the 4th node.

    Returns (seconds from the 4th's start to the last release, the results, the hostile proc)."""
    first = [procs.env(d, job, "--nnodes", N, timeout=20, stale_after=10, name=f"node{i}") for i in range(3)]
    wait_claimed(d, job, 1, [0, 1, 2], timeout=20, procs=first)
    mode, *flags = hostile_args
    hostile = procs.spawn([sys.executable, str(REPO / "tests" / "hostile.py"), mode, str(d), job, *flags])
    wait_for(lambda: "wire version" in hostile.stdout() or hostile.poll() is not None, 10, "the hostile client")
    time.sleep(hostile_head_start)  # it holds (or floods) the port before the last node comes
    t0 = time.monotonic()
    fourth = procs.env(d, job, "--nnodes", N, timeout=20, stale_after=10, name="node3")
    res = results([*first, fourth], timeout=40)
    took = max(p.ended for p in [*first, fourth]) - t0
    assert_one_world(res, N, generation=1)
    return took, res, hostile


@pytest.mark.parametrize("secret", [False, True], ids=["outsider", "with-the-secret"])
def test_a_client_that_asks_every_half_second_holds_no_rank(procs, d, secret):
    # Outsider: it cannot answer the challenge and is dropped at once, every time it comes back.
    # With the secret (a buggy peer of the same uid): its re-asks hand the rank to the node that
    # was told to wait, and after MAX_OFFERS_PER_CONN offers without a hello it is dropped.
    took, _, hostile = _three_then_fourth(procs, d, "reask", ["reasker", *(["--secret"] if secret else [])])
    print(f"released {took:.2f} s after the 4th node started")
    assert took < WITHIN, f"released {took:.1f} s after the 4th node started"
    out = hostile.stdout()
    # The outsider never gets an answer; the one with the secret was told to wait behind the 4th
    # node (or dropped, had it held on to its offers for MAX_OFFERS_PER_CONN asks).
    assert ("offer" not in out and "dropped" in out) if not secret else ('"wait": true' in out or "dropped" in out), out


def test_a_flood_of_200_connections_does_not_hold_the_release(procs, d):
    took, _, hostile = _three_then_fourth(procs, d, "flood", ["flood"])
    print(f"released {took:.2f} s after the 4th node started")
    assert took < WITHIN, f"released {took:.1f} s after the 4th node started"
    assert "opened" in hostile.stdout(), hostile.stderr()


@pytest.mark.parametrize("hard", [False, True], ids=["soft-1024", "hard-1024"])
def test_20_sources_x_60_silent_connections_neither_kill_nor_stall_rank0(procs, d, hard):
    # Issue 29: 20 sources x 60 silent connections, each re-opened as soon as rank 0 drops it, and
    # rank 0 at the common soft limit of 1,024 open files: accept() met EMFILE, so did rank 0's
    # own filesystem calls, and it died (exit 5, once a raw OSError from PosixStore.listdir); a
    # world of 2 was not released in 25 s.  Rank 0 raises its soft limit at start (soft-1024),
    # and where the hard limit is 1,024 too it sheds unanswered connections before its store can
    # meet EMFILE (hard-1024).  The member shares 127.0.0.0/24 with the flood.
    import resource

    hard_now = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = f"--nofile=1024:{1024 if hard else ('unlimited' if hard_now == resource.RLIM_INFINITY else hard_now)}"
    job = "sources"
    rank0 = procs.env(d, job, "--nnodes", 2, timeout=40, stale_after=10, name="rank0", prefix=["prlimit", limit, "--"])
    wait_claimed(d, job, 1, [0], timeout=20, procs=[rank0])
    hostile = procs.spawn([sys.executable, str(REPO / "tests" / "hostile.py"), "sources", str(d), job, "20", "60"])

    def flooding():
        assert rank0.poll() is None, f"rank 0 exited {rank0.poll()}:\n{rank0.stderr()[-3000:]}"
        lines = [ln.split() for ln in hostile.stdout().splitlines() if ln.startswith("opened")]
        return lines and int(lines[-1][1]) >= 2400  # every connection dropped and re-opened once at least

    wait_for(flooding, 30, "the flood to cycle")
    t0 = time.monotonic()
    member = procs.env(d, job, "--nnodes", 2, timeout=40, stale_after=10, name="member")
    res = results([rank0, member], timeout=30)
    took = max(p.ended for p in [rank0, member]) - t0
    assert_one_world(res, 2, generation=1)
    print(f"released {took:.2f} s after the member started; the flood: {hostile.stdout().splitlines()[-1]}")
    assert took < 5.0, f"released {took:.1f} s after the member started"
    assert "Traceback" not in rank0.stderr(), rank0.stderr()


# ---------------------------------------------------------------------------------------------
# The handshake and the lease rules, unit by unit: a real rank 0 (Participant, explicit rank 0,
# stepped in this thread) on real loopback sockets, and raw clients speaking the wire format.

SCAN = 0.25  # scan_interval: the lease is max(1 s, 2 x scan_interval) = 1 s
PROBE = 0.5  # probe_timeout: the time to answer the challenge before a crowd may shed a connection


class Rank0:
    """Rank 0 of a world of ``size`` on 127.0.0.1, stepped by :meth:`pump`."""

    def __init__(self, tmp_path, size: int = 2, probe: float = PROBE, stale: float = 8.0, scan: float = SCAN):
        from fsmingle.fs.jobdir import open_job_dir
        from fsmingle.net.channel import TcpTransport
        from fsmingle.net.hostinfo import this_process
        from fsmingle.protocol.participant import Participant, Timing

        self.base = tmp_path / "rdv"
        self.base.mkdir(mode=0o700)
        timing = Timing(scan_interval=scan, probe_timeout=probe, stale_after=stale)
        self.p = Participant(
            open_job_dir(str(self.base), "auth", create_base=False),
            job_id="auth",
            mode="node",
            size=size,
            rank=0,
            addr="127.0.0.1",
            instance=secrets.token_hex(8),
            me=this_process(),
            timeout=60,
            timing=timing,
            transport=TcpTransport(ping_interval=timing.ping_interval),
        )
        self.endpoint = wait_for(self._endpoint, 10, "rank 0's endpoint record", interval=0)
        # No secret: an older fsmingle (wire 2, no challenge); the lease tests then still run
        # unsigned, so that they show what the old code did (see ``Raw.challenge``).
        self.port, self.secret = self.endpoint["master_port"], self.endpoint.get("secret")

    def _endpoint(self):
        self.pump(0.01)
        master = self.base / "auth" / "gen-00000001" / "master"
        for f in master.glob("beacon-*.json") if master.is_dir() else []:
            b = read_json(f)
            if b and b.get("master_port"):
                return b
        return None

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            assert self.p.step() is None, "released unexpectedly"
            if time.monotonic() >= end:
                return
            self.p.wait(min(0.01, end - time.monotonic()))

    def close(self) -> None:
        if self.p.hub is not None:
            self.p.hub.close()


@pytest.fixture
def rank0(tmp_path):
    r = Rank0(tmp_path)
    yield r
    r.close()


class Raw:
    """A client speaking the wire format by hand; ``recv`` steps rank 0 while it waits."""

    def __init__(self, r0: Rank0, inst: str | None = None, src: str | None = None):
        self.r0, self.inst = r0, inst or secrets.token_hex(8)
        self.s = socket.create_connection(("127.0.0.1", r0.port), timeout=2, source_address=src and (src, 0))
        self.s.setblocking(False)
        self.buf = b""
        self.nonce: str | None = None
        self.mnonce = secrets.token_hex(16)  # this client's own nonce: rank 0 seals over it
        self.unsealer = None

    def recv(self, timeout: float = 2.0, pump: bool = True):
        """The next message; "EOF" once rank 0 closed the connection; None if nothing came
        (rank 0 is stepped while waiting, unless ``pump`` is false)."""
        end = time.monotonic() + timeout
        while True:
            if b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                m = json.loads(line)
                if m.get("t") == "ping":
                    continue
                if self.unsealer is not None and "mac" in m:
                    # Rank 0's seal (wire 4): checked, then left out so tests compare the message.
                    assert self.unsealer.check(m) is None, (self.unsealer.check(m), m)
                    m = {k: v for k, v in m.items() if k not in ("seq", "mac")}
                return m
            try:
                data = self.s.recv(65536)
                if not data:
                    return "EOF"
                self.buf += data
                continue
            except BlockingIOError:
                pass
            except ConnectionResetError:
                return "EOF"
            if time.monotonic() >= end:
                return None
            if pump:
                self.r0.pump(0.01)
            else:
                time.sleep(0.005)

    def challenge(self, required: bool = False) -> str | None:
        if self.r0.secret is None and not required:
            return None  # an older rank 0: no challenge to wait for
        m = self.recv()
        assert isinstance(m, dict) and m["t"] == "challenge", m
        self.nonce = m["nonce"]
        if self.r0.secret is not None:
            from fsmingle.net.wire import Unsealer

            self.unsealer = Unsealer(self.r0.secret, self.nonce, self.mnonce)
        return self.nonce

    def send(self, m: dict) -> None:
        self.s.sendall(json.dumps(m).encode() + b"\n")

    def msg(self, t: str, *, rank=None, sign: bool = True, secret: str | None = None, nonce: str | None = None):
        from fsmingle.net import wire

        b = self.r0.endpoint
        m = {
            "t": t,
            "v": wire.WIRE_VERSION,
            "job": "auth",
            "gen": 1,
            "inst": self.inst,
            "mode": "node",
            "size": b["size"],
        }
        m.update(restart_count=0, slurm_job_id="", taken=[], mnonce=self.mnonce)
        if t == "hello":
            host = {"hostname": "h", "boot_id": "b", "pidns": "p", "pid": 1, "pid_start": 1.0}
            m.update(rank=rank, addr="127.0.0.1", host=host)
        if sign and self.r0.secret is not None:
            m["mac"] = wire.auth_mac(
                secret or self.r0.secret,
                nonce or self.nonce,
                t,
                "auth",
                1,
                self.inst,
                rank if t == "hello" else None,
                self.mnonce,
            )
        return m

    def ask(self) -> None:
        self.send(self.msg("ask"))


def test_rank0_challenges_each_connection_and_drops_whatever_fails_it(tmp_path):
    rank0 = Rank0(tmp_path, stale=2.0)
    try:
        _challenges(rank0)
    finally:
        rank0.close()


def _challenges(rank0: Rank0) -> None:
    first = Raw(rank0)
    nonce = first.challenge(required=True)
    assert len(nonce) == 32 and int(nonce, 16) >= 0
    for name, payload in [
        ("no mac", lambda c: c.msg("hello", rank=1, sign=False)),
        ("wrong secret", lambda c: c.msg("ask", secret="0" * 64)),
        ("another connection's nonce", lambda c: c.msg("ask", nonce=nonce)),
        ("mac over other fields", lambda c: {**c.msg("hello", rank=1), "rank": 2}),
        ("not a hello or ask", lambda c: {**c.msg("ask"), "t": "ack"}),
    ]:
        c = Raw(rank0)
        c.challenge()
        c.send(payload(c))
        assert c.recv() == "EOF", name  # dropped at once, not one word of answer
    c = Raw(rank0)
    c.challenge()
    c.s.sendall(b"\x00\xffgarbage\n")
    assert c.recv() == "EOF"
    # Silent, crowding nobody: dropped once stale_after has passed (issue 29: not at probe_timeout,
    # which would drop the members of a world arriving faster than rank 0 reads).
    c = Raw(rank0)
    c.challenge()
    t0 = time.monotonic()
    assert c.recv(timeout=5) == "EOF"
    assert 2.0 - 0.05 <= time.monotonic() - t0 < 2.0 + 1.0
    assert first.recv(timeout=0.1) == "EOF"  # silent as well
    # The one that answers properly gets its offer; nothing of the others is left behind.
    good = Raw(rank0)
    good.challenge()
    good.ask()
    assert good.recv() == {"t": "offer", "gen": 1, "ranks": [1]}
    coord = rank0.p.role
    assert not coord.unauth and not coord.unauth_of and not coord.pending and list(coord.nonces) == [*coord.askers]


def test_an_older_wire_version_is_told_which_versions_meet(rank0):
    c = Raw(rank0)
    c.challenge(required=True)
    c.send({**c.msg("hello", rank=1, sign=False), "v": 2})  # an older fsmingle sends its hello at once
    m = c.recv()
    from fsmingle.net.wire import WIRE_VERSION

    assert m["t"] == "reject" and m["fatal"] and f"wire protocol {WIRE_VERSION}, you sent 2" in m["why"], m
    assert "mac" not in m  # the one answer to a peer that did not authenticate: nothing to seal it with
    assert c.recv() == "EOF"


def _states(conns, n: int = 2) -> list:
    """What each raw connection got, without stepping rank 0: its challenge, then None (still
    open) or "EOF" (dropped)."""
    return [[c.recv(timeout=0.02, pump=False) for _ in range(n)] for c in conns]


def test_unanswered_connections_over_the_source_cap_go_oldest_first_once_their_time_is_up(tmp_path):
    from fsmingle.protocol.rank0.door import UNAUTH_PER_SOURCE

    r0 = Rank0(tmp_path)  # 0.5 s to answer before a crowd may shed it; 8 s without a crowd
    try:
        silent = [Raw(r0) for _ in range(UNAUTH_PER_SOURCE + 4)]
        late = Raw(r0)  # a member arriving behind a flood from its own address
        late.challenge()
        late.ask()
        assert late.recv() == {"t": "offer", "gen": 1, "ranks": [1]}
        t0 = time.monotonic()
        r0.pump(0.8)  # past the time to answer (probe_timeout, 0.5 s), before stale_after (8 s)
        assert time.monotonic() - t0 < 7, "too slow to tell the cap from the deadline"
        states = _states(silent)
        assert all(s[0]["t"] == "challenge" for s in states), states
        # The 4 oldest over the cap went (the member answered: it is not counted), the rest stay
        # until their deadline.  (Before issue 29: 5 went at once, the member's own among the count.)
        assert [s[1] for s in states] == ["EOF"] * 4 + [None] * UNAUTH_PER_SOURCE, states
        assert late.recv(timeout=0.05) is None  # the member is untouched
    finally:
        r0.close()


def test_unanswered_connections_are_capped_per_24_prefix(tmp_path):
    # Five sources of one /24, each under the per-source cap, together over the prefix's: the
    # oldest go once their time to answer is up (before issue 29 nothing capped them but
    # probe_timeout: any number of addresses gave an attacker any number of connections).
    from fsmingle.protocol.rank0.door import UNAUTH_PER_PREFIX, UNAUTH_PER_SOURCE, prefix_of

    assert prefix_of("10.1.2.3") == "10.1.2.0/24" and prefix_of("2001:db8:1:2:3::4") == "2001:db8:1:2::/64"
    r0 = Rank0(tmp_path)
    try:
        per = UNAUTH_PER_SOURCE - 4
        conns = []
        for i in range(5):
            conns += [Raw(r0, src=f"127.0.0.{2 + i}") for _ in range(per)]
            r0.pump(0)  # accept them: more than the listen backlog (128) in all
        over = len(conns) - UNAUTH_PER_PREFIX
        assert over > 0
        r0.pump(0.8)
        assert [s[1] for s in _states(conns)] == ["EOF"] * over + [None] * UNAUTH_PER_PREFIX
    finally:
        r0.close()


def test_a_burst_of_a_whole_world_from_one_address_is_not_a_flood(tmp_path):
    # Issue 29: N = 4,096 from one address never released as shipped: rank 0 evicted members
    # mid-handshake ("more than 64 unauthenticated connections from 127.0.0.1").  The caps grow
    # with the world: 299 members of a world of 300 connect at once and answer late (0.8 s, past
    # probe_timeout, 0.5 s): they crowd nobody, so none is shed, and each gets its offer.
    r0 = Rank0(tmp_path, size=300)
    try:
        members = [Raw(r0) for _ in range(299)]
        r0.pump(0.8)
        states = _states(members, 1)
        assert all(isinstance(s[0], dict) and s[0]["t"] == "challenge" for s in states)
        for c, s in zip(members, states):
            c.nonce = s[0]["nonce"]
            c.ask()
        offered = set()
        for c in members:
            m = c.recv(timeout=5)
            assert isinstance(m, dict) and m["t"] == "offer" and len(m["ranks"]) == 1, m
            offered.add(m["ranks"][0])
        assert offered == set(range(1, 300))
    finally:
        r0.close()


def test_the_secret_is_in_the_endpoint_record_only(rank0, tmp_path):
    gen = rank0.base / "auth" / "gen-00000001"
    (rec,) = (gen / "master").glob("beacon-*.json")
    assert os.stat(rec).st_mode & 0o777 == 0o600 and os.stat(gen).st_mode & 0o777 == 0o700
    assert len(rank0.secret) == 64 and int(rank0.secret, 16) >= 0
    (own,) = gen.glob("beacon-*.json")
    assert "secret" not in read_json(own)
    st = run_cli("status", "auth", "--dir", rank0.base, "--json")
    assert st.returncode == 1 and json.loads(st.stdout)["state"] == "waiting"  # 1: not released yet
    assert rank0.secret not in st.stdout and rank0.secret not in st.stderr
    assert rank0.secret not in repr(rank0.p.beacon(endpoint=True))


def test_a_record_without_a_secret_still_decodes():
    from fsmingle.fs.records import Beacon, decode, encode

    from_old = json.loads(encode(Beacon(**BEACON)))
    assert "secret" not in from_old  # an empty secret is left out: older readers see the same record
    assert decode(json.dumps(from_old).encode(), Beacon).secret == ""
    assert decode(encode(Beacon(**BEACON, secret="ab" * 32)), Beacon).secret == "ab" * 32


BEACON = dict(
    job_id="j",
    generation=1,
    instance="0123456789abcdef",
    mode="node",
    size=2,
    rank=0,
    addr="127.0.0.1",
    master_port=29500,
    heartbeat=0,
    restart_count=0,
    host=None,
)


@pytest.fixture(autouse=True)
def _beacon_host():
    from fsmingle.net.hostinfo import this_process

    BEACON["host"] = this_process()


def test_an_offer_not_followed_by_a_hello_goes_back_after_the_lease(rank0):
    a, b = Raw(rank0), Raw(rank0)
    a.challenge(), b.challenge()
    a.ask()
    assert a.recv() == {"t": "offer", "gen": 1, "ranks": [1]}
    t0 = time.monotonic()
    b.ask()
    assert b.recv() == {"t": "offer", "gen": 1, "ranks": [], "wait": True}
    # b does not ask again: the lapsed offer comes to it by itself.
    assert b.recv(timeout=3) == {"t": "offer", "gen": 1, "ranks": [1]}
    # After the lease (1 s), and by itself (b asked once): no upper bound on a loaded machine.
    assert time.monotonic() - t0 >= 0.9


def test_an_asker_that_asks_again_cannot_keep_a_rank_from_who_waits(tmp_path):
    # A 10 s lease (scan_interval 5 s), so "at once, not after a lease" holds with a wide margin on
    # a loaded machine (with the 1 s lease this asserted under 0.8 s).
    rank0 = Rank0(tmp_path, scan=5.0)
    a, b = Raw(rank0), Raw(rank0)
    a.challenge(), b.challenge()
    a.ask()
    assert a.recv() == {"t": "offer", "gen": 1, "ranks": [1]}
    b.ask()
    assert b.recv() == {"t": "offer", "gen": 1, "ranks": [], "wait": True}
    t0 = time.monotonic()
    a.ask()
    assert b.recv(timeout=8) == {"t": "offer", "gen": 1, "ranks": [1]}  # at once, not after a lease
    assert time.monotonic() - t0 < 5.0, "b waited for a's lease (10 s)"
    assert a.recv() == {"t": "offer", "gen": 1, "ranks": [], "wait": True}
    rank0.close()


def test_a_connection_that_keeps_asking_without_a_hello_is_dropped(rank0):
    from fsmingle.protocol.rank0 import coordinator

    MAX_OFFERS_PER_CONN = getattr(coordinator, "MAX_OFFERS_PER_CONN", 8)  # (to run it on older code too)
    a = Raw(rank0)
    a.challenge()
    for _ in range(MAX_OFFERS_PER_CONN):
        a.ask()
        assert a.recv() == {"t": "offer", "gen": 1, "ranks": [1]}
    a.ask()
    m = a.recv()
    assert m["t"] == "reject" and not m["fatal"] and "without saying hello" in m["why"], m
    assert a.recv() == "EOF"


def test_an_unverified_hello_blocks_offers_only_for_the_lease(rank0):
    forged, b = Raw(rank0), Raw(rank0)
    forged.challenge(), b.challenge()
    forged.send(forged.msg("hello", rank=1))  # nobody claimed rank 1: it cannot be verified
    rank0.pump(0.05)
    t0 = time.monotonic()
    b.ask()
    assert b.recv() == {"t": "offer", "gen": 1, "ranks": []}  # blocked by the hello, for now
    rank0.pump(max(0.0, 1.05 - (time.monotonic() - t0)))
    b.ask()
    assert b.recv() == {"t": "offer", "gen": 1, "ranks": [1]}  # the lease ran out
    # The hello itself is neither accepted nor thrown out before --stale-after: still pending.
    assert forged.recv(timeout=0.1) is None and len(rank0.p.role.pending) == 1


def test_a_member_meeting_an_older_rank0_says_so(procs, d):
    # An older rank 0 publishes no secret and sends no challenge: waiting for one would last until
    # the timeout, so the member fails at once naming the versions (exit 3, ConfigError).
    from fsmingle.fs.records import Beacon, encode
    from fsmingle.net.hostinfo import this_process

    gen = make_gen_dir(d, "old", 1)
    (gen / "master").mkdir(mode=0o700)
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(8)
        inst = secrets.token_hex(8)
        b = Beacon(**{**BEACON, "job_id": "old", "instance": inst, "master_port": lsock.getsockname()[1]})
        rec = gen / "master" / f"beacon-{inst}.json"
        rec.write_bytes(encode(dataclasses_replace(b, host=this_process(), version="0.0.9")))
        os.chmod(rec, 0o600)
        p = procs.env(d, "old", "--nnodes", 2, timeout=20)
        assert p.wait(15) == 3, p.stderr()
    from fsmingle.net.wire import WIRE_VERSION

    assert "runs fsmingle 0.0.9" in p.stderr() and f"wire protocol {WIRE_VERSION}" in p.stderr(), p.stderr()


# ---------------------------------------------------------------------------------------------
# A verified member's second hello; the ranks askers report taken (issue 29, item 6).


def test_a_second_hello_of_a_verified_member_frees_its_rank(tmp_path):
    # Before issue 29 the connection was dropped but the rank stayed bound to it: it looked
    # silent until stale_after, then the generation was voided for silence.

    rank0 = Rank0(tmp_path, size=3)  # a world of 3: one member does not complete it
    try:
        _second_hello(rank0)
    finally:
        rank0.close()


def _second_hello(rank0: Rank0) -> None:
    from fsmingle.fs.layout import claim_name
    from fsmingle.fs.records import Claim, encode

    m = Raw(rank0)
    assert rank0.p.store.create(claim_name(1, 1), encode(Claim(1, m.inst)))
    m.challenge()
    m.send(m.msg("hello", rank=1))
    w = m.recv()
    assert isinstance(w, dict) and w["t"] == "welcome", w
    coord = rank0.p.role
    assert coord.rank_conn.get(1) is not None
    m.send(m.msg("hello", rank=1))
    r = m.recv()
    while isinstance(r, dict) and r["t"] == "status":
        r = m.recv()
    assert isinstance(r, dict) and r["t"] == "reject" and "second hello" in r["why"], r
    assert m.recv() == "EOF"
    assert 1 not in coord.rank_conn and not coord.conn_rank and 1 in coord.missing_sorted
    assert "second hello" in coord.lost[1]  # a loss: the decision voids at once, not after stale_after


def test_ranks_reported_taken_are_kept_from_offers_for_a_lease_only(rank0):
    # Before issue 29 a rank an ask's `taken` named stayed out of offers for ever: one report
    # nobody's claim bore out (a buggy asker's, a holder of the secret's) kept it from everyone.
    a = Raw(rank0)
    a.challenge()
    a.send({**a.msg("ask"), "taken": [1]})
    assert a.recv() == {"t": "offer", "gen": 1, "ranks": []}  # none known free: the asker lists
    t0 = time.monotonic()
    coord = rank0.p.role
    lease = coord._taken_lease()
    rank0.pump(lease + 0.1)
    a.ask()
    assert a.recv() == {"t": "offer", "gen": 1, "ranks": [1]}, "still kept after the lease"
    assert time.monotonic() - t0 >= lease


def test_ranks_reported_taken_are_bounded(tmp_path):
    from fsmingle.protocol.rank0.offers import KNOWN_TAKEN_MAX

    r0 = Rank0(tmp_path, size=KNOWN_TAKEN_MAX + 200)
    try:
        askers = [Raw(r0) for _ in range(3)]
        for c in askers:
            c.challenge()
        r = 1
        for _ in range(6):
            for c in askers:
                c.send({**c.msg("ask"), "taken": list(range(r, r + 64))})
                r += 64
                m = c.recv()
                assert isinstance(m, dict) and m["t"] == "offer", m
        assert r - 1 > KNOWN_TAKEN_MAX
        kept = r0.p.role.known_taken
        assert len(kept) <= KNOWN_TAKEN_MAX and max(kept) == r - 1  # the oldest reports went
    finally:
        r0.close()


# ---------------------------------------------------------------------------------------------
# Rank 0's descriptors: the hub never holds more connections than its room, accept() short of
# descriptors does not kill it, and the store reports what an exhausted process meets.

HUB_SCRIPT = """
import os, resource, socket, sys, time
from fsmingle.net.channel import EventKind, Hub
resource.setrlimit(resource.RLIMIT_NOFILE, (200, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
hub = Hub("127.0.0.1", 0, backlog=256)
print("port", hub.port, "limit", hub.limit, flush=True)
ids = []
def pump(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ids.extend(ev.conn for ev in hub.poll(0.02) if ev.kind is EventKind.ACCEPTED)
sys.stdin.readline()  # the clients are connecting
pump(1.5)
print("full", hub.open_connections(), hub.room(), flush=True)
for c in ids[:5]:
    hub.drop(c)
fill = []
try:
    while True:
        fill.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print("filled", e.errno, flush=True)
pump(1.0)
print("starved", hub.open_connections(), hub.room(), hub.starved, flush=True)
for fd in fill:
    os.close(fd)
pump(1.5)
print("again", hub.open_connections(), hub.room(), flush=True)
"""


def test_the_hub_holds_no_more_than_its_room_and_survives_emfile_on_accept(procs):
    import subprocess

    hub = subprocess.Popen(
        [sys.executable, "-c", HUB_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        _, port, _, limit = hub.stdout.readline().split()
        port, limit = int(port), int(limit)
        assert 8 <= limit <= 200 - 64
        clients = []
        for _ in range(limit + 20):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            clients.append(s)
        hub.stdin.write("go\n")
        hub.stdin.flush()
        assert hub.stdout.readline().split() == ["full", str(limit), "0"]  # the other 20 wait in the backlog
        assert hub.stdout.readline().split()[0] == "filled"
        starved = hub.stdout.readline().split()
        # accept() met EMFILE (starved), the hub lived on and accepted nothing meanwhile.
        assert starved[:2] == ["starved", str(limit - 5)] and int(starved[3]) >= 1, starved
        assert hub.stdout.readline().split() == ["again", str(limit), "0"]
        assert hub.wait(10) == 0, hub.stderr.read()
    finally:
        if hub.poll() is None:
            hub.kill()
        for s in clients:
            s.close()


STORE_SCRIPT = """
import os, resource, tempfile
from fsmingle.errors import StorageError
from fsmingle.fs.store import PosixStore
d = tempfile.mkdtemp()
store = PosixStore(d)
store.publish("a.json", b"{}")
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
fill = []
try:
    while True:
        fill.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
for call in (lambda: store.listdir(), lambda: store.read("a.json"), lambda: store.publish("b.json", b"{}")):
    try:
        call()
    except StorageError as e:
        print("StorageError", e.errno, "open-file limit" in str(e))
"""


def test_every_oserror_out_of_the_store_is_a_storage_error():
    # Issue 29: rank 0 out of descriptors died once with a raw OSError traceback from
    # PosixStore.listdir; every call now fails as a StorageError (exit 5) that says what to do.
    import errno
    import subprocess

    r = subprocess.run(
        [sys.executable, "-c", STORE_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == [f"StorageError {errno.EMFILE} True"] * 3, r.stdout
