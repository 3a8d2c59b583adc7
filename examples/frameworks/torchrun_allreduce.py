#!/usr/bin/env python3
"""Recipe (a): torchrun's static rendezvous fed by fsmingle through PET_* variables.

On every node (``fsmingle env`` waits for the world, prints ``export PET_MASTER_ADDR=...``
and the rest; torchrun reads ``PET_*`` as the defaults of its own flags)::

    eval "$(fsmingle env --dir /shared/rdzv --job-id exp42 --nnodes 2 --format sh)"
    torchrun --nproc-per-node 1 examples/frameworks/torchrun_allreduce.py

Every worker all-reduces its global rank: the sum is 0 + 1 + ... + (W-1).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="directory for rank<R>.json results")
    args = ap.parse_args()
    dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    print(f"rank {rank}/{world} node {os.environ.get('GROUP_RANK')}: sum of ranks = {t.item():g}", flush=True)
    write_result(args.out, rank, world_size=world, sum=t.item(), group_rank=os.environ.get("GROUP_RANK"))
    dist.barrier()
    dist.destroy_process_group()
    return 0 if t.item() == world * (world - 1) / 2 else 1


if __name__ == "__main__":
    sys.exit(main())
