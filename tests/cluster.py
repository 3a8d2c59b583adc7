"""A cluster on one machine, for tests.

``Cluster`` creates K "hosts" as network namespaces on a private bridge.  Every
process started on a host runs inside the host's network namespace and in a
fresh private UTS + mount namespace, where it has

* the host's own hostname (``node0``, ``node1``, ...);
* a private ``/etc/hosts`` (and an empty ``/etc/resolv.conf``);
* the host's own NFS-like FUSE view of ONE shared backing directory, mounted at
  the same path (``cluster.shared``) on every host: ``bindfs`` with
  ``attr_timeout``/``entry_timeout``/``negative_timeout`` = ``cache_timeout``,
  so a file created on host A can stay invisible to ``stat``/``open`` on host B
  for up to ``cache_timeout`` seconds (``os.listdir`` shows it at once), just
  like NFS's lookup cache.  bindfs does not forward locks by default, so
  ``flock``/``fcntl`` locks are node-local: they succeed and exclude nothing
  across hosts (like NFS mounted with ``local_lock``).

Inside a host there is NO default route (only ``lo`` and ``eth0``): a tool that
picks its own address by "route to 8.8.8.8" must fall back to ``eth0``.

``SlurmCluster`` runs a real Slurm (munged + slurmctld + one slurmd per host;
with ``accounting=True`` also slurmdbd on a MariaDB of its own, for ``sacct``)
on top of such a cluster; ``sbatch``/``wait``/``output`` drive it.

Network rule: traffic goes only to loopback and to namespaces created here.
Every run picks a random private /24 (10.<100-250>.<0-255>.0/24) not used on
the machine and a random name prefix, so concurrent runs cannot collide.  The
bridge gets its address before anything is sent.  Teardown always runs
(context manager, pytest fixture finalizers, ``atexit``), and a run killed
with SIGKILL is swept by the next one (see ``sweep_stale``).

Pytest fixtures (import them in conftest.py, e.g. ``from conftest_cluster
import *``): ``make_cluster``, ``cluster``, ``make_slurm``, ``slurm_cluster``,
``slurm_cluster_module``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import ipaddress
import json
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fsmingle.rendezvous.queue import ENDED

try:  # pytest is only needed for the fixtures / skip helper
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]

__all__ = [
    "Cluster",
    "Host",
    "SlurmCluster",
    "JobResult",
    "missing_capabilities",
    "require_capabilities",
    "sweep_stale",
    "PYTHON_BIN",
    "make_cluster",
    "cluster",
    "make_slurm",
    "slurm_cluster",
    "slurm_cluster_module",
]

PYTHON_BIN = os.path.dirname(os.path.abspath(sys.executable))
"""Directory of the running Python: first on PATH in hosts and Slurm jobs, so
``fsmingle``/``torchrun``/``python3`` there resolve to this interpreter's."""

REGISTRY_DIR = Path("/run/fsmingle-test-cluster")
KEEP_ENV = "FSMINGLE_KEEP_CLUSTER"  # set to 1: keep the work dir (logs) after teardown
REQUIRE_ENV = "FSMINGLE_REQUIRE_CLUSTER"  # set to 1: fail instead of skip

# Slurm's states of a job that has ended: the ones fsmingle's queue watch knows (without its own
# "GONE", a job that squeue and sacct no longer report).
_TERMINAL_STATES = ENDED - {"GONE"}


# --------------------------------------------------------------------------- helpers


