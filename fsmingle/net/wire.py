"""The wire format of the direct channel: framing, versions, the handshake's HMAC, long values in parts.

Newline-terminated UTF-8 JSON objects, each at most :data:`MAX_LINE` bytes, with a string type
field ``t``.  Authentication is mutual, keyed by the generation's secret that only the
owner-only endpoint record holds (``docs/protocol.md``, "Threat model"): rank 0 challenges every
connection with a nonce, and a member's hello, ask and ack carry :func:`auth_mac` over it and
the member's own nonce; every message rank 0 sends after the challenge is sealed
(:func:`seal`) over both nonces and a per-connection counter, which the member checks
(:class:`Unsealer`).  A value too long for one line
(the member list at release) travels as :func:`encode_parts`.  Pure functions, no sockets:
:mod:`fsmingle.net.channel` does the I/O.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import ipaddress
import json
import secrets
import zlib

# json.dumps(x, separators=(",", ":")[, sort_keys=True]), without the encoder json.dumps makes
# per call for non-default arguments (2 us of rank 0's CPU per message; the output is the same).
_compact = json.JSONEncoder(separators=(",", ":")).encode
_canonical = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode

MAX_LINE = 64 * 1024  # a hello or a placement is ~300 bytes; anything larger is hostile


# 3: rank 0 challenges every connection; hello, ask and ack carry an HMAC over the challenge
# keyed by the generation's secret (docs/protocol.md, "Threat model").
# 4: mutual: the challenge says the version (``v``), hello and ask carry the member's own nonce
# (``mnonce``, under their mac), and everything rank 0 sends after the challenge carries a
# ``mac`` over both nonces and a counter ``seq`` (seal).  A v3 member meets a v4 rank 0's fatal
# reject naming both versions; a v4 member reads a v3 rank 0's version in its endpoint record.
WIRE_VERSION = 4


def new_secret() -> str:
    """A generation's channel secret (256 bits, hex)."""
    return secrets.token_hex(32)


def new_nonce() -> str:
    """One connection's challenge (128 bits, hex)."""
    return secrets.token_hex(16)


def auth_mac(secret: str, nonce: str, t, job, gen, inst, rank=None, mnonce="") -> str:
    """The ``mac`` of a hello, ask or ack: HMAC-SHA256 keyed by ``secret`` over the connection's
    ``nonce`` (rank 0's challenge), the member's own ``mnonce`` and the fields that say who
    speaks and what for (hex).  The values are taken as the message carries them (any JSON), so
    a receiver checks exactly what it then acts on."""
    body = _canonical([WIRE_VERSION, nonce, t, job, gen, inst, rank, mnonce])
    h = _keyed(secret).copy()  # the key schedule once per secret (_keyed): rank 0 checks N of these
    h.update(body.encode())
    return h.hexdigest()


def mac_ok(secret: str, nonce: str, mac, t, job, gen, inst, rank=None, mnonce="") -> bool:
    """True if ``mac`` (as received: any JSON value) is :func:`auth_mac` of these fields; constant time."""
    if not secret or not _is_mac(mac):
        return False
    try:
        want = auth_mac(secret, nonce, t, job, gen, inst, rank, mnonce)
    except (TypeError, ValueError, RecursionError):  # a value json cannot encode (never from the wire)
        return False
    return hmac.compare_digest(want, mac)


def _is_mac(mac) -> bool:
    return isinstance(mac, str) and len(mac) == 64 and mac.isascii()


def nonce_ok(nonce) -> bool:
    """A nonce as a peer may send it: a non-empty string of at most 256 characters."""
    return isinstance(nonce, str) and 0 < len(nonce) <= 256


# ---------------------------------------------------------------- rank 0's seal (wire 4)
# What rank 0 sends on an authenticated connection is bound to (1) the secret: only rank 0 and
# the job's own processes can make it; (2) the member's nonce, fresh and random per connection:
# nothing recorded on another connection -- to another member, or to this one before -- verifies
# here, even if whoever holds rank 0's port replays rank 0's challenge nonce too; (3) the counter
# ``seq``, strictly increasing per connection: nothing is replayed or reordered within it.  A gap
# is allowed (a send interrupted before it left): it is a message the member never got, as after
# a reset.  The body is the message as JSON with sorted keys, so the member recomputes it from
# the dict it decoded: rank 0's messages hold only JSON values with string keys.


