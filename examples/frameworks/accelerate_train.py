#!/usr/bin/env python3
"""Recipe (d): Hugging Face Accelerate, one process per rank, launched by ``fsmingle run`` in per-rank mode.

On every host, once per rank (e.g. one ``srun`` task each)::

    fsmingle run --dir /shared/rdzv --job-id exp42 --world-size 2 -- python examples/frameworks/accelerate_train.py

``fsmingle run --world-size`` exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT, which ``Accelerator()`` reads (``env://``): no ``accelerate
launch`` and no ``accelerate config`` needed.  On GPUs it picks NCCL by itself.  On a machine
without GPUs Accelerate must be told ``Accelerator(cpu=True)`` (or ``ACCELERATE_USE_CPU=1``):
otherwise it connects the process group but then reports ``DistributedType.NO`` and every
process trains alone, silently.  This script passes ``cpu=True`` when CUDA is unavailable.

Trains a tiny linear model and checks that all ranks end with the same weights.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import sys

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="force CPU (gloo) even where CUDA is available")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", help="directory for rank<R>.json results")
    args = ap.parse_args()

    acc = Accelerator(cpu=args.cpu or not torch.cuda.is_available())  # see the docstring
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt, dl = acc.prepare(model, opt, DataLoader(TensorDataset(x, y), batch_size=8))
    for _, (xb, yb) in zip(range(args.steps), dl):
        opt.zero_grad()
        acc.backward(nn.functional.mse_loss(model(xb), yb))
        opt.step()
    total = acc.reduce(torch.tensor([float(acc.process_index)], device=acc.device), reduction="sum")
    params = torch.cat([p.detach().flatten().cpu() for p in acc.unwrap_model(model).parameters()])
    digest = hashlib.sha256(params.double().numpy().tobytes()).hexdigest()[:16]
    print(
        f"accelerate: process {acc.process_index}/{acc.num_processes} local {acc.local_process_index} "
        f"{acc.distributed_type} sum of ranks {total.item():g} weights {digest}",
        flush=True,
    )
    write_result(
        args.out,
        acc.process_index,
        world_size=acc.num_processes,
        distributed_type=str(acc.distributed_type),
        sum=total.item(),
        digest=digest,
    )
    # Teardown in the order that keeps torch 2.13's gloo from aborting at exit (about 1 run in
    # 4 otherwise; ../DEVELOPERS.md): drop what holds the process group, collect, barrier, destroy.
    del model, opt, dl
    gc.collect()
    acc.wait_for_everyone()
    acc.end_training()  # destroys the process group
    return 0


if __name__ == "__main__":
    sys.exit(main())
