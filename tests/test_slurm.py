"""The batch scripts in slurm/, submitted unchanged to a real Slurm (tests/cluster/).

A 3-node Slurm (munged, slurmctld, one slurmd per network-namespace host; every
host has an NFS-like view of one shared directory and no default route) runs
``slurm/*.sbatch`` exactly as a user would submit them; only environment
variables the scripts document (``FSMINGLE_DIR``, ``TRAIN``, ``NPROC_PER_NODE``,
``RUN_TIMEOUT``, ``TMPDIR``, ``FSMINGLE_JOB_ID``, ``NNODES``) and sbatch options
(``--nodes``, ``--exclusive``, ``--array``) differ, and arguments after the
script go to examples/train_ddp.py.

Every job runs under ``timeout -k`` inside the scripts (RUN_TIMEOUT) and the test
waits with a deadline (the harness scancels the job on timeout).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import REPO, slurm_job_env, status_of

pytest.importorskip("torch")

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow]

SLURM = REPO / "slurm"
STEPS = "30"
RUN_TIMEOUT = 200  # seconds, enforced by `timeout -k 30` inside the scripts
WAIT = RUN_TIMEOUT + 60

_SUMMARY = re.compile(r"fsmingle-example: world_size=(\d+) ranks_agree=(\w+) checksum=(\S+) master=(\S+)")


@pytest.fixture(scope="module")
def slurm(slurm_cluster_module):
    return slurm_cluster_module


def _env(s, **extra) -> dict:
    return slurm_job_env(s, RUN_TIMEOUT, **extra)


def _submit(s, script: str, sbatch_args=(), script_args=(), env=None) -> str:
    """sbatch [sbatch_args] SCRIPT [script_args] on the login side; returns the job id.
    (``SlurmCluster.sbatch`` puts every argument before the script, so it cannot pass
    arguments to the script itself.)"""
    argv = [
        "sbatch",
        "--parsable",
        f"--output={s.outdir}/slurm-%A_%a.out"
        if any(a.startswith("--array") for a in sbatch_args)
        else f"--output={s.outdir}/slurm-%j.out",
        f"--chdir={s.cluster.shared}",
        *sbatch_args,
        str(SLURM / script),
        *script_args,
    ]
    p = s.login(argv, env=env, timeout=15)
    assert p.returncode == 0, f"sbatch failed: {p.stderr}"
    return p.stdout.strip().split(";")[0]


def _wait_ok(s, jid: str) -> str:
    res = s.wait(jid, timeout=WAIT)
    out = s.output(jid)
    assert res.ok, f"job {jid}: {res.state} exit {res.exit_code}:{res.signal}\n{out[-6000:]}"
    return out


def _records(out: Path, n: int) -> list[dict]:
    names = sorted(p.name for p in out.glob("rank*.json"))
    assert len(names) == n, names
    recs = [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]
    assert len({r["checksum"] for r in recs}) == 1, [r["checksum"] for r in recs]
    assert all(r["ranks_agree"] and r["world_size"] == n for r in recs)
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in recs}) == 1
    return recs


def _ip_of(s) -> dict:
    return {h.name: h.ip for h in s.hosts}


def _check_master(s, recs):
    """MASTER_ADDR is the IP of the host running rank 0 (an IP literal, not loopback)."""
    rank0 = next(r for r in recs if r["rank"] == 0)
    assert recs[0]["MASTER_ADDR"] == _ip_of(s)[rank0["hostname"]]


def _status(s, job: str) -> dict:
    return status_of(f"{s.cluster.shared}/rdzv", job)


def test_ddp_torchrun_three_nodes(slurm):
    """ddp_torchrun.sbatch, zero-config fsmingle: 3 nodes x 2 workers = 6 ranks."""
    out = Path(slurm.cluster.shared) / "out-torchrun"
    jid = _submit(
        slurm,
        "ddp_torchrun.sbatch",
        ["--nodes=3"],
        ["--steps", STEPS, "--out", str(out)],
        env=_env(slurm, NPROC_PER_NODE=2),
    )
    text = _wait_ok(slurm, jid)
    m = _SUMMARY.search(text)
    assert m and m.group(1) == "6" and m.group(2) == "True", text[-4000:]
    assert "ranks_agree=True" in text
    recs = _records(out, 6)
    _check_master(slurm, recs)
    assert sorted(r["hostname"] for r in recs) == ["node0", "node0", "node1", "node1", "node2", "node2"]
    # node ranks follow SLURM_NODEID and the job id is the Slurm job id
    assert len(re.findall(rf"fsmingle: {jid} released: master {re.escape(recs[0]['MASTER_ADDR'])}:", text)) == 3
    st = _status(slurm, jid)
    assert st["release"]["state"] == "released" and st["generation"] == 1


def test_ddp_per_rank(slurm):
    """ddp_per_rank.sbatch: 2 nodes x 2 srun tasks, per-rank mode chosen from SLURM_NTASKS > SLURM_NNODES."""
    out = Path(slurm.cluster.shared) / "out-perrank"
    jid = _submit(slurm, "ddp_per_rank.sbatch", [], ["--steps", STEPS, "--out", str(out)], env=_env(slurm))
    text = _wait_ok(slurm, jid)
    m = _SUMMARY.search(text)
    assert m and m.group(1) == "4" and m.group(2) == "True", text[-4000:]
    recs = _records(out, 4)
    _check_master(slurm, recs)
    hosts = {r["hostname"] for r in recs}
    assert len(hosts) == 2
    for h in hosts:  # two ranks per node, local ranks 0 and 1
        assert sorted(r["local_rank"] for r in recs if r["hostname"] == h) == [0, 1]
    assert len(re.findall(rf"fsmingle: {jid} released: .*, rank \d/4 \(local \d/2, node \d/2\)", text)) == 4


def test_separate_jobs_join_then_resubmit_and_requeue(slurm):
    """join_job.sbatch: two single-node jobs submitted separately join one training by
    FSMINGLE_JOB_ID; then the same name runs again with one job re-submitted and the
    other requeued (scontrol requeue: SLURM_RESTART_COUNT=1 beside a fresh job's 0)."""
    shared = Path(slurm.cluster.shared)
    job = "join-exp"

    def submit(out):
        return _submit(
            slurm,
            "join_job.sbatch",
            ["--exclusive"],
            ["--steps", STEPS, "--out", str(out)],
            env=_env(slurm, FSMINGLE_JOB_ID=job, NNODES=2, NPROC_PER_NODE=1),
        )

    out1 = shared / "out-join-1"
    a = submit(out1)
    b = submit(out1)
    texts = [_wait_ok(slurm, a), _wait_ok(slurm, b)]
    recs = _records(out1, 2)
    _check_master(slurm, recs)
    assert len({r["hostname"] for r in recs}) == 2  # --exclusive: one node each
    assert sum("ranks_agree=True" in t for t in texts) == 1  # rank 0's job prints the summary
    assert all(re.search(rf"fsmingle: {job} released: .*, node rank [01]/2, generation 1", t) for t in texts)

    # Run 2: a fresh submission plus a requeue of job b (which reruns the script
    # unchanged, with the env it was submitted with, so it writes to out1 again).
    for f in out1.glob("rank*.json"):
        f.unlink()
    c = submit(out1)
    r = slurm.login(["scontrol", "requeue", b], timeout=15)
    assert r.returncode == 0, r.stderr
    # Slurm holds a requeued job back ~2 minutes (its BeginTime); let it start now.
    r = slurm.login(["scontrol", "update", f"JobId={b}", "StartTime=now"], timeout=15)
    assert r.returncode == 0, r.stderr
    texts = [_wait_ok(slurm, c), _wait_ok(slurm, b)]
    assert slurm.jobs(b)[0].get("Restarts") == "1"
    recs = _records(out1, 2)
    _check_master(slurm, recs)
    assert all(re.search(rf"fsmingle: {job} released: .*, generation 2", t) for t in texts), texts
    st = _status(slurm, job)
    assert st["generation"] == 2 and st["release"]["state"] == "released"


def test_job_array_is_one_training(slurm):
    """join_job.sbatch as an array: job id SLURM_ARRAY_JOB_ID, nnodes = task count, node rank = task index."""
    out = Path(slurm.cluster.shared) / "out-array"
    jid = _submit(
        slurm,
        "join_job.sbatch",
        ["--array=0-1", "--exclusive"],
        ["--steps", STEPS, "--out", str(out)],
        env=_env(slurm, NPROC_PER_NODE=1),
    )
    text = _wait_ok(slurm, jid)
    assert "world_size=2 ranks_agree=True" in text, text[-4000:]
    recs = _records(out, 2)
    _check_master(slurm, recs)
    assert len(re.findall(rf"fsmingle: {jid} released: .*, node rank [01]/2, generation 1", text)) == 2