@functools.lru_cache(maxsize=8)
def _keyed(secret: str):
    # HMAC's key schedule once per secret, not per message: rank 0 seals N messages per status.
    return hmac.new(secret.encode(), digestmod=hashlib.sha256)


def canonical(msg: dict) -> bytes:
    """The bytes a seal covers: ``msg`` (without ``seq`` and ``mac``) as JSON with sorted keys."""
    return _canonical(msg).encode()


class SealedMsg(dict):
    """A message as rank 0 sends it sealed: the dict (``seq`` and ``mac`` included: what the model
    tests' fake network and the benchmarks read) and, in :attr:`wire`, its wire line made once
    (:meth:`Sealer.seal`), so the channel sends it without encoding it again."""

    __slots__ = ("wire",)


class Sealer:
    """The seal of one connection (see :func:`seal`): the HMAC state over the secret and both
    nonces is made once per connection, so a message costs one copy of it and the message's bytes.

    Args:
        secret (str): the generation's secret.
        nonce (str): rank 0's challenge on this connection.
        mnonce (str): the member's own nonce on this connection.
    """

    __slots__ = ("_h",)

    def __init__(self, secret: str, nonce: str, mnonce: str):
        # The MAC covers json.dumps([WIRE_VERSION, "rank0", nonce, mnonce, n]) + "\n" + body: all
        # but the counter and what follows it is the same for every message on the connection.
        head = json.dumps([WIRE_VERSION, "rank0", nonce, mnonce], separators=(",", ":"))
        self._h = _keyed(secret).copy()
        self._h.update(head[:-1].encode() + b",")

    def mac(self, n: int, body: bytes) -> str:
        """The ``mac`` of the message with counter ``n`` whose :func:`canonical` bytes are ``body``."""
        h = self._h.copy()
        h.update(b"%d]\n" % n + body)
        return h.hexdigest()

    def seal(self, n: int, msg: dict, body: bytes | None = None) -> SealedMsg:
        """``msg`` sealed with counter ``n`` (see :func:`seal`), its wire line in ``.wire``.

        Raises:
            ValueError: ``msg`` has a ``seq`` or ``mac`` field of its own (a programming error)."""
        if "seq" in msg or "mac" in msg:
            raise ValueError(f"a {msg.get('t')!r} message may not use the fields seal adds (seq, mac)")
        if body is None:
            body = canonical(msg)
        mac = self.mac(n, body)
        out = SealedMsg(msg, seq=n, mac=mac)
        # The line is the signed body with the two fields spliced in before its closing brace: the
        # member decodes a JSON object (key order is nobody's business) and re-encodes the rest.
        out.wire = b'%s%s"mac":"%s","seq":%d}\n' % (body[:-1], b"," if len(body) > 2 else b"", mac.encode(), n)
        return out


def seal(secret: str, nonce: str, mnonce: str, n: int, msg: dict, body: bytes | None = None) -> dict:
    """``msg`` as rank 0 sends it on an authenticated connection: a copy with ``seq`` (``n``, this
    connection's counter) and ``mac``, HMAC-SHA256 keyed by ``secret`` over the challenge
    ``nonce``, the member's ``mnonce``, ``n`` and the message.  ``msg`` itself is not changed (a
    broadcast shares one dict among connections).  ``body``: :func:`canonical` of ``msg`` if the
    caller has it already (a broadcast encodes it once for every connection).  Rank 0 keeps one
    :class:`Sealer` per connection instead (the same bytes, the HMAC prefix made once).

    Raises:
        ValueError: ``msg`` has a ``seq`` or ``mac`` field of its own (a programming error)."""
    return Sealer(secret, nonce, mnonce).seal(n, msg, body)


