#!/usr/bin/env python3
"""Recipe (c): PyTorch Lightning DDP across nodes, launched by ``fsmingle run`` in node mode.

On every node::

    fsmingle run --dir /shared/rdzv --job-id exp42 --nnodes 2 -- python examples/frameworks/lightning_fit.py

``fsmingle run`` exports MASTER_ADDR, MASTER_PORT, NODE_RANK and NNODES.  With no
scheduler variables present (no TORCHELASTIC_RUN_ID, no SLURM_NTASKS, no LSF/MPI)
Lightning picks its ``LightningEnvironment``, which reads exactly those: the global rank
is ``NODE_RANK * devices + local_rank``, the world size ``num_nodes * devices``.  Lightning
starts ``devices - 1`` more processes on each node itself.

Fits a tiny linear model on synthetic data and checks that all ranks end with the same weights.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl  # pip install lightning
except ImportError:  # pragma: no cover - the standalone package
    import pytorch_lightning as pl  # pip install pytorch-lightning

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_result


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=1, help="processes per node (Lightning starts them)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--out", help="directory for rank<R>.json results")
    args = ap.parse_args()

    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=int(os.environ.get("NNODES", "1")),
        strategy="ddp",
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Tiny()
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=8))
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    digest = hashlib.sha256(params.double().numpy().tobytes()).hexdigest()[:16]
    env = type(trainer.strategy.cluster_environment).__name__
    print(
        f"lightning: global_rank {trainer.global_rank}/{trainer.world_size} node_rank {trainer.node_rank} "
        f"environment {env} weights {digest}",
        flush=True,
    )
    write_result(
        args.out,
        trainer.global_rank,
        world_size=trainer.world_size,
        node_rank=trainer.node_rank,
        cluster_environment=env,
        digest=digest,
    )
    # Teardown in the order that keeps torch 2.13's gloo from aborting at exit (about 1 run in
    # 4 otherwise; ../DEVELOPERS.md): drop what holds the process group, collect, barrier, destroy.
    del trainer, model
    gc.collect()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
