"""The adversary's equivalence checks of rank 0's CPU cuts (branch "rank0") against the code before them
(9933735): the wire line a ``Sealer`` splices is a JSON object equal to what ``encode_msg(seal(...))`` sent, its MAC
is the one the old ``_seal_mac`` computed (written out here from the old code), both ``Unsealer``s accept it, and
``peer_host``'s shortcut answers what the old ``ipaddress`` path did.  Mixed versions end to end (3 nodes, rank 0
of either tree, members of the other: one world) were run by hand; see the report."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from fsmingle.net import wire

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=8,
)
MSG = st.dictionaries(st.text(max_size=6).filter(lambda k: k not in ("seq", "mac")), JSON, max_size=5)


def _old_seal(secret, nonce, mnonce, n, msg):
    """fsmingle/net/wire.py at 9933735: seal() and _seal_mac(), then encode_msg()."""
    body = json.dumps(msg, separators=(",", ":"), sort_keys=True).encode()
    head = json.dumps([wire.WIRE_VERSION, "rank0", nonce, mnonce, n], separators=(",", ":")).encode()
    mac = hmac.new(secret.encode(), head + b"\n" + body, hashlib.sha256).hexdigest()
    return json.dumps(dict(msg, seq=n, mac=mac), separators=(",", ":")).encode() + b"\n"


@settings(max_examples=400, deadline=None)
@given(msg=MSG, n=st.integers(0, 2**40), nonce=st.text(max_size=12), mnonce=st.text(max_size=12))
def test_a_spliced_sealed_line_is_the_old_message_and_both_unsealers_accept_it(msg, n, nonce, mnonce):
    msg = {"t": "ack", **msg}
    new = wire.Sealer("s3cret", nonce, mnonce).seal(n, msg).wire
    old = _old_seal("s3cret", nonce, mnonce, n, msg)
    assert wire.decode_msg(new) == wire.decode_msg(old) == json.loads(old)
    assert len(new) == len(old)
    for line in (new, old):
        assert wire.Unsealer("s3cret", nonce, mnonce).check(wire.decode_msg(line)) is None


@given(st.one_of(st.ip_addresses().map(str), st.text(max_size=20),
                 st.ip_addresses(v=6).map(lambda a: f"{a}%eth0")))  # fmt: skip
def test_peer_host_shortcut_answers_what_ipaddress_did(addr):
    a = str(addr).split("%")[0]
    try:
        ip = ipaddress.ip_address(a)
        want = str(ip.ipv4_mapped) if ip.version == 6 and ip.ipv4_mapped is not None else str(ip)
    except ValueError:
        want = a
    assert wire.peer_host(addr) == want
