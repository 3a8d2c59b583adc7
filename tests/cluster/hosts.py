"""A host of the cluster: a network namespace, its hostname and mounts, its pid namespace."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .plumbing import (
    _PIDNS_INIT,
    _env,
    _fuse_abort,
    _kill_all,
    _mount_dev_minor,
    _netns_pids,
    _proc_state,
    _sh,
    _which,
)

if TYPE_CHECKING:
    from .core import Cluster
    from .hosts import Host


# sh script run inside "nsenter --net unshare --uts --mount": $1 hostname, $2 per-host
# mount (or ""), $3 common path, $4 hosts file, $5 resolv.conf (or ""), $6 cwd.
# The cwd is entered AFTER the bind mounts, otherwise a cwd under the common path
# would point at the directory underneath the mount.
_WRAP = (
    'set -e; hostname "$1"; '
    'if [ -n "$2" ]; then mount --bind "$2" "$3"; fi; '
    'mount --bind "$4" /etc/hosts; '
    'if [ -n "$5" ]; then mount --bind "$5" /etc/resolv.conf; fi; '
    # $7 = 1: the process runs in the host's pid namespace; a /proc of that namespace makes
    # `ps`, psutil and /proc/<pid> lookups see the host's processes only, by their host pids.
    'if [ "$7" = 1 ]; then mount -t proc proc /proc; fi; '
    'cd -- "$6"; shift 7; exec "$@"'
)


class Host:
    """One host: a network namespace + private hostname/mounts for its processes."""

    def __init__(self, cluster: Cluster, name: str, ip: str, netns: str, veth: str, mountpoint: str | None):
        self.cluster = cluster
        self.name = name
        self.ip = ip
        self.netns = netns
        self.veth = veth  # root-namespace end of the veth pair
        self.mountpoint = mountpoint  # this host's bindfs view (root namespace path)
        self.tmpdir = str(cluster.workdir / "tmp" / name)
        self._procs: list[subprocess.Popen] = []
        self._init: subprocess.Popen | None = None  # `unshare --pid` holding the host's pid namespace
        self.init_pid: int | None = None  # pid 1 of the host's pid namespace, as the root namespace sees it
        self.fuse_pids: list[int] = []  # this host's FUSE client daemons (real filesystems)

    def __repr__(self) -> str:
        return f"<Host {self.name} {self.ip} netns={self.netns}>"

    # -- command construction
    def wrap(self, argv: Sequence[str], cwd: str | os.PathLike | None = None) -> list[str]:
        """argv that runs ``argv`` on this host (netns + private UTS/mount ns)."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a sequence; use host.sh('...') for shell text")
        c = self.cluster
        pidns = [f"--pid=/proc/{self.init_pid}/ns/pid"] if self.init_pid else []
        return [
            _which("nsenter"),
            f"--net=/run/netns/{self.netns}",
            *pidns,
            _which("unshare"),
            "--uts",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _WRAP,
            "fsm-host",
            self.name,
            self.mountpoint or "",
            c.shared,
            str(c.hosts_file),
            str(c.resolv_file) if c.resolv_file else "",
            str(cwd if cwd is not None else c.default_cwd),
            "1" if self.init_pid else "0",
            *map(str, argv),
        ]

    def env(self, env: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """The environment a host process gets: os.environ (minus SLURM_*), python bin
        first on PATH, TMPDIR private to the host, then ``env`` on top."""
        return _env({"TMPDIR": self.tmpdir}, env)

    # -- running things
    def popen(
        self,
        argv: Sequence[str],
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike | None = None,
        **kw,
    ) -> subprocess.Popen:
        """Start ``argv`` on this host.  Own session (process group), so
        ``os.killpg(p.pid, sig)`` reaches its children.  Extra kwargs go to Popen."""
        kw.setdefault("start_new_session", True)
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(self.wrap(argv, cwd), env=self.env(env), **kw)
        self._procs.append(p)
        return p

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str | None] | None = None,
        timeout: float = 60,
        check: bool = False,
        input: str | None = None,
        cwd: str | os.PathLike | None = None,
        capture_output: bool = True,
        text: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` on this host; kill its whole process group on timeout
        (then raise subprocess.TimeoutExpired)."""
        pipe = subprocess.PIPE if capture_output else None
        p = self.popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=pipe,
            stderr=pipe,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            text=text,
        )
        try:
            out, err = p.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, out, err)
        finally:
            with contextlib.suppress(ValueError):
                self._procs.remove(p)
        cp = subprocess.CompletedProcess(list(argv), p.returncode, out, err)
        if check and cp.returncode != 0:
            raise subprocess.CalledProcessError(cp.returncode, argv, out, err)
        return cp

    def sh(self, script: str, **kw) -> subprocess.CompletedProcess:
        """``run(["bash", "-c", script])``."""
        return self.run(["bash", "-c", script], **kw)

    def python(self, code: str, *args: str, **kw) -> subprocess.CompletedProcess:
        """Run Python code with this interpreter on the host."""
        return self.run([sys.executable, "-c", code, *args], **kw)

    def pids(self) -> list[int]:
        """Root-namespace pids of the processes on this host (its FUSE client daemons excluded;
        its pid namespace's init excluded)."""
        skip = set(self.fuse_pids) | {self.init_pid, self._init.pid if self._init else None}
        return [p for p in _netns_pids(self.netns) if p not in skip]

    def kill_all(self, sig: int = signal.SIGKILL, grace: float = 0.0) -> None:
        """Kill every process on this host (``grace`` > 0: SIGTERM first).  The host's FUSE
        client keeps running (its mount stays usable); with a pid namespace the host then
        "boots" a fresh one (see :meth:`kill_node`)."""
        if self.init_pid and sig == signal.SIGKILL and grace == 0:
            self.kill_node()
        else:
            _kill_all(self.pids, sig, grace)
        for p in list(self._procs):
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
            with contextlib.suppress(ValueError):
                self._procs.remove(p)

    # -- pid namespace: the host's "machine"
    def _start_pidns(self) -> None:
        """Start the host's pid namespace: its pid 1 reaps orphans (so a dead process of this
        host never lingers as a zombie that looks alive to ``kill(pid, 0)``)."""
        self._init = subprocess.Popen(
            [
                _which("nsenter"),
                f"--net=/run/netns/{self.netns}",
                _which("unshare"),
                "--pid",
                "--fork",
                "--kill-child",
                sys.executable,
                "-c",
                _PIDNS_INIT,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError, ValueError):
                kids = Path(f"/proc/{self._init.pid}/task/{self._init.pid}/children").read_text().split()
                # unshare's child is pid 1 of the new namespace; it is ready once it runs python
                if kids and Path(f"/proc/{kids[0]}/comm").read_text().startswith("python"):
                    self.init_pid = int(kids[0])
                    break
            if self._init.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pid namespace of {self.name} did not start")
            time.sleep(0.01)
        self.cluster.track_pid(self._init.pid)

    def _pidns_members(self) -> list[int]:
        """Root pids of the processes in this host's pid namespace (init included)."""
        if not self.init_pid:
            return []
        try:
            ino = os.stat(f"/proc/{self.init_pid}/ns/pid").st_ino
        except OSError:
            return []
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{d}/ns/pid").st_ino == ino:
                        out.append(int(d))
        return out

    def kill_node(self, wait: float = 10.0) -> bool:
        """SIGKILL the host's pid namespace: the kernel kills every process of the host at once
        (pid_namespaces(7): the death of a namespace's init kills all its members), as when a
        machine loses power.  Then a fresh pid namespace starts ("the node reboots").  The
        host's FUSE client is not in it and survives.  Returns False if some process was still
        there after ``wait`` seconds (one stuck in a hung mount: see :meth:`fuse_abort`)."""
        if not self.init_pid:
            raise RuntimeError(f"{self.name} has no pid namespace (Cluster(pid_ns=True))")
        members = self._pidns_members()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init_pid, signal.SIGKILL)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(
            Path(f"/proc/{p}").exists() and _proc_state(p) not in ("Z", None) for p in members
        ):
            time.sleep(0.02)
        gone = not any(_proc_state(p) not in ("Z", None) for p in members)
        with contextlib.suppress(Exception):
            self._init.wait(timeout=5)
        self.init_pid = None
        self._start_pidns()
        return gone

    # -- the host's FUSE client (real filesystems)
    def fuse_abort(self) -> None:
        """Abort this host's FUSE connection and lazily unmount it: every pending and later call
        on it fails at once (ENOTCONN/ECONNABORTED).  Frees processes stuck on a client whose host
        lost its network: SIGKILL cannot, they wait until the client gives up (80-170 s).  The
        host has no mount afterwards; :meth:`remount` gives it a new client."""
        if self.mountpoint:
            _fuse_abort(self.mountpoint)
        for pid in self.fuse_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.fuse_pids = []

    def remount(self) -> None:
        """Mount a fresh FUSE client for this host (after :meth:`fuse_abort`).  Processes
        started afterwards see it; running ones keep the old (aborted) view."""
        self.cluster.fs_backend.mount_host(self)

    def ensure_mount(self, probe_s: float | None = None) -> None:
        """Leave this host with a client that answers: remount one that is gone, abort and
        replace one that is mounted but does not complete a create within ``probe_s`` seconds
        (default ``fs_base.PROBE_S``: a test cut its link, or it hung on its own)."""
        fs = self.cluster.fs_backend
        if _mount_dev_minor(self.mountpoint) is not None:
            if fs.answers(self.mountpoint, probe_s):
                return
            self.fuse_abort()
        self.remount()

    # -- failure injection
    def link_down(self) -> None:
        """Cut this host off the network (its eth0 stays up, the bridge port goes down)."""
        _sh(["ip", "link", "set", self.veth, "down"])

    def link_up(self) -> None:
        _sh(["ip", "link", "set", self.veth, "up"])
