"""An in-memory shared filesystem with bounded staleness, for model-checking the rendezvous policy.

:class:`FakeFS` holds the truth: every file's full history of versions (with
the fake time each became current) and every directory's.  Each simulated node
gets its own :class:`FakeStore` (``fs.view(node)``), an implementation of
:class:`fsmingle.fs.store.Store` that answers the way an NFS client with attribute,
lookup and directory caches may:

* **Reads may be stale, within a bound.**  A view has a ``lag`` (0 ..
  ``fs.max_staleness`` fake seconds, set by the test): ``read`` returns the
  version that was current at ``now - lag`` -- an older version of a file, or a
  removed file still present.  Never older than the bound, and never older than
  what this view already returned (caches do not go backwards).
* **Negative caching.**  "Absent" for a file that exists is answered only if
  this view itself looked the name up and found it missing (a negative dentry),
  and only while the file is younger than the lag.  A view that never looked a
  name up asks the server and sees the file.
* **listdir lags** the same way (the directory as it was at ``now - lag``,
  monotonic per view and directory); a view's own writes refresh its listing
  of that directory (the client invalidates its directory cache).
* **Negative caches of any length** (``view.neg_ttl``, not bounded by the
  staleness bound): a name this view looked up while it did not exist stays
  "absent" for ``neg_ttl`` seconds after the lookup -- ``read`` answers None,
  writes *into* such a directory raise ``FileNotFoundError``, ``listdir`` of
  it answers ``[]`` -- while a listing of its parent shows it at once and
  operations that go to the server (``create``, ``mkdir``) see the truth.
  Measured: 61 s on a GlusterFS client with ``nl-cache`` (see
  ``../shared/notes/real-filesystems.md``).  :meth:`FakeStore.blind` makes
  any existing name (a directory too) answer so for a while: a spurious
  ``ENOENT``.
* ``create`` (exclusive, ``link()``) and ``mkdir`` are **linearisable on the
  truth**, as ``link()`` and ``mkdir`` are on NFSv3+; ``publish`` is an atomic
  replace; ``retire`` removes a whole directory at once.  There is no
  ``O_EXCL`` variant any more: :class:`~fsmingle.fs.store.PosixStore` refuses
  filesystems without hard links.
* **Lost replies** (:meth:`FakeStore.arm_lost_reply`): a ``create`` takes
  effect but returns False, as a ``link()`` whose reply was lost and whose
  retransmission got ``EEXIST`` (NFS over UDP, or a reconnecting TCP mount).
* **Crashes** (:meth:`FakeStore.arm_crash`): the process dies at its k-th store
  operation, before or after the operation takes effect.  A crash inside
  ``publish`` or ``create`` leaves a hidden temporary and either the old or
  the new target, never a partial one.
* **Corruption** (:meth:`FakeFS.corrupt`): a hostile or broken writer replaces
  a file with arbitrary bytes.

:class:`FakeClock` gives each node a monotonic clock with its own offset and a
wall clock skewed by minutes; ``sleep`` advances nothing -- the test advances
``fs.now``.  Everything is deterministic: no randomness, no real time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fsmingle.fs.store import Store

__all__ = ["Crash", "FakeClock", "FakeFS", "FakeStore"]

NEVER = -math.inf


class Crash(BaseException):
    """The simulated process died inside a store operation.

    A ``BaseException`` so that nothing in fsmingle catches it, as nothing
    survives a SIGKILL.
    """


@dataclass(frozen=True)
class Version:
    t: float  # fake time it became current
    data: bytes | None  # None: absent (before creation, or removed)
    writer: str | None = None  # node that wrote it (None: the test, e.g. corruption)


@dataclass(frozen=True)
class Event:
    """One effective mutation of the truth, for the test's invariants."""

    t: float
    node: str | None
    op: str  # publish | create | mkdir | remove | retire | corrupt | tmp
    name: str
    data: bytes | None
    ok: bool  # create/mkdir/retire: whether it took effect


