"""Core rendezvous with real processes on a temp dir (no torch imported by participants)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import FSMINGLE, clean_env, results, run_cli


def spawn_env(procs, d, job, *args, timeout=60, extra_env=None):
    """``fsmingle env --format json`` on 127.0.0.1, default --stale-after."""
    return procs.env(d, job, *args, timeout=timeout, stale_after=None, extra_env=extra_env)


def test_import_does_not_import_torch():
    code = "import sys, fsmingle, fsmingle.cli, fsmingle.api; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("ranks", ["explicit", "first-come"])
def test_eight_nodes_released_with_same_master(procs, d, ranks):
    n = 8
    ps = [
        spawn_env(procs, d, "eight", "--nnodes", n, *(["--node-rank", i] if ranks == "explicit" else []))
        for i in range(n)
    ]
    res = results(ps, timeout=90)
    assert {(r["master_addr"], r["master_port"], r["generation"]) for r in res} == {
        ("127.0.0.1", res[0]["master_port"], 1)
    }
    assert sorted(r["node_rank"] for r in res) == list(range(n))
    assert all(r["nnodes"] == n and r["job_id"] == "eight" for r in res)
    if ranks == "explicit":
        assert [r["node_rank"] for r in res] == list(range(n))


def test_per_rank_mode_eight(procs, d):
    n = 8
    ps = [spawn_env(procs, d, "pr", "--world-size", n, "--rank", i) for i in range(n)]
    res = results(ps, timeout=90)
    assert [r["rank"] for r in res] == list(range(n))
    assert {r["world_size"] for r in res} == {n}
    # all on one host: local ranks equal global ranks, one node
    assert [r["local_rank"] for r in res] == list(range(n))
    assert {r["local_world_size"] for r in res} == {n}
    assert {r["nnodes"] for r in res} == {1}
    assert len({r["master_port"] for r in res}) == 1


def test_per_rank_first_come_from_slurm_env(procs, d):
    n = 4
    env = {"SLURM_NTASKS": str(n), "SLURM_NNODES": "1"}
    ps = [spawn_env(procs, d, "prs", extra_env=env) for _ in range(n)]
    res = results(ps, timeout=90)
    assert sorted(r["rank"] for r in res) == list(range(n))
    assert {r["mode"] for r in res} == {"rank"}


def test_scheduler_env_fallbacks(procs, d):
    env = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "FSMINGLE_DIR": str(d)}
    argv = [*FSMINGLE, "env", "--addr", "127.0.0.1", "--format", "json", "--timeout", "60"]
    ps = [procs.spawn(argv, env=clean_env({**env, "SLURM_NODEID": str(i)})) for i in range(2)]
    res = results(ps, timeout=90)
    assert [r["node_rank"] for r in res] == [0, 1]
    assert {r["job_id"] for r in res} == {"4242"}
    assert (d / "4242").is_dir()


def test_run_exports_env_and_execs(procs, d, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ps = []
    for i in range(2):
        script = f"import os, json; json.dump(dict(os.environ), open({str(out)!r} + '/{i}.json', 'w'))"
        argv = ["--nnodes", 2, "--node-rank", i, "--", sys.executable, "-c", script]
        ps.append(procs.env(d, "runjob", *argv, cmd="run", timeout=60, stale_after=None))
    for p in ps:
        assert p.wait(90) == 0, p.stderr()
        assert "released: master 127.0.0.1:" in p.stderr()
    envs = [json.loads((out / f"{i}.json").read_text()) for i in range(2)]
    for i, e in enumerate(envs):
        assert e["NODE_RANK"] == e["PET_NODE_RANK"] == str(i)
        assert e["NNODES"] == e["PET_NNODES"] == "2"
        assert e["MASTER_ADDR"] == e["PET_MASTER_ADDR"] == "127.0.0.1"
        assert e["MASTER_PORT"] == e["PET_MASTER_PORT"] == envs[0]["MASTER_PORT"]
        assert e["FSMINGLE_JOB_ID"] == "runjob" and e["FSMINGLE_GENERATION"] == "1"


def test_run_child_flags_are_not_parsed_and_exit_code_propagates(d):
    # --nnodes after the command word belongs to the child; exit code is the child's own.
    run = ["run", "--dir", d, "--nnodes", 1, "--addr", "127.0.0.1"]
    child = [sys.executable, "-c", "import sys; print(sys.argv[1:]); sys.exit(3)", "--nnodes", 99, "--timeout", "x"]
    p = run_cli(*run, "--job-id", "solo", "--", *child)
    assert p.returncode == 3, p.stderr
    assert "['--nnodes', '99', '--timeout', 'x']" in p.stdout
    # without "--": parsing stops at the first positional word
    p = run_cli(*run, "--job-id", "solo2", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--rank", 5)
    assert p.returncode == 0, p.stderr
    assert "['--rank', '5']" in p.stdout


def test_misspelt_option_is_an_error(d):
    p = run_cli("run", "--dir", d, "--nnode", "2", "--", "true")
    assert p.returncode == 2
    assert "--nnode" in p.stderr


def test_env_formats(d):
    for fmt, check in [("sh", "export MASTER_ADDR=127.0.0.1"), ("dotenv", "MASTER_ADDR=127.0.0.1")]:
        p = run_cli(
            "env",
            "--dir",
            d,
            "--job-id",
            f"fmt-{fmt}",
            "--nnodes",
            1,
            "--addr",
            "127.0.0.1",
            "--format",
            fmt,
            "--quiet",
        )
        assert p.returncode == 0, p.stderr
        assert check in p.stdout.splitlines()
        if fmt == "sh":
            out = subprocess.run(
                ["bash", "-c", 'eval "$1"; echo $NODE_RANK:$PET_NNODES:$FSMINGLE_JOB_ID', "_", p.stdout],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            assert out == "0:1:fmt-sh"


def test_timeout_names_missing_and_leaves_dir_ready(procs, d):
    # 2 of 3 nodes present: both fail naming node rank 2, exit 7.
    ps = [spawn_env(procs, d, "to", "--nnodes", 3, "--node-rank", i, timeout=3) for i in range(2)]
    for p in ps:
        assert p.wait(60) == 7, p.stderr()
        se = p.stderr()
        assert "missing node ranks 2 (1 of 3)" in se
        assert str(d) in se
        assert "--timeout" in se
    # the next attempt with all three succeeds, in a fresh generation
    res = results([spawn_env(procs, d, "to", "--nnodes", 3, "--node-rank", i) for i in range(3)], timeout=90)
    assert sorted(r["node_rank"] for r in res) == [0, 1, 2]
    assert len({(r["master_port"], r["generation"]) for r in res}) == 1
    assert res[0]["generation"] >= 2


def test_same_job_twice_in_a_row(procs, d):
    gens = []
    for _ in range(3):
        res = results([spawn_env(procs, d, "again", "--nnodes", 2) for _ in range(2)], timeout=90)
        assert sorted(r["node_rank"] for r in res) == [0, 1]
        assert len({r["generation"] for r in res}) == 1
        gens.append(res[0]["generation"])
    assert gens == sorted(set(gens)), gens  # a new generation every run


def test_a_world_of_one_leaves_the_master_port_free_for_torch(d):
    """A world of one is released in rank 0's first step; that path kept the rendezvous' listening
    socket on the master port, so ``fsmingle.worlds(nnodes=1)`` failed EADDRINUSE in
    ``init_process_group`` (found by the recovery work).  After the call the port must be bindable,
    as torch's TCPStore binds it (no SO_REUSEPORT), and a second world of one must follow."""
    import socket

    import fsmingle

    for run in range(2):
        r = fsmingle.rendezvous(str(d), "solo", nnodes=1, addr="127.0.0.1", timeout=30)
        assert (r.node_rank, r.nnodes, r.generation) == (0, 1, run + 1)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", r.master_port))  # EADDRINUSE before the fix
            s.listen(1)
