"""``Store.retire`` on a real directory (:mod:`fsmingle.fs.trash`): out of every listing at once, files kept
``keep_for`` seconds, expired trash swept by a later retire -- without listing the root once per retire."""

from __future__ import annotations

import os
import time

from fsmingle.fs import trash
from fsmingle.fs.store import PosixStore


def _trash(root) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith(trash.PREFIX))


def _dirs(root, *names) -> PosixStore:
    for n in names:
        os.makedirs(os.path.join(root, n, "sub"))
        with open(os.path.join(root, n, "sub", "v-1"), "w") as f:
            f.write("x")
    return PosixStore(str(root))


def test_retired_with_nothing_to_keep_is_gone_at_once(tmp_path):
    store = _dirs(tmp_path, "g-1", "g-2", "g-3")
    for n in ("g-1", "g-2", "g-3"):
        assert store.retire(n) is True
    assert store.retire("g-1") is False  # already gone: another retired it
    assert os.listdir(tmp_path) == []  # nothing in the trash either


def test_kept_files_stay_until_their_expiry_then_a_later_retire_sweeps_them(tmp_path):
    store = _dirs(tmp_path, "a", "b", "c")
    assert store.retire("a", keep_for=60.0)
    (kept,) = _trash(tmp_path)
    assert "a" not in os.listdir(tmp_path)  # out of every listing at once
    assert os.path.exists(os.path.join(tmp_path, kept, "sub", "v-1"))  # a stale link() there meets EEXIST
    assert store.retire("b", keep_for=0.2)
    time.sleep(0.3)
    assert store.retire("c", keep_for=0.2)  # b expired 0.1 s ago: a retire that keeps files sweeps
    left = _trash(tmp_path)
    assert kept in left and not any(n.endswith("-b") for n in left), left


def test_a_burst_of_retires_lists_the_root_once(tmp_path, monkeypatch):
    # The cleaner retires up to CLEAN_PER_CALL generations per call: one listing of the root, not one each.
    store = _dirs(tmp_path, *(f"g-{i}" for i in range(8)))
    listed = []
    real = os.listdir
    monkeypatch.setattr(trash.os, "listdir", lambda p: listed.append(p) or real(p))
    for i in range(8):
        assert store.retire(f"g-{i}")
    assert listed.count(str(tmp_path)) <= 1, listed
    assert os.listdir(tmp_path) == []


def test_an_epoch_of_a_key_of_100_bytes_is_retired_and_read_back_from_the_trash(tmp_path):
    """A FolderStore key of 96-100 bytes has a directory name of 194-202 characters (``k-`` and hex): its epoch's trash
    entry, ``.trash-<expiry>-<8 hex>-<key dir>_<epoch>``, would be over NAME_MAX (255), the ``rename()`` failed
    (ENAMETOOLONG, suppressed: a later seal tries again) and the key kept every epoch it ever made.  Now the entry
    ends in the SHA-256 of that name instead: the key keeps epoch 0 and its current epoch, and a version of a
    retired epoch is still found in the trash (``read_kept``).  Before: 14 epochs after 40 sets, nothing in the trash."""
    from fsmingle.fs.folderstore import FolderKV, key_dir

    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    store = PosixStore(str(root))
    kv = FolderKV(store)
    kv.seal_at = 4
    key, kd = "x" * 100, key_dir("x" * 100)
    for i in range(3):  # epoch 0's two versions, then version 1 of epoch 1
        kv.set(key, str(i))
    first = next(e for e in os.listdir(root / kd) if e != "e-000000000000")
    for i in range(3, 40):
        kv.set(key, str(i))
    assert len(kd) == 202 and kv.try_get(key) == b"39"
    assert len(os.listdir(root / kd)) <= 3, os.listdir(root / kd)  # epoch 0, the current one (and one being retired)
    kept = _trash(root)
    assert kept and all(len(n) <= 255 for n in kept), kept
    assert trash.read_kept(store, f"{kd}/{first}/v-000000000001") is not None  # found in the trash by its name
