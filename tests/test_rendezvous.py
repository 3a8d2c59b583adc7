"""Core rendezvous with real processes on a temp dir (no torch imported by participants)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

FSMINGLE = [sys.executable, "-m", "fsmingle"]


def spawn_env(d, job, *args, timeout=60, extra_env=None):
    env = dict(os.environ, **(extra_env or {}))
    env.pop("SLURM_JOB_ID", None)
    cmd = FSMINGLE + [
        "env",
        "--dir",
        str(d),
        "--job-id",
        job,
        "--addr",
        "127.0.0.1",
        "--timeout",
        str(timeout),
        "--format",
        "json",
        *map(str, args),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def collect(procs, timeout=90):
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, se
        out.append(json.loads(so))
    return out


def test_import_does_not_import_torch():
    code = "import sys, fsmingle, fsmingle.cli, fsmingle.api; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("ranks", ["explicit", "first-come"])
def test_eight_nodes_released_with_same_master(tmp_path, ranks):
    n = 8
    procs = [
        spawn_env(tmp_path, "eight", "--nnodes", n, *(["--node-rank", i] if ranks == "explicit" else []))
        for i in range(n)
    ]
    res = collect(procs)
    assert {(r["master_addr"], r["master_port"], r["generation"]) for r in res} == {
        ("127.0.0.1", res[0]["master_port"], 1)
    }
    assert sorted(r["node_rank"] for r in res) == list(range(n))
    assert all(r["nnodes"] == n and r["job_id"] == "eight" for r in res)
    if ranks == "explicit":
        assert [r["node_rank"] for r in res] == list(range(n))


def test_per_rank_mode_eight(tmp_path):
    n = 8
    procs = [spawn_env(tmp_path, "pr", "--world-size", n, "--rank", i) for i in range(n)]
    res = collect(procs)
    assert [r["rank"] for r in res] == list(range(n))
    assert {r["world_size"] for r in res} == {n}
    # all on one host: local ranks equal global ranks, one node
    assert [r["local_rank"] for r in res] == list(range(n))
    assert {r["local_world_size"] for r in res} == {n}
    assert {r["nnodes"] for r in res} == {1}
    assert len({r["master_port"] for r in res}) == 1


def test_per_rank_first_come_from_slurm_env(tmp_path):
    n = 4
    env = {"SLURM_NTASKS": str(n), "SLURM_NNODES": "1"}
    procs = [spawn_env(tmp_path, "prs", extra_env=env) for _ in range(n)]
    res = collect(procs)
    assert sorted(r["rank"] for r in res) == list(range(n))
    assert {r["mode"] for r in res} == {"rank"}


def test_scheduler_env_fallbacks(tmp_path):
    env = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2"}
    procs = []
    for i in range(2):
        e = dict(os.environ, **env, SLURM_NODEID=str(i), FSMINGLE_DIR=str(tmp_path))
        e.pop("FSMINGLE_JOB_ID", None)
        procs.append(
            subprocess.Popen(
                FSMINGLE + ["env", "--addr", "127.0.0.1", "--format", "json", "--timeout", "60"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=e,
            )
        )
    res = collect(procs)
    assert [r["node_rank"] for r in res] == [0, 1]
    assert {r["job_id"] for r in res} == {"4242"}
    assert (tmp_path / "4242").is_dir()


def test_run_exports_env_and_execs(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "d").mkdir(mode=0o700)
    procs = []
    for i in range(2):
        script = f"import os, json; json.dump(dict(os.environ), open({str(out)!r} + '/{i}.json', 'w'))"
        procs.append(
            subprocess.Popen(
                FSMINGLE
                + [
                    "run",
                    "--dir",
                    str(tmp_path / "d"),
                    "--job-id",
                    "runjob",
                    "--nnodes",
                    "2",
                    "--node-rank",
                    str(i),
                    "--addr",
                    "127.0.0.1",
                    "--timeout",
                    "60",
                    "--",
                    sys.executable,
                    "-c",
                    script,
                ],
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        assert "released: master 127.0.0.1:" in err
    envs = [json.loads((out / f"{i}.json").read_text()) for i in range(2)]
    for i, e in enumerate(envs):
        assert e["NODE_RANK"] == e["PET_NODE_RANK"] == str(i)
        assert e["NNODES"] == e["PET_NNODES"] == "2"
        assert e["MASTER_ADDR"] == e["PET_MASTER_ADDR"] == "127.0.0.1"
        assert e["MASTER_PORT"] == e["PET_MASTER_PORT"] == envs[0]["MASTER_PORT"]
        assert e["FSMINGLE_JOB_ID"] == "runjob" and e["FSMINGLE_GENERATION"] == "1"


def test_run_child_flags_are_not_parsed_and_exit_code_propagates(tmp_path):
    # --nnodes after the command word belongs to the child; exit code is the child's own.
    p = subprocess.run(
        FSMINGLE
        + [
            "run",
            "--dir",
            str(tmp_path),
            "--job-id",
            "solo",
            "--nnodes",
            "1",
            "--addr",
            "127.0.0.1",
            "--",
            sys.executable,
            "-c",
            "import sys; print(sys.argv[1:]); sys.exit(3)",
            "--nnodes",
            "99",
            "--timeout",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 3, p.stderr
    assert "['--nnodes', '99', '--timeout', 'x']" in p.stdout
    # without "--": parsing stops at the first positional word
    p = subprocess.run(
        FSMINGLE
        + [
            "run",
            "--dir",
            str(tmp_path),
            "--job-id",
            "solo2",
            "--nnodes",
            "1",
            "--addr",
            "127.0.0.1",
            sys.executable,
            "-c",
            "import sys; print(sys.argv[1:])",
            "--rank",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "['--rank', '5']" in p.stdout


def test_misspelt_option_is_an_error(tmp_path):
    p = subprocess.run(
        FSMINGLE + ["run", "--dir", str(tmp_path), "--nnode", "2", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 2
    assert "--nnode" in p.stderr


def test_env_formats(tmp_path):
    for fmt, check in [("sh", "export MASTER_ADDR=127.0.0.1"), ("dotenv", "MASTER_ADDR=127.0.0.1")]:
        p = subprocess.run(
            FSMINGLE
            + [
                "env",
                "--dir",
                str(tmp_path),
                "--job-id",
                f"fmt-{fmt}",
                "--nnodes",
                "1",
                "--addr",
                "127.0.0.1",
                "--format",
                fmt,
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
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


def test_timeout_names_missing_and_leaves_dir_ready(tmp_path):
    # 2 of 3 nodes present: both fail naming node rank 2, exit 7.
    procs = [spawn_env(tmp_path, "to", "--nnodes", 3, "--node-rank", i, timeout=3) for i in range(2)]
    for p in procs:
        _so, se = p.communicate(timeout=60)
        assert p.returncode == 7, se
        assert "missing node ranks 2 (1 of 3)" in se
        assert str(tmp_path) in se
        assert "--timeout" in se
    # the next attempt with all three succeeds, in a fresh generation
    res = collect([spawn_env(tmp_path, "to", "--nnodes", 3, "--node-rank", i) for i in range(3)])
    assert sorted(r["node_rank"] for r in res) == [0, 1, 2]
    assert len({(r["master_port"], r["generation"]) for r in res}) == 1
    assert res[0]["generation"] >= 2


def test_same_job_twice_in_a_row(tmp_path):
    gens = []
    for _ in range(3):
        res = collect([spawn_env(tmp_path, "again", "--nnodes", 2) for _ in range(2)])
        assert sorted(r["node_rank"] for r in res) == [0, 1]
        assert len({r["generation"] for r in res}) == 1
        gens.append(res[0]["generation"])
    assert gens == sorted(set(gens)), gens  # a new generation every run
