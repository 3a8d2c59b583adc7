#!/usr/bin/env python3
"""Recipe (b): plain torch.distributed, one process per rank, no launcher.

``fsmingle.init_process_group`` rendezvouses through the shared directory (per-rank
mode), exports RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
and calls ``torch.distributed.init_process_group(init_method="env://")``::

    python examples/frameworks/plain_torch.py --dir /shared/rdzv --job-id exp42 --world-size 2 --rank 0   # one host
    python examples/frameworks/plain_torch.py --dir /shared/rdzv --job-id exp42 --world-size 2 --rank 1   # another

Without ``--rank`` ranks are handed out first-come.  With ``--store folder`` the process group keeps
its keys in this generation's FolderStore (``<dir>/<job>/gen-N/store``) instead of a TCPStore on
rank 0's master port (docs/folderstore.md).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

import fsmingle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="shared rendezvous directory")
    ap.add_argument("--job-id", required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--addr", default=None, help="IP to announce (default: fsmingle chooses)")
    ap.add_argument("--timeout", type=float, default=600.0, help="rendezvous timeout, seconds")
    ap.add_argument("--out", help="directory for rank<R>.json results")
    ap.add_argument("--store", choices=("tcp", "folder"), default="tcp", help="where the process group keeps its keys")
    args = ap.parse_args()

    r = fsmingle.init_process_group(
        "gloo",
        dir=args.dir,
        job_id=args.job_id,
        world_size=args.world_size,
        rank=args.rank,
        addr=args.addr,
        timeout=args.timeout,
        store="folder" if args.store == "folder" else None,
    )
    t = torch.tensor([float(r.rank + 1)])
    dist.all_reduce(t)  # sum of 1..W
    world = dist.get_world_size()
    print(
        f"rank {dist.get_rank()}/{world} (generation {r.generation}, master {r.master_addr}:{r.master_port}): "
        f"all_reduce = {t.item():g}",
        flush=True,
    )
    write_result(args.out, r.rank, world_size=world, sum=t.item(), generation=r.generation)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if t.item() == world * (world + 1) / 2 else 1


if __name__ == "__main__":
    sys.exit(main())
