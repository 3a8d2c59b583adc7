"""What the tests of FolderStore's delta ``add`` on a real directory share (``test_adversary_adds.py``,
``test_adversary_settle.py``): a store per "host", the store's directory, and ``os`` shims that put a fault into the
system calls the real path makes (fakefs never runs it: it is not a ``PosixStore``)."""

from __future__ import annotations

import errno
import os

import pytest

from fsmingle.fs import folderstore_add as fa
from fsmingle.fs.folderstore import FolderKV
from fsmingle.fs.store import PosixStore


def kv_at(root, seal_at, **kw) -> FolderKV:
    """A FolderKV on ``root`` (one "host") whose epochs seal at ``seal_at`` versions."""
    kv = FolderKV(PosixStore(str(root)), **kw)
    kv.seal_at = kv.seal_first = seal_at  # a counter's first epoch too (its creating add names it)
    return kv


@pytest.fixture
def root(tmp_path):
    d = tmp_path / "store"
    d.mkdir(mode=0o700)
    return d


class Os:
    """``os`` for a store module: the real one, but for what a subclass overrides (``link``, ``stat``, ``open``)."""

    def __getattr__(self, name):
        return getattr(os, name)


def eio_once(tries: list, hidden: bool = False, where: str = "/v-") -> Os:
    """``os`` whose first ``link()`` of a version (a name containing ``where``) takes effect and answers EIO (a soft
    mount's timeout after the server linked); every later ``link()`` is real.  ``tries``: every version ``link()``.
    ``hidden``: the version so linked first stays unreadable (a lookup that lies: GlusterFS nl-cache), for a shim
    installed as the store module's ``os`` too."""

    class EioOnce(Os):
        def link(self, src, dst):
            os.link(src, dst)
            if where in dst:
                tries.append(dst)
                if len(tries) == 1:
                    raise OSError(errno.EIO, "Input/output error (after the effect)", dst)

        def open(self, path, flags, *args, **kw):
            if hidden and tries and str(path) == tries[0] and not flags & os.O_CREAT:
                raise FileNotFoundError(errno.ENOENT, "No such file (a lookup that lies)", path)
            return os.open(path, flags, *args, **kw)

    return EioOnce()


def eio_then_retired(monkeypatch, b: FolderKV, tries: list, retired: list | None = None) -> Os:
    """``os`` for folderstore_add whose first ``link()`` of a version takes effect and answers EIO (a soft mount's
    timeout); before the retry, ``b``'s adds of 1000 seal and retire the epoch, so the retry answers ENOENT and only
    the trash can tell whose the retired version is.  ``tries``: every version ``link()``; ``retired``: the epoch."""

    class EioThenRetired(Os):
        def link(self, src, dst):
            if "/v-" not in dst:
                return os.link(src, dst)
            tries.append(dst)
            if len(tries) == 1:
                os.link(src, dst)
                raise OSError(errno.EIO, "Input/output error (after the effect)", dst)
            if len(tries) > 2:
                return os.link(src, dst)  # a later try (code with the hole: in the next epoch)
            epoch = os.path.dirname(dst)
            monkeypatch.setattr(fa, "os", os)  # B on the real os
            while os.path.isdir(epoch):
                b.add("k", 1000)
            monkeypatch.setattr(fa, "os", self)
            if retired is not None:
                retired.append(epoch)
            return os.link(src, dst)

    return EioThenRetired()
