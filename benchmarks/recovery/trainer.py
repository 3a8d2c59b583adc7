"""The recovery benchmark's training process: a small gloo DDP loop that logs each step.

``python -m benchmarks.recovery.trainer env``: one world, from the environment a launcher set
(torchrun: ``RANK``/``WORLD_SIZE``; ``fsmingle run``: ``NODE_RANK``/``NNODES``; both
``MASTER_ADDR``/``MASTER_PORT``); a peer's failure ends the process (exit 1: the launcher's
restart).  ``... inproc DIR JOB NNODES [--spare]``: :func:`fsmingle.worlds`, every world in this
process.  Every line goes to ``$BENCH_LOG`` (JSON): ``start`` (before ``import torch``),
``released`` (inproc: the rendezvous returned), ``ready`` (process group and DDP built; ``wid``:
rank 0's token, the same for every member of one world), ``step``, ``lost``.
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = time.time()
_LOG = open(os.environ["BENCH_LOG"], "a", buffering=1)


def say(**kw) -> None:
    _LOG.write(json.dumps({"t": time.time(), "pid": os.getpid(), **kw}) + "\n")


say(ev="start", t0=T0)

import datetime  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

PG_TIMEOUT = float(os.environ.get("BENCH_PG_TIMEOUT", "10"))
SLEEP = float(os.environ.get("BENCH_STEP_SLEEP", "0.1"))


def train(rank: int, net, step: int) -> int:
    """Train until killed; returns never (a peer's failure raises)."""
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        box = [f"{os.getpid()}-{time.time()}", step]
        dist.broadcast_object_list(box, src=0)
        wid, step = box
        say(ev="ready", wid=wid, rank=rank, size=dist.get_world_size())
        g = torch.Generator().manual_seed(rank)
        while True:
            x = torch.randn(16, 32, generator=g)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            say(ev="step", wid=wid, rank=rank, step=step)
            time.sleep(SLEEP)
    except Exception:
        say(ev="raised", rank=rank)  # before any teardown or formatting of the error
        raise
    finally:
        t = time.time()
        del model, opt
        say(ev="td", what="del_ddp", s=time.time() - t)


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def main_env() -> int:
    rank = int(os.environ.get("RANK") or os.environ["NODE_RANK"])
    size = int(os.environ.get("WORLD_SIZE") or os.environ["NNODES"])
    dist.init_process_group(
        "gloo", init_method="env://", rank=rank, world_size=size, timeout=datetime.timedelta(seconds=PG_TIMEOUT)
    )
    try:
        train(rank, net(), 0)
    except Exception as e:
        say(ev="lost", rank=rank, error=str(e).splitlines()[0][:200])
        sys.stdout.flush()
        os._exit(1)  # the launcher restarts; a torn-down gloo group can abort at exit (torch 2.13)
    return 0


def _time_teardown() -> None:
    """Log how long each piece of a broken world's teardown takes (``td`` lines: where the
    survivors' time between ``raised`` and ``lost`` goes, issue 31 item 3)."""
    import gc

    from torch.distributed import distributed_c10d as c10d

    def timed(what, f):
        def run(*a, **k):
            t = time.time()
            try:
                return f(*a, **k)
            finally:
                say(ev="td", what=what, s=time.time() - t)

        return run

    c10d._abort_process_group = timed("abort", c10d._abort_process_group)
    dist.destroy_process_group = timed("destroy", dist.destroy_process_group)
    gc.collect = timed("gc", gc.collect)


def main_inproc(d: str, job: str, nnodes: int, spare: bool) -> int:
    import logging
    import math

    if os.environ.get("BENCH_LOGLEVEL"):  # fsmingle's own lines (rendezvous steps), timestamped
        logging.basicConfig(level=os.environ["BENCH_LOGLEVEL"], format="%(created).3f %(name)s %(message)s")

    import fsmingle

    _time_teardown()
    kw = dict(nnodes=nnodes, addr=os.environ.get("BENCH_ADDR", "127.0.0.1"), stale_after=PG_TIMEOUT, timeout=300)
    if spare:
        kw["spare_timeout"] = math.inf
    m, step = net(), 0
    for world in fsmingle.worlds(d, job, **kw):
        say(ev="released", t_rel=world.released, gen=world.generation, rank=world.rank)
        with world:
            train(world.rank, m, step)
        say(ev="lost", rank=world.rank, error=type(world.failure).__name__)  # str(): slow (C++ backtrace)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "env":
        sys.exit(main_env())
    sys.exit(main_inproc(sys.argv[2], sys.argv[3], int(sys.argv[4]), "--spare" in sys.argv))