def _sh(argv: Sequence[str], check: bool = True, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    """Run a plumbing command in the root namespaces, with a hard timeout."""
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed (rc={p.returncode}): {p.stderr.strip()}")
    return p


def missing_capabilities(slurm: bool = False, fs: str = "bindfs", accounting: bool = False) -> list[str]:
    """What this machine lacks to build a cluster on filesystem ``fs`` (empty list: all present);
    ``accounting``: a Slurm with slurmdbd and MariaDB (``SlurmCluster(accounting=True)``)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces and mounts)")
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse")
    tools = ["ip", "bindfs", "nsenter", "unshare", "mount", "hostname", "timeout"]
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        missing.append("fusermount (package fuse3)")
    if slurm:
        tools += ["munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun"]
    if accounting:
        tools += ["slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db"]
    if fs != "bindfs":
        tools += fs_tools(fs)
    if fs == "s3fs" and not os.access(moto_server_path(), os.X_OK):
        missing.append(f"{moto_server_path()} (a venv with moto[server]; see .ci/run)")
    for t in tools:
        if not shutil.which(t) and not os.path.exists(f"/usr/sbin/{t}"):
            missing.append(f"`{t}` executable")
    return missing


def require_capabilities(slurm: bool = False, fs: str = "bindfs", accounting: bool = False) -> None:
    """pytest.skip (or fail if $FSMINGLE_REQUIRE_CLUSTER=1) naming what is missing."""
    missing = missing_capabilities(slurm, fs, accounting)
    if missing:
        msg = "cluster-on-one-machine needs: " + ", ".join(missing)
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(msg)
        pytest.skip(msg)


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


# --------------------------------------------------------------------------- registry


def _register(prefix: str, state: dict) -> None:
    REGISTRY_DIR.mkdir(mode=0o700, exist_ok=True)
    tmp = REGISTRY_DIR / f".{prefix}.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, REGISTRY_DIR / f"{prefix}.json")


def _unregister(prefix: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (REGISTRY_DIR / f"{prefix}.json").unlink()


def _cleanup_state(state: dict) -> None:
    """Undo everything a (possibly dead) run recorded.  Only names it created."""
    for mp in state.get("fuse_mounts", []):  # real filesystems: a hung client must not hang teardown
        _fuse_abort(mp)
    for ns in state.get("netns", []):
        if os.path.exists(f"/run/netns/{ns}"):
            _kill_netns(ns)
    _stop_servers(state)
    for pid in state.get("pids", []):  # root-namespace daemons (munged, bindfs)
        start = state.get("pid_start", {}).get(str(pid))
        if start and _proc_start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for mp in state.get("mounts", []):
        if _mounts_under(mp):
            _unmount(mp)
    for mp in state.get("tmpfs", []):  # MooseFS chunk store, after its chunkserver stopped
        if _mounts_under(mp):
            _sh(["umount", "-l", mp], check=False)
    for ns in state.get("netns", []):
        if os.path.exists(f"/run/netns/{ns}"):
            _sh(["ip", "netns", "del", ns], check=False)
    for link in state.get("links", []):
        if os.path.exists(f"/sys/class/net/{link}"):
            _sh(["ip", "link", "del", link], check=False)
    wd = state.get("workdir")
    if wd and os.path.isdir(wd) and not _mounts_under(wd) and os.environ.get(KEEP_ENV) != "1":
        shutil.rmtree(wd, ignore_errors=True)


def sweep_stale() -> list[str]:
    """Clean up clusters whose owning process is gone (e.g. pytest was SIGKILLed).
    Returns the prefixes swept.  Called automatically by ``Cluster.start``."""
    swept = []
    if not REGISTRY_DIR.is_dir():
        return swept
    for f in REGISTRY_DIR.glob("*.json"):
        try:
            state = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        owner, start = state.get("owner"), state.get("owner_start")
        if owner and _proc_start_time(owner) == start:
            continue  # still alive
        _cleanup_state(state)
        _unregister(f.stem)
        swept.append(f.stem)
    return swept


# --------------------------------------------------------------------------- real filesystems

FILESYSTEMS = ("bindfs", "glusterfs-tuned", "glusterfs-nfs60", "moosefs", "cephfs", "s3fs")
"""Filesystems a :class:`Cluster` can share between its hosts (``Cluster(fs=...)``)."""

MOTO_VENV_ENV = "FSMINGLE_MOTO_VENV"  # a venv with moto[server] (.ci/run makes /opt/moto-venv)
MOTO_VENV_DEFAULT = "/opt/moto-venv"

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

# mfsmount cache options: 1 s attribute/entry/negative caches (mfsmount(8)); the notes measured
# that the negative cache holds exactly this long.
MFS_MOUNT_OPTS = "mfsattrcacheto=1,mfsentrycacheto=1,mfsnegentrycacheto=1"

# CephFS file system settings (`ceph fs set cephfs KEY VALUE`).  session_timeout 30 (default 60,
# and the least the monitor accepts: "session_timeout must be at least 30s"): the MDS evicts a
# client that stopped renewing its session after this long, and until then the capabilities it
# holds block every other client that needs them -- a host whose link goes down stalls the
# others' reads of its files (measured: released 61-71 s after the link went down with 60).  30
# keeps that test shorter, like GlusterFS's network.ping-timeout 10.
CEPH_FS_SETTINGS = [("session_timeout", "30")]


def fs_tools(fs: str) -> list[str]:
    """Executables filesystem ``fs`` needs on this machine (Debian packages in .ci/run)."""
    return {
        "bindfs": ["bindfs"],
        "glusterfs-tuned": ["glusterd", "gluster", "mount.glusterfs"],
        "glusterfs-nfs60": ["glusterd", "gluster", "mount.glusterfs"],
        "moosefs": ["mfsmaster", "mfschunkserver", "mfsmount"],
        "cephfs": ["ceph-mon", "ceph-osd", "ceph-mds", "ceph-fuse", "ceph", "monmaptool"],
        "s3fs": ["s3fs"],
    }[fs]


def moto_server_path() -> str:
    return os.path.join(os.environ.get(MOTO_VENV_ENV, MOTO_VENV_DEFAULT), "bin", "moto_server")


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
        host.fuse_pids = self.mount(host.mountpoint, host.netns)

    def stop(self) -> None:
        """Stop the servers (mounts are gone by then)."""
        _stop_servers(self.c._state)

    def diagnostics(self) -> str:
        return ""


class _Bindfs(_FsBackend):
    fs = "bindfs"
    fuse_type = "fuse"

    def start(self) -> None:
        pass


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


class _S3fs(_FsBackend):
    """s3fs-fuse over a local S3 server (moto).  Not a filesystem fsmingle can use: no link(),
    O_EXCL not exclusive across mounts; the refusal tests run on it."""

    fs = "s3fs"
    fuse_type = "fuse.s3fs"

    def start(self) -> None:
        import urllib.request

        c = self.c
        b = c.workdir / "s3"
        b.mkdir()
        moto = moto_server_path()
        if not os.access(moto, os.X_OK):
            raise RuntimeError(
                f"{moto} missing: python3 -m venv {MOTO_VENV_DEFAULT} && "
                f"{MOTO_VENV_DEFAULT}/bin/pip install 'moto[server]' (or set ${MOTO_VENV_ENV})"
            )
        self.port = _free_port_block(1)
        d = subprocess.Popen(
            [moto, "-H", self.server_ip, "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=open(b / "moto.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        c.track_pid(d.pid)
        c._daemons.append(d)
        url = f"http://{self.server_ip}:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{url}/fsmbucket", method="PUT"), timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or d.poll() is not None:
                    raise RuntimeError("moto_server did not start:\n" + (b / "moto.log").read_text()[-2000:])
                time.sleep(0.1)
        pw = b / "passwd"
        pw.write_text("fsmkey:fsmsecret\n")
        pw.chmod(0o600)  # s3fs refuses a password file others can read
        self.opts = f"url={url},use_path_request_style,passwd_file={pw},allow_other,umask=0022"
        self.base = b

    def client_argv(self, mnt: str) -> list[str]:
        return ["s3fs", "fsmbucket", mnt, "-o", self.opts]


def _make_backend(cluster: Cluster, fs: str) -> _FsBackend:
    if fs == "bindfs":
        return _Bindfs(cluster)
    if fs.startswith("glusterfs-"):
        return _Gluster(cluster, fs.split("-", 1)[1])
    if fs == "moosefs":
        return _MooseFS(cluster)
    if fs == "cephfs":
        return _CephFS(cluster)
    return _S3fs(cluster)


def _stop_servers(state: dict) -> None:
    """Stop what a run recorded: its Gluster volume (and glusterd if it started it and no volume
    is left), its daemons (``pids``; by start time, never a recycled pid).  Idempotent."""
    vol = state.pop("gluster_volume", None)
    if vol:
        _sh(["gluster", "--mode=script", "volume", "stop", vol, "force"], check=False, timeout=60)
        _sh(["gluster", "--mode=script", "volume", "delete", vol], check=False, timeout=60)
    own = state.get("glusterd_own")
    if own and _proc_start_time(own[0]) == own[1]:
        p = _sh(["gluster", "volume", "list"], check=False)
        if "No volumes" in p.stdout + p.stderr:  # printed on stderr
            with contextlib.suppress(ProcessLookupError):
                os.kill(own[0], signal.SIGTERM)
            deadline = time.monotonic() + 10  # the next run must not find it dying
            while _proc_state(own[0]) not in (None, "Z") and time.monotonic() < deadline:
                time.sleep(0.1)
            state.pop("glusterd_own", None)
    conf = state.pop("ceph_conf", None)
    if conf:
        # CephFS: osd and mds ignore SIGTERM for seconds once the monitor is gone, and memstore
        # holds nothing worth saving: SIGKILL every daemon and client naming this cluster's conf.
        _kill_all(lambda: _pids_with_arg(conf))
    for pid in state.get("pids", []):
        start = state.get("pid_start", {}).get(str(pid))
        if start and _proc_start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for pid in state.get("pids", []):
        start = state.get("pid_start", {}).get(str(pid))
        while start and _proc_start_time(pid) == start and _proc_state(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)


# --------------------------------------------------------------------------- hosts

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

    # -- failure injection
    def link_down(self) -> None:
        """Cut this host off the network (its eth0 stays up, the bridge port goes down)."""
        _sh(["ip", "link", "set", self.veth, "down"])

    def link_up(self) -> None:
        _sh(["ip", "link", "set", self.veth, "up"])


class Cluster:
    """K hosts on a private bridge sharing one directory through NFS-like mounts.

    Parameters:
      n_hosts: number of hosts (``node0`` .. ``node{n-1}``, IPs 10.A.B.(10+k)).
      cache_timeout: bindfs attr/entry/negative timeout in seconds (0 disables caching).
      shared_path: where hosts see the shared dir.  Default: ``<workdir>/shared``, which
        in the test process (root namespace) is the backing directory itself, so
        ``cluster.shared`` names the same files everywhere (uncached here).
      hosts_file: "cluster" (every hostname -> its namespace IP), "loopback" (own
        hostname -> 127.0.1.1, others unknown) or "none" (only localhost).
      bindfs_args: extra bindfs arguments (e.g. ``["--multithreaded",
        "--enable-lock-forwarding"]`` for cluster-coherent locks).
      extra_hosts: names of extra namespaces without the shared mount, IPs 10.A.B.2..
        (``SlurmCluster`` uses one for slurmctld).
      fs: the shared filesystem, one of :data:`FILESYSTEMS`.  ``"bindfs"`` (default): the
        NFS-like views above.  The others are real distributed filesystems whose servers the
        cluster starts in the root namespace at the bridge address (``<subnet>.1``):
        ``"glusterfs-tuned"`` / ``"glusterfs-nfs60"`` (a replica 3 arbiter 1 volume; cache profiles in
        :data:`GLUSTER_PROFILES`), ``"moosefs"`` (master + chunkserver), ``"s3fs"`` (s3fs-fuse
        over moto, for the refusal tests).  Each host gets its OWN FUSE client, started in the
        host's network namespace: when the host loses its link (``link_down``) its mount hangs
        like a real node's; :meth:`Host.fuse_abort` frees its stuck processes.  The test
        process sees the filesystem at ``cluster.shared`` through a client of its own
        (``cache_timeout`` and ``bindfs_args`` apply to bindfs only).
      pid_ns: run each host's processes in a pid namespace of the host (default: True for the
        real filesystems): :meth:`Host.kill_node` then kills a whole "machine" with SIGKILL,
        and the host's processes see only each other in /proc.
    """

    def __init__(
        self,
        n_hosts: int = 3,
        cache_timeout: float = 2.0,
        shared_path: str | None = None,
        hosts_file: str = "cluster",
        bindfs_args: Sequence[str] = (),
        extra_hosts: Sequence[str] = (),
        host_names: Sequence[str] | None = None,
        fs: str = "bindfs",
        pid_ns: bool | None = None,
    ):
        if fs not in FILESYSTEMS:
            raise ValueError(f"fs must be one of {', '.join(FILESYSTEMS)}")
        if n_hosts < 1 or n_hosts > 200:
            raise ValueError("n_hosts must be 1..200")
        if hosts_file not in ("cluster", "loopback", "none"):
            raise ValueError("hosts_file must be 'cluster', 'loopback' or 'none'")
        self.n_hosts = n_hosts
        self.fs = fs
        self.pid_ns = (fs != "bindfs") if pid_ns is None else pid_ns
        self.cache_timeout = cache_timeout
        self.hosts_file_mode = hosts_file
        self.bindfs_args = list(bindfs_args)
        self.extra_names = list(extra_hosts)
        self.host_names = list(host_names) if host_names else [f"node{k}" for k in range(n_hosts)]
        if len(self.host_names) != n_hosts:
            raise ValueError("host_names must have n_hosts entries")
        self.prefix = "fm" + secrets.token_hex(3)  # 8 chars; link names <= 15
        self.workdir = Path(tempfile.mkdtemp(prefix=f"fsmc-{self.prefix}-"))
        os.chmod(self.workdir, 0o755)  # jobs of other users (nobody) may need to traverse
        self.backing = self.workdir / "shared"
        self.shared = str(shared_path or self.backing)
        self.hosts_file = self.workdir / "etc" / "hosts"
        self.resolv_file: Path | None = self.workdir / "etc" / "resolv.conf"
        self.default_cwd = os.getcwd()
        self.bridge = f"{self.prefix}br"
        self.subnet: str | None = None  # "10.A.B"
        self.hosts: list[Host] = []
        self.extra: dict[str, Host] = {}
        self._state: dict = {
            "owner": os.getpid(),
            "owner_start": _proc_start_time(os.getpid()),
            "workdir": str(self.workdir),
            "netns": [],
            "links": [],
            "mounts": [],
            "pids": [],
            "pid_start": {},
            "fuse_mounts": [],
            "tmpfs": [],
        }
        self.fs_backend = _make_backend(self, fs)
        self._daemons: list[subprocess.Popen] = []  # server daemons we started (reaped at close)
        self._closed = False
        self._started = False
        self._lock = threading.Lock()
        self._cleanups: list = []  # callables run first at close (e.g. Slurm daemons)

    # -- lifecycle
    def __enter__(self) -> Cluster:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getitem__(self, k: int) -> Host:
        return self.hosts[k]

    def __iter__(self):
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def _save(self) -> None:
        _register(self.prefix, self._state)

    def _pick_subnet(self) -> str:
        used = []
        for cmd in (["ip", "-4", "-o", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
            for tok in _sh(cmd, check=False).stdout.split():
                with contextlib.suppress(ValueError):
                    if tok[0].isdigit():
                        used.append(ipaddress.ip_network(tok, strict=False))
        rng = random.SystemRandom()
        for _ in range(1000):
            net = ipaddress.ip_network(f"10.{rng.randint(100, 250)}.{rng.randint(0, 255)}.0/24")
            if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
                return str(net.network_address).rsplit(".", 1)[0]
        raise RuntimeError("no free 10.x.y.0/24 subnet")

    def start(self) -> Cluster:
        missing = missing_capabilities(fs=self.fs)
        if missing:
            raise RuntimeError("cannot build a cluster here, missing: " + ", ".join(missing))
        self._started = True
        sweep_stale()
        atexit.register(self.close)
        self._save()
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        t0 = time.monotonic()
        # Bridge first, with its address, before anything is sent to the subnet.
        self._state["links"].append(self.bridge)
        self._save()
        _sh(["ip", "link", "add", self.bridge, "type", "bridge"])
        for _attempt in range(5):
            self.subnet = self._pick_subnet()
            _sh(["ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge])
            # a concurrent run may have grabbed the same /24 between pick and add
            others = [
                l
                for l in _sh(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines()
                if f" {self.subnet}." in l and self.bridge not in l.split()[1]
            ]
            if not others:
                break
            _sh(["ip", "addr", "flush", "dev", self.bridge])
        else:
            raise RuntimeError("could not reserve a private subnet")
        _sh(["ip", "link", "set", self.bridge, "up"])
        self._state["subnet"] = self.subnet

        (self.workdir / "etc").mkdir()
        self.backing.mkdir(exist_ok=True)
        if self.fs != "bindfs":
            # the servers, then the test process's own client at cluster.shared
            self.fs_backend.start()
            if self.shared != str(self.backing):
                raise ValueError("shared_path is for bindfs only")
            self.fs_backend.mount(self.shared, None)
        with contextlib.suppress(OSError):  # s3fs: no chmod on the bucket root
            os.chmod(self.backing, 0o1777)  # like a scratch dir; tests may chmod it
        if self.shared != str(self.backing):
            Path(self.shared).mkdir(parents=True, exist_ok=True)
        # The rendezvous directory every test uses: fsmingle never creates --dir
        # (a typo must fail at once), so the "cluster admin" makes it once.
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.join(self.shared, "rdzv"), 0o700)

        names = [(n, f"{self.subnet}.{10 + k}", True) for k, n in enumerate(self.host_names)]
        names += [(n, f"{self.subnet}.{2 + k}", False) for k, n in enumerate(self.extra_names)]
        for idx, (name, ip, shared) in enumerate(names):
            host = self._add_host(idx, name, ip, shared)
            if shared:
                self.hosts.append(host)
            else:
                self.extra[name] = host
        self._write_etc()
        self.setup_seconds = time.monotonic() - t0

    def _add_host(self, idx: int, name: str, ip: str, shared: bool) -> Host:
        ns = f"{self.prefix}-{name}"
        veth = f"{self.prefix}v{idx}"
        self._state["netns"].append(ns)
        self._state["links"].append(veth)
        mnt = str(self.workdir / "mnt" / name) if shared else None
        if mnt and self.fs == "bindfs":
            self._state["mounts"].append(mnt)
        self._save()
        _sh(["ip", "netns", "add", ns])
        _sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _sh(["ip", "link", "set", veth, "master", self.bridge, "up"])
        _sh(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
        _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        _sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
        host = Host(self, name, ip, ns, veth, mnt)
        Path(host.tmpdir).mkdir(parents=True, exist_ok=True)
        os.chmod(host.tmpdir, 0o1777)
        if mnt and self.fs == "bindfs":
            Path(mnt).mkdir(parents=True)
            t = f"{self.cache_timeout:g}"
            _sh(
                [
                    "bindfs",
                    "-o",
                    f"attr_timeout={t},entry_timeout={t},negative_timeout={t}",
                    *self.bindfs_args,
                    str(self.backing),
                    mnt,
                ]
            )
        elif mnt:
            self.fs_backend.mount_host(host)
        if self.pid_ns:
            host._start_pidns()
        return host

    def _write_etc(self) -> None:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        if self.hosts_file_mode == "cluster":
            lines += [f"{h.ip}\t{h.name}" for h in [*self.hosts, *self.extra.values()]]
        elif self.hosts_file_mode == "loopback":
            # Every host's own name -> loopback (what many distros do): one shared file,
            # so all hostnames resolve to 127.0.1.1 everywhere, none to a reachable IP.
            lines += [f"127.0.1.1\t{h.name}" for h in [*self.hosts, *self.extra.values()]]
        self.hosts_file.write_text("\n".join(lines) + "\n")
        self.hosts_file.chmod(0o644)
        if self.resolv_file:
            # no nameserver: DNS lookups fail fast inside the namespaces
            self.resolv_file.write_text("options timeout:1 attempts:1\n")
            self.resolv_file.chmod(0o644)

    # -- operations
    def host(self, name: str) -> Host:
        for h in [*self.hosts, *self.extra.values()]:
            if h.name == name:
                return h
        raise KeyError(name)

    def kill_all(self, sig: int = signal.SIGKILL, grace: float = 0.0) -> None:
        """Kill every process on every host (and extra namespaces)."""
        for h in [*self.hosts, *self.extra.values()]:
            h.kill_all(sig, grace)

    def track_pid(self, pid: int) -> None:
        """Record a root-namespace daemon so a later run can sweep it if we die."""
        self._state["pids"].append(pid)
        self._state["pid_start"][str(pid)] = _proc_start_time(pid)
        self._save()

    def close(self) -> None:
        """Tear everything down.  Idempotent; never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        for fn in reversed(self._cleanups):
            with contextlib.suppress(Exception):
                fn()
        with contextlib.suppress(Exception):
            for h in [*self.hosts, *self.extra.values()]:
                for p in h._procs:
                    with contextlib.suppress(Exception):
                        os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            _cleanup_state(self._state)
        for h in [*self.hosts, *self.extra.values()]:
            for p in [*h._procs, *([h._init] if h._init else [])]:
                with contextlib.suppress(Exception):
                    p.wait(timeout=5)
        for d in self._daemons:
            with contextlib.suppress(Exception):
                d.wait(timeout=10)
        if not _mounts_under(str(self.workdir)) and not any(
            os.path.exists(f"/run/netns/{ns}") for ns in self._state["netns"]
        ):
            _unregister(self.prefix)


