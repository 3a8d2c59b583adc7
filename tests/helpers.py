"""The test harness: how every test starts a participant and what environment it gets.

* One way to start a participant: :meth:`Procs.env` (``fsmingle env``/``run``), here or on a
  network-namespace host of tests/cluster/ (``host=``); :meth:`Procs.spawn` for any other
  command; :func:`run_cli` for a short ``fsmingle`` command run to completion.
* One environment scrub: :func:`clean_env` (and :func:`torch_env` for torch jobs,
  :func:`host_env` as an overlay for cluster hosts) drops every scheduler/launcher variable the
  test process may carry (``_SCRUB``).

Every participant is a real ``fsmingle`` process (``python -m fsmingle ...``)
whose stdout and stderr go to files, so a test can watch its progress while it
runs and read everything once it ended, without pipe deadlocks.  Every wait is
bounded; :class:`Procs` kills whatever a test left running (and the whole
process group, so ``unshare``'d children go too).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil

FSMINGLE = [sys.executable, "-m", "fsmingle"]
REPO = Path(__file__).resolve().parents[1]  # the repository root: the one place the tests compute it

# The one environment scrub of the tests.  Variables a scheduler, a launcher (torchrun, a parent
# fsmingle) or a framework reads; the test process may carry them (pytest itself run under torchrun
# or Slurm, a developer's FSMINGLE_* settings), and each would change what a participant, torchrun
# or a framework resolves.
_SCRUB = re.compile(
    r"^(SLURM_|FSMINGLE_|PET_|PBS_|LSB_|JSM_|OMPI_|PMI_|TORCHELASTIC_|ACCELERATE_|KUBERNETES_|"
    r"(MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|GROUP_RANK|"
    r"ROLE_RANK|ROLE_WORLD_SIZE|NNODES|NCCL_SOCKET_IFNAME|GLOO_SOCKET_IFNAME|JOB_ID|JOB_COMPLETION_INDEX|"
    r"TORCH_DISABLE_SHARE_RDZV_TCP_STORE|LOGLEVEL|CUDA_VISIBLE_DEVICES)$)"
)


def scrubbed(name: str) -> bool:
    """True if the variable ``name`` is one the tests never pass on from their own environment."""
    return bool(_SCRUB.match(name))


def clean_env(extra: dict | None = None) -> dict:
    """``os.environ`` without scheduler/launcher/fsmingle variables, plus ``extra``; fsmingle importable."""
    env = {k: v for k, v in os.environ.items() if not scrubbed(k)}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def torch_env(tmp_path, extra: dict | None = None) -> dict:
    """:func:`clean_env` for torch jobs: one OpenMP thread per rank (2 cores), TMPDIR inside ``tmp_path``."""
    tmpdir = Path(tmp_path) / "tmp"
    tmpdir.mkdir(exist_ok=True)
    return clean_env({"TMPDIR": str(tmpdir), "OMP_NUM_THREADS": "1", **(extra or {})})


def host_env(extra: dict | None = None) -> dict:
    """The same scrub as an overlay for :meth:`cluster.Host.popen` (a value of None removes the
    variable on the host): every variable :func:`clean_env` drops, its PYTHONPATH, unbuffered
    output, one OpenMP thread, then ``extra``."""
    drop = {k: None for k in os.environ if scrubbed(k)}
    # PYTHONPATH as clean_env's: the `fsmingle` a host runs is this checkout's, not the one the
    # package was installed from (a worktree's tests otherwise ran the main checkout's code on hosts)
    path = clean_env()["PYTHONPATH"]
    return {**drop, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(extra or {})}


def run_cli(
    *args, env: dict | None = None, timeout: float = 60, module: str = "fsmingle"
) -> subprocess.CompletedProcess:
    """Run ``python -m MODULE ARGS`` in the repository to completion: text stdout/stderr captured,
    :func:`clean_env` unless ``env`` is given; subprocess.TimeoutExpired after ``timeout`` seconds."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )


def status_of(d, job: str) -> dict:
    """``fsmingle status JOB --dir D --json``, which must exit 0: the job's status record."""
    p = run_cli("status", job, "--dir", d, "--json")
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    return st[0] if isinstance(st, list) else st


