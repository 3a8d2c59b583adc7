"""Array tasks of a real Slurm (``cluster.SlurmCluster``) as the queue tests watch them (``test_slurm_queue.py``,
``test_torchrun_queue.py``): a job's state, a task's output file, and the wait for a task to end."""

from __future__ import annotations

from pathlib import Path

from helpers import wait_for


def job_state(s, jid: str) -> str:
    """The ``JobState`` ``scontrol`` shows for job (or array task ``"<jid>_<task>"``) ``jid`` of SlurmCluster ``s``;
    ``""`` when it shows none."""
    jobs = s.jobs(jid)
    return jobs[0].get("JobState", "") if jobs else ""


def task_output(s, jid: str, task: int) -> str:
    """Array task ``task``'s output so far (``<outdir>/slurm-<jid>_<task>.out``, read as a file: still there once
    the task has left ``scontrol``); ``""`` before the file exists."""
    f = Path(s.outdir) / f"slurm-{jid}_{task}.out"
    return f.read_text(errors="replace") if f.exists() else ""


def wait_task_done(s, jid: str, task: int, timeout: float) -> str:
    """Wait for array task ``task`` to end (COMPLETED, FAILED, CANCELLED or TIMEOUT) and return that state;
    AssertionError after ``timeout`` seconds."""
    wait_for(lambda: job_state(s, f"{jid}_{task}") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout, "end")
    return job_state(s, f"{jid}_{task}")
