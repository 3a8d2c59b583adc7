"""Writing one version of a FolderStore key: the ``link()`` whose answer decides (ours, another's, or the epoch gone),
and where the log went when the epoch is gone.  Functions of a :class:`.folderstore.FolderKV` (``kv``), as
:mod:`.folderstore_add` is; the argument: ``docs/folderstore.md``, "Compaction without ABA" and "Where the log went,
and a counter's first seal"."""

from __future__ import annotations

import errno

from ..errors import CorruptStateError, StorageError
from .folderstore_add import settled_in_trash
from .folderstore_log import _UNKNOWN_EFFECT, Op, State, Version, epoch_number, version_name


def link_version(kv, d: str, n: int, new: Version, key: str, op: Op) -> Version | None:
    """``FolderKV._link``: create version ``n`` of epoch ``d`` as ``new``: returns ``new`` if ours, the winner's
    version if another's, None if the epoch directory is gone.  Whose is told by the token: a lost reply
    (EEXIST after success) and an I/O error after the effect are read back, never failed."""
    name, data = f"{d}/{version_name(n)}", new.encode()
    pause, since, unknown = kv.poll_min, kv.clock.monotonic(), False
    while True:
        try:
            made = kv._create(name, data)
        except FileNotFoundError:  # gone: after an EIO ours may be in it, retired since (the trash tells)
            return settled_in_trash(kv, d, n, new, key, op) if unknown else None
        except StorageError as e:
            if e.errno not in (errno.EIO, errno.ETIMEDOUT, errno.EAGAIN):
                raise
            # The effect is unknown (a soft mount's timeout, a reply lost for good): create it
            # again with the same token -- EEXIST then reads back whose it is.
            kv._nap(op, pause, f"creating {kv.store.path(name)} keeps failing: {e} ({_UNKNOWN_EFFECT})")
            pause, unknown = min(pause * 2, kv.poll_max), True
            continue
        if made:
            return new
        # EEXIST: version n exists -- ours (a lost reply) or another's.  Until a read-back tells, a later
        # ENOENT (the epoch retired while we paused) must ask the trash, never answer "gone, nothing of
        # ours": that add would be written again, counted twice (nradv's finding 5).
        unknown = True
        try:
            won = kv._read(d, n, key)
        except StorageError as e:  # EIO on the read-back: whose version n is, is read again (nradv's finding 4)
            kv._nap(op, pause, f"reading {kv.store.path(name)} back keeps failing: {e} ({_UNKNOWN_EFFECT})")
            pause = min(pause * 2, kv.poll_max)
            continue  # create again: EEXIST, then the read-back (ours or another's, never unknown for good)
        if won is not None:
            return new if won.token == new.token else won
        # The server said it exists but this client cannot read it: a lying lookup (list, read
        # again after a pause) -- or the epoch was retired since (then the probe says so).
        kv._unreadable(op, name, since, pause, unknown=True)
        pause = min(pause * 2, kv.poll_max)
        if not kv._probe(d):  # retired since: its files wait in the trash (retire_grace) -- ours among them?
            return settled_in_trash(kv, d, n, new, key, op)


def moved_on(kv, key: str, kd: str, st: State, op: Op, gone: float, lie_limit: float) -> tuple[State, bool, float]:
    """Where the log of ``key`` stands after a write found the directory of ``st.ep`` gone: ``(state, fresh,
    gone)``, ``gone`` the time since which ``st.ep`` has been missing (0.0 once the log is found past it).

    First a full listing of the key, not fresh: an epoch numbered above the gone one that it shows is where the
    log went (an epoch is retired only after its successor holds a version: "Compaction without ABA"), and the
    next ``link()`` judges, as after a lost race -- a state older than the newest costs a lost race or a gone
    epoch more, never a wrong write.  That saves the nap, the two ``mkdir`` and the probes below, 1.5 times a
    contended add (session 14's profile).  Else (a listing that lags, the epoch's lookup lying, the store
    removed): nap ``poll_min``, make the key directory again -- a store removed under us raises at once -- and
    resolve fresh (every epoch probed: a lagging listing shows the new one).

    Raises:
        CorruptStateError: the store was removed while in use, or ``st.ep`` stayed missing for ``lie_limit``
            seconds (``LIE_LIMIT``).
        the timeout error: the deadline passed (checked first: the log may move on under every try, and this
            path has no pause to end at the deadline; nothing of ours took effect in the gone epoch)."""
    if op.deadline is not None and kv.clock.monotonic() >= op.deadline:
        raise kv.timeout_error(
            f"Timeout after {op.secs:g} s {op.what}: {kv.store.path(kd)}/{st.ep} is gone"
            " (the log kept moving on under this write; it took no effect)"
        )
    now, _ = kv._try_resolve(key, kd, fresh=False, full=True)
    if now is not None and epoch_number(now.ep) > epoch_number(st.ep):
        return now, False, 0.0
    gone = gone or kv.clock.monotonic()
    if kv.clock.monotonic() - gone > lie_limit:
        raise CorruptStateError(f"{kv.store.path(kd)}/{st.ep} has been missing for {lie_limit:g} s")
    kv._nap(op, kv.poll_min, f"{kv.store.path(kd)}/{st.ep} is missing (or its lookup lies)")
    kv._keydir(key, again=True)
    now = kv._resolve(key, kd, op, fresh=True)
    return now, True, 0.0 if epoch_number(now.ep) > epoch_number(st.ep) else gone
