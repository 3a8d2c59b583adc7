"""Master ports outside the kernel's ephemeral range, a fresh one for every listener.

A port the kernel hands out for ``bind(0)`` or an outgoing ``connect()`` comes from
``/proc/sys/net/ipv4/ip_local_port_range`` (32768-60999 by default).  Rank 0 holds its master
port from its claim until exec and torch binds it after a second or more of Python start-up:
a port from that range could, in between, be handed by the kernel to another job's process on
the same host (another fsmingle's ``bind(0)``, any outgoing connection), and torch would fail
with EADDRINUSE.  A port outside the range is never handed out by the kernel; a random one (not
the same every generation) makes two fsmingles on one host choosing at the same time collide
with odds of 1 in the size of the range, and the loser of the bind simply draws again.
"""

from __future__ import annotations

import random

RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 20000  # below: well-known and registered services are more common


def ephemeral_range(path: str = RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (32768, 60999 when it cannot be read)."""
    try:
        with open(path) as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
        return (lo, hi) if 1 <= lo <= hi <= 65535 else (32768, 60999)
    except (OSError, ValueError):
        return 32768, 60999


def outside_ranges(eph: tuple[int, int]) -> list[tuple[int, int]]:
    """Inclusive port ranges at or above :data:`LOWEST` that the kernel never hands out."""
    lo, hi = eph
    out = []
    if lo - 1 >= LOWEST:
        out.append((LOWEST, lo - 1))
    if hi + 1 <= 65535:
        out.append((max(hi + 1, LOWEST), 65535))
    return out


def candidates(n: int = 64, eph: tuple[int, int] | None = None, rng: random.Random | None = None) -> list[int]:
    """Up to ``n`` random distinct ports outside the ephemeral range ([] when there are none:
    then the caller binds port 0, as before)."""
    rng = rng or random.SystemRandom()
    ranges = outside_ranges(eph or ephemeral_range())
    total = sum(b - a + 1 for a, b in ranges)
    if total <= 0:
        return []
    picks: list[int] = []
    for _ in range(min(n, total) * 2):
        k = rng.randrange(total)
        for a, b in ranges:
            if k <= b - a:
                if a + k not in picks:
                    picks.append(a + k)
                break
            k -= b - a + 1
        if len(picks) >= n:
            break
    return picks


def listener(family: int, backlog: int = 128):
    """A listening TCP socket (all interfaces of ``family``, ``SO_REUSEADDR``) on a port outside the
    ephemeral range, for a server that takes a held socket (torch's ``TCPStore(master_listen_fd=)``);
    None when no such port is free (then let the server bind port 0 itself)."""
    import errno
    import socket

    for cand in candidates():
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind(("::" if family == socket.AF_INET6 else "", cand))
            s.listen(backlog)
            return s
        except OSError as e:
            s.close()
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                return None
    return None
