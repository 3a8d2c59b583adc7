"""A shared filesystem's servers and its per-host FUSE clients: the base class, and bindfs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .plumbing import (
    _fuse_abort,
    _mount_dev_minor,
    _netns_pids,
    _sh,
    _which,
)
from .registry import _stop_servers

if TYPE_CHECKING:
    from .core import Cluster
    from .hosts import Host


PROBE_S = 20.0  # seconds a fresh client may take to create and unlink a file (loaded CI: ~0.1 s measured)
MOUNT_TRIES = 3


class _FsBackend:
    """Servers of one shared filesystem (root namespace, reached at the bridge address) and the
    FUSE client mounts: one per host, run in the host's network namespace (``nsenter --net``
    only, so the mount stays in the root mount namespace where every host's wrapper can bind
    it), plus one in the root namespace at ``cluster.shared`` for the test process."""

    fs = "?"
    fuse_type = "?"

    def __init__(self, cluster: Cluster):
        self.c = cluster

    @property
    def server_ip(self) -> str:
        return f"{self.c.subnet}.1"

    def start(self) -> None:
        raise NotImplementedError

    def client_argv(self, mnt: str) -> list[str]:
        raise NotImplementedError

    def mount(self, mnt: str, netns: str | None) -> list[int]:
        """Mount a client at ``mnt`` (in ``netns``, else the root one); returns its daemon pids."""
        Path(mnt).mkdir(parents=True, exist_ok=True)
        self.c._state["fuse_mounts"].append(mnt)
        self.c._save()
        before = set(_netns_pids(netns)) if netns else set()
        pre = [_which("nsenter"), f"--net=/run/netns/{netns}"] if netns else []
        # Retried for a while: right after a host's link comes back up (Host.link_up) its first
        # connections can still fail ("All subvolumes are down"); the notes measured 1-3 s.
        deadline = time.monotonic() + 20
        while True:
            p = _sh([*pre, *self.client_argv(mnt)], check=False, timeout=60)
            if p.returncode == 0 and _mount_dev_minor(mnt) is not None:
                break
            if _mount_dev_minor(mnt) is not None:  # mounted but the helper failed: start clean
                _fuse_abort(mnt)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.fs} mount at {mnt} failed (rc={p.returncode}): {p.stderr.strip()}" + self.diagnostics()
                )
            time.sleep(0.5)
        return sorted(set(_netns_pids(netns)) - before) if netns else []

    def mount_host(self, host: Host) -> None:
        """Mount ``host``'s client and check that it answers (:meth:`answers`); a client that
        does not is aborted and replaced, up to ``MOUNT_TRIES`` times.

        Why: a mount that is there is not a client that works.  In CI a JuiceFS client of a
        freshly started cluster passed the mount check (its root inode) and then answered the
        first lookup of two hosts with ETIMEDOUT after 150 s -- the harness, not fsmingle, had
        handed the test a dead host (stop 35).  Each replacement prints the backend's logs.

        Raises:
            RuntimeError: no client answered after ``MOUNT_TRIES`` mounts."""
        for attempt in range(1, MOUNT_TRIES + 1):
            host.fuse_pids = self.mount(host.mountpoint, host.netns)
            if self.answers(host.mountpoint):
                return
            msg = f"{self.fs} client of {host.name} did not answer a create within {PROBE_S:g} s (mount {attempt})"
            print(f"[cluster] {msg}; aborting it{self.diagnostics()}", file=sys.stderr, flush=True)
            host.fuse_abort()
        raise RuntimeError(f"{msg}; gave up" + self.diagnostics())

    @staticmethod
    def answers(mnt: str, timeout: float | None = None) -> bool:
        """Whether the client mounted at ``mnt`` completes a metadata round trip -- create, then
        unlink, a probe file (both go to the filesystem's servers) -- within ``timeout`` seconds
        (default ``PROBE_S``).  The probe runs in a child process: a call on a hung FUSE client
        can sleep unkillably once its request was sent (fs/fuse/dev.c ``request_wait_answer``),
        so this process must not make it; a child left stuck is freed when the caller aborts
        the connection (:func:`~.plumbing._fuse_abort`)."""
        probe = subprocess.Popen(
            ["sh", "-c", 'f="$1/.harness-probe-$$" && : >"$f" && rm -f "$f"', "probe", mnt],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            return probe.wait(timeout=PROBE_S if timeout is None else timeout) == 0
        except subprocess.TimeoutExpired:
            probe.kill()  # waited on by nobody if stuck: the abort that follows frees it
            return False

    def stop(self) -> None:
        """Stop the servers (mounts are gone by then)."""
        _stop_servers(self.c._state)

    def stop_clients(self) -> None:
        """End the FUSE clients gracefully before teardown aborts what is left (JuiceFS)."""

    def diagnostics(self) -> str:
        return ""


class _Bindfs(_FsBackend):
    fs = "bindfs"
    fuse_type = "fuse"

    def start(self) -> None:
        pass
