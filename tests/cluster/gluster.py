"""GlusterFS: a replica 3 arbiter 1 volume, in two cache profiles."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .fs_base import _FsBackend
from .plumbing import (
    _proc_start_time,
    _sh,
)

if TYPE_CHECKING:
    from .core import Cluster


# GlusterFS volume options per cache profile (gluster(8) `volume set`; values from
# ../shared/notes/real-filesystems.md, where each profile's behaviour was measured):
#   tuned: the small-file tuning Gluster documents -- long md/nl caches kept coherent by
#          upcall invalidation;
#   nfs60: 60 s client caches with upcalls off, the exposure of NFS `actimeo=60`: a name a
#          client looked up before it existed stays ENOENT there for 61 s.
# Both: network.ping-timeout 10 (default 42) so a client cut off by a test gives up sooner.
GLUSTER_PROFILES = {
    "tuned": [
        ("features.cache-invalidation", "on"),
        ("features.cache-invalidation-timeout", "600"),
        ("performance.cache-invalidation", "on"),
        ("performance.md-cache-timeout", "600"),
        ("performance.nl-cache", "on"),
        ("performance.nl-cache-timeout", "600"),
    ],
    "nfs60": [
        ("features.cache-invalidation", "off"),
        ("performance.cache-invalidation", "off"),
        ("performance.md-cache-timeout", "60"),
        ("performance.nl-cache", "on"),
        ("performance.nl-cache-timeout", "60"),
    ],
}
_GLUSTER_COMMON = [("network.ping-timeout", "10")]


class _Gluster(_FsBackend):
    """A ``replica 3 arbiter 1`` GlusterFS volume on three bricks of this machine (glusterd(8),
    gluster(8)).

    Not replica 2: without client quorum (``cluster.quorum-type none``, replica 2's default) a
    client that loses one brick for a moment writes to the other alone, and two clients creating
    the same name then each win on "their" brick -- measured here under heavy load: two of four
    hosts both won ``mkdir`` of one directory and ``link()`` of one claim (a split brain).  Replica
    3 defaults to quorum ``auto`` (2 of 3 bricks), so any two writers share a brick, which
    serializes their creates.  The arbiter brick holds names and metadata only.
    """

    fuse_type = "fuse.glusterfs"

    def __init__(self, cluster: Cluster, profile: str):
        super().__init__(cluster)
        self.profile = profile
        self.fs = f"glusterfs-{profile}"
        self.volume = cluster.prefix

    def start(self) -> None:
        c = self.c
        base = c.workdir / "gluster"
        (base / "b1").mkdir(parents=True)
        (base / "b2").mkdir()
        (base / "arbiter").mkdir()
        # One glusterd per machine, shared with other tests running at the same time: start ours
        # only if none answers; stop it only if we started it and no volume is left (_stop_servers).
        if _sh(["gluster", "volume", "list"], check=False).returncode != 0:
            pidfile = base / "glusterd.pid"
            _sh(["glusterd", "-p", str(pidfile), "--log-level", "WARNING"])
            pid = int(pidfile.read_text().split()[0])
            c._state["glusterd_own"] = [pid, _proc_start_time(pid)]
            c._save()
            deadline = time.monotonic() + 20
            while _sh(["gluster", "volume", "list"], check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise RuntimeError("glusterd did not answer within 20 s")
                time.sleep(0.1)
        c._state["gluster_volume"] = self.volume
        c._save()
        # Bricks named by the bridge address: clients dial the brick host named here, and only
        # the bridge is reachable from a host's network namespace.  `force`: both bricks are on
        # one server and on the root filesystem, which gluster refuses otherwise.
        ip = self.server_ip
        _sh(
            [
                "gluster",
                "--mode=script",
                "volume",
                "create",
                self.volume,
                "replica",
                "3",
                "arbiter",
                "1",
                f"{ip}:{base}/b1",
                f"{ip}:{base}/b2",
                f"{ip}:{base}/arbiter",
                "force",
            ],
            timeout=60,
        )
        for k, v in GLUSTER_PROFILES[self.profile] + _GLUSTER_COMMON:
            # before start and before any client: no live graph switch in the middle of a test
            _sh(["gluster", "--mode=script", "volume", "set", self.volume, k, v], timeout=60)
        _sh(["gluster", "--mode=script", "volume", "start", self.volume], timeout=60)

    def client_argv(self, mnt: str) -> list[str]:
        return ["mount", "-t", "glusterfs", f"{self.server_ip}:/{self.volume}", mnt]

    def diagnostics(self) -> str:
        return "\n" + _sh(["gluster", "volume", "status", self.volume], check=False).stdout
