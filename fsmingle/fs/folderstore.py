"""FolderStore: a ``torch.distributed.Store`` kept in a shared directory, correct without flock or a server.

Layout of a store directory (``<dir>/<job>/gen-N/store`` when the rendezvous hands it out)::

    store/                          the store: mkdir, owner-only; removed with its generation
        k-<hex of the key's UTF-8>/ one directory per key (``h-<sha256>`` for keys over 100 bytes)
            v-000000000001          version 1 of the key: link() of a complete file (exclusive)
            v-000000000002          version 2: made by whoever read version 1 and won the link()
            ...

Every key is a **log of immutable versions**.  Each version file is a header line (JSON: the
key, the operation, a token unique to the writing call, the value's length) and the value's
bytes.  The rules, each because of a filesystem fact (``docs/folderstore.md``, ``store.py``):

* **Whoever creates version k+1 made the change.**  ``set``, ``add``, ``compare_set``,
  ``append`` and ``delete_key`` read the newest version k, compute the new value and create
  ``v-(k+1)`` with :meth:`~fsmingle.fs.store.PosixStore.create` (``link()`` of a complete, fsynced
  file: exclusive on NFSv3+, Lustre, GPFS, GlusterFS, and a name never shows a partial file).
  The loser of the ``link()`` re-reads and retries on top of the winner's version.  So every
  read-modify-write is linearizable across nodes whose caches lie: the log is a chain in which
  each version was computed from its predecessor, and its linearization point is its ``link()``.
* **A lost reply is read back.**  ``link()`` may answer EEXIST after it succeeded (a
  retransmitted NFS request); ``PosixStore.create`` trusts the link count, and the store reads
  the version back and compares the token it wrote (an ``add`` must never count twice).
* **Versions are never removed while the store lives** (no compaction).  Exclusive creation
  only excludes names that exist *now*: a removed version's name could be linked again by a
  writer whose listing is stale (it read version k, the log moved on to k+5, versions k+1.. were
  compacted away: its ``link()`` of k+1 succeeds and its ``add`` is lost -- ABA).  Freeing names
  safely needs a monotone floor that every writer re-reads after each create, and reading it
  fresh is exactly what these filesystems do not promise.  Immutable, never-removed versions
  also make every stale read harmless: a version read is the right content, or absent.  The
  store is scoped by its directory and removed as a whole with its generation
  (``fsmingle clean``); it is meant for start-up and control traffic (a few versions per key),
  not per-step traffic.
* **Readers find the newest version by listing** the key's directory (readdir is answered by the
  server when the directory changed), never by looking up a name that may not exist yet (a
  negative lookup cache would answer "absent" for up to a minute).  A key's directory is made
  (``mkdir``, EEXIST is fine) by the first access of each process before it is listed, for the
  same reason.  A process never goes back to an older version than one it has seen or written.
* **Deleting writes a tombstone version**, so a concurrent ``add`` that read the old value
  cannot resurrect it: it loses the ``link()`` of the same version number and retries on top of
  the tombstone (from 0).
* **Waiting costs one listing per key per poll**: ``get``/``wait`` back off from
  ``poll_min`` (2 ms) to ``poll_max`` (0.25 s, jittered ±25 %): a waiting rank costs its metadata
  server 4 READDIRs a second per missing key once backed off (about 8 in its first second),
  nothing else.  The price is latency: a waiter sees a key up to ``poll_max`` after it is set.

Consistency: ``add``, ``compare_set``, ``append``, ``delete_key`` and ``set`` are linearizable.
``get``, ``check``, ``wait``, ``num_keys`` and ``list_keys`` return what the client's directory
cache shows, never older than what this process saw or wrote, and never a value that was not in
the log (a key written once -- the common case in torch -- reads exactly).

Importing this module does not import torch; the ``torch.distributed.Store`` face is
:mod:`fsmingle.fs.folderstore_torch` (built on first use).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import secrets
import time
from collections.abc import Callable, Iterable

from ..errors import CorruptStateError
from .store import UNTRUSTED, Store

__all__ = ["FolderKV", "key_dir"]

VERSION_RE = re.compile(r"^v-(\d{12})$")
KEY_RE = re.compile(r"^(k-[0-9a-f]*|h-[0-9a-f]{64})$")
MAX_HEX_KEY = 100  # bytes of key spelled in hex in the directory name (200 characters + "k-": under NAME_MAX 255)
MAX_RECORD = 1 << 21  # PosixStore.read refuses files over 2 MiB (as untrusted): no version file may be larger
MAX_KEY = 4096  # bytes of a key's UTF-8: its JSON in a version header is at most 6 x that (\uXXXX escapes)
MAX_VALUE = MAX_RECORD - 32 * 1024  # so that the longest key's header (< 25 KiB) always fits beside the value
POLL_MIN = 0.002  # first pause of a waiting get/wait (seconds)
POLL_MAX = 0.25  # longest pause: one listing per missing key per POLL_MAX is what a waiter costs
SCHEMA = 1
LIE_LIMIT = 120.0  # seconds a lookup may keep lying (61 s measured on GlusterFS nl-cache) before "removed"


def check_key(key: str) -> bytes:
    """The UTF-8 bytes of ``key``, refused if longer than :data:`MAX_KEY`.

    Raises:
        ValueError: the key is over ``MAX_KEY`` bytes: every version file carries the key in its
            header and must stay under the record limit (``MAX_RECORD``, 2 MiB) beside a value of
            ``MAX_VALUE`` bytes, or the next read would refuse it as damaged.
        TypeError: the key is not a ``str``.
    """
    if not isinstance(key, str):
        raise TypeError(f"FolderStore keys are str, not {type(key).__name__}")
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_KEY:
        raise ValueError(
            f"FolderStore keys are at most {MAX_KEY} bytes (UTF-8); {key[:40]!r}... has {len(raw)}: every version "
            f"file holds its key, and must stay under the {MAX_RECORD}-byte record limit"
        )
    return raw


def key_dir(key: str) -> str:
    """The directory name of ``key``: its UTF-8 bytes in hex (never a path), hashed when long.

    Hex, not base64: case-insensitive filesystems (SMB exports, some FUSE mounts) would merge
    base64 names that differ only in case.

    Raises:
        ValueError: the key is over :data:`MAX_KEY` bytes (:func:`check_key`).
    """
    raw = check_key(key)
    if len(raw) <= MAX_HEX_KEY:
        return "k-" + raw.hex()
    return "h-" + hashlib.sha256(raw).hexdigest()


def _key_of_dir(name: str) -> str | None:
    """The key a ``k-`` directory names (None for ``h-``: read it from a version)."""
    if name.startswith("k-"):
        return bytes.fromhex(name[2:]).decode("utf-8", "surrogatepass")
    return None


def version_name(n: int) -> str:
    return f"v-{n:012d}"


def _as_bytes(v) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, list):  # torch passes std::vector<uint8_t> as a list of ints in some paths
        return bytes(v)
    raise TypeError(f"store values are bytes or str, not {type(v).__name__}")


class _Version:
    """One immutable version of a key: ``op`` is ``set`` or ``del`` (a tombstone)."""

    __slots__ = ("key", "op", "token", "value")

    def __init__(self, key: str, op: str, token: str, value: bytes):
        self.key, self.op, self.token, self.value = key, op, token, value

    @property
    def live(self) -> bool:
        return self.op == "set"

    def encode(self) -> bytes:
        head = {"schema": SCHEMA, "kind": "kv", "key": self.key, "op": self.op, "token": self.token}
        head["len"] = len(self.value)
        data = json.dumps(head, separators=(",", ":")).encode() + b"\n" + self.value
        if len(data) > MAX_RECORD:  # never reached within MAX_KEY and MAX_VALUE; never written past it
            raise ValueError(f"FolderStore version of {self.key[:40]!r} would be {len(data)} bytes, over {MAX_RECORD}")
        return data

    @classmethod
    def decode(cls, data: bytes, where: str) -> _Version:
        head, sep, value = data.partition(b"\n")
        try:
            h = json.loads(head) if sep else None
            ok = (
                isinstance(h, dict)
                and h.get("schema") == SCHEMA
                and h.get("kind") == "kv"
                and h.get("op") in ("set", "del")
                and isinstance(h.get("key"), str)
                and isinstance(h.get("token"), str)
                and h.get("len") == len(value)
            )
        except ValueError:
            ok = False
        if not ok:
            raise CorruptStateError(f"{where} is not a FolderStore version (damaged or foreign); remove the store")
        return cls(h["key"], h["op"], h["token"], value)


class FolderKV:
    """The store's logic on any :class:`fsmingle.fs.store.Store` (a real directory or the test's fakefs).

    Args:
        store (Store): rooted at the store directory.
        clock: ``monotonic()`` and ``sleep()`` (the module ``time`` by default).
        poll_min, poll_max (float): backoff of waiting reads (seconds).
        rng (random.Random): jitter and tokens (seeded in tests).
    """

    def __init__(self, store: Store, clock=time, poll_min: float = POLL_MIN, poll_max: float = POLL_MAX, rng=None):
        self.store, self.clock = store, clock
        self.poll_min, self.poll_max = poll_min, max(poll_min, poll_max)
        self.rng = rng or random.Random(secrets.randbits(64))
        self._made: set[str] = set()  # key directories this process made or found (mkdir)
        self._seen: dict[str, int] = {}  # key dir -> newest version number this process saw or wrote

    # ------------------------------------------------------------------ reading
    def _keydir(self, key: str) -> str:
        d = key_dir(key)
        if d not in self._made:
            # mkdir before the first listing, EEXIST is fine: a directory looked up before it
            # exists can stay "absent" in a negative lookup cache for a minute, while mkdir goes
            # to the server (PosixStore.mkdir cures a lying lookup after EEXIST: stat_existing).
            self.store.mkdir(d)
            self._made.add(d)
        return d

    def _saw(self, d: str, n: int) -> None:
        # Never lower (torch may call one store from several threads: NCCL's monitor thread).
        if n > self._seen.get(d, 0):
            self._seen[d] = n

    def _listed(self, d: str) -> int:
        """Newest version number a listing of key directory ``d`` shows (0: none), never below one seen."""
        # readdir is answered by the server when the directory changed; a name is never looked
        # up before a listing showed it (negative caches).
        best = 0
        for n in self.store.listdir(d):
            m = VERSION_RE.match(n)
            if m:
                best = max(best, int(m.group(1)))
        return max(best, self._seen.get(d, 0))

    def _read_version(self, d: str, n: int, key: str) -> _Version | None:
        """Version ``n`` of key dir ``d``; None if this client cannot see it yet (lookup lies, ESTALE)."""
        name = f"{d}/{version_name(n)}"
        data = self.store.read(name)  # a fresh open(): close-to-open consistency
        if data is None:
            return None
        if data == UNTRUSTED:
            raise CorruptStateError(f"{self.store.path(name)} is not a file of yours; remove the store")
        v = _Version.decode(data, self.store.path(name))
        if v.key != key:
            raise CorruptStateError(f"{self.store.path(name)} holds key {v.key!r}, not {key!r} (hash collision?)")
        return v

    def _newest(self, key: str, d: str) -> tuple[int, _Version | None]:
        """(number, version) of the newest version a listing shows; (0, None) when there is none.

        Versions are never removed, so a listed version that reads as absent is a lookup that
        lies (a negative cache entry, ESTALE) for a moment: retried with backoff until it shows.
        """
        pause = self.poll_min
        since = self.clock.monotonic()
        while True:
            n = self._listed(d)
            if n == 0:
                return 0, None
            v = self._read_version(d, n, key)
            if v is not None:
                self._saw(d, n)
                return n, v
            self._unreadable(d, n, since)
            self.clock.sleep(pause)
            pause = min(pause * 2, self.poll_max)

    def _unreadable(self, d: str, n: int, since: float) -> None:
        """Version ``n`` exists (listed, or EEXIST) but reads as absent: fine while a lookup may lie."""
        if self.clock.monotonic() - since > LIE_LIMIT:
            raise CorruptStateError(
                f"{self.store.path(d)}/{version_name(n)} exists but has been unreadable for {LIE_LIMIT:g} s: "
                "removed by hand (remove the store), or a client cache that keeps a lost race's ENOENT for "
                "good (GlusterFS nl-cache without upcalls: `fsmingle check` names the fix)"
            )

    def try_get(self, key: str) -> bytes | None:
        """The value of ``key`` now, or None if it is missing (never set, or deleted)."""
        d = self._keydir(key)
        _, v = self._newest(key, d)
        return v.value if v is not None and v.live else None

    def wait_for(self, keys: Iterable[str], timeout: float | None, on_timeout: Callable[[list[str]], Exception]):
        """Block until every key exists; returns their values in order.

        Args:
            timeout (float | None): seconds; None or 0 waits forever (torch's kNoTimeout).
            on_timeout: builds the exception to raise from the keys still missing.
        """
        keys = list(keys)
        found: dict[int, bytes] = {}
        deadline = None if not timeout else self.clock.monotonic() + timeout
        pause = self.poll_min
        while True:
            for i, k in enumerate(keys):
                if i not in found:
                    v = self.try_get(k)
                    if v is not None:
                        found[i] = v
            if len(found) == len(keys):
                return [found[i] for i in range(len(keys))]
            now = self.clock.monotonic()
            if deadline is not None and now >= deadline:
                raise on_timeout([k for i, k in enumerate(keys) if i not in found])
            # Backoff with jitter (mean: the pause): ranks that start waiting together must not
            # poll in lockstep.
            nap = pause * (0.75 + self.rng.random() / 2)
            if deadline is not None:
                nap = min(nap, max(0.0, deadline - now))
            self.clock.sleep(nap)
            pause = min(pause * 2, self.poll_max)

    # ------------------------------------------------------------------ read-modify-write
    def _update(self, key: str, change: Callable[[_Version | None], tuple[str, bytes] | None], blind: bool = False):
        """Apply ``change`` to the newest version of ``key`` atomically; returns (version written or read, wrote).

        ``change(current)`` returns ``(op, value)`` to write, or None to write nothing (the
        result is then ``current``).  Linearizable: the ``link()`` of version k+1 succeeds for
        exactly one writer, and that writer computed it from version k.  ``blind``: ``change``
        ignores the current value (``set``): only its number is needed, from a listing.
        """
        d = self._keydir(key)
        token = secrets.token_hex(8)
        n, cur = (self._listed(d), None) if blind else self._newest(key, d)
        pause = self.poll_min
        lost = 0.001  # backoff after a lost race (see below)
        since = self.clock.monotonic()
        while True:
            want = change(cur if cur is not None and cur.live else None)
            if want is None:
                return cur, False
            op, value = want
            if len(value) > MAX_VALUE:
                raise ValueError(f"FolderStore values are at most {MAX_VALUE} bytes; {key[:40]!r} got {len(value)}")
            new = _Version(key, op, token, value)
            name = f"{d}/{version_name(n + 1)}"
            try:
                made = self.store.create(name, new.encode())
            except FileNotFoundError:
                # link() into the key's directory said ENOENT although mkdir made or found it: a
                # lying lookup of the directory (negative cache, spurious ENOENT), or the store
                # was removed (``fsmingle clean`` of its generation).  mkdir asks the server.
                self._directory_lies(d, since)
                self.clock.sleep(pause)
                pause = min(pause * 2, self.poll_max)
                continue
            if made:
                self._saw(d, n + 1)
                return new, True
            # EEXIST: somebody made version n+1 -- or we did and the reply was lost (a
            # retransmitted LINK answers EEXIST): read it back, and our token says which.
            won = self._read_version(d, n + 1, key)
            if won is not None and won.token == token:
                self._saw(d, n + 1)
                return new, True
            lied = self.clock.monotonic()
            while won is None:
                self._unreadable(d, n + 1, lied)
                # The server said version n+1 exists but this client cannot see it yet (a lying
                # lookup): versions are never removed, so list (a listing links the name into the
                # client's caches) and read it again after a pause; our token still tells whose.
                self.clock.sleep(pause)
                pause = min(pause * 2, self.poll_max)
                self._listed(d)
                won = self._read_version(d, n + 1, key)
            if won.token == token:
                self._saw(d, n + 1)
                return new, True
            # Lost the race.  Under contention (N ranks adding to one counter) every retry at once
            # would mostly lose again, each loss a file write and a link(): back off a random
            # moment, growing with the losses in a row (at most poll_max), as CAS loops do.
            # Measured, 64 ranks adding to one key at once on a local disk: metadata operations
            # per add 102 without backoff, 66 with a 50 ms cap, 39 with 0.25 s, and faster too.
            self.clock.sleep(self.rng.random() * lost)
            lost = min(lost * 2, self.poll_max)
            # Retry on top of the newest version we can see -- the winner's, or a
            # newer one a fresh listing shows (under contention the log may have moved several
            # versions on; walking them one link() at a time would cost a file write each).  A
            # listing may be stale, never a reason to retry below n+1: the next link() is the judge.
            self._saw(d, n + 1)
            n, cur = n + 1, won
            m = self._listed(d)
            if m > n:
                newer = self._read_version(d, m, key)
                if newer is not None:
                    n, cur = m, newer
                    self._saw(d, m)

    def _directory_lies(self, d: str, since: float) -> None:
        """A create in key directory ``d`` failed with ENOENT: raise unless the directory is still there."""
        try:
            made = self.store.mkdir(d)  # goes to the server; EEXIST -> stat_existing cures a lying lookup
        except FileNotFoundError:
            made = None  # the store directory itself is gone, or its lookup lies too
        if made and self._seen.get(d, 0) > 0:
            # Versions we saw are gone: the store was removed under us.  Never write into a fresh
            # directory as if nothing had happened (the chain would restart at version 1).
            raise CorruptStateError(f"{self.store.path(d)} was removed while in use (fsmingle clean of a live store?)")
        if made is None and self.clock.monotonic() - since > LIE_LIMIT:
            raise CorruptStateError(
                f"{self.store.path(d)}: the store directory has been missing for {LIE_LIMIT:g} s; was it removed?"
            )

    def set(self, key: str, value) -> None:
        value = _as_bytes(value)
        self._update(key, lambda cur: ("set", value), blind=True)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer in ``key`` (missing: 0); returns the new value.  Always writes a
        version, even for ``amount == 0`` (torch's barrier reads counters with ``add(k, 0)``, and a read
        from a listing could be stale)."""
        amount = int(amount)
        out = []

        def change(cur):
            base = 0
            if cur is not None:
                try:
                    base = int(cur.value)
                except ValueError:
                    raise ValueError(f"add: the value of {key!r} is not an integer: {cur.value[:40]!r}") from None
            out[:] = [base + amount]
            return "set", str(base + amount).encode()

        self._update(key, change)
        return out[0]

    def compare_set(self, key: str, expected, desired) -> bytes:
        """torch's semantics: missing key -> set ``desired`` if ``expected`` is empty and return it, else
        return ``expected``; present -> set ``desired`` if the value equals ``expected`` and return it,
        else return the current value."""
        expected, desired = _as_bytes(expected), _as_bytes(desired)
        out = []

        def change(cur):
            if cur is None:
                out[:] = [desired if expected == b"" else expected]
                return ("set", desired) if expected == b"" else None
            out[:] = [desired if cur.value == expected else cur.value]
            return ("set", desired) if cur.value == expected else None

        self._update(key, change)
        return out[0]

    def append(self, key: str, value) -> None:
        value = _as_bytes(value)
        self._update(key, lambda cur: ("set", (cur.value if cur is not None else b"") + value))

    def delete(self, key: str) -> bool:
        """Write a tombstone if ``key`` exists; True if it existed."""
        out = [False]

        def change(cur):
            out[0] = cur is not None
            return ("del", b"") if cur is not None else None

        self._update(key, change)
        return out[0]

    def check(self, keys: Iterable[str]) -> bool:
        return all(self.try_get(k) is not None for k in keys)

    def list_keys(self) -> list[str]:
        """Keys that exist now (one listing of the store, one listing and one read per key directory)."""
        out = []
        for name in self.store.listdir(""):
            if not KEY_RE.match(name):
                continue
            key = _key_of_dir(name)
            n = self._listed(name)
            if n == 0:
                continue
            if key is None:  # a hashed name: the key is in every version
                v = self._read_version_any(name, n)
                if v is None:
                    continue
                key = v.key
            self._made.add(name)
            if self.try_get(key) is not None:
                out.append(key)
        return sorted(out)

    def _read_version_any(self, d: str, n: int) -> _Version | None:
        data = self.store.read(f"{d}/{version_name(n)}")
        if not data:
            return None
        return _Version.decode(data, self.store.path(f"{d}/{version_name(n)}"))
