"""Smoke of the recovery benchmark (``python -m benchmarks.recovery``) and of the in-process example
(``examples/train_worlds.py``), small enough for every CI run: 2 nodes, one repetition.

The full runs (N = 4, 8, 16, five paths, three faults) and their table are in
``benchmarks/README.md``; ``tests/test_worlds.py`` drives the example through real faults.
"""

from __future__ import annotations

import json
import subprocess
import sys

import cluster as cl
import pytest
from helpers import REPO, torch_env

pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _smoke(tmp_path, fault: str, *extra: str, timeout: float = 150) -> tuple[dict, str]:
    """Run the benchmark once for the in-process path at N = 2 with ``fault``; its one row and table."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "benchmarks.recovery", "--n", "2", "--paths", "inproc", "--faults", fault]
    cmd += ["--reps", "1", "--train-s", "0.5", *extra, "--out", str(out)]
    p = subprocess.run(cmd, cwd=REPO, env=torch_env(tmp_path), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["ok"], row.get("note")
    return row, (out / "results.md").read_text()


def test_recovery_benchmark_smoke_in_process_path_after_a_sigkill(tmp_path):
    row, table = _smoke(tmp_path, "kill")
    # The spare took the dead node's place; the survivor saw the failure before the new world stepped.
    assert row["spare_in"] is True
    assert 0 <= row["detect"] <= row["release"] <= row["first_step"]
    assert "| kill | 2 | inproc | 1/1 |" in table


@pytest.mark.root
def test_recovery_benchmark_smoke_in_process_path_after_a_network_cut(tmp_path):
    """``--faults cut``: every node on a network-namespace host of tests/cluster/, the victim's
    link down, its processes running.  Nothing closes a connection, so the survivor sees the cut
    at its process-group timeout; the spare takes the cut node's place, the cut node stays out
    of the new world once its link is up again, and the new world goes on training."""
    cl.require_capabilities()
    extra = ("--pg-timeout", "5", "--stale-after", "5", "--cut-watch", "3")
    row, table = _smoke(tmp_path, "cut", *extra, timeout=200)
    assert row["spare_in"] is True
    # A cut sends no RST: the survivor's collective raises at its timeout (5 s), not at once.
    assert 2.5 <= row["detect"] <= row["release"] <= row["first_step"]
    cut = row["cut"]
    assert cut["victim_in_new_world"] is False
    # The cut node's own collective timed out too: it left its world (and waits in the next generation).
    assert "raised" in cut["victim_cut"] and "lost" in cut["victim_cut"]
    assert cut["new_world_steps_up"] > 0 and cut["worlds_after_up"] == 0
    assert "| cut | 2 | inproc | 1/1 |" in table


def test_example_train_worlds_trains_to_the_end_and_stops(tmp_path, d):
    # No fault: one world, the loop ends when the block ends, both processes exit 0.
    args = [sys.executable, str(REPO / "examples" / "train_worlds.py"), "--dir", str(d), "--job-id", "smoke"]
    args += ["--nnodes", "2", "--steps", "5", "--addr", "127.0.0.1", "--timeout", "60"]
    env = torch_env(tmp_path)
    ps = [subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    ps.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in ps]
    ranks = set()
    for p, (o, e) in zip(ps, outs):
        assert p.returncode == 0, e[-3000:]
        lines = [json.loads(x) for x in o.splitlines()]
        assert lines[-1]["event"] == "done" and lines[-1]["step"] == 5
        steps = [x for x in lines if "loss" in x]
        assert [x["step"] for x in steps] == [1, 2, 3, 4, 5]
        assert {x["world"] for x in steps} == {0} and {x["gen"] for x in steps} == {1}
        ranks.add(steps[0]["rank"])
    assert ranks == {0, 1}


FROZEN = """
import gc, sys, fsmingle
for world in fsmingle.worlds(sys.argv[1], "frozen", nnodes=2, addr="127.0.0.1", timeout=60):
    with world:
        print("frozen", gc.get_freeze_count(), flush=True)
"""


def test_worlds_freezes_what_the_warm_up_left_so_each_teardown_collects_little(tmp_path, d):
    """A broken world's teardown runs gc.collect(): with torch, dynamo and sympy loaded that is
    0.14 s of CPU per process, 1.7 s of wall time per survivor with 16 of them on 2 cores (issue
    31, the recovery benchmark at N = 16).  worlds() freezes what the warm-up left (gc.freeze),
    so a collection looks only at what came after.  Before: nothing frozen."""
    env = torch_env(tmp_path)
    cmd = [sys.executable, "-c", FROZEN, str(d)]
    ps = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    ps.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=150) for p in ps]
    finally:
        for p in ps:
            p.kill()
    for p, (out, err) in zip(ps, outs):
        assert p.returncode == 0, out[-2000:] + err[-3000:]
        assert int(out.split("frozen")[1]) > 100_000  # torch and what DDP's first use imports


def test_torchrun_join_benchmark_smoke_fsmingle_and_c10d(tmp_path):
    """``python -m benchmarks.recovery.join`` at N = 2: both backends' agents start, every worker runs
    its first line, and fsmingle's confirmation round is timed (the full run: benchmarks/README.md)."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "benchmarks.recovery.join", "--n", "2", "--reps", "1", "--out", str(out)]
    p = subprocess.run(cmd, cwd=REPO, env=torch_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = {r["path"]: r for r in json.loads((out / "results.json").read_text())}
    assert set(rows) == {"torchrun-c10d", "torchrun-fsmingle"}
    for r in rows.values():
        assert r["ok"], r.get("note")
        assert 0 < r["agents_up"] <= r["round_in"] <= r["round"] <= r["join"]
    fs = rows["torchrun-fsmingle"]
    assert fs["redo"] == 0 and fs["round"] <= fs["confirmed"] <= fs["join"]
    assert "| 2 | torchrun-fsmingle | 1/1 |" in (out / "results.md").read_text()
