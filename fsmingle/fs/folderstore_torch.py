"""``fsmingle.FolderStore``: the ``torch.distributed.Store`` face of :class:`~fsmingle.fs.folderstore.FolderKV`.

The class is built on first use (:func:`folder_store_class`), so that importing fsmingle never
imports torch; :func:`open_store_dir` makes and checks the store's directory.  The rules of the
store itself (versions, exclusive ``link()``, listings) are in :mod:`fsmingle.fs.folderstore`.
"""

from __future__ import annotations

import os
from datetime import timedelta

from .folderstore import LIE_LIMIT, POLL_MAX, FolderKV
from .jobdir import check_owned_dir, negative_lookup_cache_warning
from .store import PosixStore

__all__ = ["folder_store_class", "open_store_dir"]


def open_store_dir(path: str) -> PosixStore:
    """Create the store directory ``path`` (owner-only) if needed, check it is ours, and return its store.

    Its parent must exist (a missing mount must fail at once, not make a directory on a node's
    local disk).
    """
    path = os.path.abspath(os.fspath(path))
    parent = PosixStore(os.path.dirname(path))
    if not os.path.isdir(parent.root):
        from ..errors import StorageError

        raise StorageError(f"FolderStore {path}: its parent {parent.root} does not exist; is the shared mount there?")
    # mkdir is atomic and exclusive; EEXIST is fine (another rank made it) and PosixStore.mkdir then
    # makes sure a negative lookup cache does not hide it (stat_existing) and that it is ours.
    parent.mkdir(os.path.basename(path))
    check_owned_dir(path, what="FolderStore directory")
    # A FolderStore reads other ranks' versions by name: a client cache that keeps a lost race's
    # ENOENT (GlusterFS nl-cache without upcalls) can stall it.  Say so once, with the fix.
    negative_lookup_cache_warning(path)
    return PosixStore(path)


_CLASS = None
_LIVE: list = []  # every FolderStore made in this process (see FolderStore.__init__)


def folder_store_class():
    """The ``torch.distributed.Store`` subclass (built on first use, so that importing fsmingle never imports torch)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import torch.distributed as dist

    class FolderStore(dist.Store):
        """A ``torch.distributed.Store`` kept in a shared directory: one subdirectory per key, one
        immutable file per version, every read-modify-write an exclusive ``link()``.  Needs no
        server, no port and no ``flock``.  See :mod:`fsmingle.fs.folderstore` and ``docs/folderstore.md``.

        Args:
            path (str): the store directory, unique to this run (``Rendezvous.folder_store()`` gives
                ``<dir>/<job>/gen-N/store``); created owner-only if missing, its parent must exist.
            world_size (int | None): processes of the job (None or < 1: unknown); only how often a young
                ``wait`` looks depends on it (``folderstore_wait.fast_pause``: 255 waiters of a 256-rank barrier
                must not each poll every 10 ms on 2 cores).
            timeout (timedelta): default timeout of ``get`` and ``wait`` (``set_timeout`` changes it).
            poll_max (float): longest pause between two looks of a waiting ``get``/``wait`` (seconds).
            retire_grace (float): seconds a compacted key's old versions are kept before they are
                deleted (longer than any client's entry cache: ``docs/folderstore.md``, compaction).
        """

        def __init__(
            self,
            path,
            world_size=None,
            timeout=timedelta(seconds=300),
            poll_max: float = POLL_MAX,
            retire_grace: float = LIE_LIMIT,
        ):
            super().__init__()
            self.path = os.path.abspath(os.fspath(path))
            self.world_size = world_size
            # torch 2.13 keeps only the C++ half of a Python store that C++ holds (a PrefixStore
            # around it, a clone, the agent's store): once Python drops its last reference, every
            # call from C++ fails "Not implemented" (init.cpp).  So a FolderStore lives as long as
            # the process: a few small objects per process (one per generation or round).
            _LIVE.append(self)
            self.set_timeout(timeout)
            # Every operation keeps the store's timeout (set_timeout included): set/add/compare_set
            # too, and a version that stays unreadable says why in the DistStoreError.
            self._kv = FolderKV(
                open_store_dir(self.path),
                poll_max=poll_max,
                timeout=self._seconds,
                timeout_error=self._store_error,
                retire_grace=retire_grace,
                crowd=world_size or 1,  # None: unknown; FolderKV takes any crowd < 1 as 1
            )

        def __repr__(self):
            return f"FolderStore({self.path!r})"

        def _store_error(self, msg: str):
            return dist.DistStoreError(f"FolderStore {self.path}: {msg}")

        def _timeout_error(self, what: str, secs: float):
            def make(missing):
                return dist.DistStoreError(
                    f"FolderStore {self.path}: Timeout after {secs:g} s waiting for {what} {missing[:8]}"
                    + (f" (and {len(missing) - 8} more)" if len(missing) > 8 else "")
                )

            return make

        def _seconds(self, timeout=None) -> float:
            t = self.timeout if timeout is None else timeout
            return t.total_seconds() if isinstance(t, timedelta) else float(t)

        def _wait(self, keys, timeout, what):
            secs = self._seconds(timeout)
            return self._kv.wait_for(keys, secs, self._timeout_error(what, secs))

        def clone(self):
            """A new client of the same store directory (torch clones stores for other threads)."""
            return type(self)(self.path, self.world_size, self.timeout, self._kv.poll_max)  # kept alive: _LIVE

        def set(self, key, value):
            self._kv.set(key, value)

        def get(self, key):
            return self._wait([key], None, "key")[0]

        def add(self, key, value):
            return self._kv.add(key, value)

        def compare_set(self, key, expected_value, desired_value):
            return self._kv.compare_set(key, expected_value, desired_value)

        def append(self, key, value):
            self._kv.append(key, value)

        def wait(self, keys, timeout=None):
            self._wait(keys, timeout, "keys")

        def check(self, keys):
            return self._kv.check(keys)

        def delete_key(self, key):
            return self._kv.delete(key)

        def num_keys(self):
            return len(self._kv.list_keys())

        def list_keys(self):
            return self._kv.list_keys()

        def multi_get(self, keys):
            return self._wait(keys, None, "keys")

        def multi_set(self, keys, values):
            if len(keys) != len(values):
                raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")
            for k, v in zip(keys, values):
                self._kv.set(k, v)

        def has_extended_api(self):
            return True  # append, multi_get and multi_set are implemented

        # torch's C++ trampoline looks these two up by their C++ names (torch 2.13: a Python store
        # that only defines delete_key/num_keys fails "pure virtual" when called from C++).
        deleteKey = delete_key
        getNumKeys = num_keys

    FolderStore.__module__ = __name__
    FolderStore.__qualname__ = "FolderStore"
    _CLASS = FolderStore
    return FolderStore


def __getattr__(name):
    if name == "FolderStore":
        return folder_store_class()
    raise AttributeError(name)
