"""In-process re-rendezvous: :func:`worlds` hands a training loop one world after another.

When a peer dies or hangs mid-training, a survivor does not have to exit, start Python and import
torch again to take part in the next world: it tears its broken process group down and joins the
next generation in the same process, exactly as a restarted process would (a new
:func:`fsmingle.rendezvous` call, a new participant), with the spare that waits there::

    for world in fsmingle.worlds(dir="/shared/rdzv", job_id="exp42", nnodes=4, spare_timeout=math.inf):
        with world:                      # a peer's failure inside: torn down, next world
            model = DDP(net)             # DDP broadcasts rank 0's parameters: a survivor's
            step = world.agree(step)     # rank 0's step counter, to everyone (the spare too)
            while step < steps: ...
            del model, optimizer         # before the clean teardown (torch 2.13 gloo, docs/recovery.md)

Ranks are kept where they can be: from its second world on a survivor joins first-come with its
previous rank as its ``--topology-key`` and every participant uses ``--rank-order key``, so the
survivors keep their order (those below the dead rank keep their ranks, those above move down by
one), rank 0 of the new world is the lowest surviving rank (a survivor: DDP's broadcast carries the
trained parameters) and fresh processes (the spare) come last.  ``--spare-timeout`` applies to a
process's first world only: a survivor is no spare, and its ``--timeout`` runs.

A failure is seen as torch reports it: a collective raising (gloo: the dead peer's connections
closed, or the process group's ``timeout`` passed -- a hung peer, SIGSTOP).  The process group's
timeout defaults to ``--stale-after``, the protocol's own bound on silence.  Torch is imported only
when a world is initialised.  See ``docs/recovery.md``.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from .api import Rendezvous, rendezvous

log = logging.getLogger("fsmingle")

__all__ = ["World", "worlds"]

#: Key of a process that has not trained yet (a spare, or any process in its first world):
#: ``natural_key`` orders digit runs before text, so previous ranks ("0", "1", ...) come first.
FRESH_KEY = "fresh"


@dataclass
class World:
    """One world of :func:`worlds`: the rendezvous, an initialised process group, and its end.

    Use it as a context manager around the training of this world.  Leaving the block normally
    ends the loop (the training is done): the process group is torn down in the order torch 2.13
    gloo needs (``gc.collect()``, ``barrier()``, ``destroy_process_group()``; delete your DDP model
    and optimizer before the block ends).  A peer's failure raised inside the block (a torch
    ``DistError``, or a ``RuntimeError`` from a collective) is swallowed: the group is aborted and
    destroyed, and :func:`worlds` hands out the next world.  Any other exception propagates
    (after the same abort).

    Attributes:
        rendezvous (Rendezvous): this world's rendezvous result.
        rank (int): this process's rank in the world.
        world_size (int): number of processes in the world.
        index (int): 0 for this process's first world, then 1, 2, ...
        previous_rank (int | None): this process's rank in its previous world (None in its first).
        released (float): ``time.time()`` when this world's rendezvous returned (seconds).
        started (float): ``time.time()`` when this world's process group was ready (seconds).
        failure (BaseException | None): what ended this world, once it ended with a failure.
    """

    rendezvous: Rendezvous
    rank: int
    world_size: int
    index: int
    previous_rank: int | None
    released: float = 0.0
    started: float = 0.0
    failure: BaseException | None = None
    finished: bool = False
    _closed: bool = field(default=False, repr=False)

    @property
    def generation(self) -> int:
        """The fsmingle generation this world was released in."""
        return self.rendezvous.generation

    def agree(self, value):
        """Rank 0's ``value`` (any picklable object), returned on every rank.

        For what a fresh member cannot know: the step to resume from, the epoch, a data-loader
        position.  Rank 0 of a world after the first is a survivor (see the module doc).

        Raises:
            RuntimeError: as ``torch.distributed.broadcast_object_list`` does when a peer fails.
        """
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def __enter__(self) -> World:
        return self

    def __exit__(self, etype, exc, tb) -> bool:
        if exc is None:
            _teardown_clean()
            self.finished = True
            self._closed = True
            return False
        # Abort first, before anything slow (logging formats the error, whose C++ backtrace is
        # symbolised lazily; gc.collect()): each survivor's abort is what makes the peers still
        # blocked on it fail, so its delay adds up along the chain of survivors (measured at N = 16:
        # the last survivor saw the failure 5.4 s after the first with gc.collect() ahead of it).
        self.failure = exc
        _teardown_broken()
        self._closed = True
        # A peer's failure is swallowed and said once the next world stands (worlds()): str() of
        # a torch error symbolises its C++ backtrace, about a second under load, which here would
        # delay the next rendezvous.
        return _is_peer_failure(exc)


def worlds(
    dir: str | None = None,
    job_id: str | None = None,
    *,
    backend: str = "gloo",
    pg_timeout: float | None = None,
    max_worlds: int | None = None,
    warm_up=True,
    init_retries: int = 3,
    gc_freeze: bool = True,
    **kwargs,
) -> Iterator[World]:
    """Successive worlds for one process: rendezvous, ``init_process_group``, yield; again after a failure.

    Args:
        dir (str | None), job_id (str | None): as :func:`fsmingle.rendezvous`.
        backend (str): torch backend for ``init_process_group`` (``"gloo"``; ``"nccl"`` untested here).
        pg_timeout (float | None): the process group's timeout in seconds, which bounds how long a
            collective waits for a hung peer; None: the rendezvous's ``stale_after`` (30 s by default).
        max_worlds (int | None): stop after this many worlds (None: no bound).
        gc_freeze (bool): after the warm-up, move every object alive then (torch, its imports:
            about 290,000 objects) out of the garbage collector's reach (``gc.freeze()``), so the
            ``gc.collect()`` of each teardown -- and Python's own full collections while training
            -- look only at what came after: 0.14 s of CPU per collection less here, which at
            N = 16 on 2 shared cores was 1.7 s of each survivor's teardown.  What is frozen is
            never collected (garbage cycles alive at that moment stay); False: leave ``gc`` alone.
        init_retries (int): ``init_process_group`` calls in a row that may fail as a peer's failure
            does (a peer died between the release and its own call: the store or a connection
            timed out or was refused) and lead to the next world instead of ending the loop; the
            next failure in a row is raised.  A misconfiguration (a wrong ``GLOO_SOCKET_IFNAME``)
            fails every time, so it costs at most ``init_retries + 1`` rendezvous and
            ``pg_timeout`` each.  0: every failure is raised.
        warm_up (bool | Callable[[], None]): before the first rendezvous, pay the one-time costs
            of a fresh process that would otherwise fall inside the first world: True builds a
            ``DistributedDataParallel`` on a one-process gloo group (its first construction imports
            ``torch._dynamo`` and sympy: 1.4 s here, 5 s on a loaded machine, during which the
            survivors' first collective waits for the spare and may pass ``pg_timeout``); a callable
            is called instead; False: nothing.
        **kwargs: keywords of :func:`fsmingle.rendezvous` (``nnodes`` or ``world_size``, ``addr``,
            ``timeout``, ``stale_after``, ``spare_timeout`` -- first world only --, ...).  ``rank``
            and ``node_rank`` apply to the first world only; from the second on, ``rank_order`` is
            ``"key"`` and ``topology_key`` the previous rank (see the module doc).

    Yields:
        World: with the process group initialised; use it as a context manager.  The loop ends
        when a world's block ends without an exception.

    Raises:
        ImportError: torch is not installed.
        FsmingleError: as :func:`fsmingle.rendezvous` raises (a rendezvous timeout ends the loop:
            not enough participants came back within ``timeout`` seconds).
        RuntimeError: ``init_process_group`` failed more than ``init_retries`` times in a row
            (a torch ``DistError`` or a ``RuntimeError``), or failed another way (not retried).
    """
    import datetime

    import torch.distributed as dist

    if warm_up is True:
        _warm_ddp()
    elif callable(warm_up):
        warm_up()
    if gc_freeze:
        gc.collect()  # what is garbage now is not frozen
        gc.freeze()
    index = 0
    previous: int | None = None
    last: World | None = None
    init_failures: list[tuple[int, int, BaseException]] = []  # in a row, since the last world stood
    first = dict(kwargs)
    first.setdefault("rank_order", "key")
    first.setdefault("topology_key", FRESH_KEY)
    while max_worlds is None or index < max_worlds:
        if index == 0 and not init_failures:
            args = first
        else:  # after a failure, even one at init: no explicit rank (the spare may hold it now)
            args = {k: v for k, v in kwargs.items() if k not in ("rank", "node_rank", "spare_timeout")}
            args.update(rank_order="key", topology_key=FRESH_KEY if previous is None else str(previous))
        r = rendezvous(dir, job_id, **args)
        released = time.time()
        rank = r.rank if r.rank is not None else r.node_rank
        size = r.world_size if r.world_size is not None else r.nnodes
        os.environ.update({k: v for k, v in r.env().items() if k.endswith("_SOCKET_IFNAME")})
        timeout = pg_timeout if pg_timeout is not None else float(kwargs.get("stale_after") or 30.0)
        host = f"[{r.master_addr}]" if ":" in r.master_addr else r.master_addr
        try:
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://{host}:{r.master_port}",
                rank=rank,
                world_size=size,
                timeout=datetime.timedelta(seconds=timeout if math.isfinite(timeout) else 86400 * 365),
            )
        except Exception as e:
            # A peer that died between the release and its own init_process_group (or a master
            # port that refuses) fails everyone's init: the store times out or refuses.  The
            # others come back to the next generation as after a failure in training, so do we;
            # a cause that fails every time (a misconfiguration) is raised after init_retries.
            if not _is_peer_failure(e) or len(init_failures) >= init_retries:
                raise
            init_failures.append((r.generation, rank, e))
            _forget_failed_init()
            continue
        world = World(r, rank, size, index, previous, released=released, started=time.time())
        if last is not None:
            log.warning(
                "world of generation %d ended (rank %d): %s", last.generation, last.rank, _first_line(last.failure)
            )
        for gen, was, e in init_failures:  # said once a world stands: str() of a torch error is slow
            log.warning("init_process_group of generation %d failed (rank %d): %s", gen, was, _first_line(e))
        init_failures = []
        log.info("world %d: generation %d, rank %d of %d (was %s)", index, r.generation, rank, size, previous)
        yield world
        if not world._closed:
            # The caller did not use the world as a context manager: treat it as done.
            world.__exit__(None, None, None)
        if world.finished or world.failure is not None and not _is_peer_failure(world.failure):
            return
        previous, last = rank, world
        index += 1


def _warm_ddp() -> None:
    """Construct and step a DDP model once on a one-process group in memory (``HashStore``: no
    port, no file), so the lazy imports and initialisations of DDP happen before this process joins."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        m = DistributedDataParallel(torch.nn.Linear(1, 1))
        m(torch.zeros(1, 1)).sum().backward()
        del m
    finally:
        _teardown_clean()


def _is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is how torch reports a peer's failure (a collective or the store failing)."""
    try:
        import torch.distributed as dist

        if isinstance(exc, dist.DistError):
            return True
    except ImportError:  # pragma: no cover - worlds() needs torch
        return False
    return type(exc) is RuntimeError or isinstance(exc, ConnectionError | TimeoutError)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _teardown_clean() -> None:
    """The order that torch 2.13 gloo needs at the end (it aborts about 1 exit in 4 otherwise)."""
    import torch.distributed as dist

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def _forget_failed_init() -> None:
    """Undo what a failed ``init_process_group`` left behind, as ``destroy_process_group`` would.

    torch names the default group by a per-process counter (``_world.group_count``, part of every
    store key of the group: ``/default_pg/<n>//cpu//...``) that it bumps before the init can fail
    and that only ``destroy_process_group()`` sets back to 0.  Left at 1, this process's next group
    would wait for keys no other process writes (they use 0) and time out, world after world.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if dist.is_initialized():
        _teardown_broken()
    else:
        c10d._world.group_count = 0
    gc.collect()


def _teardown_broken() -> None:
    """Tear down a process group whose peer failed: abort it (unblocks and closes its connections,
    so peers still blocked in a collective with this process fail at once instead of waiting out
    their timeout), then destroy it so the next ``init_process_group`` starts clean."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        return
    try:
        c10d._abort_process_group()
    except Exception as e:  # an abort that fails still leaves destroy to try
        log.debug("abort of the broken process group: %s", e)
    gc.collect()  # after the abort: the peers blocked on this process learn of the failure first
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:
            log.debug("destroy of the broken process group: %s", e)
