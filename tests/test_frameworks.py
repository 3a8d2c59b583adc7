"""The framework recipes of docs/frameworks.md, run for real: 2 participants on loopback, CPU only.

Each test starts two processes the way the recipe says (through ``fsmingle env`` /
``fsmingle run`` / ``fsmingle.init_process_group``) in a temporary directory, every one
wrapped in ``timeout``, and checks what each rank wrote to ``--out``.  A test skips only
when its framework is not importable; ``.ci/run`` installs all of them.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import REPO, Procs, torch_env

EX = REPO / "examples" / "frameworks"
PY = shlex.quote(sys.executable)
FSMINGLE = f"{PY} -m fsmingle"


def run_pair(
    procs: Procs, tmp_path: Path, script: Callable[[int], str], limit: int = 150
) -> tuple[list[dict], list[str]]:
    """Run ``script(participant)`` (bash) for participants 0 and 1 concurrently, each under ``timeout``.

    Returns what each rank wrote to ``tmp_path/out`` and each participant's output (stdout, then
    stderr).  Fails with both outputs unless both exit 0.
    """
    env = torch_env(tmp_path, {"JAX_PLATFORMS": "cpu"})
    argv = ["timeout", "-k", "10", str(limit), "bash", "-c"]
    ps = [
        procs.spawn([*argv, "set -euo pipefail\n" + script(i)], name=f"participant{i}", env=env, cwd=str(REPO))
        for i in (0, 1)
    ]
    rcs = [p.wait(timeout=limit + 30) for p in ps]
    texts = [p.stdout() + p.stderr() for p in ps]
    report = "\n".join(f"--- participant {i} (exit {rc}):\n{t[-3000:]}" for i, (rc, t) in enumerate(zip(rcs, texts)))
    assert rcs == [0, 0], report
    return results(tmp_path / "out"), texts


def results(out: Path, n: int = 2) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def rdzv_opts(tmp_path: Path, job: str) -> str:
    (tmp_path / "rdzv").mkdir(mode=0o700, exist_ok=True)  # --dir must exist: fsmingle never creates it
    return f"--dir {shlex.quote(str(tmp_path / 'rdzv'))} --job-id {job} --addr 127.0.0.1 --timeout 90"


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_torchrun_static_via_pet_variables(procs, tmp_path):
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun") or f"{PY} -m torch.distributed.run"
    node = (
        f'eval "$({FSMINGLE} env {rdzv_opts(tmp_path, "tr")} --nnodes 2 --format sh)"\n'
        f'env | grep "^PET_" | sort\n'
        f"{torchrun} --nproc-per-node 1 {EX / 'torchrun_allreduce.py'} --out {tmp_path / 'out'}\n"
    )
    res, logs = run_pair(procs, tmp_path, lambda _: node)
    assert [r["world_size"] for r in res] == [2, 2]
    assert [r["sum"] for r in res] == [1.0, 1.0]
    assert sorted(r["group_rank"] for r in res) == ["0", "1"]  # torchrun took its node rank from PET_NODE_RANK
    assert {r["env"]["MASTER_ADDR"] for r in res} == {"127.0.0.1"}
    assert all("PET_NNODES=2" in log for log in logs)


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_plain_torch_distributed_per_rank(procs, tmp_path):
    pytest.importorskip("torch")
    opts = f"{rdzv_opts(tmp_path, 'plain')} --world-size 2"
    res, _ = run_pair(
        procs, tmp_path, lambda r: f"{PY} {EX / 'plain_torch.py'} {opts} --rank {r} --out {tmp_path / 'out'}"
    )
    assert [r["sum"] for r in res] == [3.0, 3.0]  # all_reduce of rank+1 over both ranks
    assert [r["env"]["RANK"] for r in res] == ["0", "1"]
    assert [r["env"]["LOCAL_RANK"] for r in res] == ["0", "1"]  # same host: local ranks 0 and 1
    assert {r["env"]["MASTER_PORT"] for r in res} == {res[0]["env"]["MASTER_PORT"]}


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_plain_torch_distributed_on_a_folder_store(procs, tmp_path):
    """``fsmingle.init_process_group(..., store="folder")``: the process group's keys live in the generation's
    FolderStore (issue 23), not in a TCPStore on rank 0's port."""
    pytest.importorskip("torch")
    opts = f"{rdzv_opts(tmp_path, 'fstore')} --world-size 2 --store folder"
    res, _ = run_pair(
        procs, tmp_path, lambda r: f"{PY} {EX / 'plain_torch.py'} {opts} --rank {r} --out {tmp_path / 'out'}"
    )
    assert [r["sum"] for r in res] == [3.0, 3.0]
    stores = list(tmp_path.glob("**/gen-*/store"))
    assert len(stores) == 1 and any(n.name.startswith("k-") for n in stores[0].iterdir())


# What the ranks of an `fsmingle run` recipe report (besides world size 2 and identical DDP replicas).
_LIGHTNING = {"cluster_environment": ["LightningEnvironment"] * 2, "node_rank": [0, 1]}
_ACCELERATE = {"distributed_type": ["DistributedType.MULTI_CPU"] * 2, "sum": [1.0, 1.0]}


@pytest.mark.torch
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("framework", "participants", "script", "limit", "expect"),
    [
        ("lightning", "--nnodes 2", "lightning_fit.py", 220, _LIGHTNING),  # devices=1: global rank = node rank
        ("accelerate", "--world-size 2", "accelerate_train.py", 150, _ACCELERATE),
    ],
    ids=["lightning_two_nodes", "accelerate_per_rank"],
)
def test_fsmingle_run_recipe(procs, tmp_path, framework, participants, script, limit, expect):
    """The same ``fsmingle run ... -- python SCRIPT`` line on both participants (docs/frameworks.md)."""
    pytest.importorskip("torch")
    pytest.importorskip(framework)
    opts = f"{rdzv_opts(tmp_path, framework[:3])} {participants}"
    line = f"{FSMINGLE} run {opts} -- {PY} {EX / script} --out {tmp_path / 'out'}"
    res, _ = run_pair(procs, tmp_path, lambda _: line, limit=limit)
    assert {k: [r[k] for r in res] for k in expect} == expect
    assert [r["world_size"] for r in res] == [2, 2]
    assert res[0]["digest"] == res[1]["digest"]  # DDP kept the replicas identical


@pytest.mark.timeout(180)
def test_jax_distributed_from_env_json(procs, tmp_path):
    pytest.importorskip("jax")
    env = f'rdzv="$({FSMINGLE} env {rdzv_opts(tmp_path, "jax")} --world-size 2 --format json'
    script = lambda r: f'{env} --rank {r})"\n{PY} {EX / "jax_allgather.py"} "$rdzv" --out {tmp_path / "out"}'
    res, _ = run_pair(procs, tmp_path, script)
    assert [r["world_size"] for r in res] == [2, 2]  # jax.process_count()
    assert [r["process_index"] for r in res] == [0, 1]
    assert [r["allgather"] for r in res] == [[0, 1], [0, 1]]  # a real cross-process collective
