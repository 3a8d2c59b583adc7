"""FolderStore: a ``torch.distributed.Store`` kept in a shared directory, correct without flock or a server.

Every key is a **log of immutable versions** in epoch directories (layout:
:mod:`fsmingle.fs.folderstore_log`; the argument, rule by rule: ``docs/folderstore.md``):

* **Whoever creates version k+1 of an epoch made the change** (an exclusive ``link()``), having
  read version k: every write is linearizable at its ``link()``; a lost reply or an I/O error
  after the effect is read back by the call's token, never counted twice nor failed.
* **Compaction without ABA**: the write that fills an epoch is a *seal* naming a new epoch (a
  never-used random name); the epochs below it are then retired whole (``rename()``, files kept ``retire_grace``),
  so a stale writer's ``link()`` into one fails (ENOENT, or EEXIST via a cached entry), never re-uses a freed name.
* **Every answer is linearizable**: one that writes nothing comes from a *fresh* read (each epoch
  directory probed before its listing is trusted); **every timeout is kept** (a deadline per call).

No torch import here: the ``torch.distributed.Store`` face is :mod:`fsmingle.fs.folderstore_torch`.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import time
from collections.abc import Callable, Iterable

from ..errors import CorruptStateError, StorageError
from .folderstore_add import Moved, add, fresh_lookup, full, harvest
from .folderstore_keys import live_keys
from .folderstore_link import link_version, moved_on
from .folderstore_log import (
    _UNKNOWN_EFFECT,
    _UNREADABLE,
    EPOCH0,
    EPOCH_RE,
    MAX_KEY,
    MAX_VALUE,
    VERSION_RE,
    FolderStoreTimeout,
    Op,
    State,
    Version,
    as_bytes,
    epoch_cap,
    epoch_number,
    key_dir,
    new_epoch_name,
    probe_dir,
    version_name,
)
from .folderstore_wait import wait_for
from .store import UNTRUSTED, PosixStore, Store

__all__ = ["MAX_KEY", "MAX_VALUE", "FolderKV", "FolderStoreTimeout", "key_dir"]

POLL_MIN = 0.010  # pause of a waiting get/wait: one listing per 10 ms per missing key while it is young
POLL_MAX = 0.25  # longest pause: one listing per missing key per POLL_MAX is what a long waiter costs
SEAL_AT = 32  # versions an epoch holds (its last one a seal) before the log moves to a new epoch
SEAL_AT0 = 2  # epoch 0 is never retired (no stale writer can re-create it): it holds two versions
LIE_LIMIT = 120.0  # seconds a lookup may keep lying (61 s measured on GlusterFS nl-cache) before "removed"


class FolderKV:
    """The store's logic on any :class:`fsmingle.fs.store.Store` (a real directory or the test's fakefs).

    Args:
        store (Store): rooted at the store directory.
        clock: ``monotonic()`` and ``sleep()`` (the module ``time`` by default).
        poll_min, poll_max (float): pauses of waiting reads (seconds): ``poll_min`` for ``FAST_FOR`` s, then
            doubling up to ``poll_max``.  rng (random.Random): jitter (seeded in tests).
        timeout (float | None | callable): seconds any one operation may take (None or 0: no limit;
            a callable is asked at each operation); ``wait_for`` takes its own.
        timeout_error: builds the timeout's exception from its message (:class:`FolderStoreTimeout`).
        retire_grace (float): seconds a retired epoch's files are kept (``Store.retire``; ``LIE_LIMIT``).
        crowd (int): processes of the job that may wait at once (``world_size``; 1: unknown): a young wait of a
            crowd over ``folderstore_wait.CROWD`` polls less often (:func:`.folderstore_wait.fast_pause`).
    """

    def __init__(self, store: Store, clock=time, poll_min: float = POLL_MIN, poll_max: float = POLL_MAX, rng=None,
                 timeout=None, timeout_error: Callable[[str], Exception] = FolderStoreTimeout,
                 retire_grace: float = LIE_LIMIT, crowd: int = 1):  # fmt: skip
        self.store, self.clock = store, clock
        self.poll_min, self.poll_max = poll_min, max(poll_min, poll_max)
        self.rng = rng or random.Random(secrets.randbits(64))
        self.timeout, self.timeout_error = timeout, timeout_error
        self.seal_at = SEAL_AT  # versions per epoch (tests lower it to compact often)
        self.seal_max = None  # a grown epoch's largest capacity (None: folderstore_add.SEAL_GROW x seal_at, 128)
        self.grow_after = 1  # lost slots of the last delta's writer that grow the next epoch (0: every delta seal)
        self.seal_first = None  # capacity of a counter's first epoch, named by its creating add (None: grown_cap)
        self.retire_grace = retire_grace  # seconds a retired epoch's files are kept (Store.retire)
        self.crowd = max(1, crowd)
        self._made: set[str] = set()  # key directories this process made or found (mkdir)
        # key dir -> (epoch number, epoch, version) newest this process saw or wrote: never go back
        self._seen: dict[str, tuple[int, str, int]] = {}
        self._seal: dict[str, tuple[str, Version]] = {}  # key dir -> (epoch, the seal that named it), newest
        self._vals: dict[tuple[str, int], Version] = {}  # (epoch dir, n) -> value of a delta (folderstore_add)
        self._hints: dict[tuple[str, int], tuple[str, int]] = {}  # (epoch dir, n) -> a delta's (token, amount)
        self._harvested: set[tuple[str, str]] = set()  # (epoch dir, hint name) kept in _hints (harvest)
        self._posix = store.root if isinstance(store, PosixStore) else None

    # ------------------------------------------------------------------ primitives
    def _op(self, what: str, secs: float | None = -1.0) -> Op:
        if secs == -1.0:
            secs = self.timeout() if callable(self.timeout) else self.timeout
        return Op(self.clock, secs, what)

    def _nap(self, op: Op, pause: float, why: str) -> None:
        """Sleep ``pause`` seconds, never past the deadline; at the deadline raise the timeout, saying ``why``."""
        now = self.clock.monotonic()
        if op.deadline is not None:
            if now >= op.deadline:
                raise self.timeout_error(f"Timeout after {op.secs:g} s {op.what}: {why}")
            pause = min(pause, op.deadline - now)
        self.clock.sleep(pause)

    def _create(self, name: str, data: bytes) -> bool:
        # No fsync: a version is needed only while the job's generation lives; a crash of the writer's
        # node ends that generation (docs/folderstore.md, "What an fsync would buy").  The store's
        # first link() still proves the filesystem's link count (PosixStore.create).
        return self.store.create(name, data, fsync=False)

    def _probe(self, d: str) -> bool:
        """Make the next listing of directory ``d`` fresh (a change of ours in it); False if ``d`` is gone."""
        if self._posix is not None:
            return probe_dir(self._posix, d)
        name = f"{d}/.p-{secrets.token_hex(6)}" if d else f".p-{secrets.token_hex(6)}"
        try:
            self.store.publish(name, b"")
        except FileNotFoundError:
            return False
        self.store.remove(name)
        return True

    def _keydir(self, key: str, again: bool = False) -> str:
        d = key_dir(key)
        if again or d not in self._made:
            # mkdir before the first listing, EEXIST is fine: a directory looked up before it
            # exists can stay "absent" in a negative lookup cache for a minute, while mkdir goes
            # to the server (PosixStore.mkdir cures a lying lookup after EEXIST: stat_existing).
            # Epoch 0 likewise; it is never retired, so this mkdir never re-creates a retired epoch.
            try:
                made = self.store.mkdir(d)
            except FileNotFoundError:
                if not again:
                    raise
                return d  # the store directory is missing, or its lookup lies: the caller retries
            if made and again and d in self._seen:
                # Versions we saw are gone: the store was removed under us.  Never write into a
                # fresh directory as if nothing had happened (the log would restart at version 1).
                raise CorruptStateError(
                    f"{self.store.path(d)} was removed while in use (fsmingle clean of a live store?)"
                )
            try:
                self.store.mkdir(f"{d}/{EPOCH0}")
            except FileNotFoundError:
                return d  # the key directory's lookup lies: a write into it fails, and comes back here
            self._made.add(d)
        return d

    def _saw(self, kd: str, ep: str, n: int) -> None:
        # Never lower (NCCL's monitor thread may call too).
        pos = (epoch_number(ep), ep, n)
        old = self._seen.get(kd)
        if old is None or (pos[0], pos[2]) > (old[0], old[2]):
            self._seen[kd] = pos

    def _listed(self, d: str) -> int:
        """Newest version number a listing of directory ``d`` shows (0: none); keeps the delta hints it shows.  Versions
        have 12 digits: the newest is the greatest name that is one (a regex per name cost CPU, session 13)."""
        harvest(self, d, names := self.store.listdir(d))
        for n in sorted((n for n in names if n.startswith("v-")), reverse=True):
            if m := VERSION_RE.match(n):
                return int(m.group(1))
        return 0

    def _epochs(self, kd: str) -> list[tuple[int, str]]:
        return sorted(((epoch_number(n), n) for n in self.store.listdir(kd) if EPOCH_RE.match(n)), reverse=True)

    def _read(self, d: str, n: int, key: str | None) -> Version | None:
        """Version ``n`` of directory ``d``; None if this client cannot see it (lookup lies, ESTALE, retired)."""
        name = f"{d}/{version_name(n)}"
        data = self.store.read(name)  # a fresh open(): close-to-open consistency
        if data is None:
            return None
        if data == UNTRUSTED:
            raise CorruptStateError(f"{self.store.path(name)} is not a file of yours; remove the store")
        v = Version.decode(data, self.store.path(name))
        if key is not None and v.key != key:
            raise CorruptStateError(f"{self.store.path(name)} holds key {v.key!r}, not {key!r} (hash collision?)")
        return v

    # ------------------------------------------------------------------ where a key's log stands
    def _resolve(self, key: str | None, kd: str, op: Op, fresh: bool = False) -> State:
        """The newest version of the key (``State``).  ``fresh``: linearizable -- every epoch directory trusted is
        probed first, so that its listing shows every version made before.  A listed version that reads as absent
        (a lookup that lies, an epoch retired meanwhile) is looked for again, fresh, after a pause (until the deadline)
        -- at once for an epoch newly gone: the key moved on (256 adders seal one in milliseconds)."""
        pause, since, missing, gone = self.poll_min, self.clock.monotonic(), "", set()
        while True:
            st, missing = self._try_resolve(key, kd, fresh, deep=pause > self.poll_min or missing in (kd, *gone))
            if st is not None:
                return st
            fresh = True
            if missing == kd and kd not in self._made:  # no epoch 0 listed: its maker stalled, or our mkdir met a lie
                with contextlib.suppress(FileNotFoundError):  # still lying: again next time
                    self.adopt(kd)  # (never retired: this mkdir never re-creates a retired epoch)
            epoch_gone = missing not in gone and EPOCH_RE.match(missing.rpartition("/")[2])  # retired: no pause
            self._unreadable(op, missing, since, 0.0 if epoch_gone else pause)  # the deadline is kept either way
            pause = pause if epoch_gone else min(pause * 2, self.poll_max)
            gone.add(missing)

    def _try_resolve(self, key: str | None, kd: str, fresh: bool, deep: bool = False, full: bool = False):
        if deep and not self._probe(kd):  # deep: the epochs listed were gone -- a fresh listing of the key
            return None, kd
        seen = self._seen.get(kd, (-1, "", 0))
        e0_empty = False
        # A plain look (a poll, a write's first read) lists only the epoch this process last saw (epoch
        # 0 at first): one listing per poll.  A write into a stale epoch fails and comes back fresh.
        quick = not (fresh or deep or full)
        if quick:
            eps = [seen[:2]] if seen[1] else [(0, EPOCH0)]
        else:
            eps = self._epochs(kd)
            if seen[1] and seen[1] not in (n for _, n in eps):
                eps = sorted([*eps, seen[:2]], reverse=True)
        for num, ep in eps:
            if num < seen[0]:
                break  # older than an epoch seen: sealed (and being retired)
            d = f"{kd}/{ep}"
            if fresh and not self._probe(d):
                if ep == seen[1]:
                    # Retired (or its lookup lies): an epoch goes only once its successor holds a
                    # version, so a listing of the key shows a later one; keep only the number as a floor.
                    self._seen[kd] = (seen[0], "", 0)
                    return None, d
                continue
            listed = self._listed(d)
            if listed == 0 and fresh and not self._probe(d):
                # Retired after our probe: a gone directory lists empty, not "just sealed into" -- asked before the
                # floor of what we saw, which would read that version through an entry cached by inode (NFS, FUSE)
                # and answer a fresh read from a retired epoch (the session 15 attack; hypothesis example below).
                return None, d
            n = max(listed, seen[2] if ep == seen[1] else 0)
            sealed = self._seal.get(kd)  # read once: another thread may replace it (NCCL's monitor thread)
            if n == 0 and sealed is not None and sealed[0] == ep:
                return State(ep, 0, sealed[1]), ""  # just sealed into: the seal's value is current
            if n == 0:
                e0_empty = ep == EPOCH0
                continue  # empty: an orphan of a lost seal, or just sealed into (reached by its seal below)
            v, bad = self._full(d, n, key)
            if v is None:
                return None, bad
            while v.next is not None:  # a seal: the log goes on in the epoch it names
                ep, d = v.next, f"{kd}/{v.next}"
                if fresh and not self._probe(d):
                    return None, d  # sealed into and already retired: the key moved on further
                m = self._listed(d)
                if m == 0 and fresh and not self._probe(d):
                    return None, d  # as above: retired between the probe and the listing
                self._seal[kd] = (ep, v)  # immutable: what an empty epoch's value is, once its seal is read
                if m == 0:
                    self._saw(kd, ep, 0)
                    return State(ep, 0, v), ""
                w, bad = self._full(d, m, key)
                if w is None:
                    return None, bad
                n, v = m, w
            self._saw(kd, ep, n)
            return State(ep, n, v), ""
        if quick and eps[0][1] != EPOCH0:
            return self._try_resolve(key, kd, fresh, full=True)
        if fresh and not e0_empty:
            return None, kd  # every epoch listed is gone and epoch 0 was not seen empty: list the key afresh
        return State(EPOCH0, 0, None), ""  # never written (fresh: epoch 0, never retired, is empty)

    def _full(self, d: str, n: int, key: str | None) -> tuple[Version | None, str]:  # a delta's value: computed
        return full(self, d, n, v, key) if (v := self._read(d, n, key)) else (None, f"{d}/{version_name(n)}")

    def _unreadable(self, op: Op, what: str, since: float, pause: float, unknown: bool = False) -> None:
        """``unknown``: ``what`` may be the caller's own write, whose effect is not settled yet: the errors say so."""
        if fresh_lookup(self, what):
            return  # a negative dentry of a version made fresh: read again now, no pause (fs/lookup.py)
        p, tail = self.store.path(what), f" ({_UNKNOWN_EFFECT})" if unknown else ""
        if self.clock.monotonic() - since > LIE_LIMIT:
            raise CorruptStateError(f"After {LIE_LIMIT:g} s {op.what}: {p} is still {_UNREADABLE}{tail}")
        self._nap(op, pause, f"{p} is {_UNREADABLE}{tail}")

    # ------------------------------------------------------------------ reading
    def try_get(self, key: str, fresh: bool = True, op: Op | None = None) -> bytes | None:
        """The value of ``key`` now, or None if it is missing (never set, or deleted).

        ``fresh`` (the default): linearizable (the directories read are probed first); False: what
        this client's directory cache shows (never older than what this process saw).

        Raises:
            the timeout error: a listed version stayed unreadable until the store's timeout.
        """
        kd = self._keydir(key)
        return self._resolve(key, kd, op or self._op(f"reading {key[:80]!r}"), fresh).value

    def wait_for(self, keys: Iterable[str], timeout: float | None, on_timeout: Callable[[list[str]], Exception]):
        """Block until every key exists; returns their values in order (:func:`.folderstore_wait.wait_for`)."""
        return wait_for(self, keys, timeout, on_timeout)

    def check(self, keys: Iterable[str]) -> bool:
        """True if every key exists (each read linearizably)."""
        return all(self.try_get(k) is not None for k in keys)

    def list_keys(self) -> list[str]:
        """Keys that hold a value now, sorted; linearizable (two equal fresh collects: :mod:`.folderstore_keys`).

        Raises:
            the timeout error: keys kept changing during every pair of collects until the store's timeout.
        """
        return live_keys(self, self._op("listing keys"))

    probe, resolve, nap = _probe, _resolve, _nap  # what folderstore_keys uses

    def adopt(self, kd: str) -> None:
        """Before the first listing of key directory ``kd`` (listed by the store's): mkdir its epoch 0, as
        ``_keydir`` does -- a writer that made ``kd`` and died (or stalls) before epoch 0 must not make
        it unreadable; and epoch 0, never retired, is never re-created by this."""
        if kd not in self._made:
            self.store.mkdir(f"{kd}/{EPOCH0}")
            self._made.add(kd)

    # ------------------------------------------------------------------ read-modify-write
    def _update(
        self, key: str, change: Callable[[bytes | None], tuple[str, bytes] | None], what: str, jump=None, created=None
    ):
        """Apply ``change`` to the value of ``key`` atomically; returns the version written (None: nothing written),
        or what ``jump(kd, state, op)`` returned that is not None nor a newer state (an add's delta: .folderstore_add).
        ``created(kd, version, op)`` is called after a write of ours created the key (version 1 of epoch 0, written
        ``sealing``: ``created`` seals epoch 0).

        ``change(value)`` (None: missing) returns ``(op, value)`` to write, or None to write nothing
        (then answered from a fresh read: a failed ``compare_set`` is linearizable too).  The ``link()``
        of version k+1 of an epoch succeeds for one writer, who computed it from version k.
        """
        kd = self._keydir(key)
        op = self._op(f"{what} {key[:80]!r}")
        token = secrets.token_hex(8)
        st, fresh = self._resolve(key, kd, op), False
        lost = 0.001  # backoff after a lost race (see below)
        gone = 0.0  # since when st's epoch directory has been missing (0: it was not)
        while True:
            while jump is not None and (done := jump(kd, st, op)) is not None:
                if done is Moved.EPOCH_GONE:
                    st, fresh, gone = moved_on(self, key, kd, st, op, gone, LIE_LIMIT)
                    continue
                if not isinstance(done, State):
                    return done
                st, fresh = done, False  # the epoch filled up: on from where it stands now (its seal next)
            want = change(st.value)
            if want is None:
                if fresh:
                    return None
                st, fresh = self._resolve(key, kd, op, fresh=True), True
                continue
            kind, value = want
            if len(value) > MAX_VALUE:
                raise ValueError(f"FolderStore values are at most {MAX_VALUE} bytes; {key[:40]!r} got {len(value)}")
            seal = None
            if st.n + 1 >= self.cap(st.ep):
                seal = self._new_epoch(kd, st.ep)  # a read-modify-write's epoch: the default capacity
            # A creating write whose caller seals epoch 0 at once says so: the others wait for that seal.
            new = Version(key, kind, token, value, seal, sealing=created is not None and st.ep == EPOCH0 and st.n == 0)
            got = self._link(f"{kd}/{st.ep}", st.n + 1, new, key, op)
            if got is new:
                self._saw(kd, st.ep, st.n + 1)
                if seal is not None:
                    self._seal[kd] = (seal, new)
                    self._sealed(kd, st.ep, seal, new)
                elif created is not None and st.ep == EPOCH0 and st.n == 0:
                    created(kd, new, op)
                return new
            if seal is not None:
                self._retire(f"{kd}/{seal}")  # nobody knows its name: the seal that would have named it lost
            if got is None:  # the epoch is gone (retired: the log moved on), or its lookup lies
                st, fresh, gone = moved_on(self, key, kd, st, op, gone, LIE_LIMIT)
                continue
            # Lost the race.  Under contention (N ranks adding to one counter) every retry at once
            # would mostly lose again: back off a random moment, growing with the losses in a row
            # (at most poll_max), as CAS loops do.
            self._saw(kd, st.ep, st.n + 1)
            self._nap(op, self.rng.random() * lost, f"lost the race for {self.store.path(kd)}/{st.ep}")  # no effect
            lost = min(lost * 2, self.poll_max)
            # Retry on top of the newest version we can see: the winner's, or a newer one a listing
            # shows (never below the winner's: _seen).  The next link() is the judge.
            st, fresh = self._resolve(key, kd, op), False

    def _link(self, d: str, n: int, new: Version, key: str, op: Op) -> Version | None:  # (tests patch it here)
        return link_version(self, d, n, new, key, op)

    def cap(self, ep: str) -> int:
        """Versions epoch ``ep`` holds, the last one its seal: 2 for epoch 0, else what its name says (the default
        ``seal_at`` for a name without a capacity): the same for every process (names are immutable, never reused).
        Raises ``CorruptStateError`` for a name saying a capacity under 2."""
        return SEAL_AT0 if ep == EPOCH0 else epoch_cap(ep, self.seal_at)

    def _new_epoch(self, kd: str, cur: str, cap: int | None = None) -> str:
        """mkdir the epoch the seal about to be linked will name: numbered above every epoch listed,
        under a name never used (a stale writer's mkdir can never re-create a retired one); ``cap``: its
        capacity, written into the name unless it is the default."""
        top = max([epoch_number(cur), *(num for num, _ in self._epochs(kd))])
        name = new_epoch_name(top + 1, None if cap in (None, self.seal_at) else cap)
        self.store.mkdir(f"{kd}/{name}")
        return name

    def _sealed(self, kd: str, old: str, new_ep: str, seal: Version) -> None:
        """After our seal of ``old`` won: copy its value into the new epoch (its version 1: the next adds go there as
        deltas, not as read-modify-writes racing for version 1), then retire the epochs below it (never epoch 0)."""
        copy = Version(seal.key, seal.op, secrets.token_hex(8), seal.value)
        try:  # a failure here must not fail the write (it took effect): a later seal retires these epochs
            self._create(f"{kd}/{new_ep}/{version_name(1)}", copy.encode())  # EEXIST: a writer's successor
            if old == EPOCH0:
                return  # epoch 0 stays (a seal's value stays readable there): nothing to retire
            old_eps = [ep for num, ep in self._epochs(kd) if num < epoch_number(new_ep) and ep != EPOCH0]
        except (FileNotFoundError, StorageError):
            return  # not proven there (the copy), or the epochs not listed (EIO)
        # Every epoch below the new one is sealed (or an orphan nobody names) and the new one holds
        # the value: retiring them loses nothing, and a stale writer's link() into one now fails
        # (ENOENT) instead of succeeding: the directory, not its files, goes, and no name comes back.
        for ep in old_eps:
            self._retire(f"{kd}/{ep}")

    def _retire(self, d: str) -> None:
        with contextlib.suppress(FileNotFoundError, StorageError):  # a later seal tries again
            # Out of every listing at once, its files deleted retire_grace later: a stale writer's
            # link() through an entry cached by inode meets EEXIST, never a freed name (Store.retire).
            self.store.retire(d, keep_for=self.retire_grace)

    # ------------------------------------------------------------------ the operations
    def set(self, key: str, value) -> None:
        value = as_bytes(value)
        self._update(key, lambda cur: ("set", value), "setting")

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer in ``key`` (missing: 0); returns the new value (:func:`.folderstore_add.add`).

        Raises:
            ValueError: the value is not an integer (read freshly, or the one our delta landed on): no effect.
        """
        return add(self, key, amount)

    def compare_set(self, key: str, expected, desired) -> bytes:
        """torch's semantics: missing key -> set ``desired`` if ``expected`` is empty and return it, else
        return ``expected``; present -> set ``desired`` if the value equals ``expected`` and return it,
        else return the current value."""
        expected, desired = as_bytes(expected), as_bytes(desired)
        out = []

        def change(cur):
            if cur is None:
                out[:] = [desired if expected == b"" else expected]
                return ("set", desired) if expected == b"" else None
            out[:] = [desired if cur == expected else cur]
            return ("set", desired) if cur == expected else None

        self._update(key, change, "compare_set of")
        return out[0]

    def append(self, key: str, value) -> None:
        value = as_bytes(value)
        self._update(key, lambda cur: ("set", (cur or b"") + value), "appending to")

    def delete(self, key: str) -> bool:
        """Write a tombstone if ``key`` exists; True if it existed."""
        out = [False]

        def change(cur):
            out[0] = cur is not None
            return ("del", b"") if cur is not None else None

        self._update(key, change, "deleting")
        return out[0]
