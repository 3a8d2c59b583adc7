"""``SlurmCluster``: a real Slurm (munged, slurmctld, one slurmd per host) on a ``Cluster``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fsmingle.protocol.queue import ENDED

from .accounting import DBD_PORT, _Accounting
from .core import Cluster
from .plumbing import (
    _env,
    _which,
)

if TYPE_CHECKING:
    from .hosts import Host


# Slurm's states of a job that has ended: the ones fsmingle's queue watch knows (without its own
# "GONE", a job that squeue and sacct no longer report).
_TERMINAL_STATES = ENDED - {"GONE"}


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


class SlurmCluster(_Accounting):
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
