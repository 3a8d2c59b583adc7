"""Where the participants' rendezvous directories live: a local directory, or bindfs mounts of one
backing directory with per-mount client caches (one FUSE mount per participant up to a limit, like
separate NFS clients).

Modes (``FS_OPTS``):

* ``bindfs``: 1 s attribute/entry/negative caches, no lock forwarding (like NFS with ``local_lock``).
* ``bindfs2``: 2 s caches (issue 30's row: 256 FolderStore ranks on 4 mounts).
* ``bindfs5``: 5 s caches -- issue 11's row "16 participants on 4 mounts with 5 s attribute/entry
  caches" (run it with ``--max-mounts 4``).
* ``bindfs-coherent``: no caches, locks forwarded: NFS with a working lock manager (torch's
  FileStore's best case: it appends to one file under ``flock``).
"""

from __future__ import annotations

import os
import shutil
import subprocess

FS_MODES = ("local", "bindfs", "bindfs5", "bindfs-coherent")
FS_OPTS = {
    "bindfs": "attr_timeout=1,entry_timeout=1,negative_timeout=1",
    "bindfs2": "attr_timeout=2,entry_timeout=2,negative_timeout=2",
    "bindfs5": "attr_timeout=5,entry_timeout=5,negative_timeout=5",
    "bindfs-coherent": "attr_timeout=0,entry_timeout=0,negative_timeout=0,enable-lock-forwarding,"
    "multithreaded,direct_io",
}


def bindfs_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root (per-participant FUSE mounts need root here)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse missing"
    if not shutil.which("bindfs"):
        return "bindfs not installed (apt-get install bindfs fuse3)"
    if not (shutil.which("fusermount3") or shutil.which("fusermount") or shutil.which("umount")):
        return "no fusermount/umount"
    return None


def _unmount(mnt: str) -> None:
    for cmd in (["fusermount3", "-u", mnt], ["fusermount", "-u", mnt], ["umount", "-l", mnt]):
        if shutil.which(cmd[0]):
            r = subprocess.run(cmd, capture_output=True)
            if r.returncode == 0:
                return


class MountSet:
    """One backing directory and M bindfs mounts of it (NFS-like client caches)."""

    def __init__(self, root: str, count: int, opts: str) -> None:
        self.root = root
        self.backing = os.path.join(root, "backing")
        os.makedirs(self.backing, mode=0o700, exist_ok=True)
        self.mounts: list[str] = []
        self.opts = opts
        try:
            for i in range(count):
                mnt = os.path.join(root, f"mnt{i:04d}")
                os.makedirs(mnt, exist_ok=True)
                r = subprocess.run(["bindfs", "-o", self.opts, self.backing, mnt], capture_output=True, text=True)
                if r.returncode != 0:
                    raise RuntimeError(f"bindfs mount {i} failed: {r.stderr.strip()}")
                self.mounts.append(mnt)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for mnt in self.mounts:
            _unmount(mnt)
        self.mounts = []
