"""Protocol v2 as users meet it: partitions, IPv6-only hosts, negative caches, an unreachable master.

Each test builds network-namespace hosts (tests/cluster.py) sharing one
directory through bindfs views, and runs ``fsmingle env`` on them as a user
would.  The oracle everywhere: nobody is released into a world with a member
that is not alive and reachable *now*, and every failure names what is missing.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
_ENV = {k: None for k in ("FSMINGLE_DIR", "FSMINGLE_JOB_ID", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                          "PET_NNODES", "PET_NODE_RANK", "SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NODEID")}
_ENV["PYTHONUNBUFFERED"] = "1"


def _env_proc(host, d: str, job: str, *args, timeout: float = 60, stale_after: float = 4, log: Path):
    argv = ["timeout", "-k", "5", str(timeout + 30), sys.executable, "-m", "fsmingle", "env", "--dir", d,
            "--job-id", job, "--format", "json", "--timeout", str(timeout), "--stale-after", str(stale_after),
            "--poll-max", str(min(0.28, stale_after / 4)), *map(str, args)]
    out = open(log.with_suffix(".out"), "w")
    err = open(log.with_suffix(".err"), "w")
    try:
        return host.popen(argv, env=_ENV, cwd=REPO, stdout=out, stderr=err)
    finally:
        out.close()
        err.close()


def _text(log: Path, kind: str) -> str:
    try:
        return log.with_suffix(kind).read_text()
    except FileNotFoundError:
        return ""


def _wait_text(log: Path, needle: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while needle not in _text(log, ".err"):
        if time.monotonic() > end:
            raise AssertionError(f"no {needle!r} in {log} within {timeout:g} s:\n{_text(log, '.err')}")
        time.sleep(0.1)


def _results(procs_logs, timeout: float) -> list[dict]:
    out = []
    for p, log in procs_logs:
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError(f"{log.name} did not finish:\n{_text(log, '.err')}")
        assert rc == 0, f"{log.name} exited {rc}:\n{_text(log, '.err')}"
        out.append(json.loads(_text(log, ".out")))
    return out


def _decisions(cluster, job: str) -> dict[int, dict]:
    jd = Path(cluster.shared) / "rdzv" / job
    out = {}
    for g in sorted(jd.glob("gen-*")):
        try:
            out[int(g.name[4:])] = json.loads((g / "release.json").read_text())
        except (FileNotFoundError, ValueError):
            pass
    return out


def _claim_instance(cluster, job: str, g: int, rank: int) -> str | None:
    try:
        return json.loads((Path(cluster.shared) / "rdzv" / job / f"gen-{g:08d}" / f"rank-{rank:05d}.claim")
                          .read_text())["instance"]
    except (FileNotFoundError, ValueError):
        return None


def test_partitioned_member_is_never_released(make_cluster, tmp_path):
    """Node rank 1's link goes down (no RST, no answer) while its filesystem stays reachable.

    v1 released ranks 0 and 2 with rank 1 in the world.  v2: rank 1 cannot
    acknowledge the release, so the generation is voided; nothing is released
    while rank 1 is cut off; once its link is back, all four are released.
    """
    c = make_cluster(4)
    d = f"{c.shared}/rdzv"
    logs = [tmp_path / f"r{r}" for r in range(4)]
    procs = [_env_proc(c[r], d, "part", "--nnodes", 4, "--node-rank", r, log=logs[r]) for r in range(3)]
    _wait_text(logs[1], "connected to the master", 30)
    victim = _claim_instance(c, "part", 1, 1)
    assert victim
    c[1].link_down()
    try:
        procs.append(_env_proc(c[3], d, "part", "--nnodes", 4, "--node-rank", 3, log=logs[3]))
        time.sleep(4 * 2 + 4)  # two stale_after periods and more: nobody may be released meanwhile
        for g, rel in _decisions(c, "part").items():
            assert rel["state"] == "restart", f"generation {g} released while rank 1 was cut off: {rel}"
        assert all(p.poll() is None for p in procs), [(_text(lg, ".err")) for lg in logs]
        reasons = " | ".join(rel["reason"] for rel in _decisions(c, "part").values())
        assert "did not acknowledge" in reasons or "silent" in reasons or "lost" in reasons, reasons
    finally:
        c[1].link_up()
    res = _results(list(zip(procs, logs)), 60)
    assert len({(r["master_addr"], r["master_port"], r["generation"]) for r in res}) == 1, res
    assert sorted(r["node_rank"] for r in res) == [0, 1, 2, 3]
    assert res[0]["generation"] >= 2
    assert res[0]["master_addr"] == c[0].ip


def test_ipv6_only_hosts_complete(make_cluster, tmp_path):
    """Hosts with only IPv6 addresses (ULA ``fd42::/64``): v1 never completed (its master port bound AF_INET only)."""
    c = make_cluster(3)
    net = f"fd42:{random.randrange(1 << 16):x}:{random.randrange(1 << 16):x}:1"
    addrs = []
    for k, h in enumerate(c):
        subprocess.run(["ip", "-n", h.netns, "addr", "flush", "dev", "eth0", "scope", "global"], check=True)
        a = f"{net}::{k + 10}"
        subprocess.run(["ip", "-n", h.netns, "-6", "addr", "add", f"{a}/64", "dev", "eth0", "nodad"], check=True)
        addrs.append(a)
    d = f"{c.shared}/rdzv"
    logs = [tmp_path / f"v6-{r}" for r in range(3)]
    procs = [_env_proc(c[r], d, "v6", "--nnodes", 3, log=logs[r]) for r in range(3)]
    res = _results(list(zip(procs, logs)), 90)
    assert len({(r["master_addr"], r["master_port"], r["generation"]) for r in res}) == 1, res
    assert sorted(r["node_rank"] for r in res) == [0, 1, 2]
    assert res[0]["master_addr"] in addrs and ":" in res[0]["master_addr"]
    assert res[0]["generation"] == 1, [_text(lg, ".err") for lg in logs]


def test_master_address_that_does_not_answer_is_never_released(make_cluster, tmp_path):
    """Rank 0 announces an address nobody can reach (``--addr`` of another host, accepted on purpose).

    v1 released both nodes with that MASTER_ADDR when rank 0 itself completed
    the world.  v2 releases only over a connection to the announced address:
    nobody is released; the member's timeout says it could not reach the master.
    """
    c = make_cluster(2)
    d = f"{c.shared}/rdzv"
    bogus = "10.255.255.1"  # in no namespace: connects time out (no route -> no answer)
    l0, l1 = tmp_path / "m0", tmp_path / "m1"
    p1 = _env_proc(c[1], d, "bogus", "--nnodes", 2, "--node-rank", 1, timeout=12, log=l1)
    time.sleep(1)
    p0 = _env_proc(c[0], d, "bogus", "--nnodes", 2, "--node-rank", 0, "--addr", bogus, "--addr-not-local",
                   timeout=12, log=l0)
    assert p0.wait(60) == 7, _text(l0, ".err")
    assert p1.wait(60) == 7, _text(l1, ".err")
    err1 = _text(l1, ".err")
    assert f"cannot reach the master {bogus}:" in err1 and "--iface/--addr" in err1, err1
    err0 = _text(l0, ".err")
    assert "node ranks 1 claimed a place but never connected to the master" in err0, err0
    assert all(rel["state"] == "restart" for rel in _decisions(c, "bogus").values())


def test_negative_cache_like_glusterfs_reruns(make_cluster, tmp_path):
    """4 hosts whose views cache "absent" answers for 60 s (bindfs negative_timeout, as GlusterFS nl-cache).

    v1 took a looked-up-too-early generation directory for "gone", left a
    generation holding a claim without voiding it, and split fresh jobs across
    generations.  v2 creates directories before looking them up and confirms an
    ENOENT by listing; 5 re-runs with one job id each release one full world,
    within seconds (release goes over the connections, not through the caches).
    """
    c = make_cluster(4, cache_timeout=60.0)
    d = f"{c.shared}/rdzv"
    gens = []
    for run in range(5):
        logs = [tmp_path / f"run{run}-{k}" for k in range(4)]
        t0 = time.monotonic()
        procs = [_env_proc(c[k], d, "neg", "--nnodes", 4, log=logs[k], timeout=60, stale_after=8)
                 for k in range(4)]
        res = _results(list(zip(procs, logs)), 90)
        took = time.monotonic() - t0
        assert len({(r["master_addr"], r["master_port"], r["generation"]) for r in res}) == 1, res
        assert sorted(r["node_rank"] for r in res) == [0, 1, 2, 3]
        assert took < 30, f"run {run} took {took:.1f} s: {[_text(lg, '.err') for lg in logs]}"
        gens.append(res[0]["generation"])
    assert gens == sorted(set(gens)), gens  # each re-run a new generation
    if os.environ.get("FSMINGLE_DEBUG_TESTS"):
        print(gens)


_V6_TRAIN = r'''
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("SUM", int(t.item()), os.environ["MASTER_ADDR"], flush=True)
dist.barrier()
dist.destroy_process_group()
'''


def test_ipv6_only_hosts_run_torch_gloo(make_cluster, tmp_path):
    """torch 2.13 accepts a bare IPv6 literal as MASTER_ADDR (TCPStore and gloo): per-rank mode over IPv6 only."""
    pytest.importorskip("torch")
    c = make_cluster(2)
    net = f"fd42:{random.randrange(1 << 16):x}:{random.randrange(1 << 16):x}:2"
    for k, h in enumerate(c):
        subprocess.run(["ip", "-n", h.netns, "addr", "flush", "dev", "eth0", "scope", "global"], check=True)
        subprocess.run(["ip", "-n", h.netns, "-6", "addr", "add", f"{net}::{k + 10}/64", "dev", "eth0", "nodad"],
                       check=True)
    script = tmp_path / "v6.py"
    script.write_text(_V6_TRAIN)
    procs = []
    for k, h in enumerate(c):
        argv = ["timeout", "-k", "5", "90", sys.executable, "-m", "fsmingle", "run", "--dir", f"{c.shared}/rdzv",
                "--job-id", "v6torch", "--world-size", "2", "--rank", str(k), "--timeout", "60", "--",
                sys.executable, str(script)]
        procs.append(h.popen(argv, env={**_ENV, "GLOO_SOCKET_IFNAME": "eth0"}, cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        assert f"SUM 3 {net}::10" in out, out


def test_check_mesh_refuses_a_broken_path_between_members(make_cluster, tmp_path):
    """--check-mesh: node1 reaches the master but not node2 (a blackhole route); nobody is released.

    Without the check the world would be released and NCCL/gloo would hang at
    init.  With it, the generation is voided naming both hosts, both addresses
    and the interface; once the route is fixed, the world is released.
    """
    c = make_cluster(4)
    d = f"{c.shared}/rdzv"
    subprocess.run(["ip", "-n", c[1].netns, "route", "add", "blackhole", f"{c[2].ip}/32"], check=True)
    logs = [tmp_path / f"mesh{r}" for r in range(4)]
    procs = [_env_proc(c[r], d, "mesh", "--nnodes", 4, "--node-rank", r, "--check-mesh", log=logs[r], timeout=60,
                       stale_after=8) for r in range(4)]
    deadline = time.monotonic() + 30
    while not any("cannot reach its ring neighbour" in rel.get("reason", "")
                  for rel in _decisions(c, "mesh").values()):
        assert time.monotonic() < deadline, [_text(lg, ".err") for lg in logs]
        time.sleep(0.2)
    assert all(rel["state"] == "restart" for rel in _decisions(c, "mesh").values())
    reason = next(rel["reason"] for rel in _decisions(c, "mesh").values() if "ring neighbour" in rel["reason"])
    assert f"{c[1].name} ({c[1].ip}, interface eth0)" in reason and c[2].name in reason and c[2].ip in reason, reason
    subprocess.run(["ip", "-n", c[1].netns, "route", "del", "blackhole", f"{c[2].ip}/32"], check=True)
    res = _results(list(zip(procs, logs)), 90)
    assert len({(r["master_addr"], r["master_port"], r["generation"]) for r in res}) == 1, res
    assert sorted(r["node_rank"] for r in res) == [0, 1, 2, 3] and res[0]["generation"] >= 2
