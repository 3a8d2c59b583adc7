"""Peers that wait in the scheduler's queue: ask Slurm about them, pause the timeout, fail early.

A training made of separate jobs (array tasks, ``sbatch`` submissions) may wait for a peer job
that is still PENDING.  Rank 0 (only rank 0: one ``squeue`` call for all peers, at most every
``--queue-poll`` seconds, in a thread so the step loop never blocks) asks the scheduler about the
peer jobs that have not joined, and:

* while every missing rank is accounted for by a peer job that is PENDING/CONFIGURING, the
  ``--timeout`` does not run (``hold``); ``--queue-timeout`` bounds that time instead;
* a peer job that ended without joining (CANCELLED, FAILED, TIMEOUT, NODE_FAIL, COMPLETED...)
  fails the wait at once (:class:`fsmingle.errors.PeerJobEndedError`), naming job, state, reason;
  one that joined this generation or an earlier one (``joined``: seen present by this process, or
  named by a decision record's ``jobs``, which every decision carries forward) and then ended is a
  place for a spare or a re-run to fill: ``--timeout`` runs, nothing fails (the torchrun backend's
  rule, ``torchrun/queuehold.py`` ``_reachable``, for the same case);
* the findings (``missing rank 3: job 4242_3 PENDING (JobHeldUser), expected start 14:05``) go
  into the progress line, rank 0's beacon (``fsmingle status``) and the timeout message, and to
  every member in rank 0's status message (``queue``), where members pause their timeout too.

No ``squeue`` (or one that fails): one warning, then today's behaviour.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass

from ..errors import ConfigError, PeerJobEndedError
from .hold import DeadlineHold
from .queue_relay import ENDED_VOID, Relay

log = logging.getLogger("fsmingle")

WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
ENDED = frozenset(
    {
        "CANCELLED",
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "GONE",  # ours: reported before, now unknown to squeue and sacct (purged after it ended)
    }
)
_ID = re.compile(r"^(\d+)(?:_(\d+|\[[0-9,:\-%]+\]))?$")


def parse_peer_jobs(spec: str) -> tuple[str, ...]:
    """``--peer-jobs``: job ids and array expressions, comma-, colon- or space-separated:
    ``4300,4301``, ``4242_[0-3]``, ``4242_[1,3-5]``, ``4242`` (a whole array or one job).
    Colons because torchrun's ``--rdzv-conf`` splits its value on commas: ``peer_jobs=4300:4301``,
    ``peer_jobs=4242_[1:3-5]``.

    Raises:
        ConfigError: an entry that is not one of these.
    """
    out: list[str] = []
    for tok in re.findall(r"\d+_\[[^\]]*\]|[^\s,:]+", spec or ""):
        m = _ID.match(tok)
        if not m:
            raise ConfigError(f"--peer-jobs: {tok!r} is not a job id (4242), a task (4242_3) or an array (4242_[0-3])")
        base, task = m.group(1), m.group(2)
        if task is None or not task.startswith("["):
            out.append(tok)
            continue
        for part in re.split(r"[,:]", task[1:-1].split("%")[0]):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) - int(lo) > 100_000:
                raise ConfigError(f"--peer-jobs: {tok!r}: {part!r} is not a task index or range")
            out.extend(f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1))
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class JobState:
    """One peer job as the scheduler reports it."""

    id: str
    state: str
    reason: str = ""
    start: str = ""  # expected start (squeue %S), "" when unknown

    def describe(self) -> str:
        why = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        start = self.start if self.start not in ("", "N/A", "Unknown", "None") else ""
        hhmm = start[11:16] if len(start) >= 16 else start
        when = "" if not start else f", expected start {hhmm}" if self.state in WAITING else f", started {hhmm}"
        return f"job {self.id} {self.state}{why}{when}"


def squeue(ids: tuple[str, ...], timeout: float = 20.0) -> dict[str, JobState] | str:
    """One ``squeue`` call for all ``ids`` (base ids; array tasks one per line), then one ``sacct``
    call for the ids squeue no longer knows (slurmctld purges an ended job after ``MinJobAge``).

    Slurm 22.05, measured: ``squeue -j`` with one purged id exits 1 ("Invalid job id specified"),
    with several ids it prints nothing and exits 0; ``sacct`` answers an array task that never
    left the array's pending record (a held array cancelled whole) only when asked about the
    array, on one line ``4242_[0-3]``: sacct is asked about base ids and such lines are expanded.
    Without accounting sacct fails: squeue's view stands (a peer seen before and now unknown to
    both is :class:`QueueWatch`'s ``GONE``).

    Args:
        ids: job ids, ``4242`` or ``4242_3`` (:func:`parse_peer_jobs`).
        timeout: seconds each command may take.

    Returns:
        ``{id: JobState}`` (array tasks by task id), or a string saying why squeue could not be
        asked (no squeue, it failed or timed out).  Raises nothing."""
    exe = shutil.which("squeue")
    if exe is None:
        return "squeue is not on PATH"
    bases = sorted({i.split("_", 1)[0] for i in ids})
    try:
        r = subprocess.run(
            [exe, "-h", "-r", "-t", "all", "-j", ",".join(bases), "-o", "%i|%T|%r|%S"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"squeue failed: {e}"
    if r.returncode != 0 and "Invalid job id" not in r.stderr:
        return f"squeue exited {r.returncode}: {r.stderr.strip()[:200]}"
    found: dict[str, JobState] = {}
    for line in r.stdout.splitlines():
        f = line.strip().split("|")
        if len(f) == 4:
            found[f[0]] = JobState(f[0], f[1].split()[0], f[2], f[3])
    unknown = [i for i in ids if i not in found and not any(k.startswith(i + "_") for k in found)]
    sacct = shutil.which("sacct")
    if unknown and sacct:
        try:
            r = subprocess.run(
                [sacct, "-n", "-X", "-P", "-j", ",".join(sorted({i.split("_", 1)[0] for i in unknown}))]
                + ["-o", "JobID,State,Reason"],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            for line in r.stdout.splitlines() if r.returncode == 0 else ():
                f = line.strip().split("|")
                if len(f) != 3 or not f[1]:
                    continue
                try:  # "4242_[0-3]": the tasks still in the array's own record
                    tasks = parse_peer_jobs(f[0]) if "_[" in f[0] else (f[0],)
                except ConfigError:
                    tasks = (f[0],)
                for t in tasks:
                    found.setdefault(t, JobState(t, f[1].split()[0], f[2]))
        except (OSError, subprocess.SubprocessError):
            pass  # accounting is optional: squeue's view stands
    return found


class QueueWatch:
    """One participant's view of its peer jobs (see the module doc).

    Args:
        peers: peer job ids (:func:`parse_peer_jobs`); mine: this job's id ("4242_3" or "4300").
        interval: seconds between scheduler queries (rank 0 only).
        queue_timeout: seconds the wait may be held by pending peers (None: no bound).
        rank_of_task: (array job id, min task) when ranks are array task indexes, for
            "missing rank 3: job 4242_3 ..."; None otherwise.
        query: the scheduler call (:func:`squeue`; tests pass a fake).
        threaded (bool): run ``query`` in a thread (False: inline, for tests on a fake clock).

    While rank 0 is missing, the lowest present rank asks instead (:mod:`.queue_relay`).
    """

    def __init__(self, peers, mine, interval=30.0, queue_timeout=None, rank_of_task=None, query=squeue, threaded=True):
        self.peers = tuple(p for p in peers if p != mine)
        self.mine, self.interval, self.queue_timeout = mine, interval, queue_timeout
        self.rank_of_task, self.query = rank_of_task, query
        self.jobs: dict[str, JobState] = {}
        self.seen: set[str] = set()  # ids the scheduler reported at least once
        # Jobs known to have joined this generation or an earlier one (seen present by this process,
        # or named by a decision record's ``jobs``): one that ended left a place, it never "ended
        # without joining".  A spare and a restarted survivor are new processes that saw no earlier
        # world: they learn it from the decisions (Joining), each of which carries the set forward.
        self.joined: set[str] = set()
        self.broken = False  # the scheduler could not be asked: today's behaviour
        self.hold, self.lines, self.ended = False, [], ""
        self.held_time = DeadlineHold(queue_timeout)  # the time --timeout was held, for --queue-timeout
        self.next_query = 0.0
        self._thread: threading.Thread | None = None
        self._result = None
        self._asked: tuple[str, ...] = ()
        self.threaded = threaded
        self._next_emit = 0.0
        self.relay = Relay()

    # ---------------------------------------------------------------- rank 0: ask, judge
    def poll(self, now: float, present_jobs, nmissing: int) -> None:
        """Rank 0, every step: start a query when due, take a finished one, judge the findings."""
        if self.broken or not self.peers:
            return
        present_jobs = set(present_jobs)
        self.joined.update(j for j in present_jobs if j)  # present in a generation: joined (module doc)
        if self._thread is not None and not self._thread.is_alive():
            self._thread, res = None, self._result
            if isinstance(res, str):
                self.broken, self.hold, self.lines = True, False, []
                log.warning("cannot ask the scheduler about peer jobs (%s); waiting with --timeout only", res)
                return
            asked = set(self._asked)
            # Reported before, now unknown: purged.  A peer given as a whole array ("4242") is
            # reported task by task ("4242_3"): its tasks count as asked about too.
            was = {k for k in self.seen if k in asked or k.split("_", 1)[0] in asked}
            for gone in was - set(res):
                res[gone] = JobState(gone, "GONE", "no longer known to squeue or sacct")
            self.seen |= {k for k, j in res.items() if j.state != "GONE"}
            self.jobs = res
        if self._thread is None and now >= self.next_query:
            self.next_query = now + self.interval
            ask = self._asked = tuple(j for j in self.peers if j not in present_jobs)  # the ones not here yet
            self._thread = threading.Thread(target=self._run, args=(ask,), name="fsmingle-squeue", daemon=True)
            if self.threaded:
                self._thread.start()
            else:
                self._run(ask)  # the thread object stays unstarted: not alive, taken at the next poll
        self.judge(present_jobs, nmissing)

    def _run(self, ask) -> None:
        try:
            self._result = self.query(ask) if ask else {}
        except Exception as e:  # any failure of the scheduler call degrades
            self._result = f"{e.__class__.__name__}: {e}"

    def judge(self, present_jobs, nmissing: int) -> None:
        """Judge the last findings: ``hold``, ``lines`` and ``ended`` (an ended peer job that never
        joined; one in :attr:`joined` left a place to fill instead, and holds nothing).

        Args:
            present_jobs: scheduler jobs present in this generation now, or counted so.
            nmissing (int): ranks missing now.
        """
        present = set(present_jobs)
        absent: list[JobState] = []
        for peer in self.peers:
            if peer in present:
                continue
            tasks = [j for k, j in self.jobs.items() if k == peer or k.startswith(peer + "_")]
            absent.extend(j for j in tasks if j.id not in present and j.id != self.mine)
        ended = [j for j in absent if j.state in ENDED and j.id not in self.joined]
        waiting = [j for j in absent if j.state in WAITING]
        self.ended = "; ".join(f"peer {j.describe()} without joining" for j in ended[:8])
        self.hold = nmissing > 0 and not ended and len(waiting) >= nmissing
        self.lines = [self._line(j) for j in sorted(absent, key=lambda j: _natural(j.id))[:16]] if nmissing else []

    def _line(self, j: JobState) -> str:
        if j.state in ENDED and j.id in self.joined:
            return self._rank_line(j, f"{j.describe()} after it joined; its place waits for a spare or a re-run")
        return self._rank_line(j, j.describe())

    def record_jobs(self) -> tuple[str, ...]:
        """The jobs a decision record names (``Release.jobs``): every one known to have joined."""
        return tuple(sorted(self.joined | {self.mine} - {""}, key=_natural))

    def learn_jobs(self, jobs) -> None:
        """A decision record's ``jobs`` (read while joining): they joined an earlier generation."""
        self.joined.update(j for j in jobs if j)

    def _rank_line(self, j: JobState, text: str) -> str:
        if self.rank_of_task and j.id.startswith(self.rank_of_task[0] + "_"):
            task = j.id.split("_", 1)[1]
            if task.isdigit():
                return f"missing rank {int(task) - self.rank_of_task[1]}: {text}"
        return f"missing: {text}"

    def progress(self) -> dict:
        """``held`` and ``queue_left`` (seconds) for :class:`~fsmingle.protocol.states.Progress` while held."""
        if not self.hold:
            return {}
        held = self.held_time.held_for
        left = None if self.queue_timeout is None else max(0.0, self.queue_timeout - held)
        return {"held": held, "queue_left": left}

    def as_wire(self) -> dict:
        return {"hold": self.hold, "lines": self.lines, "ended": self.ended}

    # ---------------------------------------------------------------- members: rank 0's word
    def from_wire(self, q) -> None:
        if isinstance(q, dict):
            self.hold = q.get("hold") is True
            self.lines = [str(x)[:300] for x in q.get("lines", [])[:16]] if isinstance(q.get("lines"), list) else []
            self.ended = str(q.get("ended") or "")[:2000]

    def from_void(self, reason: str) -> None:
        """A restart record's reason: if a scheduler asker wrote it on a peer job that ended
        (:data:`~fsmingle.protocol.queue_relay.ENDED_VOID`), this participant fails on it too."""
        if reason.startswith(ENDED_VOID) and reason[len(ENDED_VOID) :].strip():
            self.ended = reason[len(ENDED_VOID) :][:2000]

    def forget(self) -> None:
        """A new generation: nothing is held until its rank 0 (or asker) says so (an ended peer
        stays ended: rank 0 voids right after telling the members, and they must still fail on it)."""
        self.hold, self.lines = False, []
        self.relay = Relay()

    # ---------------------------------------------------------------- everyone: the deadline
    def tick(self, p, now: float, waiting: bool = True) -> None:
        """Hold ``p.deadline`` while pending peers account for every missing rank (only while
        ``waiting`` in a generation); fail on an ended peer.  ``p`` needs ``deadline``, ``job_id``,
        ``gen``, ``missing_hint`` and ``emit()`` (a Participant, or the torchrun backend's shim).
        While rank 0 is missing, a participant runs ``self.relay.step`` first (:mod:`.queue_relay`)."""
        if self.ended:
            raise PeerJobEndedError(
                f"rendezvous for job {p.job_id} cannot complete: {self.ended} (generation {p.gen})", self.ended
            )
        bound_reached = self.held_time.tick(p, now, waiting, self.hold)
        if self.hold and waiting and now >= self._next_emit:  # the progress line says how long, per --queue-poll
            self._next_emit = now + self.interval
            p.emit()
        if bound_reached:
            from ..errors import RendezvousTimeoutError

            raise RendezvousTimeoutError(
                f"rendezvous for job {p.job_id}: peer jobs still pending after --queue-timeout "
                f"{self.queue_timeout:g} s: {'; '.join(self.lines) or 'no details'}",
                list(p.missing_hint or []),
            )


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def peers_from_env(env, peer_jobs: str | None) -> tuple[tuple[str, ...], str, tuple[str, int] | None]:
    """(peers, this job's id, rank_of_task) from ``--peer-jobs`` or a job array's variables."""
    aid, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    mine = f"{aid}_{task}" if aid and task else str(env.get("SLURM_JOB_ID") or "")
    if peer_jobs:
        return parse_peer_jobs(peer_jobs), mine, None
    if aid and task and env.get("SLURM_ARRAY_TASK_COUNT"):
        lo, hi, n = (env.get(k, "") for k in ("SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT"))
        if lo.isdigit() and hi.isdigit() and n.isdigit() and int(hi) - int(lo) + 1 == int(n):
            return tuple(f"{aid}_{i}" for i in range(int(lo), int(hi) + 1)), mine, (aid, int(lo))
        return (aid,), mine, None
    return (), mine, None
