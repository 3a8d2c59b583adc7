"""FolderStore's ``wait``: block until keys exist, cheaply while many ranks wait (:class:`.folderstore.FolderKV`).

A waiter polls every ``poll_min`` (10 ms) for its first ``FAST_FOR`` second, then backs off to ``poll_max``;
a waiter of a job of more than ``CROWD`` processes polls every ``poll_min * world_size / CROWD`` (at most ``poll_max``)
in that first second (:func:`fast_pause`): the looks of all its waiters together stay near those of ``CROWD``.
At 256 ranks, 255 finished ranks waiting on a barrier's done key made ~25,000 listings a second through the
mounts' FUSE daemons, competing with the last adders (docs/folderstore.md, "Session 4").  So, in the fast phase
of a job of fewer than ``LIST_EVERY * CROWD / poll_min`` = 0.1 * 16 / 0.010 = 160 processes (at the default
``POLL_MIN``), a poll first stats the directory its last listing read (``Store.dir_signature``: ``statx`` with
``AT_STATX_FORCE_SYNC``, past the attribute cache): a listing is skipped while the directory's identity, mtime,
ctime, link count and size are what they were just *before* that listing -- a version made since is a new entry, which changes the
directory's mtime and ctime.  Whatever the stat says, a key is listed at least every ``LIST_EVERY`` seconds: two
changes in one timestamp tick (coarse, 1-10 ms on Linux) read alike, and where ``statx`` is missing a plain
``stat`` may answer from a cache (bindfs ``attr_timeout``, NFS ``acdirmin``); so the stat only ever *delays* a
listing, by at most ``LIST_EVERY``; it never decides an answer (a key is found only by a listing and a fresh read).
A waiter of a job of 160 processes or more pauses ``poll_min * world_size / CROWD`` >= ``LIST_EVERY`` between
polls (:func:`fast_pause`), as a backed-off wait does: its every poll lists, without a stat (``LIST_EVERY`` has
passed at each, so a stat could skip no listing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .folderstore_log import EPOCH0, key_dir

FAST_FOR = 1.0  # seconds a wait polls every poll_min before backing off (a barrier's wake in milliseconds)
CROWD = 16  # waiters that each poll every poll_min at first; a bigger job's waiters share their rate (fast_pause)
LIST_EVERY = 0.1  # seconds: in the fast phase a key whose directory's stat is unchanged is listed this often


def _dir_sig(kv, key: str) -> object | None:
    """What a ``stat`` shows of the directory a plain look of ``key`` lists (None: unknown, list it)."""
    kd = key_dir(key)
    ep = kv._seen.get(kd, (0, "", 0))[1] or EPOCH0  # as _try_resolve's quick look
    # A stat of the directory, not a lookup of the version we wait for: a name looked up before it
    # exists can stay "missing" in a negative dentry cache (docs/folderstore.md).
    return kv.store.dir_signature(f"{kd}/{ep}")


def fast_pause(kv) -> float:
    """Seconds between the looks of a young wait: ``poll_min`` for a job of at most ``CROWD`` processes, else
    ``poll_min * crowd / CROWD`` (at most ``poll_max``).  Measured at 256 ranks on four 2 s-cached bindfs mounts
    (docs/folderstore.md, "Session 6"): 255 barrier waiters polling every 10 ms took ~2 of the barrier's ~9 CPU
    seconds on 2 cores -- from the last adders.  Only *when* a wait looks changes: what it answers is a fresh read,
    as before, and every pause ends at the deadline (``_nap``)."""
    return min(kv.poll_max, kv.poll_min * max(1.0, kv.crowd / CROWD))


def wait_for(kv, keys: Iterable[str], timeout: float | None, on_timeout: Callable[[list[str]], Exception]):
    """Block until every key exists; returns their values in order (each read linearizably).

    Args:
        kv (FolderKV): the store.
        keys: the keys (each at most ``MAX_KEY`` bytes).
        timeout (float | None): seconds; None or 0 waits forever (torch's kNoTimeout).
        on_timeout: builds the exception to raise from the keys still missing.

    Raises:
        ValueError: a key too long (refused, not waited for).
        the exception ``on_timeout`` builds: a key still missing at the deadline.
        the store's timeout error: a listed version stayed unreadable until the deadline.
    """
    keys = list(keys)
    for k in keys:
        key_dir(k)  # a key too long is refused, not waited for
    found: dict[int, bytes] = {}
    op = kv._op(f"waiting for {keys[:8]}", timeout)
    t0 = kv.clock.monotonic()
    pause = fast_pause(kv)
    sigs: dict[int, tuple[tuple | None, float]] = {}  # key -> (its directory's stat before its last listing, when)
    while True:
        now = kv.clock.monotonic()
        for i, k in enumerate(keys):
            if i in found:
                continue
            sig = _dir_sig(kv, k) if pause < LIST_EVERY else None  # backed off: every poll lists anyway
            last = sigs.get(i)
            if sig is not None and last is not None and last[0] == sig and now - last[1] < LIST_EVERY:
                continue  # nothing new in the directory since its last listing (see above): no listing now
            sigs[i] = (sig, now)
            # A cheap look (the cached listing) first; a value it shows is confirmed by a fresh,
            # linearizable read (a get must not return a value deleted before it began).
            if kv.try_get(k, fresh=False, op=op) is not None:
                v = kv.try_get(k, fresh=True, op=op)
                if v is not None:
                    found[i] = v
        if len(found) == len(keys):
            return [found[i] for i in range(len(keys))]
        now = kv.clock.monotonic()
        if op.deadline is not None and now >= op.deadline:
            raise on_timeout([k for i, k in enumerate(keys) if i not in found])
        # Jitter (+0..25 %, never below poll_min): ranks that wait together must not poll in lockstep.
        kv._nap(op, pause * (1 + kv.rng.random() / 4), "")
        if now - t0 >= FAST_FOR:
            pause = min(pause * 2, kv.poll_max)
