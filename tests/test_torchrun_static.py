"""Real torchrun on top of `fsmingle run`: 2 nodes x 2 processes, then the same command again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO, clean_env

pytest.importorskip("torch")

SCRIPT = str(REPO / "examples" / "train_ddp.py")


def launch_nodes(procs, tmp_path, job, out, nnodes=2, nproc=2, steps=40) -> list[str]:
    """``fsmingle run ... -- torchrun train_ddp.py`` as ``nnodes`` nodes on this machine; their output."""
    d = tmp_path / "rdzv"
    d.mkdir(mode=0o700, exist_ok=True)  # --dir must exist: fsmingle never creates it
    env = {"TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    train = ["torchrun", "--nproc-per-node", nproc, SCRIPT, "--steps", steps, "--out", out]
    # `timeout -k`: a failed peer can leave torchrun agents in a 300 s exit barrier.
    kill = ["timeout", "-k", "10", "240"]
    ps = [
        procs.env(
            d,
            job,
            "--nnodes",
            nnodes,
            "--",
            *train,
            cmd="run",
            timeout=120,
            stale_after=None,
            prefix=kill,
            extra_env=env,
        )
        for _ in range(nnodes)
    ]
    rcs = [p.wait(300) for p in ps]
    logs = [p.stdout() + p.stderr() for p in ps]
    for rc, log in zip(rcs, logs, strict=True):
        assert rc == 0, log[-4000:]
    return logs


@pytest.mark.torch
def test_two_nodes_two_procs_then_again_same_job_id(procs, tmp_path):
    checksums = []
    for attempt in range(2):
        out = tmp_path / f"out{attempt}"
        logs = launch_nodes(procs, tmp_path, "ddp-static", out)
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
    env = clean_env({"TMPDIR": str(tmp_path)})
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
