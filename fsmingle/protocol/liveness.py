"""Judging whether a participant that is *not* connected to us is alive, from what the filesystem shows.

Used only where the direct channel cannot answer: rank 0 judging a claimer
that never connected, a member judging a rank 0 it cannot reach yet, a
contester judging the holder of the rank it asked for.  Connected peers are
judged by their connection (see :mod:`fsmingle.net.channel`).

Rules (nfs(5); ``docs/protocol.md``):

* Same pid space (boot id and pid namespace equal): ask the kernel (psutil)
  directly -- the only evidence that is never stale.
* Elsewhere: watch the beacon's heartbeat *counter* change on the observer's
  own monotonic clock.  File times are never compared with the local clock:
  clocks of nodes and the file server disagree, and mtimes are coarse.
* A beacon that cannot be read is not evidence either way; only after it has
  been unreadable for ``stale_after`` seconds does its holder count as dead.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from ..fs.records import Beacon, HostId


class Verdict(enum.Enum):
    ALIVE = "alive"  # positive evidence: the counter moved, or the kernel says so
    DEAD = "dead"  # positive evidence of death: the process is gone, or silent for stale_after
    UNKNOWN = "unknown"  # not enough observation yet


@dataclass
class _Seen:
    counter: int
    changed_at: float
    missing_since: float | None = None
    looked_at: float = 0.0  # when the observer last read this beacon


class Judge:
    """Heartbeat watcher of one observer in one generation.

    Args:
        me (HostId): the observer's identity (for same-host checks).
        stale_after (float): seconds without a counter change that make a holder dead.
        local_alive (Callable[[HostId, HostId], bool | None]): see
            :func:`fsmingle.net.hostinfo.local_process_alive`.
        restart_count (int), slurm_job_id (str): a beacon of the same Slurm job
            with a smaller ``SLURM_RESTART_COUNT`` belongs to a requeued-away run.
    """

    def __init__(
        self,
        me: HostId,
        stale_after: float,
        local_alive: Callable[[HostId, HostId], bool | None],
        restart_count: int = 0,
        slurm_job_id: str = "",
    ):
        self.me, self.stale_after, self.local_alive = me, stale_after, local_alive
        self.restart_count, self.slurm_job_id = restart_count, slurm_job_id
        self.seen: dict[str, _Seen] = {}

    def judge(self, key: str, beacon: Beacon | None, now: float) -> Verdict:
        """Verdict on the holder tracked as ``key`` given its beacon as read just now (None: unreadable/absent).

        Args:
            key (str): the holder's instance id (or a stand-in for an unreadable claim).
            beacon (Beacon | None): what was read.
            now (float): the observer's monotonic seconds.
        """
        s = self.seen.get(key)
        if beacon is None:
            if s is None:
                s = self.seen[key] = _Seen(-1, now, now)
            if s.missing_since is None:
                s.missing_since = now
            return Verdict.DEAD if now - s.missing_since >= self.stale_after else Verdict.UNKNOWN
        if beacon.restart_count < self.restart_count and beacon.slurm_job_id == self.slurm_job_id:
            return Verdict.DEAD  # a beacon of the run Slurm requeued away (same job, earlier incarnation)
        direct = self.local_alive(self.me, beacon.host)
        if s is None:
            s = self.seen[key] = _Seen(beacon.heartbeat, now, looked_at=now)
        s.missing_since = None
        changed = False
        if beacon.heartbeat != s.counter:
            # A change proves life only within the last stale_after: after a long gap
            # between two looks (the observer stalled, or its reads kept failing) the
            # holder may have beaten once and died since.  Appearing after being
            # unreadable is not a heartbeat either.  Otherwise: a new window starts.
            changed = s.counter != -1 and now - s.looked_at < self.stale_after
            s.counter, s.changed_at = beacon.heartbeat, now
        s.looked_at = now
        if direct is not None:
            return Verdict.ALIVE if direct else Verdict.DEAD
        if now - s.changed_at >= self.stale_after:
            return Verdict.DEAD
        return Verdict.ALIVE if changed else Verdict.UNKNOWN
