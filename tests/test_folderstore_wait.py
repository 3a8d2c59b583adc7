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
from fsmingle.fs.folderstore_wait import LIST_EVERY
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
