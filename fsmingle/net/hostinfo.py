"""Identity of this process and host, and direct liveness checks on the same host (psutil)."""

from __future__ import annotations

import functools
import os
import socket

import psutil

from ..fs.records import HostId


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    """The kernel's boot id (``/proc/sys/kernel/random/boot_id``), or "" if unavailable."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()[:64]
    except OSError:
        return ""


def pid_namespace() -> str:
    """``readlink /proc/self/ns/pid`` (e.g. ``pid:[4026531836]``), or "" if unavailable."""
    try:
        return os.readlink("/proc/self/ns/pid")[:64]
    except OSError:
        return ""


def this_process() -> HostId:
    """The :class:`~fsmingle.fs.records.HostId` of the calling process."""
    pid = os.getpid()
    try:
        start = psutil.Process(pid).create_time()
    except psutil.Error:
        start = 0.0
    return HostId(hostname=socket.gethostname(), boot_id=boot_id(), pidns=pid_namespace(), pid=pid, pid_start=start)


def local_process_alive(me: HostId, other: HostId) -> bool | None:
    """Check ``other`` directly if it runs in our pid space.

    Returns:
        bool | None: True/False when ``other`` shares our boot id and pid
        namespace (pid exists with the same psutil create time); None when it
        cannot be checked from here (another host, container or boot).
    """
    if not me.same_pid_space(other):
        return None
    try:
        p = psutil.Process(other.pid)
        # create_time guards against pid reuse; 10 ms tolerance for float rounding
        return abs(p.create_time() - other.pid_start) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return None


def port_holder(port: int) -> str:
    """Who listens on TCP ``port`` on this host, for an error message: ``"pid 123 (python -m x)"``.

    ``psutil.net_connections`` reads ``/proc/net/tcp*`` and maps sockets to pids through
    ``/proc/<pid>/fd``: another user's process shows without its pid unless we are root, and
    some platforms refuse the call altogether (``AccessDenied``).  Whatever cannot be told is
    said so; this never raises.
    """
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError) as e:
        return f"psutil cannot list this host's sockets ({e.__class__.__name__})"
    pids = sorted(
        {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port},
        key=lambda p: (p is None, p or 0),
    )
    if not pids:
        return "psutil sees no listener (a socket in TIME_WAIT or bound but not listening, or another namespace)"
    out = []
    for pid in pids[:3]:
        if pid is None:
            out.append("a process of another user (run as root to see which)")
            continue
        try:
            cmd = " ".join(" ".join(psutil.Process(pid).cmdline()).split())[:200]
        except psutil.Error:
            cmd = ""
        out.append(f"pid {pid}" + (f" ({cmd})" if cmd else ""))
    return ", ".join(out)