def free_port() -> int:
    """A TCP port that was free a moment ago (bound and released)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def wait_for(pred: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll ``pred`` until it returns something truthy; AssertionError naming ``what`` after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def gen_dir(d, job: str, g: int) -> Path:
    return Path(d) / job / f"gen-{g:08d}"


def make_gen_dir(d, job: str, g: int = 1) -> Path:
    """Create generation ``g`` of ``job`` under ``d`` by hand (to plant files in it), every level
    0700 as fsmingle makes them; returns the generation directory."""
    gd = gen_dir(d, job, g)
    gd.mkdir(parents=True)
    for p in (d, Path(d) / job, gd):
        os.chmod(p, 0o700)
    return gd


def read_json(path) -> dict | None:
    try:
        return json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None


def claim_of(d, job: str, g: int, rank: int) -> dict | None:
    return read_json(gen_dir(d, job, g) / f"rank-{rank:05d}.claim")


def beacon_of(d, job: str, g: int, instance: str) -> dict | None:
    return read_json(gen_dir(d, job, g) / f"beacon-{instance}.json")


def release_of(d, job: str, g: int) -> dict | None:
    return read_json(gen_dir(d, job, g) / "release.json")


def generations(d, job: str) -> list[int]:
    try:
        names = os.listdir(Path(d) / job)
    except OSError:
        return []
    return sorted(int(n[4:]) for n in names if re.fullmatch(r"gen-\d{8}", n))


class Proc:
    """One spawned process; stdout/stderr in files under ``logdir``."""

    def __init__(
        self,
        argv: Sequence[str],
        logdir: Path,
        name: str,
        env: dict | None = None,
        preexec_user: Sequence[str] = (),
        cwd: str | None = None,
    ):
        self.name = name
        self.argv = list(preexec_user) + list(argv)
        self.out_path = logdir / f"{name}.out"
        self.err_path = logdir / f"{name}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._out,
            stderr=self._err,
            stdin=subprocess.DEVNULL,
            env=env if env is not None else clean_env(),
            cwd=cwd,
            start_new_session=True,
        )
        self.ended: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def poll(self) -> int | None:
        rc = self.popen.poll()
        if rc is not None and self.ended is None:
            self.ended = time.monotonic()
        return rc

    def wait(self, timeout: float) -> int:
        """Exit status; kills the process and fails the test if it is still running after ``timeout``."""
        try:
            rc = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} still running after {timeout:g} s (killed); "
                f"argv={self.argv}\nstderr:\n{self.stderr()[-4000:]}"
            ) from None
        self.poll()
        self._out.close()
        self._err.close()
        return rc

    @property
    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def result(self, timeout: float = 30) -> dict:
        """Wait for success and return the JSON ``fsmingle env --format json`` printed."""
        rc = self.wait(timeout)
        assert rc == 0, f"{self.name} exited {rc}\nstderr:\n{self.stderr()[-4000:]}"
        try:
            return json.loads(self.stdout().strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise AssertionError(f"{self.name}: no JSON on stdout: {self.stdout()!r}\nstderr:\n{self.stderr()}")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the process, its descendants and its process group."""
        for p in self.descendants():
            try:
                p.kill()
            except psutil.Error:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.kill()
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.poll()


