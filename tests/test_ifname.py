"""NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: torch listens on the interface of the address fsmingle announced.

Hosts are network namespaces whose only interface besides ``lo`` is ``eth0``
(tests/cluster/).  On each, the user's command is ``env``: it shows what a
training script launched by ``fsmingle run`` would get.  A value the user set
is the user's and stays as it was.
"""

from __future__ import annotations

import sys

import pytest
from cross_host_training import check_training, node_run
from helpers import host_env, run_cli


def _env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _run_everywhere(procs, c, job: str, env_of=lambda h: {}) -> dict[str, dict[str, str]]:
    """``fsmingle run ... -- env`` on every host of ``c``: {host: the environment the command got}."""
    ps = {
        h.name: procs.env(
            f"{c.shared}/rdzv",
            job,
            *("--nnodes", len(c.hosts), "--", "env"),
            cmd="run",
            timeout=40,
            stale_after=None,
            addr=None,
            host=h,
            extra_env=env_of(h),
        )
        for h in c
    }
    for p in ps.values():
        assert p.wait(90) == 0, p.stderr()
    return {name: _env_of(p.stdout()) for name, p in ps.items()}


@pytest.mark.root
@pytest.mark.slow
def test_each_host_exports_its_own_interface(make_cluster, procs):
    c = make_cluster(2)
    out = _run_everywhere(procs, c, "ifname")
    for h in c:
        e = out[h.name]
        assert e["GLOO_SOCKET_IFNAME"] == "eth0" and e["NCCL_SOCKET_IFNAME"] == "eth0", e
        assert e["MASTER_ADDR"] == c[0].ip or e["MASTER_ADDR"] == c[1].ip


@pytest.mark.root
@pytest.mark.slow
def test_a_value_the_user_set_is_kept(make_cluster, procs):
    c = make_cluster(2)
    # NCCL's exact-match syntax and gloo's prefix: both lead fsmingle to eth0 too, and stay as written
    out = _run_everywhere(
        procs,
        c,
        "ifname-user",
        env_of=lambda h: {"NCCL_SOCKET_IFNAME": "=eth0"} if h is c[0] else {"GLOO_SOCKET_IFNAME": "eth"},
    )
    assert out[c[0].name]["NCCL_SOCKET_IFNAME"] == "=eth0" and out[c[0].name]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert out[c[1].name]["GLOO_SOCKET_IFNAME"] == "eth" and out[c[1].name]["NCCL_SOCKET_IFNAME"] == "eth0"


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.torch
def test_torchrun_backend_hands_each_workers_its_hosts_interface(make_cluster, procs):
    """``torchrun --rdzv-backend fsmingle``: the workers torchrun starts get the interface of
    the address their agent announced, as under ``fsmingle run`` (the worker is ``env``)."""
    c = make_cluster(2)
    ps = []
    for h in c:
        argv = [
            "timeout", "-k", "5", "150", sys.executable, "-m", "torch.distributed.run",
            "--rdzv-backend", "fsmingle", "--rdzv-endpoint", f"{c.shared}/rdzv", "--rdzv-id", "ifname-torchrun",
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-conf", "join_timeout=120",
            "--monitor-interval", "0.5", "--no-python", "env",
        ]  # fmt: skip
        ps.append(procs.spawn(argv, name=h.name, env=host_env(), host=h))
    for h, p in zip(c, ps):
        assert p.wait(170) == 0, p.stderr()[-4000:]
        e = _env_of(p.stdout())
        assert e["GLOO_SOCKET_IFNAME"] == "eth0" and e["NCCL_SOCKET_IFNAME"] == "eth0", (h.name, e)
        assert e["MASTER_ADDR"] in (c[0].ip, c[1].ip), e


NO_IFNAME = {"GLOO_SOCKET_IFNAME": None, "NCCL_SOCKET_IFNAME": None}  # not exported at all


@pytest.mark.parametrize(
    ("addr", "expect"),
    [
        # behind a NAT: the announced address is on no interface here, so no interface is named
        (["203.0.113.7", "--addr-not-local"], {"MASTER_ADDR": "203.0.113.7", **NO_IFNAME}),
        (["127.0.0.1"], {"GLOO_SOCKET_IFNAME": "lo"}),
    ],
    ids=["nat", "loopback"],
)
def test_an_address_no_interface_has_exports_nothing(d, addr, expect):
    cp = run_cli("env", "--dir", d, "--job-id", "j", "--nnodes", "1", "--addr", *addr, "--format", "dotenv")
    assert cp.returncode == 0, cp.stderr
    e = _env_of(cp.stdout)
    assert {k: e.get(k) for k in expect} == expect, e


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.torch
def test_gloo_training_works_where_hostnames_resolve_to_loopback(make_cluster):
    """The failure the export prevents: hostnames map to 127.0.1.1 (Debian's /etc/hosts), so gloo on
    its own advertises loopback and ``connectFullMesh`` fails.  Nobody sets GLOO_SOCKET_IFNAME here:
    fsmingle's export alone makes DDP train across the hosts."""
    pytest.importorskip("torch")

    c = make_cluster(2, hosts_file="loopback")
    recs, texts = node_run(c, "ifname-gloo", 2, node_rank=[0, 1])  # the test harness scrubs GLOO_SOCKET_IFNAME
    check_training(recs, 4)
    assert {r["MASTER_ADDR"] for r in recs} == {c[0].ip}
