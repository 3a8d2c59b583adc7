"""fsmingle: rendezvous for multi-node PyTorch through a shared filesystem.

Each participant atomically writes a JSON beacon into ``<dir>/<job_id>/``; rank
0's beacon supplies the master address and port; once the world is complete one
release record lets everyone go.  No etcd, no known endpoint, no hostname that
must resolve.  Importing this package does not import torch.

Public API: :func:`rendezvous`, :class:`Rendezvous`, :func:`init_process_group`,
:func:`worlds` (successive worlds in one process: in-process re-rendezvous after a peer's
failure), :class:`FolderStore` (a ``torch.distributed.Store`` in the shared directory; torch is imported
when it is first used), and the :class:`FsmingleError` family in :mod:`fsmingle.errors`.
"""

from ._version import __version__
from .api import Rendezvous, rendezvous
from .errors import (
    ConfigError,
    CorruptStateError,
    FsmingleError,
    RankConflictError,
    RecordError,
    RendezvousTimeoutError,
    StorageError,
    UnsafeDirectoryError,
)
from .inprocess import World, worlds
from .protocol.participant import Progress, Timing

__all__ = [
    "__version__",
    "rendezvous",
    "Rendezvous",
    "Timing",
    "Progress",
    "init_process_group",
    "worlds",
    "World",
    "FolderStore",
    "FsmingleError",
    "ConfigError",
    "CorruptStateError",
    "RankConflictError",
    "RecordError",
    "RendezvousTimeoutError",
    "StorageError",
    "UnsafeDirectoryError",
]


def __getattr__(name):
    # fsmingle.FolderStore subclasses torch.distributed.Store: built on first use, so that
    # `import fsmingle` (and the CLI) never imports torch.
    if name == "FolderStore":
        from .fs.folderstore_torch import folder_store_class

        return folder_store_class()
    raise AttributeError(f"module 'fsmingle' has no attribute {name!r}")


def init_process_group(backend: str | None = None, *, store=None, **kwargs):
    """Rendezvous, then call ``torch.distributed.init_process_group`` with the result (per-rank mode).

    Keyword arguments of :func:`rendezvous` (``dir``, ``job_id``, ``world_size``,
    ``rank``, ``addr``, ``iface``, ``port``, ``timeout``, ...) are taken from
    ``kwargs``; the rest go to torch.  Sets ``MASTER_ADDR``, ``MASTER_PORT``,
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` in ``os.environ``
    and initialises with ``init_method="env://"``.

    Args:
        backend (str | None): torch backend (``"gloo"``, ``"nccl"``); None lets torch choose.
        store (str | torch.distributed.Store | None): ``"folder"``: the process group's store is
            this generation's :class:`FolderStore` (``Rendezvous.folder_store()``) instead of a
            TCPStore on rank 0's master port (NCCL still opens its own TCP connections between
            nodes); a Store object is passed to torch as is; None: ``init_method="env://"``.

    Returns:
        Rendezvous: the rendezvous result.

    Raises:
        ImportError: torch is not installed (``pip install fsmingle[torch]``).
        FsmingleError: as :func:`rendezvous` raises.
    """
    import inspect
    import os

    rdzv_keys = set(inspect.signature(rendezvous).parameters)
    rdzv_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in rdzv_keys}
    if "world_size" not in rdzv_kwargs and "nnodes" not in rdzv_kwargs:
        rdzv_kwargs.setdefault("world_size", None)
    import torch.distributed as dist  # imported only here: the rendezvous path stays torch-free

    r = rendezvous(**rdzv_kwargs)
    os.environ.update(r.env())
    if store == "folder":
        store = r.folder_store()
    elif isinstance(store, str):
        raise ValueError(f"store={store!r}: give 'folder', a torch.distributed.Store, or None")
    where = {"init_method": "env://"} if store is None else {"store": store}
    dist.init_process_group(
        backend=backend,
        rank=r.rank if r.rank is not None else r.node_rank,
        world_size=r.world_size if r.world_size is not None else r.nnodes,
        **where,
        **kwargs,
    )
    return r
