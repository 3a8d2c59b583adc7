"""Separate jobs and job arrays (issue 24): node ranks not taken from another job's numbering,
the scheduler identity in the beacon, and (below) queue-aware waiting against a fake scheduler."""

from __future__ import annotations

import json
import logging

from fsmingle.config import resolve
from fsmingle.fs.records import Beacon, HostId, decode, encode

ARRAY_TASK = {
    "SLURM_JOB_ID": "4245",
    "SLURM_ARRAY_JOB_ID": "4242",
    "SLURM_ARRAY_TASK_ID": "3",
    "SLURM_ARRAY_TASK_MIN": "1",
    "SLURM_ARRAY_TASK_MAX": "3",
    "SLURM_ARRAY_TASK_COUNT": "3",
    "SLURM_JOB_PARTITION": "debug",
    "SLURM_NNODES": "1",
    "SLURM_NODEID": "0",
}


def test_array_task_with_its_own_job_id_and_nnodes_is_first_come_not_node_0():
    """Measured bug: `fsmingle env --job-id X --nnodes 3` in three array tasks took node rank 0
    from SLURM_NODEID in each (each task is node 0 of its own 1-node job)."""
    s = resolve(dir="/x", job_id="X", nnodes=3, env=ARRAY_TASK)
    assert (s.size, s.rank) == (3, None)
    assert any("SLURM_NODEID" in n and "--nnodes 3 exceeds SLURM_NNODES=1" in n for n in s.notes)
    # separate jobs (no array), same rule
    s = resolve(dir="/x", job_id="X", nnodes=2, env={"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_NODEID": "0"})
    assert s.rank is None and s.notes
    # one multi-node job: SLURM_NODEID is the training's node rank, as before
    s = resolve(dir="/x", job_id="X", nnodes=3, env={"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_NODEID": "2"})
    assert (s.rank, s.notes) == (2, ())
    # an explicit --node-rank always wins
    assert resolve(dir="/x", job_id="X", nnodes=3, node_rank=1, env=ARRAY_TASK).rank == 1


def test_array_task_rank_from_task_index_also_with_explicit_nnodes():
    s = resolve(dir="/x", env=ARRAY_TASK)
    assert (s.job_id, s.size, s.rank) == ("4242", 3, 2)
    s = resolve(dir="/x", nnodes=3, env=ARRAY_TASK)
    assert (s.job_id, s.size, s.rank) == ("4242", 3, 2)
    # a different world size than the array's: the task index means nothing, first-come
    s = resolve(dir="/x", nnodes=5, env=ARRAY_TASK)
    assert (s.size, s.rank) == (5, None)


def test_verbose_says_why_no_node_rank_was_taken(tmp_path, caplog):
    import fsmingle
    from fsmingle.errors import RendezvousTimeoutError

    caplog.set_level(logging.DEBUG, logger="fsmingle")
    (tmp_path / "d").mkdir(mode=0o700)
    try:
        fsmingle.rendezvous(dir=str(tmp_path / "d"), job_id="X", nnodes=3, timeout=0.3, env=dict(ARRAY_TASK))
    except RendezvousTimeoutError:
        pass
    assert "not taking the node rank from SLURM_NODEID=0" in caplog.text
    assert "scheduler: slurm_job 4245, array_job 4242, array_task 3, partition debug" in caplog.text


def _beacon(**kw) -> Beacon:
    return Beacon(
        job_id="j",
        generation=1,
        instance="ab" * 8,
        mode="node",
        size=3,
        rank=None,
        addr="10.0.0.1",
        master_port=None,
        heartbeat=0,
        restart_count=0,
        host=HostId("h", "b", "pid:[1]", 1, 1.0),
        **kw,
    )


def test_scheduler_identity_in_the_beacon_is_optional_and_tolerated():
    ident = resolve(dir="/x", env=ARRAY_TASK).scheduler
    assert dict(ident) == {"slurm_job": "4245", "array_job": "4242", "array_task": "3", "partition": "debug"}
    b = _beacon(scheduler=ident)
    raw = json.loads(encode(b))
    assert raw["scheduler"]["array_task"] == "3"
    assert dict(decode(encode(b), Beacon).scheduler) == dict(ident)
    # absent (an older writer): empty; an older reader ignores the unknown key (decode ignores extras)
    assert "scheduler" not in json.loads(encode(_beacon()))
    assert decode(encode(_beacon()), Beacon).scheduler == ()
    # junk is dropped, never a reason to refuse the beacon
    raw["scheduler"] = {"slurm_job": 5, "BAD KEY": "x", "partition": "p\n"}
    assert decode(json.dumps(raw).encode(), Beacon).scheduler == ()
    raw["scheduler"] = "nonsense"
    assert decode(json.dumps(raw).encode(), Beacon).scheduler == ()
    pbs = resolve(dir="/x", env={"PBS_JOBID": "12.pbs", "PBS_QUEUE": "workq", "PBS_NUM_NODES": "1"}, nnodes=2)
    assert dict(pbs.scheduler) == {"pbs_job": "12.pbs", "pbs_queue": "workq"}