class Unsealer:
    """A member's check of what rank 0 sends on one connection (see :func:`seal`).

    Args:
        secret (str): the generation's secret, from rank 0's endpoint record.
        nonce (str): rank 0's challenge on this connection.
        mnonce (str): this member's own nonce on this connection.
    """

    def __init__(self, secret: str, nonce: str, mnonce: str):
        self.secret, self.nonce, self.mnonce = secret, nonce, mnonce
        self.sealer = Sealer(secret, nonce, mnonce)
        self.last = -1  # the counter of the last message accepted

    def check(self, m: dict) -> str | None:
        """None if ``m`` (a decoded message) carries a valid ``mac`` and a counter above every one
        accepted before on this connection (it is then accepted); else why not, for a log line."""
        mac, n = m.get("mac"), m.get("seq")
        if not _is_mac(mac):
            return f"a {str(m.get('t'))[:16]!r} without a mac"
        if type(n) is not int or n <= self.last:
            return f"a {str(m.get('t'))[:16]!r} out of order or replayed (seq {str(n)[:24]}, after {self.last})"
        try:
            want = self.sealer.mac(n, canonical({k: v for k, v in m.items() if k not in ("seq", "mac")}))
        except (TypeError, ValueError, RecursionError):  # NaN is fine; only an unencodable value
            return f"a {str(m.get('t'))[:16]!r} that cannot be checked"
        if not hmac.compare_digest(want, mac):
            return f"a {str(m.get('t'))[:16]!r} with a wrong mac"
        self.last = n
        return None


def peer_host(addr: str) -> str:
    """A source address as rank 0 counts it: the IP only, IPv4-mapped IPv6 as IPv4, no scope."""
    a = str(addr).split("%")[0]
    if ":" not in a:
        # Not IPv6: an IPv4 address parses only in the form it is printed in (four decimal
        # octets, no leading zeros), so ip_address() would hand it back unchanged -- and a
        # name (a fake network's host) unchanged too.  Skipped: rank 0 calls this per accept.
        return a
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return a
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def encode_msg(msg: dict) -> bytes:
    """One wire message: compact JSON plus a newline."""
    return _compact(msg).encode() + b"\n"


def decode_msg(line: bytes) -> dict | None:
    """Parse one line; None if it is not a JSON object with a string ``t`` (a foreign or broken peer)."""
    try:
        d = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: "[[[[..." from anyone
        return None
    if not isinstance(d, dict) or not isinstance(d.get("t"), str):
        return None
    return d


PART_BYTES = 32 * 1024  # the payload of one part of a long value (encode_parts): half of MAX_LINE


def encode_parts(value) -> list[str]:
    """A JSON value too long for one wire line, as parts of at most :data:`PART_BYTES` characters.

    The value is compact JSON, zlib-compressed once (a member list of 5,000 hosts named alike
    shrinks about tenfold) and base64-encoded, then cut: the same parts go to every member that
    asked, so rank 0 encodes once whatever N is.

    Returns:
        list[str]: one or more parts; :func:`decode_parts` joins them back.
    """
    blob = base64.b64encode(zlib.compress(json.dumps(value, separators=(",", ":")).encode(), 6)).decode()
    return [blob[i : i + PART_BYTES] for i in range(0, len(blob), PART_BYTES)] or [""]


def decode_parts(parts: list, max_bytes: int):
    """Join :func:`encode_parts`'s parts back into the value.

    Args:
        parts (list): the parts in order (each a ``str``).
        max_bytes (int): the most bytes the JSON may take once decompressed; more is refused, so
            a hostile peer cannot make a member inflate gigabytes from a few kilobytes.

    Returns:
        The decoded JSON value, or None if the parts are not a valid encoding within ``max_bytes``.
    """
    if not all(isinstance(x, str) for x in parts):
        return None
    try:
        z = zlib.decompressobj()
        raw = z.decompress(base64.b64decode("".join(parts), validate=True), max_bytes + 1)
        if len(raw) > max_bytes or not z.eof:
            return None
        return json.loads(raw.decode("utf-8"))
    except (ValueError, zlib.error, UnicodeDecodeError):
        return None
