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

``SlurmCluster`` runs a real Slurm (munged + slurmctld + one slurmd per host)
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
from pathlib import Path
from typing import Iterable, Mapping, Sequence

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

_TERMINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED",
}


# --------------------------------------------------------------------------- helpers

def _sh(argv: Sequence[str], check: bool = True, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    """Run a plumbing command in the root namespaces, with a hard timeout."""
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed (rc={p.returncode}): {p.stderr.strip()}")
    return p


def missing_capabilities(slurm: bool = False) -> list[str]:
    """What this machine lacks to build a cluster (empty list: all present)."""
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
    for t in tools:
        if not shutil.which(t) and not os.path.exists(f"/usr/sbin/{t}"):
            missing.append(f"`{t}` executable")
    return missing


def require_capabilities(slurm: bool = False) -> None:
    """pytest.skip (or fail if $FSMINGLE_REQUIRE_CLUSTER=1) naming what is missing."""
    missing = missing_capabilities(slurm)
    if missing:
        msg = "cluster-on-one-machine needs: " + ", ".join(missing)
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def _which(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _mounts_under(prefix: str) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix.rstrip("/") + "/"):
                out.append(mp)
    return out


def _unmount(path: str) -> None:
    for argv in (["fusermount3", "-u", path], ["fusermount", "-u", path],
                 ["umount", path], ["umount", "-l", path]):
        if not shutil.which(argv[0]):
            continue
        with contextlib.suppress(Exception):
            if _sh(argv, check=False, timeout=10).returncode == 0:
                return


def _netns_pids(ns: str) -> list[int]:
    p = _sh(["ip", "netns", "pids", ns], check=False, timeout=10)
    return [int(x) for x in p.stdout.split() if x.strip().isdigit()]


def _kill_netns(ns: str, sig: int = signal.SIGKILL, grace: float = 0.0) -> None:
    """Signal every process in network namespace ``ns`` (loop: they may fork)."""
    if grace > 0:
        for pid in _netns_pids(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _netns_pids(ns):
            time.sleep(0.05)
    for _ in range(50):
        pids = _netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.05)


def _env(base_extra: Mapping[str, str] | None, overlay: Mapping[str, str | None] | None) -> dict[str, str]:
    """os.environ without SLURM_*, python bin first on PATH, then extras, then overlay
    (an overlay value of None removes the variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    path = env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PATH"] = ":".join([PYTHON_BIN] + [p for p in path.split(":") if p and p != PYTHON_BIN]
                           + [p for p in ("/usr/sbin", "/sbin") if p not in path.split(":")])
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
    for ns in state.get("netns", []):
        if os.path.exists(f"/run/netns/{ns}"):
            _kill_netns(ns)
    for pid in state.get("pids", []):  # root-namespace daemons (munged, bindfs)
        start = state.get("pid_start", {}).get(str(pid))
        if start and _proc_start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for mp in state.get("mounts", []):
        if _mounts_under(mp):
            _unmount(mp)
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
    'cd -- "$6"; shift 6; exec "$@"'
)


class Host:
    """One host: a network namespace + private hostname/mounts for its processes."""

    def __init__(self, cluster: "Cluster", name: str, ip: str, netns: str, veth: str,
                 mountpoint: str | None):
        self.cluster = cluster
        self.name = name
        self.ip = ip
        self.netns = netns
        self.veth = veth  # root-namespace end of the veth pair
        self.mountpoint = mountpoint  # this host's bindfs view (root namespace path)
        self.tmpdir = str(cluster.workdir / "tmp" / name)
        self._procs: list[subprocess.Popen] = []

    def __repr__(self) -> str:
        return f"<Host {self.name} {self.ip} netns={self.netns}>"

    # -- command construction
    def wrap(self, argv: Sequence[str], cwd: str | os.PathLike | None = None) -> list[str]:
        """argv that runs ``argv`` on this host (netns + private UTS/mount ns)."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a sequence; use host.sh('...') for shell text")
        c = self.cluster
        return [
            _which("nsenter"), f"--net=/run/netns/{self.netns}",
            _which("unshare"), "--uts", "--mount", "--propagation", "private",
            "sh", "-c", _WRAP, "fsm-host",
            self.name, self.mountpoint or "", c.shared, str(c.hosts_file),
            str(c.resolv_file) if c.resolv_file else "",
            str(cwd if cwd is not None else c.default_cwd),
            *map(str, argv),
        ]

    def env(self, env: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """The environment a host process gets: os.environ (minus SLURM_*), python bin
        first on PATH, TMPDIR private to the host, then ``env`` on top."""
        return _env({"TMPDIR": self.tmpdir}, env)

    # -- running things
    def popen(self, argv: Sequence[str], env: Mapping[str, str | None] | None = None,
              cwd: str | os.PathLike | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` on this host.  Own session (process group), so
        ``os.killpg(p.pid, sig)`` reaches its children.  Extra kwargs go to Popen."""
        kw.setdefault("start_new_session", True)
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(self.wrap(argv, cwd), env=self.env(env), **kw)
        self._procs.append(p)
        return p

    def run(self, argv: Sequence[str], env: Mapping[str, str | None] | None = None,
            timeout: float = 60, check: bool = False, input: str | None = None,
            cwd: str | os.PathLike | None = None, capture_output: bool = True,
            text: bool = True) -> subprocess.CompletedProcess:
        """Run ``argv`` on this host; kill its whole process group on timeout
        (then raise subprocess.TimeoutExpired)."""
        pipe = subprocess.PIPE if capture_output else None
        p = self.popen(argv, env=env, cwd=cwd, stdout=pipe, stderr=pipe,
                       stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                       text=text)
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
        return _netns_pids(self.netns)

    def kill_all(self, sig: int = signal.SIGKILL, grace: float = 0.0) -> None:
        """Kill every process on this host (``grace`` > 0: SIGTERM first)."""
        _kill_netns(self.netns, sig, grace)
        for p in list(self._procs):
            with contextlib.suppress(Exception):
                p.wait(timeout=5)
            self._procs.remove(p)

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
    """

    def __init__(self, n_hosts: int = 3, cache_timeout: float = 2.0,
                 shared_path: str | None = None, hosts_file: str = "cluster",
                 bindfs_args: Sequence[str] = (), extra_hosts: Sequence[str] = (),
                 host_names: Sequence[str] | None = None):
        if n_hosts < 1 or n_hosts > 200:
            raise ValueError("n_hosts must be 1..200")
        if hosts_file not in ("cluster", "loopback", "none"):
            raise ValueError("hosts_file must be 'cluster', 'loopback' or 'none'")
        self.n_hosts = n_hosts
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
        self._state: dict = {"owner": os.getpid(), "owner_start": _proc_start_time(os.getpid()),
                             "workdir": str(self.workdir), "netns": [], "links": [],
                             "mounts": [], "pids": [], "pid_start": {}}
        self._closed = False
        self._started = False
        self._lock = threading.Lock()
        self._cleanups: list = []  # callables run first at close (e.g. Slurm daemons)

    # -- lifecycle
    def __enter__(self) -> "Cluster":
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

    def start(self) -> "Cluster":
        missing = missing_capabilities()
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
        for attempt in range(5):
            self.subnet = self._pick_subnet()
            _sh(["ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge])
            # a concurrent run may have grabbed the same /24 between pick and add
            others = [l for l in _sh(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines()
                      if f" {self.subnet}." in l and self.bridge not in l.split()[1]]
            if not others:
                break
            _sh(["ip", "addr", "flush", "dev", self.bridge])
        else:
            raise RuntimeError("could not reserve a private subnet")
        _sh(["ip", "link", "set", self.bridge, "up"])
        self._state["subnet"] = self.subnet

        (self.workdir / "etc").mkdir()
        self.backing.mkdir(exist_ok=True)
        os.chmod(self.backing, 0o1777)  # like a scratch dir; tests may chmod it
        if self.shared != str(self.backing):
            Path(self.shared).mkdir(parents=True, exist_ok=True)

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
        if mnt:
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
        if mnt:
            Path(mnt).mkdir(parents=True)
            t = f"{self.cache_timeout:g}"
            _sh(["bindfs", "-o", f"attr_timeout={t},entry_timeout={t},negative_timeout={t}",
                 *self.bindfs_args, str(self.backing), mnt])
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
            for p in h._procs:
                with contextlib.suppress(Exception):
                    p.wait(timeout=5)
        if not _mounts_under(str(self.workdir)) and not any(
                os.path.exists(f"/run/netns/{ns}") for ns in self._state["netns"]):
            _unregister(self.prefix)


# --------------------------------------------------------------------------- Slurm

@dataclasses.dataclass
class JobResult:
    job_id: str
    state: str           # aggregate: COMPLETED only if every (array) task completed
    exit_code: int       # first non-zero exit code among tasks (else 0)
    signal: int
    tasks: list[dict]    # one dict of `scontrol show job -o` fields per (array) task

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


class SlurmCluster:
    """A real Slurm (munged, slurmctld, one slurmd per host) on a ``Cluster``.

    The "login node" is the ``ctl`` namespace: ``sbatch``/``scontrol`` run there
    (``nsenter --net``) with ``SLURM_CONF`` set.  Jobs inherit the submit
    environment (python bin first on PATH, SLURM_CONF), run in the host's
    namespaces with its hostname and see the shared directory at ``cluster.shared``.
    """

    def __init__(self, n_nodes: int = 3, cluster: Cluster | None = None,
                 cpus_per_node: int = 2, **cluster_kw):
        self._own_cluster = cluster is None
        self.cluster = cluster or Cluster(n_nodes, extra_hosts=["ctl"], **cluster_kw)
        if "ctl" not in self.cluster.extra_names:
            raise ValueError("the Cluster must be created with extra_hosts=['ctl']")
        self.cpus_per_node = cpus_per_node
        self.dir = self.cluster.workdir / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.outdir = self.dir / "out"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.daemons: dict[str, subprocess.Popen] = {}
        self._nscript = 0
        self._closed = False
        self.setup_seconds: float | None = None

    # -- lifecycle
    def __enter__(self) -> "SlurmCluster":
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

    def start(self, probe_timeout: float = 30) -> "SlurmCluster":
        t0 = time.monotonic()
        if not self.cluster._started:
            self.cluster.start()
        self.cluster._cleanups.append(self._stop_daemons)
        try:
            self._start_munge()
            self._write_conf()
            self.daemons["slurmctld"] = self.ctl.popen(
                [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)],
                stdout=open(self.dir / "slurmctld.stdout", "w"), stderr=subprocess.STDOUT)
            for h in self.hosts:
                self.daemons[f"slurmd-{h.name}"] = h.popen(
                    [_which("slurmd"), "-D", "-f", str(self.conf), "-N", h.name],
                    stdout=open(self.dir / f"slurmd-{h.name}.stdout", "w"),
                    stderr=subprocess.STDOUT)
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
            [_which("munged"), "-F", "--force", f"--socket={self.munge_socket}",
             f"--key-file={key}", f"--log-file={self.dir / 'munged.log'}",
             f"--pid-file={self.dir / 'munged.pid'}", f"--seed-file={self.dir / 'munged.seed'}"],
            stdin=subprocess.DEVNULL, stdout=open(self.dir / "munged.stdout", "w"),
            stderr=subprocess.STDOUT, start_new_session=True)
        self.daemons["munged"] = p
        self.cluster.track_pid(p.pid)
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("munged did not start: " + self._tail("munged.log")
                                   + self._tail("munged.stdout"))
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
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MinJobAge=3600",
            "KillWait=2",
            "InactiveLimit=0",
            "MailProg=/bin/true",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
        ]
        for h in self.hosts:
            lines.append(f"NodeName={h.name} NodeAddr={h.ip} NodeHostname={h.name} Sockets=1 "
                         f"CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=ALL Default=YES State=UP MaxTime=INFINITE")
        self.conf.write_text("\n".join(lines) + "\n")
        self.conf.chmod(0o644)

    def _probe(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        job = None
        while job is None:
            try:
                job = self.sbatch("#!/bin/sh\ntrue\n", f"--nodes={len(self.hosts)}",
                                  "--job-name=probe", timeout=5)
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

    def login(self, argv: Sequence[str], env: Mapping[str, str | None] | None = None,
              timeout: float = 30, cwd: str | None = None) -> subprocess.CompletedProcess:
        """Run a client command (sbatch, scontrol, squeue, scancel...) on the login side."""
        full = ["timeout", "-k", "2", str(timeout),
                _which("nsenter"), f"--net=/run/netns/{self.ctl.netns}", *argv]
        return subprocess.run(full, env=self.login_env(env), capture_output=True, text=True,
                              timeout=timeout + 5, stdin=subprocess.DEVNULL,
                              cwd=cwd or self.cluster.default_cwd)

    def scontrol(self, *args: str, timeout: float = 15) -> str:
        p = self.login(["scontrol", *args], timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {p.stderr.strip()}")
        return p.stdout

    def sbatch(self, script: str | os.PathLike, *args: str,
               env: Mapping[str, str | None] | None = None, timeout: float = 15) -> str:
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
        given = list(args) + [tok for line in text.splitlines() if line.startswith("#SBATCH")
                              for tok in line.split()[1:]]
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
            if tasks and all(t.get("JobState") in _TERMINAL_STATES for t in tasks) and not any(
                    re.search(r"[-,%]", t.get("ArrayTaskId", "")) for t in tasks):
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(Exception):
                    self.login(["scancel", str(job_id)], timeout=5)
                raise TimeoutError(f"job {job_id} not finished after {timeout}s: "
                                   f"{[(t.get('JobId'), t.get('JobState'), t.get('Reason')) for t in tasks]}"
                                   f"\n{self.logs()}")
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

    def run_job(self, script: str | os.PathLike, *args: str, timeout: float = 60,
                env: Mapping[str, str | None] | None = None) -> tuple[JobResult, str]:
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

    @pytest.fixture
    def make_cluster():
        """Factory: ``make_cluster(n_hosts=3, cache_timeout=2.0, **kw) -> Cluster``
        (started); all are torn down after the test, even when it fails."""
        require_capabilities()
        made: list[Cluster] = []

        def factory(n_hosts: int = 3, **kw) -> Cluster:
            c = Cluster(n_hosts, **kw)
            made.append(c)
            return c.start()

        yield factory
        for c in reversed(made):
            c.close()

    @pytest.fixture
    def cluster(make_cluster) -> Cluster:
        """3 hosts, cache_timeout=2 s."""
        return make_cluster(3)

    @pytest.fixture
    def make_slurm():
        """Factory: ``make_slurm(n_nodes=3, **cluster_kw) -> SlurmCluster`` (started,
        probe job done); torn down after the test."""
        require_capabilities(slurm=True)
        made: list[SlurmCluster] = []

        def factory(n_nodes: int = 3, **kw) -> SlurmCluster:
            s = SlurmCluster(n_nodes, **kw)
            made.append(s)
            return s.start()

        yield factory
        for s in reversed(made):
            s.close()

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
