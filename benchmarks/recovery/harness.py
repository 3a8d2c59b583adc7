"""One run of the recovery scenario: N nodes train, a spare waits, one non-master node fails.

Each node is a process tree in its own session (a launcher and its training process, or one
in-process trainer); every training process appends JSON lines to its node's log
(:mod:`benchmarks.recovery.trainer`).  The fault hits one node whose training rank is not 0:
``kill`` sends SIGKILL to every process of its tree, ``stop`` SIGSTOP (both with every node on
127.0.0.1 in the root namespace), ``cut`` takes the node's network link down, its processes left
running (every node then on a network-namespace host of its own: :mod:`benchmarks.recovery.netcut`).
From the logs, the same definitions for the three faults:

* **detect**: the first survivor whose collective raised (``lost``);
* **release**: the first process of the next world started (a launcher's restart), or for the
  in-process path the first rendezvous that returned;
* **ready**: every rank of the next world has its process group and its DDP model (after
  ``init_process_group``, DDP's construction and one broadcast);
* **first step**: every rank of the next world (the world whose ``wid`` shows N ranks after the
  fault) did its first step: the latest of their first steps.

All times are seconds after the fault (``time.time()``, one clock: one machine, the hosts of
``cut`` included).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
PATHS = ("inproc", "fsmingle-run", "torchrun-fsmingle", "torchrun-c10d", "torchrun-etcd")
FAULTS = ("kill", "stop", "cut")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    def __init__(
        self,
        path: str,
        n: int,
        fault: str,
        work: Path,
        stale_after: float,
        pg_timeout: float,
        cut_watch: float = 10.0,
        spares: int = 1,
    ):
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}")
        self.path, self.n, self.fault, self.work, self.cut_watch = path, n, fault, work, cut_watch
        self.stale_after, self.pg_timeout = stale_after, pg_timeout
        self.dir = work / "rdzv"
        self.dir.mkdir(mode=0o700)
        self.job = "rec"
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.etcd: subprocess.Popen | None = None
        self.c10d_port = _free_port()
        self.etcd_port = _free_port()
        self.cluster = None  # cut: the hosts (node i on cluster.hosts[i], etcd on cluster.extra["etcd"])
        # torchrun's paths: the agent's module, the workers' entrypoint, and whether --rdzv-conf sets
        # torch's timeouts from --stale-after (benchmarks/recovery/join.py changes all three).
        self.launcher = ["-m", "torch.distributed.run"]
        self.entry = ["-m", "benchmarks.recovery.trainer", "env"]
        self.timeouts = True
        if fault == "cut":
            from .netcut import start_cluster

            self.cluster = start_cluster(n + spares, etcd=path == "torchrun-etcd")

    def ip(self, i: int) -> str:
        """Node ``i``'s address (``"etcd"``: etcd's): its host's IP with ``cut``, else 127.0.0.1."""
        if self.cluster is None:
            return "127.0.0.1"
        return self.cluster.extra["etcd"].ip if i == "etcd" else self.cluster.hosts[i].ip

    # ------------------------------------------------------------------ commands
    def _trainer(self) -> list[str]:
        return [sys.executable, "-m", "benchmarks.recovery.trainer", "env"]

    def _torchrun(self, i: int) -> list[str]:
        tr = [sys.executable, *self.launcher, "--nnodes", str(self.n), "--nproc-per-node", "1"]
        tr += ["--max-restarts", "5", "--rdzv-id", self.job]
        if self.path == "torchrun-c10d":
            tr += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.ip(0)}:{self.c10d_port}"]
            conf = [f"is_host={1 if i == 0 else 0}"]
        elif self.path == "torchrun-etcd":
            tr += ["--rdzv-backend", "etcd-v2", "--rdzv-endpoint", f"{self.ip('etcd')}:{self.etcd_port}"]
            conf = []
        else:
            tr += ["--rdzv-backend", "fsmingle", "--rdzv-endpoint", str(self.dir)]
            conf = [f"addr={self.ip(i)}"]
        # The same settings on every path: torch's keep-alive bound and its store timeout (what a
        # failed round waits out: role_info in the agent's store, torch's default 60 s) are
        # fsmingle's --stale-after.  One --rdzv-conf: torchrun keeps only the last one given.
        if self.timeouts:
            conf += [f"{k}={v}" for k, v in torch_timeouts(self.stale_after).items()]
        tr += ["--rdzv-conf", ",".join(conf)] if conf else []
        if self.cluster is not None:
            tr += ["--local-addr", self.ip(i)]  # the agent's address in the rendezvous: MASTER_ADDR
        return tr + self.entry

    def command(self, i: int, spare: bool) -> list[str]:
        if self.path == "inproc":
            c = [sys.executable, "-m", "benchmarks.recovery.trainer", "inproc", str(self.dir), self.job, str(self.n)]
            return c + (["--spare"] if spare else [])
        if self.path == "fsmingle-run":
            fr = [sys.executable, "-m", "fsmingle", "run", "--dir", str(self.dir), "--job-id", self.job]
            fr += ["--nnodes", str(self.n), "--addr", self.ip(i), "--stale-after", str(self.stale_after)]
            fr += ["--timeout", "300"] + (["--spare-timeout", "inf"] if spare else [])
            loop = " ".join(map(_q, fr + ["--"] + self._trainer()))
            return ["bash", "-c", f"for i in 1 2 3 4 5; do {loop}; done"]
        return self._torchrun(i)

    def start_node(self, i: int, spare: bool = False) -> None:
        log = self.work / f"node{i}.log"
        self.logs.append(log)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FSMINGLE_", "PET_", "SLURM_", "TORCHELASTIC"))}
        env.update(
            PYTHONPATH=str(ROOT),
            BENCH_LOG=str(log),
            BENCH_PG_TIMEOUT=str(self.pg_timeout),
            OMP_NUM_THREADS="1",
            LOGLEVEL="WARNING",
            BENCH_ADDR=self.ip(i),
        )
        argv = self.command(i, spare)
        if self.cluster is not None:
            host = self.cluster.hosts[i]
            # gloo picks its interface from the hostname otherwise; TMPDIR: torchrun's files per host
            env.update(GLOO_SOCKET_IFNAME="eth0", TMPDIR=host.tmpdir)
            argv = host.wrap(argv, cwd=ROOT)
        out = open(self.work / f"node{i}.out", "wb")
        p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)

    def start_etcd(self) -> None:
        peer = _free_port()
        ip = self.ip("etcd")
        argv = [
            "etcd",
            "--enable-v2=true",
            "--data-dir",
            str(self.work / "etcd"),
            "--listen-client-urls",
            f"http://{ip}:{self.etcd_port}",
            "--advertise-client-urls",
            f"http://{ip}:{self.etcd_port}",
            "--listen-peer-urls",
            f"http://{ip}:{peer}",
            "--initial-advertise-peer-urls",
            f"http://{ip}:{peer}",
            "--initial-cluster",
            f"default=http://{ip}:{peer}",
        ]
        if self.cluster is not None:
            argv = self.cluster.extra["etcd"].wrap(argv)
        self.etcd = subprocess.Popen(
            argv,
            stdout=open(self.work / "etcd.out", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait(lambda: self.etcd.poll() is not None or _etcd_up(self.work / "etcd.out"), 30, "etcd")

    # ------------------------------------------------------------------ reading
    def events(self) -> list[tuple[int, dict]]:
        out = []
        for i, log in enumerate(self.logs):
            try:
                lines = log.read_text().splitlines()
            except FileNotFoundError:
                continue
            for line in lines:
                try:
                    out.append((i, json.loads(line)))
                except ValueError:
                    pass
        return out

    def world_ranks(self) -> dict[str, dict[int, int]]:
        """wid -> {rank: node index} of every world that stepped."""
        w: dict[str, dict[int, int]] = {}
        for i, e in self.events():
            if e.get("ev") == "step":
                w.setdefault(e["wid"], {})[e["rank"]] = i
        return w

    # ------------------------------------------------------------------ the scenario
    def run(self, train_s: float = 3.0, recover_s: float = 120.0) -> dict:
        if self.path == "torchrun-etcd":
            self.start_etcd()
        for i in range(self.n):
            self.start_node(i)
        _wait(lambda: any(len(r) == self.n for r in self.world_ranks().values()), 300, "the first world's steps")
        first = next(w for w, r in self.world_ranks().items() if len(r) == self.n)
        self.start_node(self.n, spare=True)
        self._wait_spare()
        time.sleep(train_s)
        ranks = self.world_ranks()[first]
        # A non-master node: the highest rank (for c10d: not node 0 either, which hosts the store).
        host = 0 if self.path == "torchrun-c10d" else None
        victim = next(ranks[r] for r in sorted(ranks, reverse=True) if r != 0 and ranks[r] != host)
        tree = _tree(self.procs[victim].pid)
        before = set(self.world_ranks())
        t_fault = time.time()
        if self.fault == "cut":
            self.cluster.hosts[victim].link_down()  # the processes run on; stays down until watch()
        else:
            sig = signal.SIGKILL if self.fault == "kill" else signal.SIGSTOP
            for p in tree:
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
        try:
            # A run whose every node but the victim exited cannot recover (a world needs N nodes and
            # the victim is stopped, cut or dead): end it now, not at recover_s.
            _wait(lambda: self._next_world(before) is not None or self._all_exited(victim), recover_s, "the next world")
        except TimeoutError:
            return dict(path=self.path, n=self.n, fault=self.fault, ok=False, note=self._why())
        if self._next_world(before) is None:
            note = f"every node but the victim exited {time.time() - t_fault:.1f} s after the fault\n{self._why()}"
            return dict(path=self.path, n=self.n, fault=self.fault, ok=False, note=note)
        wid = self._next_world(before)
        evs = [(i, e) for i, e in self.events() if e["t"] >= t_fault]
        lost = [e["t"] for i, e in evs if e.get("ev") in ("raised", "lost") and i != victim]
        if self.path == "inproc":
            rel = [e["t_rel"] for i, e in evs if e.get("ev") == "released"]
        else:
            rel = [e["t0"] for i, e in evs if e.get("ev") == "start"]
        td: dict[str, list[float]] = {}  # inproc: each piece of the survivors' teardown (trainer.py)
        for _i, e in evs:
            if e.get("ev") == "td":
                td.setdefault(e["what"], []).append(e["s"])
        firsts: dict[int, float] = {}
        ready: dict[int, float] = {}
        for _i, e in evs:
            if e.get("ev") == "step" and e["wid"] == wid:
                firsts.setdefault(e["rank"], e["t"])
            if e.get("ev") == "ready" and e["wid"] == wid:
                ready.setdefault(e["rank"], e["t"])
        row = dict(
            path=self.path,
            n=self.n,
            fault=self.fault,
            ok=True,
            detect=min(lost) - t_fault if lost else None,
            release=min(rel) - t_fault if rel else None,
            ready=max(ready.values()) - t_fault if ready else None,
            first_step=max(firsts.values()) - t_fault,
            spare_in=self.n in set(self.world_ranks()[wid].values()),
            teardown_max={k: round(max(v), 3) for k, v in td.items()},
        )
        if self.fault == "cut":
            from .netcut import watch

            row["cut"] = watch(self, victim, wid, before, t_fault, self.cut_watch)
        return row

    def _all_exited(self, victim: int) -> bool:
        return all(p.poll() is not None for i, p in enumerate(self.procs) if i != victim)

    def _next_world(self, before: set) -> str | None:
        for w, r in self.world_ranks().items():
            if w not in before and len(r) == self.n:
                return w
        return None

    def _wait_spare(self) -> None:
        if self.path in ("inproc", "fsmingle-run"):
            # The spare claims a rank in the generation after the running one.
            def claimed():
                gens = sorted((self.dir / self.job).glob("gen-*"))
                return any(any(g.glob("rank-*.claim")) for g in gens if not (g / "release.json").exists())

            _wait(claimed, 300, "the spare's claim")
        else:
            time.sleep(12)  # torchrun: an agent in the waiting list leaves no trace we could read (import torch)

    def _why(self) -> str:
        outs = []
        for i in range(len(self.procs)):
            try:
                tail = (self.work / f"node{i}.out").read_text(errors="replace").strip().splitlines()[-2:]
            except FileNotFoundError:
                tail = []
            outs.append(f"node{i}: " + " | ".join(x[:200] for x in tail))
        return "\n".join(outs)

    def close(self) -> None:
        if self.cluster is not None:
            for h in self.cluster.hosts:  # a cut host's processes must see the kill, not a dead link
                h.link_up()
        for p in self.procs + ([self.etcd] if self.etcd else []):
            for q in _tree(p.pid):
                try:
                    q.send_signal(signal.SIGCONT)
                    q.kill()
                except psutil.Error:
                    pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        if self.cluster is not None:
            self.cluster.close()


def torch_timeouts(stale_after: float) -> dict[str, int]:
    """torchrun's ``--rdzv-conf`` timeouts equal to fsmingle's ``--stale-after`` (whole seconds).

    ``keep_alive_interval * keep_alive_max_attempt`` (torch's dead-node rule, ``_sanitize`` in
    ``dynamic_rendezvous.py``) and ``read_timeout`` (the agents' store timeout: c10d's TCPStore,
    etcd-v2's reads, fsmingle's store) -- keys all three backends read (``create_handler`` and each
    backend's ``create_backend`` in ``torch/distributed/elastic/rendezvous/``)."""
    s = max(1, round(stale_after))
    interval = next(i for i in (5, 4, 3, 2, 1) if s % i == 0 and s // i >= 2) if s >= 2 else 1
    return {"keep_alive_interval": interval, "keep_alive_max_attempt": max(1, s // interval), "read_timeout": s}


def one(
    path: str,
    n: int,
    fault: str,
    stale_after: float,
    pg_timeout: float,
    keep: str | None = None,
    train_s: float = 3.0,
    recover_s: float = 60.0,
    cut_watch: float = 10.0,
) -> dict:
    """One run; its row (times in seconds after the fault), ``ok`` False with a ``note`` if no world formed.

    ``fault``: one of :data:`FAULTS` (ValueError otherwise); ``cut`` needs root (network
    namespaces) and adds ``cut`` to the row (:func:`benchmarks.recovery.netcut.watch`, after
    ``cut_watch`` seconds with the link up again)."""
    work = Path(tempfile.mkdtemp(prefix=f"rec-{path}-{n}-{fault}-"))
    work.chmod(0o755)
    r = None
    try:
        r = Run(path, n, fault, work, stale_after, pg_timeout, cut_watch)
        return r.run(train_s=train_s, recover_s=recover_s)
    except TimeoutError as e:
        return dict(path=path, n=n, fault=fault, ok=False, note=f"{e}\n{r._why()}")
    finally:
        if r is not None:
            r.close()
        if keep:
            shutil.copytree(work, Path(keep) / work.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("rdzv"))
        shutil.rmtree(work, ignore_errors=True)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def _etcd_up(out: Path) -> bool:
    """etcd serves its clients (its log says so; a port probe from here cannot reach a host's IP)."""
    try:
        return "ready to serve client requests" in out.read_text(errors="replace")
    except FileNotFoundError:
        return False


def _wait(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise TimeoutError(f"no {what} within {timeout:g} s")


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)
