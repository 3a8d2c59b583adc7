"""A partition that lasts, then a second failure (``python -m benchmarks.recovery.partition``).

Found by the recovery benchmark's network-cut fault (issue 31): a node whose network is cut but
whose shared filesystem still works leaves its world at its collective's timeout and claims rank 0
of the next generation through the directory.  Its peers cannot connect to it ("a node is never
released without a connection to its master"), and nothing voids that generation while its rank 0
looks alive on the filesystem: after a second failure no world forms until the link comes back.
"""

from __future__ import annotations

import json
import subprocess
import sys

import cluster as cl
import pytest
from helpers import REPO, torch_env

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.root, pytest.mark.slow]


def test_a_second_failure_recovers_while_a_partitioned_node_waits_in_the_next_generation(tmp_path):
    cl.require_capabilities()
    cmd = [sys.executable, "-m", "benchmarks.recovery.partition", "--path", "inproc", "--stale-after", "5"]
    cmd += ["--wait", "30"]
    p = subprocess.run(cmd, cwd=REPO, env=torch_env(tmp_path), capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    # Before the fix (fsmingle/protocol/rank0/reach.py, partition.py): no third world in 30 s
    # (6 x stale_after) while node 1 is cut; one formed within seconds of its link coming up,
    # often with the partitioned node as rank 0 (its state the oldest: it missed the second
    # world's training) and the survivor of both failures left out.  Now the cut node's rank 0,
    # reached by nobody, steps down after stale_after and leaves rank 0 to a reachable node.
    assert res["third_world_while_cut"], res