class Procs:
    """Spawns participants for one test and kills the leftovers at teardown."""

    def __init__(self, logdir: Path):
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.all: list[Proc] = []
        self._n = 0

    def spawn(
        self,
        argv: Sequence[str],
        name: str | None = None,
        env: dict | None = None,
        prefix: Sequence[str] = (),
        cwd: str | None = None,
        host=None,
    ) -> Proc:
        """Start ``prefix + argv``: here, or on ``host`` (a :class:`cluster.Host`: its netns, hostname, mounts;
        ``env`` is then an overlay on the host's environment, as :func:`host_env` makes)."""
        if host is not None:
            argv, prefix, cwd = host.wrap([*prefix, *argv], cwd=cwd or REPO), (), None
            env = host.env(env)
        self._n += 1
        p = Proc(argv, self.logdir, name or f"p{self._n}", env=env, preexec_user=prefix, cwd=cwd)
        self.all.append(p)
        return p

    def env(
        self,
        d,
        job: str,
        *args,
        timeout: float = 30,
        stale_after: float | None = 3,
        addr: str | None = "127.0.0.1",
        extra_env: dict | None = None,
        name: str | None = None,
        prefix: Sequence[str] = (),
        cmd: str = "env",
        fmt: str | None = "json",
        python: bool = False,
        host=None,
    ) -> Proc:
        """Spawn ``fsmingle env --format json --dir d --job-id job ARGS`` (or ``run`` with ``cmd='run'``).

        ``prefix`` is prepended to the argv (``unshare ...``, ``setpriv ...``);
        ``args`` are appended (for ``run``: options, then ``--``, then the command).
        ``host``: run it on that network-namespace host (pass ``addr=None`` to let it choose).
        The one way the tests start a participant, here or on a cluster host.
        """
        argv = FSMINGLE + [cmd, "--dir", str(d), "--job-id", job, "--timeout", str(timeout)]
        if stale_after is not None:
            argv += ["--stale-after", str(stale_after)]
        if addr is not None:
            argv += ["--addr", addr]
        if fmt is not None and cmd == "env":
            argv += ["--format", fmt]
        argv += [str(a) for a in args]
        env = clean_env(extra_env) if host is None else host_env(extra_env)
        return self.spawn(argv, name=name, env=env, prefix=prefix, host=host)

    def cli(
        self, *args, env: dict | None = None, prefix: Sequence[str] = (), timeout: float = 30, name: str | None = None
    ) -> tuple[int, str, str]:
        """Run ``fsmingle ARGS`` to completion: (rc, stdout, stderr)."""
        p = self.spawn(
            FSMINGLE + [str(a) for a in args], name=name, env=env if env is not None else clean_env(), prefix=prefix
        )
        rc = p.wait(timeout)
        return rc, p.stdout(), p.stderr()

    def cleanup(self) -> None:
        for p in self.all:
            if p.poll() is None:
                p.kill()
            for f in (p._out, p._err):
                try:
                    f.close()
                except Exception:
                    pass


def results(procs: Iterable[Proc], timeout: float = 30) -> list[dict]:
    """JSON results of several participants, all of which must succeed within ``timeout`` (in total)."""
    procs = list(procs)
    end = time.monotonic() + timeout
    out = []
    try:
        for p in procs:
            out.append(p.result(timeout=max(0.1, end - time.monotonic())))
    except AssertionError:
        for q in procs:
            if q.poll() is None:
                q.kill()
        details = "\n".join(f"--- {q.name} rc={q.poll()}\n{q.stderr()[-2500:]}" for q in procs)
        raise AssertionError(f"rendezvous failed:\n{details}") from None
    return out


def assert_one_world(res: list[dict], n: int, generation: int | None = None) -> dict:
    """All results name one master/generation and distinct ranks 0..n-1; returns one of them."""
    masters = {(r["master_addr"], r["master_port"], r["generation"]) for r in res}
    assert len(masters) == 1, f"participants disagree: {res}"
    key = "rank" if res[0].get("mode") == "rank" else "node_rank"
    assert sorted(r[key] for r in res) == list(range(n)), res
    if generation is not None:
        assert res[0]["generation"] == generation, res
    return res[0]


def wait_claimed(
    d, job: str, g: int, ranks: Iterable[int], timeout: float = 15, procs: Sequence[Proc] = ()
) -> dict[int, dict]:
    """Wait until each rank in ``ranks`` has a readable claim and its holder's beacon names the rank.

    Returns: {rank: beacon}.  Fails early if any process of ``procs`` exited.
    """
    ranks = list(ranks)

    def ready():
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.name} exited {p.poll()} early:\n{p.stderr()[-3000:]}")
        out = {}
        for r in ranks:
            c = claim_of(d, job, g, r)
            if not c:
                return None
            b = beacon_of(d, job, g, c["instance"])
            if not b or b.get("rank") != r:
                return None
            if r == 0 and not b.get("master_port"):
                return None
            out[r] = b
        return out

    return wait_for(ready, timeout, f"claims of ranks {ranks} in {gen_dir(d, job, g)}")


def wait_text(p: Proc, needle: str, timeout: float = 15) -> None:
    """Wait until ``needle`` appears in the stderr of ``p``."""

    def seen():
        if needle in p.stderr():
            return True
        if p.poll() is not None:
            raise AssertionError(f"{p.name} exited {p.poll()} before printing {needle!r}:\n{p.stderr()[-3000:]}")
        return False

    wait_for(seen, timeout, f"{needle!r} from {p.name}")


# ----------------------------------------------------------------- isolation helpers


