"""NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: torch listens on the interface of the address fsmingle announced.

Hosts are network namespaces whose only interface besides ``lo`` is ``eth0``
(tests/cluster.py).  On each, the user's command is ``env``: it shows what a
training script launched by ``fsmingle run`` would get.  A value the user set
is the user's and stays as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLEAR = {
    k: None
    for k in (
        "FSMINGLE_DIR",
        "FSMINGLE_JOB_ID",
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
        "SLURM_JOB_ID",
        "SLURM_NNODES",
        "SLURM_NODEID",
    )
}


def _env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _run_everywhere(c, job: str, env_of=lambda h: {}) -> dict[str, dict[str, str]]:
    procs = []
    for h in c:
        argv = [
            "timeout",
            "-k",
            "5",
            "60",
            sys.executable,
            "-m",
            "fsmingle",
            "run",
            "--dir",
            f"{c.shared}/rdzv",
            "--job-id",
            job,
            "--nnodes",
            str(len(c.hosts)),
            "--timeout",
            "40",
            "--",
            "env",
        ]
        procs.append(
            (
                h,
                h.popen(
                    argv,
                    env={**CLEAR, **env_of(h)},
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    out = {}
    for h, p in procs:
        so, se = p.communicate(timeout=90)
        assert p.returncode == 0, se
        out[h.name] = _env_of(so)
    return out


@pytest.mark.root
@pytest.mark.slow
def test_each_host_exports_its_own_interface(make_cluster):
    c = make_cluster(2)
    out = _run_everywhere(c, "ifname")
    for h in c:
        e = out[h.name]
        assert e["GLOO_SOCKET_IFNAME"] == "eth0" and e["NCCL_SOCKET_IFNAME"] == "eth0", e
        assert e["MASTER_ADDR"] == c[0].ip or e["MASTER_ADDR"] == c[1].ip


@pytest.mark.root
@pytest.mark.slow
def test_a_value_the_user_set_is_kept(make_cluster):
    c = make_cluster(2)
    # NCCL's exact-match syntax and gloo's prefix: both lead fsmingle to eth0 too, and stay as written
    out = _run_everywhere(
        c,
        "ifname-user",
        env_of=lambda h: {"NCCL_SOCKET_IFNAME": "=eth0"} if h is c[0] else {"GLOO_SOCKET_IFNAME": "eth"},
    )
    assert out[c[0].name]["NCCL_SOCKET_IFNAME"] == "=eth0" and out[c[0].name]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert out[c[1].name]["GLOO_SOCKET_IFNAME"] == "eth" and out[c[1].name]["NCCL_SOCKET_IFNAME"] == "eth0"


def test_an_address_no_interface_has_exports_nothing(tmp_path):
    rdzv = tmp_path / "rdzv"
    rdzv.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k not in CLEAR}
    # behind a NAT: the announced address is on no interface here, so no interface is named
    cp = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsmingle",
            "env",
            "--dir",
            str(rdzv),
            "--job-id",
            "nat",
            "--nnodes",
            "1",
            "--addr",
            "203.0.113.7",
            "--addr-not-local",
            "--format",
            "dotenv",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert cp.returncode == 0, cp.stderr
    e = _env_of(cp.stdout)
    assert e["MASTER_ADDR"] == "203.0.113.7" and "GLOO_SOCKET_IFNAME" not in e and "NCCL_SOCKET_IFNAME" not in e
    cp = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsmingle",
            "env",
            "--dir",
            str(rdzv),
            "--job-id",
            "lo",
            "--nnodes",
            "1",
            "--addr",
            "127.0.0.1",
            "--format",
            "dotenv",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert cp.returncode == 0, cp.stderr
    assert _env_of(cp.stdout)["GLOO_SOCKET_IFNAME"] == "lo"


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.torch
def test_gloo_training_works_where_hostnames_resolve_to_loopback(make_cluster):
    """The failure the export prevents: hostnames map to 127.0.1.1 (Debian's /etc/hosts), so gloo on
    its own advertises loopback and ``connectFullMesh`` fails.  Nobody sets GLOO_SOCKET_IFNAME here:
    fsmingle's export alone makes DDP train across the hosts."""
    pytest.importorskip("torch")
    from test_cross_host import _check_training, _node_run  # torch-only helpers; imported when torch is there

    c = make_cluster(2, hosts_file="loopback")
    recs, texts = _node_run(c, "ifname-gloo", 2, node_rank=[0, 1], env=CLEAR)
    _check_training(recs, 4)
    assert {r["MASTER_ADDR"] for r in recs} == {c[0].ip}
