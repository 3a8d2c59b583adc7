"""In-process re-rendezvous (``fsmingle.worlds``, issue 31): real processes, real gloo DDP.

Three nodes train ``examples/train_worlds.py`` (one process each, loopback) while a spare waits
in the next generation.  One non-master node is SIGKILLed (or SIGSTOPped) mid-training: the
survivors' collectives raise, they tear their process group down and join the next generation
in the same process (same pid, no second ``import torch``), with the spare; the new world keeps
the survivors' order (old rank 0 stays 0, old rank 2 becomes 1, the spare comes last) and training
resumes from rank 0's step.  (The end of a training, the clean teardown: tests/test_recovery_smoke.py.)
"""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest
from helpers import REPO, gen_dir, torch_env, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

EXAMPLE = str(REPO / "examples" / "train_worlds.py")
NNODES = 3


def _lines(p) -> list[dict]:
    out = []
    for line in p.stdout().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _steps(p) -> list[dict]:
    return [x for x in _lines(p) if "loss" in x]


def _start(procs, d, tmp_path, steps: int, stale_after: float):
    env = torch_env(tmp_path)
    args = [sys.executable, EXAMPLE, "--dir", str(d), "--job-id", "w", "--nnodes", str(NNODES)]
    args += ["--steps", str(steps), "--step-sleep", "0.05", "--stale-after", str(stale_after)]
    args += ["--addr", "127.0.0.1", "--timeout", "120"]
    nodes = [procs.spawn(args, name=f"node{i}", env=env) for i in range(NNODES)]
    wait_for(lambda: all(_steps(p) for p in nodes), 120, "every node's first training step")
    spare = procs.spawn(args + ["--spare"], name="spare", env=env)
    # The spare waits in generation 2 (the world trains in 1): its claim shows there.
    wait_for(lambda: any(gen_dir(d, "w", 2).glob("rank-*.claim")), 60, "the spare's claim in generation 2")
    return nodes, spare


def _rank(p, world: int) -> int:
    return next(x["rank"] for x in _steps(p) if x["world"] == world)


def _check_recovered(nodes, spare, victim: int, steps: int, fault_at: float) -> float:
    survivors = [p for i, p in enumerate(nodes) if i != victim]

    def trained_again():
        return all(sum(1 for x in _steps(p) if x["gen"] == 2) >= 3 for p in [*survivors, spare])

    wait_for(trained_again, 150, "three steps of every survivor and the spare in generation 2")
    old = {p.name: _rank(p, 0) for p in nodes}
    assert sorted(old.values()) == list(range(NNODES))
    # Each survivor's next world is world 1 of its own process (in-process), generation 2.
    for p in survivors:
        assert p.poll() is None, p.stderr()[-2000:]
        w1 = [x for x in _steps(p) if x["world"] == 1]
        assert w1 and all(x["gen"] == 2 for x in w1), p.stdout()[-800:]
        assert w1[0]["prev"] == old[p.name]
        assert any(x.get("event") == "lost" for x in _lines(p))
    spare_steps = _steps(spare)
    assert spare_steps[0]["world"] == 0 and spare_steps[0]["gen"] == 2
    # Ranks kept where they can be: the survivors in their old order, the spare last.
    new = sorted(survivors, key=lambda p: old[p.name])
    assert [_rank(p, 1) for p in new] == list(range(NNODES - 1))
    assert spare_steps[0]["rank"] == NNODES - 1
    # Training resumed from rank 0's step: nobody started over, nobody skipped.
    last_before = max(x["step"] for p in survivors for x in _steps(p) if x["world"] == 0)
    first_after = min(x["step"] for x in spare_steps)
    assert 1 <= first_after <= last_before + 1, (first_after, last_before)
    assert [x["step"] for x in spare_steps] == list(range(first_after, first_after + len(spare_steps)))
    resumed = min(x["t"] for p in [*survivors, spare] for x in _steps(p) if x["gen"] == 2)
    return resumed - fault_at


