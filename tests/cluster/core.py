"""``Cluster``: K hosts on a private bridge sharing one directory."""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import random
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from .capabilities import FILESYSTEMS, missing_capabilities
from .cephfs import _CephFS
from .fs_base import _Bindfs, _FsBackend
from .gluster import _Gluster
from .hosts import Host
from .juicefs import _JuiceFS
from .moosefs import _MooseFS
from .plumbing import (
    _mounts_under,
    _proc_start_time,
    _sh,
)
from .registry import _cleanup_state, _register, _unregister, sweep_stale
from .s3fs import _S3fs


def _make_backend(cluster: Cluster, fs: str) -> _FsBackend:
    if fs == "bindfs":
        return _Bindfs(cluster)
    if fs.startswith("glusterfs-"):
        return _Gluster(cluster, fs.split("-", 1)[1])
    if fs == "moosefs":
        return _MooseFS(cluster)
    if fs == "cephfs":
        return _CephFS(cluster)
    if fs.startswith("juicefs"):
        return _JuiceFS(cluster, fs.split("-", 1)[1] if "-" in fs else "default")
    return _S3fs(cluster)


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
        :data:`GLUSTER_PROFILES`), ``"moosefs"`` (master + chunkserver), ``"cephfs"``, ``"juicefs"`` / ``"juicefs-cached"``
        (redis-server + a local bucket; profiles in :data:`JUICEFS_PROFILES`), ``"s3fs"`` (s3fs-fuse
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
        self.bridge_mac = "02:" + ":".join(secrets.token_hex(5)[i : i + 2] for i in range(0, 10, 2))  # local, unicast
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
        # A MAC of its own, set at creation: a bridge without one takes the lowest MAC of its ports and changes it,
        # with no gratuitous ARP, whenever a port with a lower one joins (br_stp_recalculate_bridge_id; a set address
        # is kept).  A host that had resolved the bridge address to another port's MAC then sends frames the bridge
        # hands up as PACKET_OTHERHOST, which IP drops: its new connections to the servers at the bridge address time
        # out until its neighbour entry is re-resolved (15-50 s).  CI stop 41: node1's JuiceFS client could not dial
        # Redis for ~25 s on two fresh clusters in a row (a helper's reading; reproduced with three veths).
        _sh(["ip", "link", "add", self.bridge, "address", self.bridge_mac, "type", "bridge"])
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
            self.fs_backend.stop_clients()
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
