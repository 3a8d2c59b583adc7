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
        """Seconds of quiet after which either end of a connection pings."""
        return min(1.0, self.stale_after / 10)


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