def test_survivors_and_the_spare_train_again_in_process_after_a_sigkill(procs, d, tmp_path):
    steps = 100_000  # never reached: the test ends the processes once the next world trains
    nodes, spare = _start(procs, d, tmp_path, steps, stale_after=5)
    victim = next(i for i, p in enumerate(nodes) if _rank(p, 0) == 1)  # a non-master node
    fault_at = time.time()
    nodes[victim].kill()
    took = _check_recovered(nodes, spare, victim, steps, fault_at)
    print(f"SIGKILL -> first step of the next world: {took:.2f} s")


def test_a_stopped_node_is_replaced_in_process_after_the_process_group_timeout(procs, d, tmp_path):
    steps = 100_000  # never reached: the test ends the processes once the next world trains
    nodes, spare = _start(procs, d, tmp_path, steps, stale_after=4)
    victim = next(i for i, p in enumerate(nodes) if _rank(p, 0) == 1)
    fault_at = time.time()
    nodes[victim].signal(signal.SIGSTOP)
    try:
        took = _check_recovered(nodes, spare, victim, steps, fault_at)
    finally:
        nodes[victim].kill()
    print(f"SIGSTOP -> first step of the next world: {took:.2f} s (--stale-after 4)")


# A peer that takes its place in the release and dies before its own init_process_group: a plain
# rendezvous() that exits at once (os._exit: no teardown, as SIGKILL right after the release).
DIES_AFTER_RELEASE = """
import os, sys, fsmingle
r = fsmingle.rendezvous(sys.argv[1], "w", nnodes=int(sys.argv[2]), addr="127.0.0.1", stale_after=4, timeout=120,
                        rank_order="key", topology_key="fresh")
print("released", r.generation, r.node_rank, flush=True)
os._exit(0)
"""


def test_a_peer_dying_between_the_release_and_init_leads_to_the_next_world(procs, d, tmp_path):
    """Before: the survivors' init_process_group raised out of worlds() and their loops ended."""
    env = torch_env(tmp_path)
    args = [sys.executable, EXAMPLE, "--dir", str(d), "--job-id", "w", "--nnodes", str(NNODES)]
    args += ["--steps", "100000", "--step-sleep", "0.05", "--stale-after", "4"]
    args += ["--addr", "127.0.0.1", "--timeout", "120"]
    nodes = [procs.spawn(args, name=f"node{i}", env=env) for i in range(NNODES - 1)]
    # The nodes' claims first (warm-up done, waiting in generation 1), so the one that dies is
    # the last to come and takes the last rank: the others wait for it in the store.
    wait_for(lambda: len(list(gen_dir(d, "w", 1).glob("rank-*.claim"))) >= NNODES - 1, 120, "the nodes' claims")
    dier = procs.spawn([sys.executable, "-c", DIES_AFTER_RELEASE, str(d), str(NNODES)], name="dier", env=env)
    wait_for(lambda: "released 1" in dier.stdout(), 120, "the release of generation 1")
    spare = procs.spawn(args + ["--spare"], name="spare", env=env)

    def trained_in_gen2():
        return all(sum(1 for x in _steps(p) if x["gen"] == 2) >= 3 for p in [*nodes, spare])

    try:
        wait_for(trained_in_gen2, 150, "three steps of both nodes and the spare in generation 2")
    except AssertionError as e:
        tails = "\n".join(f"--- {p.name}: {p.stdout()[-600:]}\n{p.stderr()[-1500:]}" for p in [*nodes, dier, spare])
        raise AssertionError(f"{e}\n{tails}") from None
    for p in nodes:
        assert p.poll() is None, p.stderr()[-2000:]
        assert not [x for x in _steps(p) if x["gen"] == 1]  # init failed there: no world 0 in generation 1
        assert _steps(p)[0]["world"] == 0  # the first world this process trained in: generation 2
        assert "init_process_group of generation 1 failed" in p.stderr(), p.stderr()[-2000:]
    assert sorted(_rank(p, 0) for p in [*nodes, spare]) == list(range(NNODES))
