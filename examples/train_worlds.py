"""A DDP training that survives a peer's death in-process: ``fsmingle.worlds()``.

Start the same command on every node (and on a spare, which waits for a place)::

    mkdir -m 700 /shared/rdzv
    python examples/train_worlds.py --dir /shared/rdzv --job-id exp42 --nnodes 4 --steps 500
    python examples/train_worlds.py --dir /shared/rdzv --job-id exp42 --nnodes 4 --steps 500 --spare

Kill one node's process mid-training: the others tear their process group down, join the next
generation with the spare (no new Python, no new ``import torch``), and go on from rank 0's step.
Each step prints one JSON line: ``{"t": wall time, "world": n, "gen": g, "rank": r, "prev": rank in
the previous world, "step": s, "loss": l}``; a world that ends with a failure prints
``{"event": "lost", ...}``, the end ``{"event": "done", ...}``.  Needs torch only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import fsmingle


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--job-id", required=True)
    ap.add_argument("--nnodes", type=int, required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds of pretend work per step")
    ap.add_argument("--spare", action="store_true", help="wait as a spare (--spare-timeout inf)")
    ap.add_argument("--stale-after", type=float, default=None)
    ap.add_argument("--timeout", type=float, default=None, help="rendezvous --timeout, seconds")
    ap.add_argument("--addr", default=None)
    ap.add_argument("--max-worlds", type=int, default=None)
    a = ap.parse_args(argv)

    rdzv = dict(nnodes=a.nnodes, addr=a.addr, stale_after=a.stale_after, timeout=a.timeout)
    if a.spare:
        rdzv["spare_timeout"] = math.inf
    torch.manual_seed(0)  # every process builds the same initial model; DDP broadcasts rank 0's anyway
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    step = 0

    def say(**kw):
        print(json.dumps({"t": round(time.time(), 4), **kw}), flush=True)

    for world in fsmingle.worlds(a.dir, a.job_id, max_worlds=a.max_worlds, **rdzv):
        w = dict(world=world.index, gen=world.generation, rank=world.rank, prev=world.previous_rank)
        say(event="world", **w, step=step)
        with world:
            t0 = time.time()
            model = DDP(net)  # broadcasts rank 0's parameters: a survivor's, never the spare's
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            try:
                t1 = time.time()
                step = world.agree(step)  # rank 0's step: the spare learns where training stands
                say(event="ready", **w, step=step, ddp_s=round(t1 - t0, 3), agree_s=round(time.time() - t1, 3))
                gen = torch.Generator().manual_seed(1000 * world.rank + step)
                while step < a.steps:
                    x = torch.randn(16, 32, generator=gen)
                    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
                    opt.zero_grad()
                    loss.backward()  # the allreduce: raises when a peer died
                    opt.step()
                    step += 1
                    say(**w, step=step, loss=round(loss.item(), 5))
                    if a.step_sleep:
                        time.sleep(a.step_sleep)
            finally:
                # Before the teardown, clean or broken: torch 2.13 gloo aborts at exit otherwise (about
                # 1 run in 4), and a broken world's DDP reducer must not outlive its process group.
                del model, opt
        if world.failure is not None:
            where = [f"{f.name}:{f.lineno}" for f in traceback.extract_tb(world.failure.__traceback__)][-4:]
            say(event="lost", **w, step=step, at=where, error=str(world.failure).splitlines()[0][:200])
    say(event="done", step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
