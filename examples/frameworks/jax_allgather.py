#!/usr/bin/env python3
"""Recipe (e): JAX multi-process (CPU or GPU), coordinator address from ``fsmingle env --format json``.

On every host, once per process::

    rdzv="$(fsmingle env --dir /shared/rdzv --job-id exp42 --world-size 2 --format json)" &&
        python examples/frameworks/jax_allgather.py "$rdzv"

The JSON holds ``master_addr``, ``master_port``, ``rank`` and ``world_size``; rank 0's
process runs JAX's coordinator (a gRPC service) on ``master_addr:master_port``, the port
fsmingle held for it until ``fsmingle env`` exited.  Without an argument the script reads
MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE instead, so ``fsmingle run --world-size 2 --
python examples/frameworks/jax_allgather.py`` works too.

Checks ``jax.process_count()`` and all-gathers every process's id across processes.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_result


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rdzv", nargs="?", help="output of `fsmingle env --format json` (default: the environment)")
    ap.add_argument("--out", help="directory for rank<R>.json results")
    args = ap.parse_args()
    if args.rdzv:
        r = json.loads(args.rdzv)
        addr, port, rank, world = r["master_addr"], r["master_port"], r["rank"], r["world_size"]
    else:
        e = os.environ
        addr, port, rank, world = e["MASTER_ADDR"], e["MASTER_PORT"], int(e["RANK"]), int(e["WORLD_SIZE"])

    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    jax.distributed.initialize(coordinator_address=f"{addr}:{port}", num_processes=world, process_id=rank)
    ids = multihost_utils.process_allgather(jnp.array([jax.process_index()]))
    gathered = [int(i) for i in ids.reshape(-1)]
    print(
        f"jax: process {jax.process_index()}/{jax.process_count()} devices {jax.device_count()} "
        f"(local {jax.local_device_count()}) allgather {gathered}",
        flush=True,
    )
    write_result(
        args.out,
        rank,
        world_size=jax.process_count(),
        process_index=jax.process_index(),
        device_count=jax.device_count(),
        allgather=gathered,
    )
    jax.distributed.shutdown()
    return 0 if jax.process_count() == world and gathered == list(range(world)) else 1


if __name__ == "__main__":
    sys.exit(main())
