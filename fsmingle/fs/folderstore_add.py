"""FolderStore's ``add`` without a read-modify-write: a *delta* version in the first free slot of an epoch.

A contended ``add`` (torch's store-based barrier: N ranks add 1 to one counter) used to read version
k, link version k+1, and on a lost race list and read the winner's version before trying again: about
16 lost races and 159 metadata calls per add at 256 ranks on cached mounts (issue 30).  Here an
``add`` writes its version once, as ``("add", amount)``, and links it under version names n+1, n+2,
... of the current epoch until one ``link()`` succeeds: a loss (EEXIST) costs the ``link()``, one
``stat`` of our own file (a retransmitted ``LINK`` that succeeded), and after the 1st, 2nd, 4th, ...
loss a listing of the epoch (to jump past the versions made meanwhile); no read.

The value of a delta at version m is the value at m-1 plus its amount (missing or a tombstone: 0); a
delta onto a value that is not an integer leaves it unchanged (every reader agrees: the versions
are immutable) and its ``add`` raises ``ValueError``.  What stays a full version (the classic
read-modify-write of :meth:`FolderKV._update`): epoch 0's versions, version 1 of every epoch and
every seal -- so a walk back from a delta ends inside its epoch, at most its capacity (32; a contended
counter's up to 128, named in the epoch: ``_seal_now``) versions down,
and readers cache the values they computed (versions are immutable; epoch names never reused).
The argument: ``docs/folderstore.md``, "Adds without a read-modify-write".
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import secrets

from ..errors import CorruptStateError, StorageError
from .folderstore_log import (
    _UNKNOWN_EFFECT,
    EPOCH0,
    HINT_RE,
    VERSION_RE,
    Op,
    State,
    Version,
    hint_name,
    version_name,
)
from .folderstore_wait import fast_pause
from .lookup import link_count
from .store import UNTRUSTED, _tmp_name, _unlink_quiet, storage_error

_RETRY = (errno.EIO, errno.ETIMEDOUT, errno.EAGAIN)  # effect unknown: link again, EEXIST tells (nlink)
SEAL_WAIT = 4  # polls (POLL_MIN each, jittered) an adder that finds an epoch full waits for its last delta's seal
SEAL_GROW = 4  # a contended counter's epochs grow, doubling, up to SEAL_GROW x seal_at (128 versions)


class Moved(enum.Enum):
    """What :func:`delta_add` answers when its epoch directory is gone: the caller finds where the log went
    (``folderstore_link.moved_on``) without a read-modify-write into the same gone epoch (session 15)."""

    EPOCH_GONE = "epoch gone"


CACHE = 4096  # computed values and hints of delta versions kept per process (each dropped whole when full, hints
# with the names harvest marked seen)
# An integer add sees has fewer digits than this: under Python's default int_max_str_digits (4300), so str() of a
# sum never raises in a reader's walk back, and the same bound in every process whatever its own limit.
_BOUND = 10**4000


def _plain_read(kv, d, n, key):
    return kv._read(d, n, key)


def as_int(value: bytes | None) -> int | None:
    """The integer ``add`` sees in ``value`` (missing: 0); None if it is not one."""
    if value is None:
        return 0
    if len(value) > 4100:  # past the bound for certain (int() itself may refuse it: the process's digit limit)
        return None
    try:
        x = int(value)
    except ValueError:
        return None
    return x if abs(x) < _BOUND else None


def read_retired(kv, d: str, n: int, key: str | None) -> Version | None:
    """Version ``n`` of epoch ``d`` after ``d`` was retired: from the store's trash, where its files are kept
    ``retire_grace`` seconds (``Store.retire``); None if not there (deleted, or never written).  For a writer
    that must know a version of an epoch that moved on under it: its own lost reply, the base of its delta."""
    name = f"{d}/{version_name(n)}"
    data = kv.store.read_retired(name)
    if data is None or data == UNTRUSTED:
        return None
    v = Version.decode(data, kv.store.path(name))
    return v if key is None or v.key == key else None


def fresh_lookup(kv, what: str) -> bool:
    """For ``FolderKV._unreadable``: True if version ``what`` (listed, or a ``link()`` there said EEXIST: it exists)
    was just looked up afresh -- a negative dentry of this mount turned positive (``Store.refresh``; a contended
    adder's ``link()`` leaves one in each slot it lost): read it again now, no pause.  Versions only:
    ``refresh`` undoes a ``mkdir`` that succeeds, but an epoch's name must never exist twice."""
    if not VERSION_RE.match(what.rpartition("/")[2]):
        return False
    return kv.store.refresh(what)


def settled_in_trash(kv, d: str, n: int, new: Version, key: str | None, op: Op) -> Version | None:
    """What ``FolderKV._link`` answers when epoch ``d`` is gone after a ``link()`` of ``new`` as version ``n`` whose
    effect was unknown (EIO): ``new`` if the retired epoch's version ``n`` is ours, the winner's if another's,
    None if not there (the link never took effect, or the trash expired).  An I/O error reading the trash settles
    nothing: it is read again until ``op``'s deadline -- never taken for "not there", which would write the add again
    (session 12's attack: counted twice).

    Raises:
        the timeout error: the trash stayed unreadable until the deadline (the message says the effect is unknown).
    """
    pause = kv.poll_min
    while True:
        try:
            won = read_retired(kv, d, n, key)
        except StorageError as e:
            where = kv.store.path(f"{d}/{version_name(n)}")
            kv._nap(op, pause, f"reading {where} in the trash keeps failing: {e} ({_UNKNOWN_EFFECT})")
            pause = min(pause * 2, kv.poll_max)
            continue
        return None if won is None else new if won.token == new.token else won


def _kept_reader():
    """A ``read`` for :func:`full` that finds a version of an epoch retired under the walk in the trash: the
    epoch's absence is probed once per walk (a retired epoch never comes back: its name is never reused), after
    which its versions are read from the trash alone (``Store.read_retired``: one listing of the root per epoch)."""
    gone: set[str] = set()

    def read(kv, d: str, n: int, key: str | None) -> Version | None:
        if d not in gone:
            v = kv._read(d, n, key)
            if v is not None or kv._probe(d):
                return v
        w = read_retired(kv, d, n, key)
        # Found in the trash: retired for certain.  Not there: a failed probe proves nothing (a lookup of the epoch
        # that lied once, nradv's finding 3) -- the live directory again next time.
        (gone.add if w is not None else gone.discard)(d)
        return w

    return read


def harvest(kv, d: str, names) -> None:
    """Keep the delta hints a listing of epoch directory ``d`` shows: ``kv._hints[(d, k)] = (token, amount)``.

    A hint ``a-<k>-<token>-<amount>`` is made by the writer of the delta at version ``k`` only after it knew
    that version was its own (its ``link()`` won, or its link count or token said so), and names exactly what
    that immutable version holds; epoch names are never reused.  So a hint is as good as a read of ``v-<k>``,
    and a listing that lags only shows fewer of them (the walk then reads those versions).

    A name kept before is skipped unparsed (``kv._harvested``): an adder lists one epoch of up to 254 names a dozen
    times, and parsing every hint each time was most of a listing's CPU (session 13: 0.4 of 0.7 ms on a local disk).
    Skipping is safe whatever it skips: a hint only spares a read.  The set, not the version in the name looked up
    in ``kv._hints``: that costs twice the CPU (session 14: 105-131 against 55-58 us a listing of 255 names)."""
    seen = kv._harvested
    for name in names:
        if not name.startswith("a-") or (d, name) in seen:
            continue
        h = HINT_RE.match(name)
        if h:
            if len(kv._hints) > CACHE:
                kv._hints.clear()
                seen.clear()
            # Marked seen before it is kept: another thread's clear in between then costs a parse, never a hint lost
            # for good (kept after: a name marked seen whose hint was cleared -- a read for it every walk).
            seen.add((d, name))
            kv._hints[(d, int(h.group(1)))] = (h.group(2), int(h.group(3)))


def _hint(make, m: int, new: Version) -> None:
    """Make the hint of our delta ``new`` at version ``m`` (``make(name)``): best effort -- a version without one
    is read instead; EEXIST is our own earlier try (a lost reply); ENOENT, the epoch retired meanwhile."""
    name = hint_name(m, new.token, int(new.value))
    if name is not None:
        with contextlib.suppress(OSError):  # StorageError is an OSError
            make(name)


def full(kv, d: str, n: int, v: Version, key: str | None, read=None) -> tuple[Version | None, str]:
    """Version ``n`` of epoch directory ``d`` as a full version: ``v`` itself, or for a delta its value
    computed from the versions below it (a ``set`` carrying the delta's token); a delta whose hint a listing
    showed (:func:`harvest`) is not read.  ``(None, name)``: the
    version ``name`` below could not be read (a lying lookup; the caller pauses and looks again).
    ``read(kv, d, k, key)``: how a version below is read (``kv._read``; an adder's own: from the trash too).

    Raises:
        CorruptStateError: a delta at version 1 (never written: version 1 of an epoch is full).
    """
    if v.op != "add":
        return v, ""
    chain, k = [v], n - 1
    while True:
        base = kv._vals.get((d, k))
        if base is not None:
            break
        if k == 0:
            raise CorruptStateError(f"{kv.store.path(d)}/{version_name(1)} is a delta; remove the store")
        if (h := kv._hints.get((d, k))) is not None:
            chain.append(Version(v.key, "add", h[0], str(h[1]).encode()))
            k -= 1
            continue
        w = (read or _plain_read)(kv, d, k, key)
        if w is None:
            return None, f"{d}/{version_name(k)}"
        if w.op != "add":
            base = w
            break
        chain.append(w)
        k -= 1
    if len(kv._vals) > CACHE:
        kv._vals.clear()
    kv._vals[(d, k)] = base
    for dv in reversed(chain):
        k += 1
        b = as_int(base.value if base.live else None)
        if b is not None and abs(b + int(dv.value)) < _BOUND:  # else it changes nothing (its add raised ValueError)
            base = Version(dv.key, "set", dv.token, str(b + int(dv.value)).encode())
        kv._vals[(d, k)] = base
    return base, ""


def _link_slots(kv, d: str, first: int, last: int, new: Version, key: str, op: Op) -> int | None:
    """Link ``new`` as the first free version of ``first``..``last`` in epoch ``d``: its number, 0 if all
    were taken, None if the epoch directory is gone.  Whose a taken name is: the token (fakefs: a read per
    loss), else the link count of our one temporary (a lost reply of a ``link()`` that succeeded leaves it
    at 2: never linked twice).

    Raises:
        UnsupportedFilesystemError: the first ``link()`` of this store left no link count of 2 (a copy).
        StorageError: the ``link()`` failed otherwise (not EEXIST, ENOENT, or EIO/ETIMEDOUT/EAGAIN retried)."""
    root = kv._posix
    if root is None:
        for m in range(first, last + 1):
            got = kv._link(d, m, new, key, op)  # the token's read-back (fakefs's lost replies, EIO)
            if got is new:
                _hint(lambda name: kv._create(f"{d}/{name}", new.encode()), m, new)
            if got is None or got is new:
                return m if got is new else None
        return 0
    tmp = os.path.join(root, d, _tmp_name())  # same directory: link() is atomic within one on NFS
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise storage_error(e, "write in", os.path.dirname(tmp)) from None
    try:
        try:
            os.write(fd, new.encode())  # < 1 KiB: one write; no fsync (docs/folderstore.md, fsync)
        finally:
            os.close(fd)  # hands the data to an NFS server before the link() makes it visible
        m = _posix_slots(kv, root, d, tmp, first, last, new, key, op)
        if m:  # ours: its hint, a second name of the same file (one link(); nobody reads it but by listing)
            _hint(lambda name: os.link(tmp, os.path.join(root, d, name)), m, new)
        return m
    finally:
        _unlink_quiet(tmp)


def loss_pause(kv, lost: int, took: float) -> float:
    """Seconds a contended adder pauses after its ``lost``-th lost race in a row, the ``link()`` of its last lost
    race (answered EEXIST) having taken ``took`` seconds: about ``2 ** (lost - 1)`` such ``link()`` times
    (jittered x0.5..1.5), at most the young-wait pause of its job
    (:func:`.folderstore_wait.fast_pause`: ``poll_min``, more for a job of over ``CROWD``).

    Why: N adders of one counter all aim at the same next free version; every race lost is a ``link()`` and
    a ``stat`` through the mount for nothing.  At 256 ranks on cached FUSE mounts that was ~17 losses per
    add and most of a barrier's CPU on 2 cores (docs/folderstore.md, "Losers pause").  A pause measured in
    the mount's own ``link()`` time scales with the filesystem and its load (microseconds on a local disk,
    milliseconds through a busy FUSE daemon) -- binary exponential backoff, as Ethernet's (IEEE 802.3 4.2.3.2.5).
    Only *when* the next ``link()`` comes changes: nothing was linked by the lost race (its link count said
    so), and the pause ends at the deadline (``_nap``), where the add raises having taken no effect."""
    return min(fast_pause(kv), max(took, 1e-6) * 2 ** min(lost - 1, 16)) * (0.5 + kv.rng.random())


def _posix_slots(kv, root: str, d: str, tmp: str, first: int, last: int, new: Version, key: str, op: Op) -> int | None:
    """:func:`_link_slots` on a real directory, our version written as ``tmp``: the same answers."""
    m, pause, lost, tries = first, kv.poll_min, 0, 0
    unsettled = None  # the slot of an earlier try of ours whose effect is not known yet (EIO, or a count unreadable)
    eio = None  # ... where that try answered EIO: a count of 1 there may be a daemon's cache, only the token settles it
    since = None  # when a read-back of the unsettled slot first found nothing (FolderKV._unreadable's LIE_LIMIT)
    while m <= last:
        target, tries = os.path.join(root, d, version_name(m)), tries + 1
        t0 = kv.clock.monotonic()
        try:
            os.link(tmp, target)
        except FileExistsError:
            # The link() alone paces the next try (loss_pause): the forced count read below is one more trip to the
            # server (a busy FUSE daemon's queue), and counted in, it doubled every loser's pause (session 13).
            took = kv.clock.monotonic() - t0
            links = link_count(tmp)
            if links >= 2:  # a retransmitted LINK answered EEXIST after it succeeded
                return m
            if links == 0 or m == eio:
                # The stat failed (EIO, ESTALE), or a try of ours at m answered EIO: a count of 1 may then be a client
                # cache's, kept past that failed LINK (GlusterFS md-cache: mdc_link_cbk) -- the token tells.  Until it
                # has, m is unsettled: an ENOENT next (the epoch retired meanwhile) asks the trash, as _link does.
                unsettled = m
                try:
                    w = kv._read(d, m, key)
                except StorageError as e:  # EIO on the read-back: link again, EEXIST, read again (as _link)
                    kv._nap(op, pause, f"reading {target} back keeps failing: {e} ({_UNKNOWN_EFFECT})")
                    pause = min(pause * 2, kv.poll_max)
                    continue
                if w is not None and w.token == new.token:
                    return m
                if w is None:  # a lookup that lies (cured by a refresh: a link() there said EEXIST), LIE_LIMIT kept
                    since = kv.clock.monotonic() if since is None else since
                    kv._unreadable(op, f"{d}/{version_name(m)}", since, pause, unknown=True)
                    pause = min(pause * 2, kv.poll_max)
                    continue  # link() again: EEXIST, and the stat or the read tells
            unsettled = eio = since = None  # version m is another's: our try there took no effect
            # Lost to another version: on to the next free name.  N adders at once would each lose O(N)
            # races one name at a time: a listing (a lower bound of the top, stale or not) after the 1st, 2nd,
            # 4th, 8th... loss in a row jumps them (log2 listings where a stale one does not help).
            lost += 1
            kv._nap(op, loss_pause(kv, lost, took), f"{lost} races lost in {kv.store.path(d)}")
            m = max(m + 1, kv._listed(d) + 1) if lost & (lost - 1) == 0 else m + 1
            continue
        except FileNotFoundError:  # the epoch was retired: the caller resolves afresh -- unless an earlier try of ours
            # (EIO) linked it: our temporary went with the epoch, so its count is unreadable; the trash tells.
            if link_count(tmp) >= 2:
                return m
            return m if m == unsettled and settled_in_trash(kv, d, m, new, key, op) is new else None
        except OSError as e:
            if e.errno not in _RETRY:
                raise storage_error(e, "create", target, mutating=True) from None
            if link_count(tmp) >= 2:
                return m
            unsettled = eio = m
            kv._nap(op, pause, f"linking {target} keeps failing: {e} ({_UNKNOWN_EFFECT})")
            pause = min(pause * 2, kv.poll_max)
            continue
        if tries == 1 and not kv.store._link_proven:
            # Only a first link(): after a failed one FUSE keeps the attributes it read (nlink 1, bindfs).
            kv.store.prove_link(tmp, target)
        return m
    return 0


def delta_add(kv, key: str, kd: str, amount: int, st: State, op: Op) -> int | State | Moved | None:
    """Add ``amount`` by a delta version after ``st`` (where the key's log stands, as this process sees it);
    returns the new value, or None where a delta may not go (the caller's read-modify-write goes on), or
    where the log stands now if the epoch filled up meanwhile, or ``Moved.EPOCH_GONE`` if the epoch's
    directory is gone (retired: the log moved on; or its lookup lies) -- no effect, the caller looks where the
    log went (a read-modify-write's ``link()`` into the same directory would fail too: 1.5 an add, session 14).

    Raises:
        ValueError: the value the delta landed on is not an integer (the delta changes nothing).
        the timeout error: no free version was won by the deadline (no effect); or ours was, and a version below it
            stayed unreadable until the deadline -- the message then says the add took effect (do not add again); or
            a ``link()`` of ours answered EIO or a lost reply and whose version it made was not settled by the
            deadline -- the message then says whether it took effect is unknown.
    """
    if st.ep == EPOCH0 and st.n + 1 >= kv.cap(EPOCH0) and st.ver is not None and st.ver.sealing:
        # Epoch 0 full, its seal next, and its version 1 says its writer (a counter's creating add: ``created``
        # below) seals it at once: wait a moment for that, as for a last delta's seal, rather than each of the N-1
        # others making an epoch and racing for the seal's slot (a mkdir, a lost link() and a retirement each).
        return _await_seal(kv, key, kd, st, op)
    if st.ep == EPOCH0 or st.n < 1 or st.ver is None:
        return None  # epoch 0 and version 1 stay full versions
    cap = kv.cap(st.ep)  # this epoch's own capacity: from its name (docs/folderstore.md, "Grown epochs")
    if st.n + 1 >= cap:  # so does every seal: the last delta's writer makes it (below); wait a moment
        return _await_seal(kv, key, kd, st, op)
    d = f"{kd}/{st.ep}"
    new = Version(key, "add", secrets.token_hex(8), str(amount).encode())
    m = _link_slots(kv, d, st.n + 1, cap - 1, new, key, op)
    if m is None:
        return Moved.EPOCH_GONE  # no effect (ours is in no slot); the caller looks where the log went
    if m == 0:  # every version below the seal is taken: where the log stands now (the seal is next)
        kv._saw(kd, st.ep, cap - 1)
        return kv._resolve(key, kd, op)
    kv._saw(kd, st.ep, m)
    # Our add took effect at this link(): a timeout from here on (a version below ours that stays unreadable) must
    # not read as "no effect" -- a caller that adds again would count it twice.  The message says so.
    op.what += (
        f" (the add took effect as {kv.store.path(d)}/{version_name(m)}; only its answer is missing: do not add again)"
    )
    kv._vals[(d, st.n)] = st.ver  # the walk back from ours stops at where we started
    if any((d, k) not in kv._hints and (d, k) not in kv._vals for k in range(st.n + 1, m)):
        with contextlib.suppress(OSError):  # best effort (EIO: the walk reads instead); our add took effect
            kv._listed(d)  # one listing tells the amounts of the deltas below ours by their hints (harvest)
    pause, since = kv.poll_min, kv.clock.monotonic()
    read = _kept_reader()
    while True:
        try:
            v, missing = full(kv, d, m, new, key, read)  # the epoch may be sealed and retired meanwhile
        except StorageError as e:  # our add took effect: an I/O error of the walk never fails it (read again)
            kv._nap(op, pause, f"reading the versions below {kv.store.path(d)}/{version_name(m)}: {e}")
            pause = min(pause * 2, kv.poll_max)
            continue
        # cached by the walk: the value our delta was linearized on (another thread may clear it: walk again)
        if v is not None and (below := kv._vals.get((d, m - 1))) is not None:
            break
        if v is None:
            kv._unreadable(op, missing, since, pause)  # listed below ours, so it exists: a lookup that lies
            pause = min(pause * 2, kv.poll_max)
    base = as_int(below.value if below.live else None)
    if base is None or abs(base + amount) >= _BOUND:  # linearized at our link(): an add that changes nothing
        raise ValueError(f"add: the value of {key!r} is not an integer: {below.value[:40]!r}")
    if m == cap - 1:
        # Contended (our delta passed slots others took): the next epoch holds more, so that N adders cross fewer
        # epochs; a quiet counter's stay at the default (item 1's bound).  Either way in the name, never reused.
        grow = m - (st.n + 1) >= kv.grow_after
        _seal_now(kv, kd, st.ep, cap, v, op, max(cap, min(2 * cap, grown_cap(kv))) if grow else kv.seal_at)
    return base + amount


def grown_cap(kv) -> int:
    """The largest capacity of a grown epoch (versions): ``seal_max``, else ``SEAL_GROW`` x ``seal_at`` (128)."""
    return kv.seal_max or SEAL_GROW * kv.seal_at


def _seal_now(kv, kd: str, ep: str, cap: int, v: Version, op: Op, nxt_cap: int) -> None:
    """The writer of an epoch's last delta (version ``cap``-1, value ``v``, computed) seals it at once (version
    ``cap``), naming a new epoch of capacity ``nxt_cap``: a
    read-modify-write that changes nothing (the seal carries ``v``'s value) -- linearized at its ``link()`` as no
    operation.  Else every adder that found the epoch full would make an epoch and race for the seal's slot (at
    256 ranks ~40 per epoch, each a mkdir, a lost link() and a retirement).  Our add took effect: nothing here
    may fail it (a failed seal is made by the next writer, as before)."""
    # Every Exception, on purpose: StorageError, the store's timeout, even CorruptStateError met while sealing fail
    # the seal, never the add that already took effect (a caller retrying a failed add counts it twice); the next
    # writer meets the same error in its own operation, where it is reported.  The seal's own tries end within
    # SEAL_WAIT x poll_max (as long as its waiters wait, _await_seal), not at the add's deadline: a seal slot that
    # keeps failing (EIO) must not hold a caller whose add took effect for its whole timeout (session 15's attack).
    short = Op(kv.clock, SEAL_WAIT * kv.poll_max, op.what)
    if op.deadline is not None:
        short.deadline = min(short.deadline, op.deadline)
    with contextlib.suppress(Exception):
        nxt = kv._new_epoch(kd, ep, nxt_cap)
        seal = Version(v.key, "set", secrets.token_hex(8), v.value, nxt)
        if kv._link(f"{kd}/{ep}", cap, seal, v.key, short) is seal:
            kv._saw(kd, ep, cap)
            kv._seal[kd] = (nxt, seal)
            kv._sealed(kd, ep, nxt, seal)
        else:
            kv._retire(f"{kd}/{nxt}")  # nobody knows its name: the seal that would have named it lost


def _await_seal(kv, key: str, kd: str, st: State, op: Op) -> State | None:
    """An adder that finds an epoch full (its seal next) waits up to ``SEAL_WAIT`` polls for the last delta's
    writer's seal (:func:`_seal_now`): where the log stands then, or None to make the seal itself."""
    for _ in range(SEAL_WAIT):
        kv._nap(op, kv.poll_min * (1 + kv.rng.random()), "waiting for the seal")
        cur = kv._resolve(key, kd, op)
        if cur.ep != st.ep or cur.n > st.n:
            return cur
    return None


def add(kv, key: str, amount: int) -> int:
    """``FolderKV.add``: a delta version where one may go, else a read-modify-write.  ``amount == 0`` on a key
    that exists writes nothing: a fresh read answers it (torch's barrier reads its counter with ``add(k, 0)``
    from every rank); on a missing key it writes ``0``, as torch's do.

    Raises:
        ValueError: the value is not an integer (read freshly, or the one our delta landed on): no effect.
    """
    amount, out = int(amount), []

    def change(cur):
        if as_int(cur) is None:
            raise _NotInt  # perhaps a lagging listing's: a fresh read decides (below)
        out[:] = [as_int(cur) + amount]
        if abs(out[0]) >= _BOUND:  # its decimal form would not read back as an integer (as_int)
            raise ValueError(f"add: {key!r} would hold an integer of over 4000 digits")
        return None if amount == 0 and cur is not None else ("set", str(out[0]).encode())

    def jump(kd, st, op):
        return delta_add(kv, key, kd, amount, st, op) if amount and as_int(st.value) is not None else None

    def created(kd, v, op):
        # The add that created the counter seals epoch 0 at once, naming a grown epoch: a counter's first add is
        # most often one of N at once (torch's store-based barrier, a rank counter), whose other N-1 otherwise each
        # made an epoch and raced for epoch 0's seal, then crossed epochs of 32, 64 and 128 -- every crossing a
        # wait for a seal on the barrier's critical path (session 15).  A quiet counter's next seal is the default.
        _seal_now(kv, kd, EPOCH0, kv.cap(EPOCH0), v, op, kv.seal_first or grown_cap(kv))

    while True:
        try:
            done = kv._update(key, change, "adding to", jump, created)
            return done if isinstance(done, int) else out[0]
        except _NotInt:
            cur = kv.try_get(key)  # linearizable: a ValueError only for a value that is not an integer then
            if as_int(cur) is None:
                raise ValueError(f"add: the value of {key!r} is not an integer: {cur[:40]!r}") from None


class _NotInt(Exception):
    """An add's read-modify-write saw a value that is not an integer (perhaps in a lagging listing)."""
