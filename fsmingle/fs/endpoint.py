"""A record's endpoint fields: the literal IP address and the TCP port that beacons, releases and the
torchrun store's address carry (:mod:`fsmingle.fs.records` re-exports both)."""

from __future__ import annotations

import ipaddress
from typing import Any

from ..errors import RecordError


def validate_addr(addr: str) -> str:
    """Return ``addr`` normalised if it is a literal IPv4/IPv6 address.

    Args:
        addr (str): e.g. ``"10.1.2.3"`` or ``"fe80::1"``.

    Returns:
        str: the canonical text form.

    Raises:
        RecordError: if it is not an IP literal.  Hostnames are refused on
            purpose: pods and compute nodes often cannot resolve each other.
    """
    try:
        return str(ipaddress.ip_address(str(addr).split("%")[0]))
    except ValueError:
        raise RecordError(f"{addr!r} is not an IP address (hostnames are not accepted)") from None


def validate_port(port: Any, *, allow_zero: bool = False) -> int:
    """Return ``port`` if it is an int in 1..65535 (0 too if ``allow_zero``).

    Raises:
        RecordError: otherwise.
    """
    if isinstance(port, bool) or not isinstance(port, int):
        raise RecordError(f"port {port!r} is not an integer")
    low = 0 if allow_zero else 1
    if not low <= port <= 65535:
        raise RecordError(f"port {port} is outside {low}..65535")
    return port
