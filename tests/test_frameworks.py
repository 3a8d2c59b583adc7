"""The framework recipes of docs/frameworks.md, run for real: 2 participants on loopback, CPU only.

Each test starts two processes the way the recipe says (through ``fsmingle env`` /
``fsmingle run`` / ``fsmingle.init_process_group``) in a temporary directory, every one
wrapped in ``timeout``, and checks what each rank wrote to ``--out``.  A test skips only
when its framework is not importable; ``.ci/run`` installs all of them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples" / "frameworks"
FSMINGLE = f"{shlex.quote(sys.executable)} -m fsmingle"

# Variables that would change what fsmingle or a framework detects (schedulers, launchers).
_SCRUB = re.compile(
    r"^(SLURM_|FSMINGLE_|PET_|PBS_|LSB_|JSM_|OMPI_|PMI_|TORCHELASTIC_|ACCELERATE_|KUBERNETES_|"
    r"(MASTER_ADDR|MASTER_PORT|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|GROUP_RANK|"
    r"NNODES|NCCL_SOCKET_IFNAME|GLOO_SOCKET_IFNAME|JOB_COMPLETION_INDEX)$)"
)


def _env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not _SCRUB.match(k)}
    env.update(
        TMPDIR=str(tmp_path),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
    )
    env.update(extra)
    return env


def run_pair(tmp_path: Path, scripts: list[str], limit: int = 150) -> list[str]:
    """Run one bash script per participant concurrently, each under ``timeout``; return their logs.

    Fails with both logs unless both exit 0.
    """
    procs, logs = [], []
    for i, script in enumerate(scripts):
        log = open(tmp_path / f"participant{i}.log", "w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                ["timeout", "-k", "10", str(limit), "bash", "-c", "set -euo pipefail\n" + script],
                cwd=REPO,
                env=_env(tmp_path),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        for p in procs:
            p.wait(timeout=limit + 30)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    report = "\n".join(
        f"--- participant {i} (exit {p.returncode}):\n{t[-3000:]}" for i, (p, t) in enumerate(zip(procs, texts))
    )
    assert all(p.returncode == 0 for p in procs), report
    return texts


def results(out: Path, n: int = 2) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def rdzv_opts(tmp_path: Path, job: str) -> str:
    (tmp_path / "rdzv").mkdir(mode=0o700, exist_ok=True)  # --dir must exist: fsmingle never creates it
    return f"--dir {shlex.quote(str(tmp_path / 'rdzv'))} --job-id {job} --addr 127.0.0.1 --timeout 90"


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_torchrun_static_via_pet_variables(tmp_path):
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun") or f"{shlex.quote(sys.executable)} -m torch.distributed.run"
    out = tmp_path / "out"
    node = (
        f'eval "$({FSMINGLE} env {rdzv_opts(tmp_path, "tr")} --nnodes 2 --format sh)"\n'
        f'env | grep "^PET_" | sort\n'
        f"{torchrun} --nproc-per-node 1 {EX / 'torchrun_allreduce.py'} --out {out}\n"
    )
    logs = run_pair(tmp_path, [node, node])
    res = results(out)
    assert [r["world_size"] for r in res] == [2, 2]
    assert [r["sum"] for r in res] == [1.0, 1.0]
    assert sorted(r["group_rank"] for r in res) == ["0", "1"]  # torchrun took its node rank from PET_NODE_RANK
    assert {r["env"]["MASTER_ADDR"] for r in res} == {"127.0.0.1"}
    assert all("PET_NNODES=2" in log for log in logs)


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_plain_torch_distributed_per_rank(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    scripts = [
        f"{shlex.quote(sys.executable)} {EX / 'plain_torch.py'} {rdzv_opts(tmp_path, 'plain')} "
        f"--world-size 2 --rank {r} --out {out}"
        for r in (0, 1)
    ]
    run_pair(tmp_path, scripts)
    res = results(out)
    assert [r["sum"] for r in res] == [3.0, 3.0]  # all_reduce of rank+1 over both ranks
    assert [r["env"]["RANK"] for r in res] == ["0", "1"]
    assert [r["env"]["LOCAL_RANK"] for r in res] == ["0", "1"]  # same host: local ranks 0 and 1
    assert {r["env"]["MASTER_PORT"] for r in res} == {res[0]["env"]["MASTER_PORT"]}


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_lightning_two_nodes(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("lightning")
    out = tmp_path / "out"
    node = (
        f"{FSMINGLE} run {rdzv_opts(tmp_path, 'lit')} --nnodes 2 -- "
        f"{shlex.quote(sys.executable)} {EX / 'lightning_fit.py'} --out {out}"
    )
    run_pair(tmp_path, [node, node], limit=220)
    res = results(out)
    assert {r["cluster_environment"] for r in res} == {"LightningEnvironment"}
    assert [r["world_size"] for r in res] == [2, 2]
    assert [r["node_rank"] for r in res] == [0, 1]  # global rank r lives on node r (devices=1)
    assert res[0]["digest"] == res[1]["digest"]  # DDP kept the replicas identical


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_accelerate_per_rank(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    out = tmp_path / "out"
    rank = (
        f"{FSMINGLE} run {rdzv_opts(tmp_path, 'acc')} --world-size 2 -- "
        f"{shlex.quote(sys.executable)} {EX / 'accelerate_train.py'} --out {out}"
    )
    run_pair(tmp_path, [rank, rank])
    res = results(out)
    assert {r["distributed_type"] for r in res} == {"DistributedType.MULTI_CPU"}
    assert [r["world_size"] for r in res] == [2, 2]
    assert [r["sum"] for r in res] == [1.0, 1.0]
    assert res[0]["digest"] == res[1]["digest"]


@pytest.mark.timeout(180)
def test_jax_distributed_from_env_json(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "out"
    scripts = [
        f'rdzv="$({FSMINGLE} env {rdzv_opts(tmp_path, "jax")} --world-size 2 --rank {r} --format json)"\n'
        f'{shlex.quote(sys.executable)} {EX / "jax_allgather.py"} "$rdzv" --out {out}'
        for r in (0, 1)
    ]
    run_pair(tmp_path, scripts)
    res = results(out)
    assert [r["world_size"] for r in res] == [2, 2]  # jax.process_count()
    assert [r["process_index"] for r in res] == [0, 1]
    assert [r["allgather"] for r in res] == [[0, 1], [0, 1]]  # a real cross-process collective
