"""``fsmingle env --format hostfile`` and ``--format json``: the world as DeepSpeed/Open MPI launchers want it.

Every node must print the same hostfile, in rank order: hosts are network
namespaces with their own hostnames (tests/cluster.py) arriving in a scrambled
order, ranked by ``--rank-order host``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsmingle.gpu import visible

REPO = Path(__file__).resolve().parents[1]
NAMES = ["node10", "node2", "gpu7"]
CLEAR = {
    k: None
    for k in (
        "FSMINGLE_DIR",
        "FSMINGLE_JOB_ID",
        "FSMINGLE_RANK_ORDER",
        "FSMINGLE_GPUS_PER_NODE",
        "SLURM_JOB_ID",
        "SLURM_NNODES",
        "SLURM_NODEID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
    )
}


def _world(c, job: str, *args) -> dict[str, subprocess.CompletedProcess]:
    procs = []
    for k in (1, 0, 2):  # scrambled arrival
        h = c[k]
        argv = [
            "timeout",
            "-k",
            "5",
            "60",
            sys.executable,
            "-m",
            "fsmingle",
            "env",
            "--dir",
            f"{c.shared}/rdzv",
            "--job-id",
            job,
            "--nnodes",
            "3",
            "--timeout",
            "40",
            "--rank-order",
            "host",
            *args,
        ]
        procs.append((h, h.popen(argv, env=CLEAR, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        time.sleep(0.3)
    out = {}
    for h, p in procs:
        so, se = p.communicate(timeout=90)
        assert p.returncode == 0, se
        out[h.name] = so
    return out


@pytest.mark.root
@pytest.mark.slow
def test_every_node_prints_the_same_hostfile_in_rank_order(make_cluster):
    c = make_cluster(3, host_names=NAMES)
    out = _world(c, "hf", "--format", "hostfile", "--slots", "4")
    assert set(out.values()) == {"gpu7 slots=4\nnode2 slots=4\nnode10 slots=4\n"}, out
    # default slots: this node's GPU count, else 1
    out = _world(c, "hf-default", "--format", "hostfile")
    n = visible() or 1
    assert set(out.values()) == {f"gpu7 slots={n}\nnode2 slots={n}\nnode10 slots={n}\n"}, out


@pytest.mark.root
@pytest.mark.slow
def test_json_lists_every_member_on_every_node(make_cluster):
    c = make_cluster(3, host_names=NAMES)
    out = {name: json.loads(text) for name, text in _world(c, "js", "--format", "json").items()}
    ip = {h.name: h.ip for h in c}
    for name, r in out.items():
        members = r["members"]
        assert [m["rank"] for m in members] == [0, 1, 2]
        assert [m["host"] for m in members] == ["gpu7", "node2", "node10"]
        assert [m["addr"] for m in members] == [ip["gpu7"], ip["node2"], ip["node10"]]
        assert min(m["arrival"] for m in members) == 0.0 and all(m["arrival"] >= 0 for m in members)
        assert members[r["node_rank"]]["host"] == name, "each node finds itself at its own rank"
    assert len({json.dumps(r["members"]) for r in out.values()}) == 1, "every node sees the same list"


def test_per_rank_mode_hostfile_has_one_line_per_host(tmp_path):
    rdzv = tmp_path / "rdzv"
    rdzv.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k not in CLEAR}
    argv = [
        sys.executable,
        "-m",
        "fsmingle",
        "env",
        "--dir",
        str(rdzv),
        "--job-id",
        "pr",
        "--world-size",
        "3",
        "--timeout",
        "40",
        "--format",
        "hostfile",
        "--slots",
        "3",
    ]
    procs = [
        subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=90) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    lines = {o for o, _ in outs}
    assert len(lines) == 1 and len(lines.pop().splitlines()) == 1, outs  # three ranks, one host


def test_slots_only_with_hostfile(tmp_path):
    rdzv = tmp_path / "rdzv"
    rdzv.mkdir(mode=0o700)
    cp = subprocess.run(
        [sys.executable, "-m", "fsmingle", "env", "--dir", str(rdzv), "--job-id", "x", "--nnodes", "1", "--slots", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert cp.returncode == 3 and "--slots applies to --format hostfile only" in cp.stderr, cp.stderr
    assert os.listdir(rdzv) == []
