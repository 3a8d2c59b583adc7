#!/usr/bin/env python3
"""A small, real DistributedDataParallel training job to try fsmingle with.

It trains a 2-layer MLP with SGD on synthetic regression data that every rank
generates itself (seeded per rank, so each rank sees different data), then
checks that all ranks ended with bit-identical parameters.  It needs nothing
but torch (not even numpy: no ``.numpy()``, no ``all_gather_object``), and runs
in a few seconds on CPU.

Backend: ``gloo`` on CPU; ``nccl`` when CUDA is available, each process then
using the device ``cuda:LOCAL_RANK``.  ``--backend`` overrides the choice.

How to launch
-------------
Under torchrun, on one machine::

    torchrun --standalone --nproc-per-node 4 examples/train_ddp.py --steps 200

Under fsmingle, on every node (fsmingle exports MASTER_ADDR, MASTER_PORT,
NODE_RANK, NNODES and their PET_* twins, so the plain torchrun command below
runs multi-node with the static rendezvous)::

    fsmingle run ... -- torchrun --nproc-per-node 4 examples/train_ddp.py

By hand, one process per rank: set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` in each process's environment (the process
group is initialised with ``init_method="env://"``)::

    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \\
        python examples/train_ddp.py &
    RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \\
        python examples/train_ddp.py

With none of those variables set it runs as a single process (world size 1).

Output
------
Every rank prints one line ``rank R/W local_rank L host H checksum C``.
Rank 0 also prints the first and final loss (averaged over ranks) and::

    fsmingle-example: world_size=W ranks_agree=True checksum=C master=ADDR:PORT node_rank=N

The checksum is the float64 sum of all parameters and the start of the
SHA-256 of their bytes.  Every rank all-gathers the checksums and the script
exits with status 1 unless all of them are equal.  With ``--out DIR`` each
rank also writes ``DIR/rank<R>.json`` (rank, world_size, checksum, loss,
MASTER_ADDR, hostname, ...).

Teardown
--------
On torch 2.13 CPU/gloo, a DDP job can die with SIGABRT ("terminate called
without an active exception") after all ranks finished their work, in about
one run in four.  The script therefore always tears down in this order:
delete the DDP model and the optimizer, ``gc.collect()``, ``dist.barrier()``,
``dist.destroy_process_group()``.  Copy that into your own scripts.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN_FEATURES = 16
OUT_FEATURES = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Small DDP training on synthetic data; checks that all ranks agree.",
    )
    p.add_argument("--steps", type=int, default=200, help="training steps (default: 200)")
    p.add_argument("--batch-size", type=int, default=32, help="per-rank batch size (default: 32)")
    p.add_argument("--hidden", type=int, default=64, help="hidden layer width (default: 64)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default: 0.05)")
    p.add_argument("--seed", type=int, default=0, help="base seed; rank R uses seed+1+R for data")
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="process-group timeout in seconds (default: 120)",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: nccl if CUDA is available, else gloo",
    )
    p.add_argument("--out", metavar="DIR", help="write DIR/rank<R>.json with this rank's results")
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            sys.exit(f"train_ddp.py: environment variable {name} is not set")
        return default
    try:
        return int(value)
    except ValueError:
        sys.exit(f"train_ddp.py: environment variable {name}={value!r} is not an integer")


def read_env() -> tuple[int, int, int]:
    """RANK, WORLD_SIZE, LOCAL_RANK from the environment (torchrun or by hand)."""
    if "WORLD_SIZE" not in os.environ and "RANK" not in os.environ:
        # Plain `python train_ddp.py`: a single process.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        return 0, 1, _env_int("LOCAL_RANK", 0)
    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", 0)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            sys.exit(f"train_ddp.py: environment variable {name} is not set")
    if not 0 <= rank < world_size:
        sys.exit(f"train_ddp.py: RANK={rank} is not in [0, WORLD_SIZE={world_size})")
    return rank, world_size, local_rank


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, hidden),
        nn.Tanh(),
        nn.Linear(hidden, OUT_FEATURES),
    )


def param_checksum(model: nn.Module) -> tuple[float, str]:
    """float64 sum of all parameters, and SHA-256 of their raw bytes."""
    total = 0.0
    h = hashlib.sha256()
    with torch.no_grad():
        for p in model.parameters():
            t = p.detach().to("cpu", torch.float64).contiguous()
            total += float(t.sum())
            # The raw bytes without numpy (not installed by `pip install fsmingle[torch]`):
            # reinterpret as uint8, then a plain list of ints.
            raw = p.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            h.update(bytes(raw.tolist()))
    return total, h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, world_size, local_rank = read_env()

    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    t0 = time.monotonic()
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=args.timeout),
    )

    # Same initial weights everywhere (DDP broadcasts rank 0's anyway).
    torch.manual_seed(args.seed)
    model = make_model(args.hidden).to(device)
    ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    # The target function is shared; the samples are private to each rank.
    target_gen = torch.Generator().manual_seed(args.seed)
    w_true = torch.randn(IN_FEATURES, OUT_FEATURES, generator=target_gen)
    data_gen = torch.Generator().manual_seed(args.seed + 1 + rank)

    first_loss = None
    loss = torch.zeros((), device=device)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, IN_FEATURES, generator=data_gen)
        y = torch.tanh(x @ w_true) + 0.01 * torch.randn(args.batch_size, OUT_FEATURES, generator=data_gen)
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp_model(x), y)
        loss.backward()
        optimizer.step()
        if step == 0:
            first_loss = loss.detach().clone()

    # Loss averaged over ranks, first and last step.
    losses = torch.stack([first_loss if first_loss is not None else loss.detach(), loss.detach()]).to(device)
    dist.all_reduce(losses, op=dist.ReduceOp.SUM)
    losses /= world_size
    first_mean, final_mean = (float(v) for v in losses.cpu())

    param_sum, param_sha = param_checksum(model)
    checksum = f"{param_sum:.17g}:{param_sha[:16]}"
    # Gather every rank's checksum as plain tensors: all_gather_object would need numpy
    # (torch serialises objects through it), which `pip install fsmingle[torch]` does not install.
    sums = torch.tensor([param_sum], dtype=torch.float64, device=device)
    digest = torch.tensor(list(bytes.fromhex(param_sha)), dtype=torch.uint8, device=device)
    all_sums = [torch.zeros_like(sums) for _ in range(world_size)]
    all_digests = [torch.zeros_like(digest) for _ in range(world_size)]
    dist.all_gather(all_sums, sums)
    dist.all_gather(all_digests, digest)
    gathered = [f"{float(s.item()):.17g}:{bytes(t.cpu().tolist()).hex()[:16]}" for s, t in zip(all_sums, all_digests)]
    ranks_agree = all(c == checksum for c in gathered)

    host = socket.gethostname()
    master = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    node_rank = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))
    elapsed = time.monotonic() - t0

    print(
        f"rank {rank}/{world_size} local_rank {local_rank} host {host} checksum {checksum}",
        flush=True,
    )
    if rank == 0:
        print(
            f"loss: first={first_mean:.6f} final={final_mean:.6f} "
            f"steps={args.steps} backend={backend} elapsed={elapsed:.2f}s",
            flush=True,
        )
        print(
            f"fsmingle-example: world_size={world_size} ranks_agree={ranks_agree} "
            f"checksum={checksum} master={master} node_rank={node_rank}",
            flush=True,
        )
    if not ranks_agree:
        print(f"rank {rank}: ranks disagree: {gathered}", file=sys.stderr, flush=True)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        record = {
            "rank": rank,
            "world_size": world_size,
            "local_rank": local_rank,
            "node_rank": node_rank,
            "checksum": checksum,
            "param_sum": param_sum,
            "param_sha256": param_sha,
            "ranks_agree": ranks_agree,
            "gathered": gathered,
            "loss": final_mean,
            "first_loss": first_mean,
            "steps": args.steps,
            "backend": backend,
            "MASTER_ADDR": os.environ.get("MASTER_ADDR"),
            "MASTER_PORT": os.environ.get("MASTER_PORT"),
            "hostname": host,
            "elapsed_s": elapsed,
        }
        path = os.path.join(args.out, f"rank{rank}.json")
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
        os.replace(tmp, path)

    # Teardown, in this order (see the module docstring): without it, gloo on
    # torch 2.13 aborts a worker after the work is done in ~1 run in 4.
    del ddp_model, optimizer, model
    gc.collect()
    if device.type == "cuda":
        dist.barrier(device_ids=[local_rank])
    else:
        dist.barrier()
    dist.destroy_process_group()

    return 0 if ranks_agree else 1


if __name__ == "__main__":
    sys.exit(main())
