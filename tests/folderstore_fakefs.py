"""FolderStores over :mod:`fakefs` for the FolderStore model tests (``test_folderstore.py``,
``test_folderstore_keys.py``): :func:`lagging_stores`, one :class:`~fsmingle.fs.folderstore.FolderKV` per node
on one fake filesystem whose views' listings lag."""

from __future__ import annotations

from fakefs import AdvancingClock, FakeFS

from fsmingle.fs.folderstore import FolderKV


def lagging_stores(lags: list[float], seal_at: int):
    """A fake filesystem, one view per lag (seconds its listings may lag) and a FolderKV on each, sealing every
    ``seal_at`` versions: (fs, views, kvs)."""
    fs = FakeFS(max_staleness=3.0)
    views = [fs.view(f"n{i}") for i in range(len(lags))]
    for v, lag in zip(views, lags):
        v.lag = lag
    fs.mkdir_truth("", None)
    kvs = [FolderKV(v, clock=AdvancingClock(fs), poll_max=0.5) for v in views]
    for kv in kvs:
        kv.seal_at = kv.seal_first = seal_at  # a counter's first epoch too (its creating add names it)
    return fs, views, kvs
