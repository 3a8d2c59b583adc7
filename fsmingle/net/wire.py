"""The wire format of the direct channel: framing, versions, the handshake's HMAC, long values in parts.

Newline-terminated UTF-8 JSON objects, each at most :data:`MAX_LINE` bytes, with a string type
field ``t``.  Rank 0 challenges every connection with a nonce; a member's hello, ask and ack
carry :func:`auth_mac` over it, keyed by the generation's secret that only the owner-only
endpoint record holds (``docs/protocol.md``, "Threat model").  A value too long for one line
(the member list at release) travels as :func:`encode_parts`.  Pure functions, no sockets:
:mod:`fsmingle.net.channel` does the I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
import zlib

MAX_LINE = 64 * 1024  # a hello or a placement is ~300 bytes; anything larger is hostile


# 3: rank 0 challenges every connection; hello, ask and ack carry an HMAC over the challenge
# keyed by the generation's secret (see "Authentication" below and docs/protocol.md).
WIRE_VERSION = 3


def new_secret() -> str:
    """A generation's channel secret (256 bits, hex)."""
    return secrets.token_hex(32)


def new_nonce() -> str:
    """One connection's challenge (128 bits, hex)."""
    return secrets.token_hex(16)


def auth_mac(secret: str, nonce: str, t, job, gen, inst, rank=None) -> str:
    """The ``mac`` of a hello, ask or ack: HMAC-SHA256 keyed by ``secret`` over the connection's
    ``nonce`` and the fields that say who speaks and what for (hex).  The values are taken as the
    message carries them (any JSON), so a receiver checks exactly what it then acts on."""
    body = json.dumps([WIRE_VERSION, nonce, t, job, gen, inst, rank], separators=(",", ":"), sort_keys=True)
    return hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()


def mac_ok(secret: str, nonce: str, mac, t, job, gen, inst, rank=None) -> bool:
    """True if ``mac`` (as received: any JSON value) is :func:`auth_mac` of these fields; constant time."""
    if not secret or not isinstance(mac, str) or len(mac) != 64 or not mac.isascii():
        return False
    try:
        want = auth_mac(secret, nonce, t, job, gen, inst, rank)
    except (TypeError, ValueError, RecursionError):  # a value json cannot encode (never from the wire)
        return False
    return hmac.compare_digest(want, mac)


def peer_host(addr: str) -> str:
    """A source address as rank 0 counts it: the IP only, IPv4-mapped IPv6 as IPv4, no scope."""
    a = str(addr).split("%")[0]
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return a
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def encode_msg(msg: dict) -> bytes:
    """One wire message: compact JSON plus a newline."""
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


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
