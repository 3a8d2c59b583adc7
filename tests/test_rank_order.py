"""--rank-order: node ranks follow the machine (hostnames, Slurm's nodelist, a topology key), not arrival.

Hosts are network namespaces with their own hostnames (tests/cluster/); they
arrive in a deliberately scrambled order, first-come, and the ranks must come
out in the requested order -- with MASTER_ADDR on whichever host became rank 0.
"""

from __future__ import annotations

import time

import pytest

from fsmingle.protocol.decision import expand_nodelist, natural_key

pytestmark = [pytest.mark.root, pytest.mark.slow]

NAMES = ["node10", "node2", "gpu7", "node1"]


def _run_world(procs, c, job: str, per_host_args, env_of=lambda h: {}) -> dict[str, dict]:
    ps = {}
    for k in (2, 0, 3, 1):  # scrambled arrival
        h = c[k]
        ps[h.name] = procs.env(
            f"{c.shared}/rdzv",
            job,
            "--nnodes",
            4,
            *per_host_args(h),
            timeout=40,
            stale_after=None,
            addr=None,
            host=h,
            extra_env=env_of(h),
            name=h.name,
        )
        time.sleep(0.3)
    out = {name: p.result(timeout=90) for name, p in ps.items()}
    assert len({(r["master_addr"], r["master_port"], r["generation"]) for r in out.values()}) == 1, out
    return out


def _check(c, out: dict, expected_order: list[str]) -> None:
    ranks = {name: r["node_rank"] for name, r in out.items()}
    assert [n for n, _ in sorted(ranks.items(), key=lambda kv: kv[1])] == expected_order, ranks
    ip = {h.name: h.ip for h in c}
    assert out[expected_order[0]]["master_addr"] == ip[expected_order[0]], "MASTER_ADDR must be rank 0's host"


def test_rank_order_host_is_natural_hostname_order(make_cluster, procs):
    c = make_cluster(4, host_names=NAMES)
    out = _run_world(procs, c, "by-host", lambda h: ["--rank-order", "host"])
    _check(c, out, sorted(NAMES, key=natural_key))  # gpu7, node1, node2, node10


def test_rank_order_key_sorts_by_topology_key_then_hostname(make_cluster, procs):
    c = make_cluster(4, host_names=NAMES)
    keys = {"node10": "rack1/sw2", "node2": "rack2/sw1", "gpu7": "rack2/sw1", "node1": "rack10/sw1"}
    out = _run_world(
        procs,
        c,
        "by-key",
        lambda h: [],
        env_of=lambda h: {"FSMINGLE_RANK_ORDER": "key", "FSMINGLE_TOPOLOGY_KEY": keys[h.name]},
    )
    _check(c, out, ["node10", "gpu7", "node2", "node1"])  # rack1 < rack2 (gpu7 < node2) < rack10


def test_rank_order_nodelist_follows_slurm_order_and_explicit_ranks_win(make_cluster, procs):
    c = make_cluster(4, host_names=NAMES)
    nodelist = "node[2,10],gpu7,node1"
    assert expand_nodelist(nodelist) == ["node2", "node10", "gpu7", "node1"]
    # node1 insists on node rank 3: explicit ranks win; the others follow the nodelist
    out = _run_world(
        procs,
        c,
        "by-list",
        lambda h: ["--rank-order", "nodelist"] + (["--node-rank", "3"] if h.name == "node1" else []),
        env_of=lambda h: {"SLURM_JOB_NODELIST": nodelist},
    )
    _check(c, out, ["node2", "node10", "gpu7", "node1"])


@pytest.mark.parametrize(
    "spec, hosts",
    [
        ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
        ("gpu[08-10],login", ["gpu08", "gpu09", "gpu10", "login"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a1,b[2],c", ["a1", "b2", "c"]),
    ],
)
def test_expand_nodelist_as_slurm_does(spec, hosts):
    assert expand_nodelist(spec) == hosts


def test_expand_nodelist_refuses_garbage():
    for bad in ("node[1-3", "node1-3]", "node[3-1]"):
        with pytest.raises(ValueError):
            expand_nodelist(bad)