def parent(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else ""


def basename(name: str) -> str:
    return name.rsplit("/", 1)[-1]


class FakeFS:
    """The truth of one shared job directory, and the fake time.

    Args:
        max_staleness (float): the most any view may lag behind the truth
            (negative caches, ``neg_ttl``, are not bounded by it).
    """

    def __init__(self, max_staleness: float = 0.0, *, start: float = 1000.0):
        self.now = float(start)
        self.max_staleness = float(max_staleness)
        self.files: dict[str, list[Version]] = {}
        self.kept: dict[str, bytes] = {}  # a retired file's last content by its old name (Store.retire keep_for)
        self.dirs: dict[str, list[Version]] = {"": [Version(NEVER, b"")]}
        self.children: dict[str, set[str]] = {"": set()}
        self.events: list[Event] = []
        self.listeners: list[Callable[[Event], None]] = []
        self._views: dict[str, FakeStore] = {}
        self._tmp_counter = 0

    # ------------------------------------------------------------------ time
    def advance(self, dt: float) -> None:
        assert dt >= 0
        self.now += dt

    # ------------------------------------------------------------------ views
    def view(self, node: str) -> FakeStore:
        """The store as node ``node`` sees it (one NFS client; shared by its processes)."""
        if node not in self._views:
            self._views[node] = FakeStore(self, node)
        return self._views[node]

    # ------------------------------------------------------------------ truth
    def hist(self, name: str) -> list[Version]:
        h = self.files.get(name)
        if h is None:
            h = self.files[name] = [Version(NEVER, None)]
            self.children.setdefault(parent(name), set()).add(name)
        return h

    def current(self, name: str) -> bytes | None:
        h = self.files.get(name)
        return None if h is None else h[-1].data

    def dir_exists(self, name: str, t: float | None = None) -> bool:
        h = self.dirs.get(name)
        if h is None:
            return False
        if t is None:
            return h[-1].data is not None
        return _at(h, t).data is not None

    def _emit(self, ev: Event) -> None:
        self.events.append(ev)
        for f in list(self.listeners):
            f(ev)

    def write(self, name: str, data: bytes | None, node: str | None, op: str) -> None:
        h = self.hist(name)
        if h[-1].t == self.now and len(h) > 1:
            # two versions at the same instant: keep both, the later one wins at that instant
            pass
        h.append(Version(self.now, data, node))
        self._emit(Event(self.now, node, op, name, data, True))

    def new_tmp(self, directory: str, node: str) -> str:
        self._tmp_counter += 1
        name = (directory + "/" if directory else "") + f".tmp-{node}-{self._tmp_counter}"
        self.write(name, b"", node, "tmp")
        return name

    def mkdir_truth(self, name: str, node: str | None) -> bool:
        if not self.dir_exists(parent(name)):
            raise FileNotFoundError(name)
        if self.dir_exists(name) or self.current(name) is not None:
            self._emit(Event(self.now, node, "mkdir", name, None, False))
            return False
        self.dirs.setdefault(name, [Version(NEVER, None)]).append(Version(self.now, b"", node))
        self.children.setdefault(parent(name), set()).add(name)
        self.children.setdefault(name, set())
        self._emit(Event(self.now, node, "mkdir", name, None, True))
        return True

    def retire_truth(self, name: str, node: str | None) -> bool:
        if not self.dir_exists(name):
            self._emit(Event(self.now, node, "retire", name, None, False))
            return False
        # One atomic rename takes everything below out of view.
        for child in sorted(self.children.get(name, ())):
            if child in self.dirs:
                if self.dir_exists(child):
                    self.retire_truth(child, node)
            elif self.current(child) is not None:
                self.kept[child] = self.current(child)
                self.hist(child).append(Version(self.now, None, node))
        self.dirs[name].append(Version(self.now, None, node))
        self._emit(Event(self.now, node, "retire", name, None, True))
        return True

    def corrupt(self, name: str, data: bytes) -> None:
        """A hostile or broken writer replaces ``name`` (truth) with ``data``."""
        self.write(name, data, None, "corrupt")

    def present_files(self, directory: str | None = None) -> list[str]:
        """Names of files that exist now (truth), optionally only in ``directory``; hidden ones included."""
        names = self.files if directory is None else self.children.get(directory, ())
        return sorted(n for n in names if n in self.files and self.files[n][-1].data is not None)

    def listing(self, directory: str, t: float) -> list[str]:
        """Visible entries of ``directory`` as of time ``t``."""
        if not self.dir_exists(directory, t):
            return []
        out = []
        for child in self.children.get(directory, ()):
            b = basename(child)
            if b.startswith("."):
                continue
            if child in self.dirs:
                if self.dir_exists(child, t):
                    out.append(b)
            elif child in self.files and _at(self.files[child], t).data is not None:
                out.append(b)
        return sorted(out)


def _index_at(h: list[Version], t: float) -> int:
    """Index of the version current at time t (the last one with .t <= t)."""
    i = len(h) - 1
    while i > 0 and h[i].t > t:
        i -= 1
    return i


def _at(h: list[Version], t: float) -> Version:
    return h[_index_at(h, t)]


class FakeStore(Store):
    """One node's view of a :class:`FakeFS` (see the module docstring for the staleness rules).

    Attributes:
        lag (float): how far behind the truth this view answers (clamped to
            ``fs.max_staleness``).
    """

    def __init__(self, fs: FakeFS, node: str):
        self.fs, self.node = fs, node
        self._lag = 0.0
        self.seen: dict[str, int] = {}  # name -> history index last returned (caches never go back)
        self.listed: dict[str, float] = {}  # directory -> truth time of the last listing returned
        self.ops = 0
        self.trace: list[tuple[str, str]] | None = None  # (op, name) of every operation, when a list (enumeration)
        self._crash_at: int | None = None
        self._crash_after_effect = False
        self._crash_exc: Callable[[str], BaseException] | None = None
        self._hook_at: int | None = None
        self._hook: Callable[[], None] | None = None
        self.neg_ttl = 0.0  # seconds a failed lookup keeps answering "absent" (0: only the lag rule)
        self.neg: dict[str, float] = {}  # name -> fake time until which lookups of it fail
        self.sticky: dict[str, float] = {}  # the same, for lies refresh() does not end (blind(sticky=True))
        # A listing ends the negative entries of the names it shows (GlusterFS nl-cache: measured,
        # fsmingle.fs.store.stat_existing); False: they last their neg_ttl (bindfs, NFS lookupcache).
        self.listing_cures = False
        self._lost_reply_at: int | None = None  # creates counted; that one's reply is lost
        self._lost_reply_match: Callable[[str], bool] | None = None
        self.creates = 0
        self.lost_replies: list[str] = []
        # I/O errors that take effect (arm_io_error): the op counter, the armed one, what it matches
        self.io_ops = 0
        self._io_at: int | None = None
        self._io_match: Callable[[str], bool] | None = None
        self._io_ops: tuple[str, ...] = ("create", "publish")
        self._io_after_effect = True
        self._io_blind = 0.0
        self._io_exc: Callable[[str], BaseException] | None = None
        self.io_errors: list[tuple[str, str, bool]] = []  # (op, name, took effect)
        self.io_raised: list[BaseException] = []  # the exceptions raised (the test's oracles know them)
        # directory -> fake time this view's own mkdir created it: a new directory (a new inode on a
        # real server) has no cached history, so nothing below it is read from before then -- not
        # even what an earlier directory of the same name held (retired, then re-created).
        self.born: dict[str, float] = {}
        # A client's own mkdir refreshes its listing of the parent (Linux NFS: the directory's
        # post-operation attributes show the change and its cached listing is dropped).  False: a
        # cache that stays stale even then (tests of the fallback that does not rely on it).
        self.mkdir_refreshes_listing = True
        self.refreshed: set[str] = set()  # names refresh()ed through this view (refresh)

    @property
    def lag(self) -> float:
        return self._lag

    @lag.setter
    def lag(self, value: float) -> None:
        self._lag = max(0.0, min(float(value), self.fs.max_staleness))

    def path(self, name: str) -> str:
        return f"fake://{self.node}/{name}"

    # ------------------------------------------------------------------ crashes
    def arm_crash(
        self, after_ops: int, after_effect: bool = False, exc: Callable[[str], BaseException] | None = None
    ) -> None:
        """Die (raise :class:`Crash`) at the ``after_ops``-th next store operation (0: the next one).

        ``after_effect``: a mutating operation takes effect before the crash
        (for ``create``/``publish`` with ``link()``, leaving the temporary behind).
        ``exc``: raise ``exc(what)`` there instead of :class:`Crash` -- an exception *inside* the
        process (a ``KeyboardInterrupt`` from SIGTERM, a ``StorageError``) that its own handlers
        see (``Participant.run``'s ``except BaseException``), not its death.
        """
        self._crash_at = self.ops + after_ops
        self._crash_after_effect = after_effect
        self._crash_exc = exc

    def _death(self, what: str) -> BaseException:
        exc, self._crash_exc = self._crash_exc, None
        return Crash(what) if exc is None else exc(what)

    def arm_io_error(
        self,
        after_ops: int = 0,
        match: Callable[[str], bool] | None = None,
        *,
        ops: tuple[str, ...] = ("create", "publish"),
        after_effect: bool = True,
        blind_for: float = 0.0,
        exc: Callable[[str], BaseException] | None = None,
    ) -> None:
        """The ``after_ops``-th next ``create`` (``link()``) or ``publish`` (``rename()``) -- or
        ``mkdir``, when ``ops`` names it -- of a name ``match`` accepts fails with EIO -- after taking effect on the server (``after_effect``: a
        soft NFS mount's timeout, a reply lost for good) or before.  :class:`~fsmingle.fs.store.PosixStore`
        turns such an ``OSError`` into :class:`~fsmingle.errors.StorageError` (after ``create``'s link
        count could not prove the link), so that is what is raised unless ``exc`` says otherwise.
        ``blind_for``: the name then reads as absent on this node for that many seconds (the
        failed operation left a negative lookup entry: the read-back finds nothing)."""
        self._io_at = self.io_ops + after_ops
        self._io_match, self._io_ops = match, tuple(ops)
        self._io_after_effect, self._io_blind, self._io_exc = after_effect, blind_for, exc

    def _io_fault(self, op: str, name: str) -> bool:
        """Count one ``op`` on ``name``; True if it is the armed I/O error."""
        if self._io_at is None or op not in self._io_ops or (self._io_match is not None and not self._io_match(name)):
            return False
        n, self.io_ops = self.io_ops, self.io_ops + 1
        if n < self._io_at:
            return False
        self._io_at = None
        return True

    def _io_error(self, op: str, name: str, took_effect: bool) -> BaseException:
        import errno

        from fsmingle.errors import StorageError

        self.io_errors.append((op, name, took_effect))
        if self._io_blind > 0:
            self.blind(name, self._io_blind)
        what = f"cannot {op} {self.path(name)}: Input/output error; check the shared mount on this node"
        if self._io_exc is not None:
            err = self._io_exc(what)
        else:
            err = StorageError(what)
            err.errno = errno.EIO
        self.io_raised.append(err)
        return err

    def arm_hook(self, after_ops: int, fn: Callable[[], None]) -> None:
        """Call ``fn`` just before the ``after_ops``-th next store operation (a preemption point:
        the test runs another process there, modelling true concurrency inside one step)."""
        self._hook_at, self._hook = self.ops + after_ops, fn

    def disarm(self) -> None:
        self._crash_at = None
        self._crash_exc = None
        self._hook_at = self._hook = None

    # ------------------------------------------------------------------ negative caches, lost replies
    def blind(self, name: str, seconds: float, *, sticky: bool = False) -> None:
        """Lookups of ``name`` (and of anything below it) fail for ``seconds`` from now, although it may exist: a
        negative entry, which :meth:`refresh` ends.  ``sticky``: a lie nothing here ends (a cache below the kernel's
        that answers even a revalidating lookup, or a file unlinked by hand that a listing still shows)."""
        table = self.sticky if sticky else self.neg
        table[name] = max(table.get(name, -math.inf), self.fs.now + seconds)

    def hidden(self, name: str) -> bool:
        """True if a lookup of ``name`` or of one of its parent directories is answered "absent" from cache."""
        now = self.fs.now
        while name:
            if max(self.neg.get(name, -math.inf), self.sticky.get(name, -math.inf)) > now:
                return True
            name = parent(name)
        return False

    def neg_remaining(self) -> float:
        """Seconds until every negative entry of this view has expired."""
        return max([0.0, *(t - self.fs.now for t in (*self.neg.values(), *self.sticky.values()))])

    def _remember_absent(self, name: str, is_dir: bool = False) -> None:
        """A lookup that found nothing: the first missing component stays "absent" for ``neg_ttl``."""
        if self.neg_ttl <= 0:
            return
        parts = name.split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            last_file = i == len(parts) and not is_dir
            exists = self.fs.dir_exists(prefix) or (last_file and self.fs.current(prefix) is not None)
            if not exists:
                self.neg[prefix] = max(self.neg.get(prefix, -math.inf), self.fs.now + self.neg_ttl)
                return

    def _forget_absent(self, name: str) -> None:
        self.neg.pop(name, None)

    def arm_lost_reply(
        self, after_creates: int = 0, match: Callable[[str], bool] | None = None, blind_for: float = 0.0
    ) -> None:
        """The ``after_creates``-th next successful ``create`` (of a name ``match`` accepts) takes effect
        but returns False: its reply was lost and the retransmission found the name taken (EEXIST).
        ``blind_for``: the name then reads as absent on this node for that many seconds (the read-back
        after the failed create finds nothing: a negative lookup entry)."""
        self._lost_reply_at = self.creates + after_creates
        self._lost_reply_match = match
        self._lost_reply_blind = blind_for

    def _op(self, op: str = "", name: str = "") -> bool:
        """Count one operation; True if the process dies in it."""
        if self.trace is not None:
            self.trace.append((op, name))
        n = self.ops
        self.ops += 1
        if self._hook is not None and n >= self._hook_at:
            fn, self._hook_at, self._hook = self._hook, None, None
            fn()
        if self._crash_at is not None and n >= self._crash_at:
            self._crash_at = None
            return True
        return False

    # ------------------------------------------------------------------ reads
    def read(self, name: str) -> bytes | None:
        if self._op("read", name):
            raise self._death(f"{self.node} died reading {name}")
        fs = self.fs
        if self.hidden(name):
            return None  # a negative cache entry (ours, or a spurious ENOENT)
        if fs.current(name) is None:
            self._remember_absent(name)
        h = fs.hist(name)
        last = len(h) - 1
        idx = _index_at(h, max(fs.now - self._lag, self.born.get(parent(name), NEVER)))
        seen = self.seen.get(name)
        if seen is not None and seen > idx:
            idx = seen
        # "Absent" although the file exists (later) only from our own negative dentry.
        while h[idx].data is None and idx < last and idx != seen:
            idx += 1
        self.seen[name] = idx
        return h[idx].data

    def listdir(self, name: str = "") -> list[str]:
        if self._op("listdir", name):
            raise self._death(f"{self.node} died listing {name!r}")
        if name and self.hidden(name):
            return []  # opendir() needs a lookup of the directory, which the cache answers "absent"
        if name and not self.fs.dir_exists(name):
            self._remember_absent(name, is_dir=True)
        t = max(self.fs.now - self._lag, self.listed.get(name, NEVER))
        self.listed[name] = t
        names = self.fs.listing(name, t)
        if self.listing_cures:
            for n in names:  # GlusterFS: a listed name's inode is linked, which nl-cache consults first
                self.neg.pop(f"{name}/{n}" if name else n, None)
        return names

    # ------------------------------------------------------------------ writes
    def _wrote(self, name: str) -> None:
        # Read-your-writes, and our directory cache is invalidated by our own change.
        self.seen[name] = len(self.fs.hist(name)) - 1
        self.listed[parent(name)] = self.fs.now
        self._forget_absent(name)

    def _check_parent(self, name: str) -> None:
        if not self.fs.dir_exists(parent(name)) or (parent(name) and self.hidden(parent(name))):
            raise FileNotFoundError(f"{self.path(parent(name))}: no such directory")

    def publish(self, name: str, data: bytes) -> None:
        crash = self._op("publish", name)
        self._check_parent(name)
        if crash and not self._crash_after_effect:
            self.fs.new_tmp(parent(name), self.node)  # written (perhaps partly), never renamed
            raise self._death(f"{self.node} died publishing {name}")
        io = self._io_fault("publish", name)
        if io and not self._io_after_effect:
            raise self._io_error("publish", name, False)
        self.fs.write(name, bytes(data), self.node, "publish")
        self._wrote(name)
        if io:
            raise self._io_error("publish", name, True)
        if crash:
            raise self._death(f"{self.node} died after publishing {name}")

    def create(self, name: str, data: bytes, fsync: bool = True) -> bool:
        # fsync is ignored: this filesystem loses nothing a node wrote when the node crashes
        crash = self._op("create", name)
        self._check_parent(name)
        fs = self.fs
        if fs.current(name) is not None or fs.dir_exists(name):
            fs._emit(Event(fs.now, self.node, "create", name, bytes(data), False))
            if crash:
                raise self._death(f"{self.node} died creating {name} (it existed)")
            return False
        if crash and not self._crash_after_effect:
            fs.new_tmp(parent(name), self.node)  # the unique file, never linked
            raise self._death(f"{self.node} died creating {name}")
        io = self._io_fault("create", name)
        if io and not self._io_after_effect:
            fs.new_tmp(parent(name), self.node)
            raise self._io_error("create", name, False)
        fs.write(name, bytes(data), self.node, "create")
        self._wrote(name)
        if io:
            fs.new_tmp(parent(name), self.node)  # the unique file, its link count unproven
            raise self._io_error("create", name, True)
        if crash:
            fs.new_tmp(parent(name), self.node)  # linked, but the unique name not yet unlinked
            raise self._death(f"{self.node} died after creating {name}")
        if self._lost_reply_at is not None and (self._lost_reply_match is None or self._lost_reply_match(name)):
            n, self.creates = self.creates, self.creates + 1
            if n >= self._lost_reply_at:
                self._lost_reply_at = self._lost_reply_match = None
                self.lost_replies.append(name)
                if getattr(self, "_lost_reply_blind", 0.0) > 0:
                    self.blind(name, self._lost_reply_blind)
                return False  # it took effect; the reply was lost, the retransmission got EEXIST
        return True

    def mkdir(self, name: str) -> bool:
        crash = self._op("mkdir", name)
        if crash and not self._crash_after_effect:
            raise self._death(f"{self.node} died before mkdir {name}")
        if parent(name) and self.hidden(parent(name)):
            raise FileNotFoundError(f"{self.path(parent(name))}: no such directory")
        io = self._io_fault("mkdir", name)  # armed only when ops names "mkdir" (arm_io_error)
        if io and not self._io_after_effect:
            raise self._io_error("mkdir", name, False)
        made = self.fs.mkdir_truth(name, self.node)
        if made:
            self._forget_absent(name)
            self.born[name] = self.listed[name] = self.fs.now
            below = name + "/"
            for n in [n for n in self.seen if n.startswith(below)]:
                del self.seen[n]
        if self.mkdir_refreshes_listing:
            self.listed[parent(name)] = self.fs.now
        if io:
            raise self._io_error("mkdir", name, made)  # GlusterFS: EIO to a racing mkdir that took effect
        if crash:
            raise self._death(f"{self.node} died after mkdir {name}")
        return made

    def remove(self, name: str) -> None:
        crash = self._op("remove", name)
        if crash and not self._crash_after_effect:
            raise self._death(f"{self.node} died before removing {name}")
        if self.fs.current(name) is not None and not self.hidden(name):  # ENOENT from the cache: ignored
            self.fs.write(name, None, self.node, "remove")
            self._wrote(name)
        if crash:
            raise self._death(f"{self.node} died after removing {name}")

    def refresh(self, name: str) -> bool:
        """As :meth:`PosixStore.refresh <fsmingle.fs.store.PosixStore.refresh>`: an exclusive ``mkdir`` of ``name``,
        whose lookup is always fresh (``LOOKUP_EXCL``): this view's negative entry of the name is dropped and the
        server answers EEXIST if it exists.  Once per name and view (False after), as the real one per process.
        A free name in a directory still in place raises ``CorruptStateError`` (the real one's ``mkdir`` succeeded).
        """
        if name in self.refreshed:
            return False
        self.refreshed.add(name)
        crash = self._op("refresh", name)  # on a name that exists it changes nothing: before or after is alike
        if crash:
            raise self._death(f"{self.node} died refreshing {name}")
        if (parent(name) and self.hidden(parent(name))) or not self.fs.dir_exists(parent(name)):
            return True  # ENOENT: the path walk to the parent fails (from the cache, or the directory went)
        self._forget_absent(name)
        if self.fs.current(name) is None and not self.fs.dir_exists(name):
            # The mkdir succeeded (undone at once: nothing stays in the truth) in a directory still in place.
            from fsmingle.errors import CorruptStateError

            raise CorruptStateError(f"{self.path(name)} was missing, though it existed; remove the store")
        if name in self.fs.files:
            self.seen[name] = len(self.fs.files[name]) - 1  # a positive dentry: the next open reads what is there
        return True  # EEXIST

    def dir_signature(self, name: str) -> tuple | None:
        """As :meth:`PosixStore.dir_signature <fsmingle.fs.store.PosixStore.dir_signature>` (``statx`` forced past the
        attribute cache): the directory's incarnation, a change counter of its entries (NFSv4's change attribute;
        hidden ones too) and how many it holds, from the truth; None if gone or hidden from this view."""
        if self._op("stat", name):
            raise self._death(f"{self.node} died in a stat of {name}")
        fs = self.fs
        if (name and self.hidden(name)) or not fs.dir_exists(name):
            return None
        changes = present = 0
        for child in fs.children.get(name, ()):
            h = fs.dirs[child] if child in fs.dirs else fs.files.get(child, [])
            changes += len(h)
            present += bool(h) and h[-1].data is not None
        return (fs.dirs[name][-1].t, changes, present)

    def read_retired(self, name: str) -> bytes | None:
        # What PosixStore finds in the store's trash (files kept ``keep_for``): here kept for the whole run.
        return self.fs.kept.get(name)

    def retire(self, name: str, keep_for: float = 0.0) -> bool:
        # keep_for changes nothing here: the model's lookups go by path (as bindfs and CephFS), so a
        # renamed directory is unreachable at once; the realfs test checks inode-caching clients.
        crash = self._op("retire", name)
        if crash and not self._crash_after_effect:
            raise self._death(f"{self.node} died before retiring {name}")
        gone = False if self.hidden(name) else self.fs.retire_truth(name, self.node)
        self.listed[parent(name)] = self.fs.now
        if crash:
            raise self._death(f"{self.node} died after retiring {name}")
        return gone


class FakeClock:
    """A node's clocks on the fake time of ``fs``.

    ``monotonic()`` is ``fs.now`` plus a per-node offset (monotonic clocks of
    different machines share no origin); ``time()`` is a wall clock skewed by
    ``skew`` seconds (minutes, on badly synchronised clusters).  ``sleep``
    records the request and advances nothing: the test moves time.
    """

    def __init__(self, fs: FakeFS, mono_offset: float = 0.0, skew: float = 0.0):
        self.fs, self.mono_offset, self.skew = fs, mono_offset, skew
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.fs.now + self.mono_offset

    def time(self) -> float:
        return 1.7e9 + self.fs.now + self.skew

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.slept += seconds


class AdvancingClock:
    """A clock on the fake time of ``fs`` whose ``sleep`` advances that time (at least 0.1 ms): a
    blocking loop makes progress, caches and lags expire -- for one process's sequential code
    (the adversaries' enumerations, the linearizability model)."""

    def __init__(self, fs: FakeFS):
        self.fs = fs

    def monotonic(self) -> float:
        return self.fs.now

    def sleep(self, s: float) -> None:
        self.fs.advance(max(s, 1e-4))


class CountingListings:
    """Wraps a FakeStore view's ``listdir`` (from now on): ``n`` counts its listings, ``root`` those of the
    store's root (the job directory)."""

    def __init__(self, view: FakeStore):
        self.n = self.root = 0
        self._list = view.listdir
        view.listdir = self

    def __call__(self, name: str = ""):
        self.n += 1
        self.root += name == ""
        return self._list(name)
