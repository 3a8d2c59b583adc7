"""Real DDP training across hosts that share nothing but a directory.

Every test builds a small cluster on this machine (tests/cluster/): hosts are
network namespaces on a private bridge, each with its own hostname, its own
``/etc/hosts``, NO default route, and its own NFS-like bindfs view of one
shared directory.  On every host we run the command a user would run on a
real node::

    fsmingle run --dir <shared>/rdzv --job-id J --nnodes 3 --node-rank k \\
        -- torchrun --nproc-per-node 2 examples/train_ddp.py --steps 30 --out <shared>/out

and check that all ranks trained together (identical parameter checksums in
every rank's ``rank<R>.json``) and that the master address fsmingle chose is
the rank-0 host's namespace IP -- an IP literal, not a hostname and not
loopback.

About ``GLOO_SOCKET_IFNAME``: gloo does not use MASTER_ADDR to pick the
address it listens on; it resolves the machine's *hostname*.  Where the
hostname maps to a loopback address (Debian's ``127.0.1.1 <hostname>``; the
``hosts_file="loopback"`` cluster below), every rank advertises 127.0.0.1 and
the job fails with ``Gloo connectFullMesh failed ... remote=[127.0.0.1]``.
``GLOO_SOCKET_IFNAME=eth0`` makes gloo use the interface instead.  fsmingle
itself reads that variable as an address hint too, so where the test is about
fsmingle's *unhinted* choice it is passed to torch only, after the ``--``
(``fsmingle run ... -- env GLOO_SOCKET_IFNAME=eth0 torchrun ...``): fsmingle
never sees it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from cross_host_training import (
    BASE_ENV,
    SCRIPT,
    STEPS,
    check_training,
    fsmingle_run,
    node_run,
    records,
    start,
    wait_all,
)
from helpers import status_of

pytest.importorskip("torch")

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow]

_RELEASED = re.compile(r"fsmingle: (\S+) released: master (\S+):(\d+), node rank (\d+)/(\d+)")
_RELEASED_RANK = re.compile(r"fsmingle: (\S+) released: master (\S+):(\d+), rank (\d+)/(\d+) \(local (\d+)/(\d+)")


def _released_lines(texts):
    got = []
    for t in texts:
        m = _RELEASED.search(t)
        assert m, "no 'released' line in:\n" + t[-3000:]
        got.append(m.groups())
    return got


def _status(cluster, job) -> dict:
    return status_of(f"{cluster.shared}/rdzv", job)


def test_three_hosts_default_address(make_cluster):
    """No --addr/--iface/*_IFNAME for fsmingle; hostnames resolve to loopback (so no
    hostname could be trusted): fsmingle must pick eth0 (the one non-loopback interface
    that is up, since there is no default route).  Fixed node ranks 2, 0, 1."""
    c = make_cluster(3, hosts_file="loopback")
    ranks = [2, 0, 1]
    recs, texts = node_run(
        c, "cross-default", 3, node_rank=ranks, torch_env=["GLOO_SOCKET_IFNAME=eth0"]
    )  # for gloo only, see module doc
    check_training(recs, 6)
    master_host = c[ranks.index(0)]
    assert {r["MASTER_ADDR"] for r in recs} == {master_host.ip}
    for k, (job, addr, port, nr, nn) in enumerate(_released_lines(texts)):
        assert (job, addr, int(nr), int(nn)) == ("cross-default", master_host.ip, ranks[k], 3)
        assert port == recs[0]["MASTER_PORT"]
    # torchrun gave each host's two workers that host's node rank
    by_host = {}
    for r in recs:
        by_host.setdefault(r["hostname"], set()).add(int(r["node_rank"]))
    assert by_host == {c[k].name: {ranks[k]} for k in range(3)}
    # every node announced its own namespace IP; none a loopback address or a name
    st = _status(c, "cross-default")
    assert st["release"]["state"] == "released"
    assert st["release"]["members"] == [c[ranks.index(i)].ip for i in range(3)]


def _add_decoy_interface(cluster):
    """A second interface that sorts before eth0 ("dum0"), up, with an address nobody
    can reach: the unhinted fallback (first interface by name) would pick it.  (A veth
    pair with both ends inside the namespace: the ``dummy`` link type needs a kernel
    module that may be missing.)"""
    for k, h in enumerate(cluster):
        ns = h.netns
        for argv in (
            ["ip", "-n", ns, "link", "add", "dum0", "type", "veth", "peer", "name", "dum1"],
            ["ip", "-n", ns, "link", "set", "dum1", "up"],
            ["ip", "-n", ns, "addr", "add", f"198.18.{cluster.subnet.split('.')[2]}.{k + 1}/32", "dev", "dum0"],
            ["ip", "-n", ns, "link", "set", "dum0", "up"],
        ):
            subprocess.run(argv, check=True, capture_output=True, timeout=10)


def test_three_hosts_first_come_with_iface_hints(make_cluster):
    """No --node-rank: node ranks are first-come and whoever gets rank 0 is the master.
    Each host also has a decoy interface dum0 beside eth0 (sorting first, so the unhinted
    fallback would pick it): node0 says ``--iface eth0``, node1 and node2 only have
    ``GLOO_SOCKET_IFNAME=eth0`` in the environment (the variable gloo reads, which
    fsmingle honours too).  Every node must announce eth0's address.  Hostnames resolve
    to the namespace IPs here, so gloo itself needs no hint on node0.  (First-come and
    the hints share one run: each multi-host torch run costs ~35 s on 2 cores.)"""
    c = make_cluster(3)
    _add_decoy_interface(c)
    # without a hint the decoy wins the tie-break, so the hints below are what is tested
    p = c[0].run(
        ["fsmingle", "env", "--dir", f"{c.shared}/rdzv", "--job-id", "p", "--nnodes", "1", "--format", "json", "-q"],
        env=BASE_ENV,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["master_addr"].startswith("198.18.")

    recs, texts = node_run(
        c,
        "cross-firstcome",
        3,
        fsm_args=[["--iface", "eth0"], [], []],
        host_env={1: {"GLOO_SOCKET_IFNAME": "eth0"}, 2: {"GLOO_SOCKET_IFNAME": "eth0"}},
        nproc=1,
    )  # 1 worker per node: saves ~10 s on 2 cores
    check_training(recs, 3)
    lines = _released_lines(texts)
    assert sorted(int(l[3]) for l in lines) == [0, 1, 2]
    master_host = c[[int(l[3]) for l in lines].index(0)]
    assert {l[1] for l in lines} == {master_host.ip} == {r["MASTER_ADDR"] for r in recs}
    for r in recs:  # each worker's node rank is the one its host was given
        assert lines[[h.name for h in c].index(r["hostname"])][3] == r["node_rank"]
    # every node announced eth0's address, whichever way it was told
    st = _status(c, "cross-firstcome")
    assert st["release"]["state"] == "released"
    by_rank = {int(l[3]): c[k].ip for k, l in enumerate(lines)}
    assert st["release"]["members"] == [by_rank[i] for i in range(3)]


def test_per_rank_two_hosts(make_cluster):
    """Per-rank mode: 2 hosts x 2 ``fsmingle run --world-size 4 --rank r -- python
    train_ddp.py`` processes, no torchrun.  Ranks are interleaved across hosts (host 0:
    0 and 2, host 1: 1 and 3) to check fsmingle's LOCAL_RANK/node numbering."""
    c = make_cluster(2, hosts_file="loopback")
    shared = Path(c.shared)
    out = shared / "out-perrank"
    placement = {0: 0, 1: 1, 2: 0, 3: 1}  # rank -> host
    procs, logs = [], []
    for rank, k in placement.items():
        argv = fsmingle_run(c, "cross-perrank", "--world-size", 4, "--rank", rank, "--")
        # GLOO_SOCKET_IFNAME for gloo only: hostnames resolve to loopback here
        argv += ["env", "GLOO_SOCKET_IFNAME=eth0", "python", str(SCRIPT), "--steps", str(STEPS), "--out", str(out)]
        log = c.workdir / f"perrank-{rank}.log"
        procs.append(start(c[k], argv, log))
        logs.append(log)
    texts = wait_all(procs, logs)
    recs = records(out, 4)
    check_training(recs, 4)
    assert {r["MASTER_ADDR"] for r in recs} == {c[0].ip}
    for r in recs:
        assert r["hostname"] == c[placement[r["rank"]]].name
    assert {r["rank"]: r["local_rank"] for r in recs} == {0: 0, 2: 1, 1: 0, 3: 1}
    for rank, t in zip(placement, texts):
        m = _RELEASED_RANK.search(t)
        assert m, t[-3000:]
        assert m.group(2) == c[0].ip and int(m.group(4)) == rank and m.group(5) == "4"
        assert m.group(7) == "2"  # two ranks on each host
