"""Shared by the framework examples: write a small JSON result the tests can check."""

from __future__ import annotations

import json
import os


def write_result(out: str | None, rank: int, **fields) -> None:
    """Write ``out/rank<R>.json`` (when ``out`` is given) with the rank, the fsmingle variables and ``fields``."""
    if not out:
        return
    os.makedirs(out, exist_ok=True)
    env = {
        k: os.environ.get(k)
        for k in (
            "MASTER_ADDR",
            "MASTER_PORT",
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "NODE_RANK",
            "NNODES",
            "FSMINGLE_JOB_ID",
            "FSMINGLE_GENERATION",
        )
    }
    data = dict(rank=rank, env=env, **fields)
    tmp = os.path.join(out, f".rank{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, os.path.join(out, f"rank{rank}.json"))
