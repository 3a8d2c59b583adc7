"""Issue 30, item 5: a waiter costs little while many wait (fsmingle/fs/folderstore_wait.py).

255 ranks waiting on a barrier's done key listed its directory every 10 ms for their first second
(~25,000 listings a second through four FUSE daemons on 2 cores).  A waiter now stats the directory
first and lists it only when the stat changed or ``LIST_EVERY`` passed -- and still wakes at its first
poll after the write on a local disk.  A fake clock makes the count independent of the machine's load;
the directory, its listings and its stats are real.
"""

from __future__ import annotations

import time

from fsmingle.fs.folderstore import FolderKV
from fsmingle.fs.folderstore_wait import CROWD, LIST_EVERY, fast_pause
from fsmingle.fs.store import PosixStore

SET_AT = 0.5  # fake seconds into the wait when another client sets the key


class Counting(PosixStore):
    listings = 0

    def listdir(self, name: str = "") -> list[str]:
        Counting.listings += 1
        return super().listdir(name)


class Clock:
    """Fake monotonic time; the sleep that crosses ``SET_AT`` has another client set the key."""

    def __init__(self, writer: FolderKV):
        self.now, self.writer, self.set_at, self.listed_before = 0.0, writer, None, 0

    def monotonic(self):
        return self.now

    def sleep(self, s):
        self.now += s
        if self.set_at is None and self.now >= SET_AT:
            # Real time passes first: a directory's mtime ticks coarsely (1-10 ms), and the write must
            # not land in the tick of the directory's creation (a stat could not tell them apart).
            time.sleep(0.05)
            self.listed_before = Counting.listings
            self.writer.set("done", b"1")
            self.set_at = self.now


def test_a_waiter_lists_seldom_in_its_fast_phase_and_wakes_at_its_next_poll(tmp_path):
    writer = FolderKV(PosixStore(str(tmp_path)))
    clock = Clock(writer)
    waiter = FolderKV(Counting(str(tmp_path)), clock=clock)
    assert waiter.wait_for(["done"], 30.0, RuntimeError) == [b"1"]
    # Before: one listing per 10-12.5 ms poll, about 45 in the half second.  Now one per LIST_EVERY.
    assert clock.listed_before <= SET_AT / LIST_EVERY + 3, clock.listed_before
    assert clock.now == clock.set_at  # woke at the first poll after the write: no further pause


class CountingLooks(Counting):
    stats = 0

    def dir_signature(self, name: str):
        CountingLooks.stats += 1
        return super().dir_signature(name)


def test_a_waiter_of_a_big_job_looks_less_often_and_still_wakes_at_its_next_poll(tmp_path):
    """Session 6: 255 waiters of a 256-rank barrier each stat-polling every 10 ms took ~2 of the barrier's ~9 CPU
    seconds on 2 cores (benchmarks/bench_folderstore.py, its timeline).  A waiter of a job of ``world_size`` >
    ``CROWD`` looks every ``poll_min * world_size / CROWD``: all of them together look about as often as ``CROWD``
    waiters.  Before: ~45 stats and 6 listings in the half second; now about SET_AT / 0.16."""
    writer = FolderKV(PosixStore(str(tmp_path)))
    clock = Clock(writer)
    Counting.listings = CountingLooks.stats = 0
    waiter = FolderKV(CountingLooks(str(tmp_path)), clock=clock, crowd=256)
    pause = min(waiter.poll_max, waiter.poll_min * 256 / CROWD)
    assert fast_pause(waiter) == pause
    assert fast_pause(FolderKV(PosixStore(str(tmp_path)), crowd=CROWD)) == waiter.poll_min  # 16 ranks: as before
    assert waiter.wait_for(["done"], 30.0, RuntimeError) == [b"1"]
    looks = clock.listed_before + CountingLooks.stats
    assert looks <= SET_AT / pause + 3, (clock.listed_before, CountingLooks.stats)
    assert clock.now == clock.set_at  # woke at the first poll after the write: no further pause
