"""CephFS: a monitor, a memstore OSD and an MDS from plain daemons; ceph-fuse clients."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .fs_base import _FsBackend
from .plumbing import (
    _free_port_block,
    _pids_with_arg,
    _sh,
    _which,
)

if TYPE_CHECKING:
    pass


# CephFS file system settings (`ceph fs set cephfs KEY VALUE`).  session_timeout 30 (default 60,
# and the least the monitor accepts: "session_timeout must be at least 30s"): the MDS evicts a
# client that stopped renewing its session after this long, and until then the capabilities it
# holds block every other client that needs them -- a host whose link goes down stalls the
# others' reads of its files (measured: released 61-71 s after the link went down with 60).  30
# keeps that test shorter, like GlusterFS's network.ping-timeout 10.
CEPH_FS_SETTINGS = [("session_timeout", "30")]


class _CephFS(_FsBackend):
    """A minimal CephFS from plain daemons (no cephadm, no containers; Ceph 16.2 from Debian): one
    monitor, one OSD on memstore (RAM, no block device), one MDS, ``auth none``, on ports of its
    own at the bridge address; one ``ceph-fuse`` per host (this VM's kernel has no ceph client).

    No manager: CephFS creates, mounts and serves without one (measured: mds ``up:active`` and
    every realfs scenario pass), and ``ceph-mgr`` is 300 MB of the 470 MB the notes measured.
    Traps (../shared/notes/cephfs.md): each client needs its own ``--id`` (two with one name
    share an admin socket and pid file, and the second mount silently does not happen); the
    monitor must be named by the bridge address (a host's netns cannot reach 127.0.0.1); osd and
    mds ignore SIGTERM for seconds once the monitor is gone, so teardown SIGKILLs every process
    whose command line names this cluster's ceph.conf (memstore: nothing to save).
    """

    fs = "cephfs"
    fuse_type = "fuse.ceph-fuse"

    def ceph(self, *args: str, timeout: float = 60) -> str:
        """Run the ``ceph`` CLI against this cluster; its stdout."""
        return _sh(["ceph", "-c", str(self.conf), "--connect-timeout", "20", *args], timeout=timeout).stdout

    def start(self) -> None:
        import uuid

        c = self.c
        b = c.workdir / "ceph"
        for d in ("mon", "osd", "mds", "log", "run"):
            (b / d).mkdir(parents=True)
        self.base, self.conf = b, b / "ceph.conf"
        self.port = _free_port_block(1)  # not 6789: a cluster still exiting (or another run's) holds it
        ip, fsid = self.server_ip, str(uuid.uuid4())
        self.conf.write_text(
            "\n".join(
                [
                    "[global]",
                    f"fsid = {fsid}",
                    f"mon host = {ip}:{self.port}",
                    "mon initial members = a",
                    # daemons advertise an address in the bridge's subnet: the one hosts can reach
                    f"public network = {c.subnet}.0/24",
                    "auth cluster required = none",
                    "auth service required = none",
                    "auth client required = none",
                    "osd pool default size = 1",
                    "osd pool default min size = 1",
                    "mon allow pool size one = true",
                    "mon warn on pool no redundancy = false",
                    "osd objectstore = memstore",
                    "memstore device bytes = 536870912",
                    "osd crush chooseleaf type = 0",
                    f"osd data = {b}/osd",
                    f"mon data = {b}/mon",
                    f"mds data = {b}/mds",
                    f"log file = {b}/log/$name.log",
                    f"run dir = {b}/run",
                    f"admin socket = {b}/run/$name.asok",
                    f"pid file = {b}/run/$name.pid",
                    "ms bind ipv4 = true",
                    "ms bind ipv6 = false",
                ]
            )
            + "\n"
        )
        # every process of this cluster names this conf: teardown finds them by it (_stop_servers)
        c._state["ceph_conf"] = str(self.conf)
        c._save()
        cf = ["-c", str(self.conf)]
        _sh(["monmaptool", "--create", "--add", "a", f"{ip}:{self.port}", "--fsid", fsid, str(b / "monmap")])
        _sh(["ceph-mon", *cf, "--mkfs", "-i", "a", "--monmap", str(b / "monmap")], timeout=60)
        self._daemon("ceph-mon", *cf, "-i", "a")
        osd = self.ceph("osd", "create").strip()  # waits for the monitor; "0" on a new cluster
        _sh(["ceph-osd", *cf, "-i", osd, "--mkfs", "--osd-uuid", str(uuid.uuid4())], timeout=60)
        self._daemon("ceph-osd", *cf, "-i", osd)
        self._daemon("ceph-mds", *cf, "-i", "a")
        self.ceph("osd", "pool", "create", "cephfs_data", "8")
        self.ceph("osd", "pool", "create", "cephfs_meta", "8")
        self.ceph("fs", "new", "cephfs", "cephfs_meta", "cephfs_data")
        for k, v in CEPH_FS_SETTINGS:
            self.ceph("fs", "set", "cephfs", k, v)
        deadline = time.monotonic() + 60
        while "up:active" not in self.ceph("mds", "stat"):
            if time.monotonic() > deadline:
                raise RuntimeError("ceph mds not up:active after 60 s" + self.diagnostics())
            time.sleep(0.2)

    def _daemon(self, name: str, *args: str) -> None:
        # -f: foreground, so the pid we track is the daemon's (it still logs to its log file)
        d = subprocess.Popen(
            [_which(name), "-f", *args],
            stdin=subprocess.DEVNULL,
            stdout=open(self.base / "log" / f"{name}.out", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.c.track_pid(d.pid)
        self.c._daemons.append(d)

    def mount(self, mnt: str, netns: str | None) -> list[int]:
        # ceph-fuse daemonizes: of the processes that appeared in the netns keep the daemon (its
        # command line names our conf), not its parent or helpers that have exited since
        return [p for p in super().mount(mnt, netns) if p in _pids_with_arg(str(self.conf))]

    def client_argv(self, mnt: str) -> list[str]:
        # Its own client name per mount (trap above): the mount point's last two parts, unique here.
        name = re.sub(r"[^A-Za-z0-9]", "", "".join(Path(mnt).parts[-2:]))
        self._nclient = getattr(self, "_nclient", 0) + 1
        return ["ceph-fuse", "-c", str(self.conf), "--id", f"{name}{self._nclient}", mnt]

    def diagnostics(self) -> str:
        return "".join(
            f"\n--- {n.name}\n" + n.read_text(errors="replace")[-2000:] for n in sorted((self.base / "log").glob("*"))
        )
