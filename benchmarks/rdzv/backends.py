"""What one participant runs, per backend.  Imported inside worker processes only.

* ``fsmingle`` / ``fsmingle-v1``: ``fsmingle.rendezvous(dir, job_id, nnodes=N, node_rank=None,
  addr=<own loopback address>, timeout=...)`` -- the public API, exactly what the CLI calls.  The
  v1 backend is the same call on the package of another checkout (``--v1-root``, e.g. a
  ``git worktree add /tmp/v1 3be66ce``), put first on ``sys.path`` by the worker.
* ``torch-file`` / ``torch-tcp``: torch's c10d ``DynamicRendezvousHandler`` as torchrun builds it
  (``registry.get_rendezvous_handler(RendezvousParameters(backend="c10d", ...))``) on a FileStore
  on the shared directory, or on a TCPStore hosted by participant 0.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .common import BackendUnavailable


class TorchC10d:
    """c10d rendezvous (DynamicRendezvousHandler) exactly as torchrun builds it."""

    def __init__(self, cfg: dict, emit: Callable[..., None]) -> None:
        import logging

        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        self.cfg, self.emit = cfg, emit
        self.Params, self.get_handler = RendezvousParameters, get_rendezvous_handler
        self.handlers: list = []  # keep alive: heartbeats keep running after release
        self.thread_to_pid: dict[int, int] = {}
        self.joined: set[int] = set()
        outer = self

        class _JoinHook(logging.Handler):
            # The first "successfully synced its local changes" debug record of a
            # participant's thread follows its ADD_TO_PARTICIPANTS write.
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    if "has successfully synced its local changes" not in record.getMessage():
                        return
                    p = outer.thread_to_pid.get(record.thread)
                    if p is not None and p not in outer.joined:
                        outer.joined.add(p)
                        outer.emit(ev="joined", p=p, t=time.monotonic())
                except Exception:
                    pass

        lg = logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
        lg.setLevel(logging.DEBUG)
        lg.propagate = False
        lg.addHandler(_JoinHook())

    def join(self, p: int) -> dict:
        cfg = self.cfg
        self.thread_to_pid[threading.get_ident()] = p
        if cfg["backend"] == "torch-file":
            endpoint = os.path.join(cfg["dirs"][p], cfg["job_id"], "c10d.store")
            conf = {"store_type": "file"}
        else:
            endpoint = cfg["tcp_endpoint"]
            conf = {"is_host": "1" if p == cfg["tcp_host"] else "0"}
        params = self.Params(
            backend="c10d",
            endpoint=endpoint,
            run_id=cfg["job_id"],
            min_nodes=cfg["nnodes"],
            max_nodes=cfg["nnodes"],
            local_addr=cfg["addrs"][p],
            **conf,
        )
        handler = self.get_handler(params)
        self.handlers.append(handler)
        info = handler.next_rendezvous()
        bs = info.bootstrap_store_info
        return {
            "rank": info.rank,
            "world": info.world_size,
            "master_addr": bs.master_addr,
            "master_port": bs.master_port,
            "generation": None,
        }


class Fsmingle:
    """``fsmingle.rendezvous`` per participant, with the in-process operation counter installed."""

    def __init__(self, cfg: dict, emit: Callable[..., None]) -> None:
        from .fsops import OpCounter, install_counting_os

        self.cfg, self.emit = cfg, emit
        try:
            import fsmingle
        except Exception as exc:  # ImportError, or a half-written package
            raise BackendUnavailable(f"{cfg['backend']} not available: import fsmingle failed: {exc!r}") from exc
        self.fn = getattr(fsmingle, "rendezvous", None)
        if not callable(self.fn):
            raise BackendUnavailable(f"{cfg['backend']} not available: no callable fsmingle.rendezvous")
        self.where = os.path.dirname(fsmingle.__file__)
        self.counter = OpCounter()
        self.patched = install_counting_os(self.counter)
        self.world_ready = False

    def _progress(self, p: int) -> Callable[[Any], None]:
        n = self.cfg["nnodes"]

        def on_progress(pr) -> None:
            # Rank 0 knows who is connected (v2) / present (v1): all but the
            # last participant means the world is ready for the last arrival.
            present = getattr(pr, "present", None)
            if (
                getattr(pr, "rank", None) == 0
                and present is not None
                and len(present) >= n - 1
                and not self.world_ready
            ):
                self.world_ready = True
                self.emit(ev="world_ready", p=p, t=time.monotonic(), present=len(present))

        return on_progress

    def join(self, p: int) -> dict:
        cfg = self.cfg
        self.counter.bind(p)
        kw = {}
        if cfg.get("progress", True):
            kw["on_progress"] = self._progress(p)
        r = self.fn(
            cfg["dirs"][p],
            cfg["job_id"],
            nnodes=cfg["nnodes"],
            node_rank=None,
            addr=cfg["addrs"][p],
            timeout=cfg["rdzv_timeout"],
            **kw,
        )
        return {
            "rank": r.node_rank,
            "world": r.nnodes,
            "master_addr": r.master_addr,
            "master_port": r.master_port,
            "generation": getattr(r, "generation", None),
            "ops": dict(self.counter.counts.get(p, {})),
        }


def make(cfg: dict, emit: Callable[..., None]):
    """The backend object for ``cfg["backend"]``.

    Raises:
        BackendUnavailable: fsmingle cannot be imported, or has no ``rendezvous``.
    """
    if cfg["backend"].startswith("fsmingle"):
        return Fsmingle(cfg, emit)
    return TorchC10d(cfg, emit)
