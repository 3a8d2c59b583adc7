"""Real torchrun on top of `fsmingle run`: 2 nodes x 2 processes, then the same command again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

pytest.importorskip("torch")

SCRIPT = str(REPO / "examples" / "train_ddp.py")


def launch_nodes(tmp_path, job, out, nnodes=2, nproc=2, steps=40):
    procs = []
    (tmp_path / "rdzv").mkdir(mode=0o700, exist_ok=True)  # --dir must exist: fsmingle never creates it
    for _ in range(nnodes):
        env = dict(os.environ, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")
        for k in [k for k in env if k.startswith(("SLURM_", "PET_"))]:
            env.pop(k)
        # `timeout -k`: a failed peer can leave torchrun agents in a 300 s exit barrier.
        cmd = [
            "timeout",
            "-k",
            "10",
            "240",
            sys.executable,
            "-m",
            "fsmingle",
            "run",
            "--dir",
            str(tmp_path / "rdzv"),
            "--job-id",
            job,
            "--nnodes",
            str(nnodes),
            "--addr",
            "127.0.0.1",
            "--timeout",
            "120",
            "--",
            "torchrun",
            "--nproc-per-node",
            str(nproc),
            SCRIPT,
            "--steps",
            str(steps),
            "--out",
            str(out),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-4000:]
    return logs


@pytest.mark.torch
def test_two_nodes_two_procs_then_again_same_job_id(tmp_path):
    checksums = []
    for attempt in range(2):
        out = tmp_path / f"out{attempt}"
        logs = launch_nodes(tmp_path, "ddp-static", out)
        ranks = [json.load(open(out / f"rank{r}.json")) for r in range(4)]
        assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
        assert {r["world_size"] for r in ranks} == {4}
        assert len({r["checksum"] for r in ranks}) == 1, ranks
        assert {r["MASTER_ADDR"] for r in ranks} == {"127.0.0.1"}
        assert any("ranks_agree=True" in log for log in logs)
        assert any(f"generation {attempt + 1}" in log for log in logs), logs[0][-2000:]
        checksums.append(ranks[0]["checksum"])
    assert checksums[0] == checksums[1]  # same seed, same training, second run not confused by the first


@pytest.mark.torch
def test_demo_command(tmp_path, repo_root):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.run(
        ["timeout", "-k", "10", "280", sys.executable, "-m", "fsmingle", "demo", "--steps", "20"],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "demo: success" in p.stdout
    assert "ranks_agree=True" in p.stdout
