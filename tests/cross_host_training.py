"""DDP training runs across a cluster's hosts (tests/cluster/), for ``test_cross_host.py`` and
``test_ifname.py``: :func:`node_run` launches the user's command (``fsmingle run ... -- torchrun ...
examples/train_ddp.py``) on hosts 0..n-1 and returns every rank's record, :func:`check_training` checks
that all ranks trained together (identical parameter checksums, one master).

Every launch is wrapped in ``timeout -k 10 240``: a failed rank can leave the
others blocked, and torchrun's exit barrier ignores a plain SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import REPO, host_env

SCRIPT = REPO / "examples" / "train_ddp.py"
STEPS = 30
NPROC = 2
TIMEOUT = ["timeout", "-k", "10", "240"]
WAIT_S = 270  # a little more than the timeout above: the wrapper always ends first

# Launcher variables the test process may carry (e.g. when pytest itself runs under torchrun or
# Slurm) are removed so each host starts clean: helpers' one scrub.
BASE_ENV = host_env()


def start(host, argv, log: Path, env=None):
    """``argv`` on ``host`` under :data:`TIMEOUT`, output to ``log``, with :data:`BASE_ENV` plus ``env``."""
    f = open(log, "w")
    try:
        return host.popen(
            [*TIMEOUT, *argv], env={**BASE_ENV, **(env or {})}, cwd=REPO, stdout=f, stderr=subprocess.STDOUT
        )
    finally:
        f.close()  # the child has its own copy


def wait_all(procs, logs):
    """Wait for every (host, Popen); return their logs' text.  Fails naming each bad one."""
    deadline = time.monotonic() + WAIT_S
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
    texts = [Path(l).read_text(errors="replace") for l in logs]
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        details = "\n".join(
            f"===== {Path(lg).name} (rc={p.returncode})\n{t[-4000:]}" for lg, p, t in zip(logs, procs, texts)
        )
        pytest.fail(f"launches failed (index, rc): {bad}\n{details}")
    return texts


def records(out: Path, world_size: int) -> list[dict]:
    """Every rank's ``rank<R>.json`` that ``train_ddp.py`` wrote in ``out``, by rank (exactly ``world_size``)."""
    found = sorted(p.name for p in out.glob("rank*.json"))
    assert len(found) == world_size, found
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]


def check_training(recs: list[dict], world_size: int):
    """All ``world_size`` ranks trained :data:`STEPS` steps together: one checksum, one master address and port."""
    assert [r["rank"] for r in recs] == list(range(world_size))
    assert {r["world_size"] for r in recs} == {world_size}
    assert all(r["ranks_agree"] for r in recs)
    assert len({r["checksum"] for r in recs}) == 1, [r["checksum"] for r in recs]
    assert {r["steps"] for r in recs} == {STEPS}
    assert len({r["MASTER_ADDR"] for r in recs}) == 1 and len({r["MASTER_PORT"] for r in recs}) == 1


def fsmingle_run(cluster, job: str, *opts) -> list[str]:
    """``fsmingle run`` on the cluster's shared rendezvous directory, 120 s timeout, then ``opts``."""
    return ["fsmingle", "run", "--dir", f"{cluster.shared}/rdzv", "--job-id", job, "--timeout", "120", *map(str, opts)]


def node_run(
    cluster, job, nnodes, node_rank=None, fsm_args=(), torch_env=(), env=None, host_env=None, name="run", nproc=NPROC
):
    """Launch the user's command on hosts 0..nnodes-1; return (records, logs' text)."""
    shared = Path(cluster.shared)
    out = shared / f"out-{job}"
    procs, logs = [], []
    for k in range(nnodes):
        h = cluster[k]
        argv = fsmingle_run(cluster, job, "--nnodes", nnodes)
        if node_rank is not None:
            argv += ["--node-rank", str(node_rank[k])]
        argv += list(fsm_args[k] if fsm_args else ())
        argv += ["--"]
        if torch_env:
            argv += ["env", *torch_env]
        argv += ["torchrun", "--nproc-per-node", str(nproc), str(SCRIPT), "--steps", str(STEPS), "--out", str(out)]
        log = cluster.workdir / f"{name}-{h.name}.log"
        procs.append(start(h, argv, log, env={**(env or {}), **((host_env or {}).get(k, {}))}))
        logs.append(log)
    texts = wait_all(procs, logs)
    return records(out, nnodes * nproc), texts
