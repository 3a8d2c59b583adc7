"""Time in the protocol: the :class:`Timing` settings (seconds) and the clock the driver runs on.

Tests pass a fake :class:`Clock`; everything else uses :class:`SystemClock`.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass
from typing import Protocol

from ..errors import ConfigError


@dataclass(frozen=True)
class Timing:
    """Polling and liveness settings, all in seconds.

    Attributes:
        poll_min (float): first delay between filesystem polls after a change.
        poll_max (float): steady-state delay between filesystem polls (members
            looking for rank 0's endpoint, participants outside a world).
        backoff (float): factor from one delay to the next (> 1).
        jitter (float): each delay is scaled by a random factor in ``1 ± jitter``.
        stale_after (float): a peer silent this long is dead -- on its
            connection, or (not connected) by its heartbeat counter on the
            observer's monotonic clock.  Must exceed the mount's attribute-cache
            timeout (NFS ``actimeo``) several times over.
        heartbeat (float | None): beacon heartbeat period; default ``stale_after / 3``.
        scan_interval (float): how often rank 0 lists its generation directory.
        status_interval (float): how often rank 0 tells members who is missing.
        probe_timeout (float): seconds to connect to rank 0; a member has
            ``max(probe_timeout, stale_after / 6)`` seconds to acknowledge the
            release (three times that with ``--check-mesh``).

    Raises:
        ConfigError: a value is not positive, ``poll_max < poll_min``, the
            heartbeat is not below ``stale_after``, or ``poll_max`` is not well
            below ``stale_after`` (at most a quarter: a slower poll cannot notice
            a heartbeat before the peer is judged dead).
    """

    poll_min: float = 0.01
    poll_max: float = 0.28
    backoff: float = 1.6
    jitter: float = 0.1
    stale_after: float = 30.0
    heartbeat: float | None = None
    scan_interval: float = 1.0
    status_interval: float = 10.0
    probe_timeout: float = 2.0

    def __post_init__(self):
        for name in ("poll_min", "poll_max", "stale_after", "scan_interval", "status_interval", "probe_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"{name.replace('_', '-')} must be a positive number of seconds, got {getattr(self, name)}"
                )
        if self.poll_max < self.poll_min:
            raise ConfigError("--poll-max must be at least poll_min")
        if self.poll_max > self.stale_after / 4:
            raise ConfigError(
                f"--poll-max {self.poll_max:g} s must be at most a quarter of --stale-after {self.stale_after:g} s: "
                "a peer must be seen heartbeating several times before it could be judged dead; "
                "lower --poll-max or raise --stale-after"
            )
        if self.heartbeat is not None and not 0 < self.heartbeat < self.stale_after:
            raise ConfigError("heartbeat must be positive and below stale_after")

    @property
    def heartbeat_period(self) -> float:
        return self.heartbeat if self.heartbeat is not None else self.stale_after / 3

    @property
    def ping_interval(self) -> float:
        """Seconds of quiet after which either end of a connection pings (worlds up to
        :data:`PINGS_PER_S` members; :meth:`ping_interval_for` in bigger ones)."""
        return min(1.0, self.stale_after / 10)

    def ping_interval_for(self, size: int) -> float:
        """Seconds of quiet after which either end of a connection pings, in a world of ``size``.

        Rank 0 holds one connection per member, and each costs it a ping sent and one received
        per interval: ``size / PINGS_PER_S`` s past :data:`PINGS_PER_S` members keeps that at
        about PINGS_PER_S a second each way (issue 31: 1.1-1.8 CPU-seconds a second at 32,768
        with 1 s), up to ``stale_after / 5`` (6 s, reached at 3,000 members by default): a ping
        still leaves within 1.25 intervals, well inside the ``stale_after / 2`` at which rank 0
        starts to look at a member's silence and the ``stale_after`` that judges either end.
        """
        return max(self.ping_interval, min(size / PINGS_PER_S, self.stale_after / 5))

    def status_gap(self, size: int) -> float:
        """Seconds between two of rank 0's ``status`` pushes while who is missing changes.

        A push is one sealed message per member: 1 s up to :data:`STATUS_PER_S` members, then
        ``size / STATUS_PER_S`` s (4.1 s at 2,048, 16.4 s at 8,192), so rank 0 seals about
        STATUS_PER_S of them a second whatever the size.  Status is for people (progress lines, timeout messages) and
        for a waiting spare's count; the one decision a member makes on it (holding ``--timeout``
        for pending peer jobs) rank 0 pushes at once (``rank0/queueing.py``).
        """
        return max(1.0, size / STATUS_PER_S)

    def status_period(self, size: int) -> float:
        """Seconds between two ``status`` pushes when nothing changed: ``status_interval``, and
        at least :meth:`status_gap` past :data:`STATUS_PER_S` members."""
        return max(self.status_interval, self.status_gap(size)) if size > STATUS_PER_S else self.status_interval


#: Members past which the ping interval grows with the world (:meth:`Timing.ping_interval_for`).
PINGS_PER_S = 500
#: Members past which the status gap grows with the world (:meth:`Timing.status_gap`).
STATUS_PER_S = 500


class Clock(Protocol):
    """Time source; tests pass a fake one."""

    def monotonic(self) -> float: ...
    def time(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock (``time.monotonic``, ``time.time``, ``time.sleep``)."""

    monotonic = staticmethod(_time.monotonic)
    time = staticmethod(_time.time)
    sleep = staticmethod(_time.sleep)
