"""MooseFS: one master and one chunkserver on a tmpfs."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from typing import TYPE_CHECKING

from .fs_base import _FsBackend
from .plumbing import (
    _free_port_block,
    _sh,
    _which,
)

if TYPE_CHECKING:
    pass


# mfsmount cache options: 1 s attribute/entry/negative caches (mfsmount(8)); the notes measured
# that the negative cache holds exactly this long.
MFS_MOUNT_OPTS = "mfsattrcacheto=1,mfsentrycacheto=1,mfsnegentrycacheto=1"


class _MooseFS(_FsBackend):
    """One mfsmaster and one mfschunkserver (1 GiB tmpfs), on ports of their own."""

    fs = "moosefs"
    fuse_type = "fuse"

    def start(self) -> None:
        c = self.c
        b = c.workdir / "mfs"
        for d in ("master", "cs", "hdd"):
            (b / d).mkdir(parents=True)
        c._state["tmpfs"].append(str(b / "hdd"))
        c._save()
        _sh(["mount", "-t", "tmpfs", "-o", "size=1g", f"{c.prefix}mfs", str(b / "hdd")])
        shutil.copy("/var/lib/mfs/metadata.mfs.empty", b / "master" / "metadata.mfs")  # a new master needs it
        p = _free_port_block(4)  # master: p, p+1 (chunkservers), p+2 (clients); chunkserver: p+3
        self.port = p + 2
        # root: the default user mfs cannot write a root-owned DATA_PATH; nice 0 spares the cores
        common = ["WORKING_USER = root", "WORKING_GROUP = root", "NICE_LEVEL = 0"]
        (b / "master.cfg").write_text(
            "\n".join(
                common
                + [
                    f"DATA_PATH = {b}/master",
                    f"EXPORTS_FILENAME = {b}/exports.cfg",
                    f"MATOML_LISTEN_PORT = {p}",
                    f"MATOCS_LISTEN_PORT = {p + 1}",
                    f"MATOCL_LISTEN_PORT = {p + 2}",
                    # replaced files' chunks go faster (default trash time is 24 h; set to 0 below)
                    "CHUNKS_LOOP_MIN_TIME = 10",
                    "CHUNKS_SOFT_DEL_LIMIT = 1000",
                    "CHUNKS_HARD_DEL_LIMIT = 2000",
                ]
            )
            + "\n"
        )
        (b / "exports.cfg").write_text("* / rw,alldirs,admin,maproot=0:0\n")
        # MASTER_HOST not loopback: the chunkserver refuses 127.0.0.1, and clients reach it there
        (b / "cs.cfg").write_text(
            "\n".join(
                common
                + [
                    f"DATA_PATH = {b}/cs",
                    f"HDD_CONF_FILENAME = {b}/hdd.cfg",
                    f"MASTER_HOST = {self.server_ip}",
                    f"MASTER_PORT = {p + 1}",
                    f"CSSERV_LISTEN_PORT = {p + 3}",
                ]
            )
            + "\n"
        )
        (b / "hdd.cfg").write_text(f"{b}/hdd\n")
        for name, cfg in (("mfsmaster", "master.cfg"), ("mfschunkserver", "cs.cfg")):
            d = subprocess.Popen(
                [_which(name), "-f", "-c", str(b / cfg), "start"],
                stdin=subprocess.DEVNULL,
                stdout=open(b / f"{name}.log", "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            c.track_pid(d.pid)
            c._daemons.append(d)
        self.base = b
        import socket

        deadline = time.monotonic() + 30  # -f: the daemons start in the background of our Popen
        while True:
            with socket.socket() as sk, contextlib.suppress(OSError):
                sk.settimeout(1)
                sk.connect((self.server_ip, self.port))
                break
            if time.monotonic() > deadline:
                raise RuntimeError("mfsmaster is not listening after 30 s" + self.diagnostics())
            time.sleep(0.1)

    def mount(self, mnt: str, netns: str | None) -> list[int]:
        pids = super().mount(mnt, netns)
        # The chunkserver registers ~2 s after start; until then the size is 0 and writes block.
        deadline = time.monotonic() + 30
        while os.statvfs(mnt).f_blocks == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("MooseFS chunkserver did not register within 30 s" + self.diagnostics())
            time.sleep(0.1)
        if netns is None:
            # default trash time 24 h: every replaced beacon's chunks would stay and fill the tmpfs
            _sh(["mfssettrashtime", "-r", "0", mnt], check=False)
        return pids

    def client_argv(self, mnt: str) -> list[str]:
        return ["mfsmount", "-H", self.server_ip, "-P", str(self.port), "-o", MFS_MOUNT_OPTS, mnt]

    def diagnostics(self) -> str:
        return "".join(
            f"\n--- {n}\n" + (self.base / n).read_text(errors="replace")[-2000:]
            for n in ("mfsmaster.log", "mfschunkserver.log")
            if (self.base / n).exists()
        )
