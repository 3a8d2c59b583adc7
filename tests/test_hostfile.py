"""``fsmingle env --format hostfile`` and ``--format json``: the world as DeepSpeed/Open MPI launchers want it.

Every node must print the same hostfile, in rank order: hosts are network
namespaces with their own hostnames (tests/cluster/) arriving in a scrambled
order, ranked by ``--rank-order host``.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers import run_cli

from fsmingle.preflight.gpu import visible

NAMES = ["node10", "node2", "gpu7"]


def _world(procs, c, job: str, *args) -> dict[str, str]:
    """``fsmingle env ARGS`` on the 3 hosts, arriving scrambled, ranked by host name: {host: stdout}."""
    ps = []
    for k in (1, 0, 2):  # scrambled arrival
        opts = ["--nnodes", 3, "--rank-order", "host", *args]
        ps.append(
            procs.env(f"{c.shared}/rdzv", job, *opts, timeout=40, stale_after=None, addr=None, fmt=None, host=c[k])
        )
        time.sleep(0.3)
    for p in ps:
        assert p.wait(90) == 0, p.stderr()
    return {c[k].name: p.stdout() for k, p in zip((1, 0, 2), ps)}


@pytest.mark.root
@pytest.mark.slow
def test_every_node_prints_the_same_hostfile_in_rank_order(make_cluster, procs):
    c = make_cluster(3, host_names=NAMES)
    out = _world(procs, c, "hf", "--format", "hostfile", "--slots", "4")
    assert set(out.values()) == {"gpu7 slots=4\nnode2 slots=4\nnode10 slots=4\n"}, out
    # default slots: this node's GPU count, else 1
    out = _world(procs, c, "hf-default", "--format", "hostfile")
    n = visible() or 1
    assert set(out.values()) == {f"gpu7 slots={n}\nnode2 slots={n}\nnode10 slots={n}\n"}, out


@pytest.mark.root
@pytest.mark.slow
def test_json_lists_every_member_on_every_node(make_cluster, procs):
    c = make_cluster(3, host_names=NAMES)
    out = {name: json.loads(text) for name, text in _world(procs, c, "js", "--format", "json").items()}
    ip = {h.name: h.ip for h in c}
    for name, r in out.items():
        members = r["members"]
        assert [m["rank"] for m in members] == [0, 1, 2]
        assert [m["host"] for m in members] == ["gpu7", "node2", "node10"]
        assert [m["addr"] for m in members] == [ip["gpu7"], ip["node2"], ip["node10"]]
        assert min(m["arrival"] for m in members) == 0.0 and all(m["arrival"] >= 0 for m in members)
        assert members[r["node_rank"]]["host"] == name, "each node finds itself at its own rank"
    assert len({json.dumps(r["members"]) for r in out.values()}) == 1, "every node sees the same list"


def test_per_rank_mode_hostfile_has_one_line_per_host(procs, d):
    opts = ["--world-size", 3, "--format", "hostfile", "--slots", 3]
    ps = [procs.env(d, "pr", *opts, timeout=40, stale_after=None, addr=None, fmt=None) for _ in range(3)]
    assert [p.wait(90) for p in ps] == [0, 0, 0], [p.stderr() for p in ps]
    lines = {p.stdout() for p in ps}
    assert len(lines) == 1 and len(lines.pop().splitlines()) == 1, lines  # three ranks, one host


def test_slots_only_with_hostfile(d):
    cp = run_cli("env", "--dir", d, "--job-id", "x", "--nnodes", "1", "--slots", "2")
    assert cp.returncode == 3 and "--slots applies to --format hostfile only" in cp.stderr, cp.stderr
    assert os.listdir(d) == []
