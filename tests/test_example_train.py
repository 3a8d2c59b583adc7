"""Run examples/train_ddp.py for real: under torchrun, and launched one process per rank.

These start real processes that talk gloo over loopback.  Every launch is wrapped in
``timeout -k`` (a failed rank can leave the others blocked, and torchrun's exit barrier
ignores a plain SIGTERM), and torchrun's TMPDIR points inside ``tmp_path``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, free_port, torch_env

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SCRIPT = REPO / "examples" / "train_ddp.py"
KILL_AFTER_S = 5
RUN_TIMEOUT_S = 120
STEPS = 50


def _timeout_prefix() -> list[str]:
    return ["timeout", "-k", str(KILL_AFTER_S), str(RUN_TIMEOUT_S)]


def _load_ranks(out: Path, world_size: int) -> list[dict]:
    records = []
    for r in range(world_size):
        path = out / f"rank{r}.json"
        assert path.is_file(), f"missing {path}; found {sorted(p.name for p in out.glob('*'))}"
        records.append(json.loads(path.read_text()))
    return records


def _check_records(records: list[dict], world_size: int) -> None:
    assert [r["rank"] for r in records] == list(range(world_size))
    assert {r["world_size"] for r in records} == {world_size}
    checksums = {r["checksum"] for r in records}
    assert len(checksums) == 1, f"ranks disagree: {checksums}"
    assert len({r["param_sha256"] for r in records}) == 1
    for r in records:
        assert r["ranks_agree"] is True
        assert r["gathered"] == [records[0]["checksum"]] * world_size
        assert r["steps"] == STEPS
        assert r["backend"] == "gloo"
        assert math.isfinite(r["loss"]) and math.isfinite(r["param_sum"])
        # The same all-reduced loss on every rank, and training made progress.
        assert r["loss"] == records[0]["loss"]
        assert r["loss"] < r["first_loss"]
        assert r["hostname"] == socket.gethostname()


def _check_stdout(stdout: str, world_size: int, checksum: str) -> None:
    for r in range(world_size):
        assert f"rank {r}/{world_size} local_rank " in stdout, stdout
    assert f"fsmingle-example: world_size={world_size} ranks_agree=True checksum={checksum} " in stdout, stdout


def _run(tmp_path: Path, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    """Run ``python ARGV`` in ``tmp_path`` under ``timeout -k``; fails the test unless it exits 0."""
    proc = subprocess.run(
        [*_timeout_prefix(), sys.executable, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + 2 * KILL_AFTER_S,
        check=False,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _torchrun_standalone(tmp_path: Path, out: Path, env: dict) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 train_ddp.py``, which must exit 0."""
    # `-m torch.distributed.run` is what the `torchrun` script runs
    argv = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT)]
    return _run(tmp_path, [*argv, "--steps", str(STEPS), "--out", str(out)], env)


def test_torchrun_standalone_two_ranks_agree(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _torchrun_standalone(tmp_path, out, torch_env(tmp_path))
    assert "terminate called" not in proc.stderr, proc.stderr

    records = _load_ranks(out, 2)
    _check_records(records, 2)
    assert [r["local_rank"] for r in records] == [0, 1]
    _check_stdout(proc.stdout, 2, records[0]["checksum"])
    # The JSON files were written atomically: no temporary files left behind.
    assert not list(out.glob("*.tmp.*"))


def _launch_per_rank(tmp_path: Path, out: Path, world_size: int, port: int):
    procs = []
    for rank in range(world_size):
        env = torch_env(tmp_path)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        cmd = [
            *_timeout_prefix(),
            sys.executable,
            str(SCRIPT),
            "--steps",
            str(STEPS),
            "--timeout",
            "60",
            "--out",
            str(out),
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    results = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=RUN_TIMEOUT_S + 2 * KILL_AFTER_S)
            results.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return results


def test_per_rank_launch_by_hand_two_ranks_agree(tmp_path: Path) -> None:
    world_size = 2
    out = tmp_path / "out"
    # The port is picked free, but another process could grab it before rank 0's
    # TCPStore binds it: retry only in that case.
    for _attempt in range(3):
        results = _launch_per_rank(tmp_path, out, world_size, free_port())
        if all(rc == 0 for rc, _, _ in results):
            break
        errs = "".join(err for _, _, err in results).lower()
        if "address already in use" not in errs and "eaddrinuse" not in errs:
            break
    for rank, (rc, stdout, stderr) in enumerate(results):
        assert rc == 0, f"rank {rank} rc={rc}\n{stdout}\n{stderr}"
        assert "terminate called" not in stderr, stderr

    records = _load_ranks(out, world_size)
    _check_records(records, world_size)
    for r in records:
        assert r["MASTER_ADDR"] == "127.0.0.1"
        assert r["local_rank"] == r["rank"]
    stdout0 = results[0][1]
    _check_stdout(stdout0 + results[1][1], world_size, records[0]["checksum"])
    assert f"master=127.0.0.1:{records[0]['MASTER_PORT']} node_rank=0" in stdout0
    # Only rank 0 prints the summary line.
    assert "fsmingle-example:" not in results[1][1]


def test_single_process_without_launcher(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(tmp_path, [str(SCRIPT), "--steps", str(STEPS), "--out", str(out)], torch_env(tmp_path))
    records = _load_ranks(out, 1)
    _check_records(records, 1)
    _check_stdout(proc.stdout, 1, records[0]["checksum"])


def test_torchrun_two_ranks_without_numpy(tmp_path: Path) -> None:
    """`pip install fsmingle[torch]` installs no numpy: the example (what `fsmingle demo` runs) must not need it.

    A ``sitecustomize`` on PYTHONPATH makes ``import numpy`` fail in torchrun and in every worker, as in a
    fresh venv; torch then raises "Numpy is not available" from ``.numpy()`` or ``all_gather_object``.
    """
    block = tmp_path / "nonumpy"
    block.mkdir()
    (block / "sitecustomize.py").write_text("import sys\nsys.modules['numpy'] = None  # import numpy -> ImportError\n")
    env = torch_env(tmp_path)
    env["PYTHONPATH"] = str(block) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    probe = subprocess.run([sys.executable, "-c", "import numpy"], env=env, capture_output=True, text=True, check=False)
    assert probe.returncode != 0, "numpy is still importable: the test would prove nothing"
    out = tmp_path / "out"
    proc = _torchrun_standalone(tmp_path, out, env)
    assert "Numpy is not available" not in proc.stderr
    records = _load_ranks(out, 2)
    _check_records(records, 2)
