"""Plumbing of the cluster harness: commands with a timeout, /proc and mountinfo readers, killing
process sets, FUSE aborts, the environment of a host's processes, free ports."""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

PYTHON_BIN = os.path.dirname(os.path.abspath(sys.executable))
"""Directory of the running Python: first on PATH in hosts and Slurm jobs, so
``fsmingle``/``torchrun``/``python3`` there resolve to this interpreter's."""

REGISTRY_DIR = Path("/run/fsmingle-test-cluster")
KEEP_ENV = "FSMINGLE_KEEP_CLUSTER"  # set to 1: keep the work dir (logs) after teardown
REQUIRE_ENV = "FSMINGLE_REQUIRE_CLUSTER"  # set to 1: fail instead of skip


def _sh(argv: Sequence[str], check: bool = True, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    """Run a plumbing command in the root namespaces, with a hard timeout."""
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed (rc={p.returncode}): {p.stderr.strip()}")
    return p


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _proc_stat(pid: int, field: int) -> str | None:
    """Field ``field`` of /proc/<pid>/stat counted after the command name (proc(5): 0 is the
    state, 19 the start time in clock ticks), None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[field]
    except (OSError, IndexError):
        return None


def _proc_start_time(pid: int) -> str | None:
    return _proc_stat(pid, 19)


def _mounts_under(prefix: str) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix.rstrip("/") + "/"):
                out.append(mp)
    return out


def _unmount(path: str) -> None:
    for argv in (["fusermount3", "-u", path], ["fusermount", "-u", path], ["umount", path], ["umount", "-l", path]):
        if not shutil.which(argv[0]):
            continue
        with contextlib.suppress(Exception):
            if _sh(argv, check=False, timeout=10).returncode == 0:
                return


def _proc_state(pid: int) -> str | None:
    """One-letter state of ``pid`` (``"Z"`` zombie, ``"D"`` uninterruptible), None if gone."""
    return _proc_stat(pid, 0)


# pid 1 of a host's pid namespace: reaps every orphan it inherits (a zombie would look alive to
# kill(pid, 0)); SIGKILL from the root namespace ends it and, with it, the whole namespace.
_PIDNS_INIT = (
    "import os, time\n"
    "while True:\n"
    "    try:\n"
    "        os.waitpid(-1, 0)\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.2)\n"
)


def _mount_dev_minor(path: str) -> str | None:
    """The FUSE connection number of mount point ``path`` (mountinfo field 3 is MAJOR:MINOR),
    read from /proc/self/mountinfo: never stat() a mount whose client may hang."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if parts[4].replace("\\040", " ") == path:
                return parts[2].split(":")[1]
    return None


def _fuse_abort(path: str) -> None:
    """Abort the FUSE connection mounted at ``path`` through fusectl, then unmount it lazily.

    Writing to /sys/fs/fuse/connections/N/abort fails every pending and later request of that
    connection (kernel Documentation/filesystems/fuse.rst, "Aborting a filesystem connection");
    a plain umount of a hung client would sit unkillable in D state until the client gives up.
    """
    minor = _mount_dev_minor(path)
    if minor is None:
        return
    conn = "/sys/fs/fuse/connections"
    own = False
    if not any(line.split()[4] == conn for line in open("/proc/self/mountinfo")):
        own = _sh(["mount", "-t", "fusectl", "fusectl", conn], check=False).returncode == 0
    with contextlib.suppress(OSError), open(f"{conn}/{minor}/abort", "w") as f:
        f.write("1")
    if own:
        _sh(["umount", conn], check=False)
    _sh(["umount", "-l", path], check=False)


def _pids_with_arg(arg: str) -> list[int]:
    """Pids of the live processes (zombies excluded) with ``arg`` among their arguments."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                if arg.encode() in Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0") and _proc_state(int(d)) not in (
                    None,
                    "Z",
                ):
                    out.append(int(d))
    return out


def _netns_pids(ns: str) -> list[int]:
    p = _sh(["ip", "netns", "pids", ns], check=False, timeout=10)
    return [int(x) for x in p.stdout.split() if x.strip().isdigit()]


def _kill_all(pids_now: Callable[[], list[int]], sig: int = signal.SIGKILL, grace: float = 0.0) -> None:
    """Signal every process ``pids_now()`` lists (loop: they may fork); with ``grace`` > 0,
    SIGTERM first and wait up to ``grace`` seconds for them to end."""
    if grace > 0:
        for pid in pids_now():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and pids_now():
            time.sleep(0.05)
    for _ in range(50):
        pids = pids_now()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.05)


def _kill_netns(ns: str, sig: int = signal.SIGKILL, grace: float = 0.0) -> None:
    """Signal every process in network namespace ``ns``."""
    _kill_all(lambda: _netns_pids(ns), sig, grace)


def _env(base_extra: Mapping[str, str] | None, overlay: Mapping[str, str | None] | None) -> dict[str, str]:
    """os.environ without SLURM_*, python bin first on PATH, then extras, then overlay
    (an overlay value of None removes the variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PATH"] = ":".join(
        [PYTHON_BIN]
        + [p for p in path.split(":") if p and p != PYTHON_BIN]
        + [p for p in ("/usr/sbin", "/sbin") if p not in path.split(":")]
    )
    env.update(base_extra or {})
    for k, v in (overlay or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def _free_port_block(n: int, lo: int = 20000, hi: int = 60000) -> int:
    """A port p such that p..p+n-1 are all free on every address (root namespace)."""
    import socket

    rng = random.SystemRandom()
    for _ in range(200):
        p = rng.randrange(lo, hi - n)
        ok = True
        for q in range(p, p + n):
            with socket.socket() as sk:
                try:
                    sk.bind(("0.0.0.0", q))
                except OSError:
                    ok = False
                    break
        if ok:
            return p
    raise RuntimeError("no free port block")