def have(*tools: str) -> list[str]:
    """The names of ``tools`` that are not on PATH."""
    return [t for t in tools if not shutil.which(t)]


def bindfs_missing() -> list[str]:
    """What a test mounting NFS-like bindfs views lacks (root to mount, ``/dev/fuse``, ``bindfs``); [] if nothing."""
    missing = [] if os.geteuid() == 0 else ["root (to mount)"]
    missing += [] if os.path.exists("/dev/fuse") else ["/dev/fuse"]
    return missing + [f"`{t}`" for t in have("bindfs")]


@contextlib.contextmanager
def bindfs_views(tmp_path, n: int, cache: float = 2.0):
    """``n`` bindfs mounts (``tmp_path/node<i>``) of one new directory ``tmp_path/backing``, each caching
    attributes, names and absences for ``cache`` seconds, as n NFS clients would; yields ``(backing, mounts)``
    and unmounts every one at exit.  Skip a test that uses it while :func:`bindfs_missing` names something."""
    backing = Path(tmp_path) / "backing"
    backing.mkdir(mode=0o700)
    mounts: list[Path] = []
    opts = ",".join(f"{k}_timeout={cache:g}" for k in ("attr", "entry", "negative"))
    try:
        for i in range(n):
            m = Path(tmp_path) / f"node{i}"
            m.mkdir(mode=0o700)
            subprocess.run(["bindfs", "-o", opts, str(backing), str(m)], check=True, capture_output=True, timeout=30)
            mounts.append(m)
        yield backing, mounts
    finally:
        for m in mounts:
            umount(m)


def other_pidns_prefix() -> list[str]:
    """argv prefix running a command in a new pid namespace: its psutil identity is not checkable from here.

    ``--kill-child`` makes the namespace die with ``unshare`` itself, so no orphan survives a killed test.
    """
    return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL"]


def ns_python(p: Proc, timeout: float = 10) -> psutil.Process:
    """The python process running inside ``p``'s ``unshare`` namespace."""

    def find():
        for c in p.descendants():
            try:
                if "fsmingle" in " ".join(c.cmdline()):
                    return c
            except psutil.Error:
                pass
        return None

    return wait_for(find, timeout, f"the fsmingle process inside {p.name}'s pid namespace")


# capabilities root loses so that file permissions apply to it as to anyone else
DAC_CAPS = "-dac_override,-dac_read_search,-fowner,-chown"


def unprivileged_prefix() -> list[str]:
    """argv prefix running a command as root *without* the capabilities that bypass file permissions.

    Running as ``nobody`` is not possible here: the interpreter lives under
    ``/root`` (mode 0700).  Dropping CAP_DAC_OVERRIDE & co. from the bounding
    set makes uid 0 subject to mode bits exactly like an ordinary user.
    """
    return ["setpriv", f"--bounding-set={DAC_CAPS}", "--inh-caps=-all"]


def is_mountpoint(path) -> bool:
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def umount(path) -> None:
    """Unmount ``path`` (FUSE or not), lazily if busy; never raises."""
    for argv in (["fusermount", "-u", "-z", str(path)], ["umount", str(path)], ["umount", "-l", str(path)]):
        if not is_mountpoint(path):
            return
        subprocess.run(argv, capture_output=True, timeout=20)


_NOT_INTO_JOBS = (
    "FSMINGLE_JOB_ID",
    "FSMINGLE_PEER_JOBS",
    "NNODES",
    "NODE_RANK",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
)


def slurm_job_env(s, run_timeout: float, **extra) -> dict:
    """The environment overlay of a job submitted to the test Slurm cluster ``s``: the example
    training script, a shared TMPDIR, one OpenMP thread, and none of the rendezvous or launcher
    variables the test process carries (a value of None removes a variable); ``extra`` on top."""
    tmp = s.cluster.workdir / "tmp" / "jobs"
    tmp.mkdir(parents=True, exist_ok=True)
    tmp.chmod(0o1777)
    env = {
        "FSMINGLE_DIR": f"{s.cluster.shared}/rdzv",
        "TRAIN": str(REPO / "examples" / "train_ddp.py"),
        "RUN_TIMEOUT": str(run_timeout),
        "TMPDIR": str(tmp),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        # whatever the test process carries must not leak into the jobs
        **dict.fromkeys(_NOT_INTO_JOBS),
    }
    env.update({k: (str(v) if v is not None else None) for k, v in extra.items()})
    return env