# --------------------------------------------------------------------------- Slurm


@dataclasses.dataclass
class JobResult:
    job_id: str
    state: str  # aggregate: COMPLETED only if every (array) task completed
    exit_code: int  # first non-zero exit code among tasks (else 0)
    signal: int
    tasks: list[dict]  # one dict of `scontrol show job -o` fields per (array) task

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code == 0


def _parse_scontrol(text: str) -> list[dict]:
    jobs = []
    for line in text.splitlines():
        if "JobId=" not in line:
            continue
        jobs.append(dict(re.findall(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)", line)))
    return jobs


# slurmdbd's port (its default) on ctl's address: ctl is a network namespace of its own, so runs
# side by side do not collide.
DBD_PORT = 6819

# InnoDB sized for a test database, without fsyncs (its data dies with the cluster): the datadir
# is made in 1.6 s instead of 3.7 s here.
_MARIADB_TUNING = [
    "--innodb-log-file-size=4M",
    "--innodb-buffer-pool-size=16M",
    "--innodb-flush-method=nosync",
    "--innodb-doublewrite=0",
]


class SlurmCluster:
    """A real Slurm (munged, slurmctld, one slurmd per host; slurmdbd and MariaDB on ``ctl`` with
    ``accounting``) on a ``Cluster``.

    The "login node" is the ``ctl`` namespace: ``sbatch``/``scontrol`` run there
    (``nsenter --net``) with ``SLURM_CONF`` set.  Jobs inherit the submit
    environment (python bin first on PATH, SLURM_CONF), run in the host's
    namespaces with its hostname and see the shared directory at ``cluster.shared``.
    """

    def __init__(
        self,
        n_nodes: int = 3,
        cluster: Cluster | None = None,
        cpus_per_node: int = 2,
        accounting: bool = False,
        min_job_age: int = 3600,
        **cluster_kw,
    ):
        """``accounting``: also run MariaDB and slurmdbd on ``ctl`` (``sacct`` works; see
        :meth:`_start_accounting`).  ``min_job_age``: seconds slurmctld keeps an ended job
        (``squeue``/``scontrol show job``; Slurm's least is 2); :meth:`jobs` and :meth:`wait`
        need it above the test's polling, so keep the default unless a test wants jobs purged."""
        self._own_cluster = cluster is None
        self.accounting, self.min_job_age = accounting, min_job_age
        self.cluster = cluster or Cluster(n_nodes, extra_hosts=["ctl"], **cluster_kw)
        if "ctl" not in self.cluster.extra_names:
            raise ValueError("the Cluster must be created with extra_hosts=['ctl']")
        self.cpus_per_node = cpus_per_node
        self.dir = self.cluster.workdir / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.outdir = self.dir / "out"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.db_socket = self.dir / "mariadb" / "mariadb.sock"
        self.accounting_seconds: float | None = None  # start-up cost of MariaDB + slurmdbd
        self.daemons: dict[str, subprocess.Popen] = {}
        self._nscript = 0
        self._closed = False
        self.setup_seconds: float | None = None

    # -- lifecycle
    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def hosts(self) -> list[Host]:
        return self.cluster.hosts

    @property
    def ctl(self) -> Host:
        return self.cluster.extra["ctl"]

    @property
    def nodes(self) -> list[str]:
        return [h.name for h in self.cluster.hosts]

    def start(self, probe_timeout: float = 30) -> SlurmCluster:
        t0 = time.monotonic()
        if not self.cluster._started:
            self.cluster.start()
        self.cluster._cleanups.append(self._stop_daemons)
        try:
            self._start_munge()
            self._write_conf()
            if self.accounting:  # before slurmctld, which registers with slurmdbd when it starts
                self._start_accounting(probe_timeout)
            self.daemons["slurmctld"] = self.ctl.popen(
                [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)],
                stdout=open(self.dir / "slurmctld.stdout", "w"),
                stderr=subprocess.STDOUT,
            )
            for h in self.hosts:
                self.daemons[f"slurmd-{h.name}"] = h.popen(
                    [_which("slurmd"), "-D", "-f", str(self.conf), "-N", h.name],
                    stdout=open(self.dir / f"slurmd-{h.name}.stdout", "w"),
                    stderr=subprocess.STDOUT,
                )
            self._probe(probe_timeout)
        except BaseException:
            self.close()
            raise
        self.setup_seconds = time.monotonic() - t0
        return self

    def _start_munge(self) -> None:
        mdir = self.munge_socket.parent
        mdir.mkdir(parents=True)
        os.chmod(mdir, 0o755)  # 0700 fails: "Socket is inaccessible"
        key = self.dir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        p = subprocess.Popen(
            [
                _which("munged"),
                "-F",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--log-file={self.dir / 'munged.log'}",
                f"--pid-file={self.dir / 'munged.pid'}",
                f"--seed-file={self.dir / 'munged.seed'}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=open(self.dir / "munged.stdout", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.daemons["munged"] = p
        self.cluster.track_pid(p.pid)
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("munged did not start: " + self._tail("munged.log") + self._tail("munged.stdout"))
            time.sleep(0.02)

    def _write_conf(self) -> None:
        d = self.dir
        (d / "state").mkdir()
        self.outdir.mkdir(mode=0o1777)
        os.chmod(self.outdir, 0o1777)
        (d / "scripts").mkdir()
        for h in self.hosts:
            (d / "spool" / h.name).mkdir(parents=True)
        c = self.cluster
        cpus = self.cpus_per_node
        lines = [
            f"ClusterName={c.prefix}",
            f"SlurmctldHost=ctl({self.ctl.ip})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerParameters=batch_sched_delay=0",
            "JobAcctGatherType=jobacct_gather/none",
            *(
                [
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    f"AccountingStorageHost={self.ctl.ip}",
                    f"AccountingStoragePort={DBD_PORT}",
                    # the munge socket of clients' messages to slurmdbd (AuthInfo covers slurmctld's)
                    f"AccountingStoragePass={self.munge_socket}",
                ]
                if self.accounting
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            f"MinJobAge={self.min_job_age}",
            "KillWait=2",
            "InactiveLimit=0",
            "MailProg=/bin/true",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
        ]
        for h in self.hosts:
            lines.append(
                f"NodeName={h.name} NodeAddr={h.ip} NodeHostname={h.name} Sockets=1 "
                f"CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES State=UP MaxTime=INFINITE")
        self.conf.write_text("\n".join(lines) + "\n")
        self.conf.chmod(0o644)

    def _start_accounting(self, timeout: float) -> None:
        """MariaDB (its own datadir and socket under ``dir``, no TCP port) and slurmdbd (port
        ``DBD_PORT`` on ctl's address, in ctl's network namespace), both on ``ctl``; returns once
        ``sacctmgr`` gets an answer from slurmdbd.  Stopped with the other daemons."""
        t0 = time.monotonic()
        d = self.db_socket.parent
        d.mkdir()
        datadir = d / "data"
        _sh(
            [
                _which("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={datadir}",
                "--user=root",
                "--auth-root-authentication-method=normal",  # root, no password, over the socket
                "--skip-test-db",
                *_MARIADB_TUNING,
            ],
            timeout=120,
        )
        self.daemons["mariadbd"] = self.ctl.popen(
            [
                _which("mariadbd"),
                "--no-defaults",
                "--user=root",
                f"--datadir={datadir}",
                f"--socket={self.db_socket}",
                "--skip-networking",  # the socket only: no port to collide with another run
                f"--pid-file={d / 'mariadbd.pid'}",
                f"--log-error={self.dir / 'mariadbd.log'}",
                *_MARIADB_TUNING,
            ],
            stdout=open(self.dir / "mariadbd.stdout", "w"),
            stderr=subprocess.STDOUT,
        )
        self._wait_until(lambda: self.db_socket.exists(), 60, "mariadbd", "mariadbd.log")
        conf = self.dir / "slurmdbd.conf"  # slurmdbd reads it next to $SLURM_CONF; it insists on 0600
        conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "DbdHost=ctl",  # slurmdbd checks it against its hostname
                    f"DbdAddr={self.ctl.ip}",
                    f"DbdPort={DBD_PORT}",
                    "SlurmUser=root",
                    f"PidFile={self.dir / 'slurmdbd.pid'}",
                    f"LogFile={self.dir / 'slurmdbd.log'}",
                    "DebugLevel=info",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=localhost",  # localhost: libmariadb takes $MYSQL_UNIX_PORT
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                ]
            )
            + "\n"
        )
        conf.chmod(0o600)
        self.daemons["slurmdbd"] = self.ctl.popen(
            [_which("slurmdbd"), "-D"],
            env={"SLURM_CONF": str(self.conf), "MYSQL_UNIX_PORT": str(self.db_socket)},
            stdout=open(self.dir / "slurmdbd.stdout", "w"),
            stderr=subprocess.STDOUT,
        )

        def answers() -> bool:
            p = self.login(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], timeout=5)
            return p.returncode == 0

        self._wait_until(answers, timeout, "slurmdbd", "slurmdbd.log")
        self.accounting_seconds = time.monotonic() - t0

    def _wait_until(self, ready: Callable[[], bool], timeout: float, daemon: str, log: str) -> None:
        """Poll ``ready`` until true; RuntimeError with ``log``'s tail if ``daemon`` exits or
        ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        while not ready():
            p = self.daemons[daemon]
            if p.poll() is not None or time.monotonic() > deadline:
                state = f"exited rc={p.returncode}" if p.returncode is not None else f"not ready after {timeout} s"
                raise RuntimeError(f"{daemon} {state}:\n" + self._tail(log) + self._tail(f"{daemon}.stdout"))
            time.sleep(0.05)

    def _probe(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        job = None
        while job is None:
            try:
                job = self.sbatch("#!/bin/sh\ntrue\n", f"--nodes={len(self.hosts)}", "--job-name=probe", timeout=5)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise RuntimeError("slurmctld not accepting jobs:\n" + self.logs())
                for name, p in self.daemons.items():
                    if p.poll() is not None:
                        raise RuntimeError(f"{name} exited rc={p.returncode}:\n" + self.logs())
                time.sleep(0.1)
        res = self.wait(job, timeout=max(1.0, deadline - time.monotonic()))
        if not res.ok:
            raise RuntimeError(f"probe job {res}:\n" + self.logs())

    def _stop_daemons(self) -> None:
        procs = [p for p in self.daemons.values() if p.poll() is None]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 3
        for p in procs:
            try:
                p.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                with contextlib.suppress(Exception):
                    p.wait(timeout=5)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._stop_daemons()
        if self._own_cluster:
            self.cluster.close()

    # -- login-node commands
    def login_env(self, env: Mapping[str, str | None] | None = None) -> dict[str, str]:
        return _env({"SLURM_CONF": str(self.conf)}, env)

    def login(
        self,
        argv: Sequence[str],
        env: Mapping[str, str | None] | None = None,
        timeout: float = 30,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a client command (sbatch, scontrol, squeue, scancel...) on the login side."""
        full = ["timeout", "-k", "2", str(timeout), _which("nsenter"), f"--net=/run/netns/{self.ctl.netns}", *argv]
        return subprocess.run(
            full,
            env=self.login_env(env),
            capture_output=True,
            text=True,
            timeout=timeout + 5,
            stdin=subprocess.DEVNULL,
            cwd=cwd or self.cluster.default_cwd,
        )

    def scontrol(self, *args: str, timeout: float = 15) -> str:
        p = self.login(["scontrol", *args], timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {p.stderr.strip()}")
        return p.stdout

    def sbatch(
        self, script: str | os.PathLike, *args: str, env: Mapping[str, str | None] | None = None, timeout: float = 15
    ) -> str:
        """Submit ``script`` (shell text starting with ``#!``, or a path) with extra sbatch
        ``args``; returns the job id.  Defaults: ``--output=<outdir>/slurm-%j.out`` (so
        ``output()`` works; array tasks get their own file), ``--chdir=<shared dir>``.
        ``env`` is added to the submit environment, which jobs inherit."""
        if isinstance(script, str) and script.startswith("#!"):
            self._nscript += 1
            path = self.dir / "scripts" / f"job{self._nscript}.sh"
            path.write_text(script)
            path.chmod(0o755)
            script = path
        # options given in the script's #SBATCH lines or in args win over our defaults
        text = Path(script).read_text(errors="replace")
        given = list(args) + [
            tok for line in text.splitlines() if line.startswith("#SBATCH") for tok in line.split()[1:]
        ]
        argv = ["sbatch", "--parsable"]
        if not any(a.startswith(("--output", "-o")) for a in given):
            argv.append(f"--output={self.outdir}/slurm-%j.out")
        if not any(a.startswith(("--chdir", "-D")) for a in given):
            argv.append(f"--chdir={self.cluster.shared}")
        argv += [*args, str(script)]
        p = self.login(argv, env=env, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"sbatch failed (rc={p.returncode}): {p.stderr.strip()}")
        return p.stdout.strip().split(";")[0]

    def jobs(self, job_id: str) -> list[dict]:
        """``scontrol show job -o`` fields, one dict per (array) task."""
        p = self.login(["scontrol", "show", "job", "-o", str(job_id)], timeout=15)
        return _parse_scontrol(p.stdout) if p.returncode == 0 else []

    def wait(self, job_id: str, timeout: float = 60) -> JobResult:
        """Poll ``scontrol show job`` until every task of ``job_id`` ended; raise
        TimeoutError (with the Slurm logs' tail) after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            tasks = self.jobs(job_id)
            if (
                tasks
                and all(t.get("JobState") in _TERMINAL_STATES for t in tasks)
                and not any(re.search(r"[-,%]", t.get("ArrayTaskId", "")) for t in tasks)
            ):
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(Exception):
                    self.login(["scancel", str(job_id)], timeout=5)
                raise TimeoutError(
                    f"job {job_id} not finished after {timeout}s: "
                    f"{[(t.get('JobId'), t.get('JobState'), t.get('Reason')) for t in tasks]}"
                    f"\n{self.logs()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.3)
        states = [t["JobState"] for t in tasks]
        codes = [tuple(int(x) for x in t.get("ExitCode", "0:0").split(":")) for t in tasks]
        bad = [s for s in states if s != "COMPLETED"]
        nz = [c for c in codes if c != (0, 0)]
        ec, sig = nz[0] if nz else (0, 0)
        return JobResult(str(job_id), bad[0] if bad else "COMPLETED", ec, sig, tasks)

    def output(self, job_id: str) -> str:
        """Stdout file contents of a job (or array task ``"123_4"``); for an array job id,
        all tasks' outputs concatenated in task order."""
        outs = []
        tasks = self.jobs(job_id)
        tasks.sort(key=lambda t: int(t["ArrayTaskId"]) if t.get("ArrayTaskId", "").isdigit() else 0)
        for t in tasks:
            path = t.get("StdOut")
            if path and os.path.exists(path):
                outs.append(Path(path).read_text(errors="replace"))
        return "".join(outs)

    def run_job(
        self, script: str | os.PathLike, *args: str, timeout: float = 60, env: Mapping[str, str | None] | None = None
    ) -> tuple[JobResult, str]:
        """sbatch + wait + output."""
        jid = self.sbatch(script, *args, env=env)
        res = self.wait(jid, timeout)
        return res, self.output(jid)

    # -- diagnostics
    def _tail(self, name: str, n: int = 30) -> str:
        p = self.dir / name
        if not p.exists():
            return ""
        lines = p.read_text(errors="replace").splitlines()[-n:]
        return f"--- {name}\n" + "\n".join(lines) + "\n"

    def logs(self, n: int = 30) -> str:
        """Tails of the daemons' logs, for failure messages."""
        names = ["munged.log", "slurmctld.log", "slurmctld.stdout"]
        names += [f"slurmd-{h.name}.log" for h in self.hosts]
        return "".join(self._tail(x, n) for x in names)


# --------------------------------------------------------------------------- fixtures

if pytest is not None:

    def _started(cls):
        """Body of a factory fixture: yields ``factory(*args, **kw) -> cls(*args, **kw).start()``;
        closes every object it made after the test, last first, even when the test fails."""
        made = []

        def factory(*args, **kw):
            obj = cls(*args, **kw)
            made.append(obj)
            return obj.start()

        yield factory
        for obj in reversed(made):
            obj.close()

    @pytest.fixture
    def make_cluster():
        """Factory: ``make_cluster(n_hosts=3, cache_timeout=2.0, **kw) -> Cluster``
        (started); all are torn down after the test, even when it fails."""
        require_capabilities()
        yield from _started(Cluster)

    @pytest.fixture
    def cluster(make_cluster) -> Cluster:
        """3 hosts, cache_timeout=2 s."""
        return make_cluster(3)

    @pytest.fixture
    def make_slurm():
        """Factory: ``make_slurm(n_nodes=3, **cluster_kw) -> SlurmCluster`` (started,
        probe job done); torn down after the test."""
        require_capabilities(slurm=True)
        yield from _started(SlurmCluster)

    @pytest.fixture
    def slurm_cluster(make_slurm) -> SlurmCluster:
        """3-node Slurm, cache_timeout=2 s."""
        return make_slurm(3)

    @pytest.fixture(scope="module")
    def slurm_cluster_module() -> SlurmCluster:
        """3-node Slurm shared by the tests of one module (saves ~3.5 s per test).
        Tests must not depend on job ids or leave jobs running."""
        require_capabilities(slurm=True)
        with SlurmCluster(3) as s:
            yield s
