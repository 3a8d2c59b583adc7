"""The Python API: :func:`rendezvous` and its result, :class:`Rendezvous`.

The CLI (``fsmingle run`` / ``fsmingle env``) is a thin layer over this.
Nothing here imports torch.
"""

from __future__ import annotations

import inspect
import logging
import os
import secrets
from dataclasses import dataclass, replace

from . import options
from ._version import __version__
from .config import resolve
from .fs.jobdir import open_job_dir
from .net.channel import TcpTransport
from .net.hostinfo import local_process_alive, this_process
from .net.netaddr import choose_address, interface_of, socket_ifname_env
from .protocol.cleanup import locked_cleaner
from .protocol.decision import Placement, expand_nodelist
from .protocol.participant import Participant, SystemClock, Timing

log = logging.getLogger("fsmingle")

__all__ = ["DEFAULT_TIMEOUT", "Rendezvous", "rendezvous"]

DEFAULT_TIMEOUT: float = options.get("timeout").default


@dataclass(frozen=True)
class Rendezvous:
    """The outcome of a rendezvous: who the master is and where this participant stands.

    Attributes:
        master_addr (str): IP address of rank 0 (an IP literal, never a hostname).
        master_port (int): port rank 0 held for torch (free again once released).
        node_rank (int): this node's rank in 0..nnodes-1 (per-rank mode: index of
            this participant's host among the members' distinct hosts, in rank order).
        nnodes (int): number of nodes (per-rank mode: distinct hosts).
        job_id (str): the job id.
        generation (int): the generation that was released.
        mode (str): ``"node"`` or ``"rank"``.
        rank (int | None): global rank (per-rank mode only).
        world_size (int | None): number of ranks (per-rank mode only).
        local_rank (int | None): index among members on the same host (per-rank mode only).
        local_world_size (int | None): members on the same host (per-rank mode only).
        members (tuple[str, ...]): members' addresses in rank order (empty unless known: rank 0
            always knows them; others ask with ``want_members=True``).
        member_hosts (tuple[str, ...]): members' hostnames in rank order (same condition).
        arrivals (tuple[float, ...]): seconds after the first arrival at which rank 0 saw each member.
        dir (str): the rendezvous directory.
        iface (str): name of this host's interface that carries the address this participant
            announced ("" when none does: ``--addr-not-local``); :meth:`env` hands it to NCCL and gloo.
    """

    master_addr: str
    master_port: int
    node_rank: int
    nnodes: int
    job_id: str
    generation: int
    mode: str = "node"
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    local_world_size: int | None = None
    members: tuple[str, ...] = ()
    dir: str = ""
    member_hosts: tuple[str, ...] = ()
    arrivals: tuple[float, ...] = ()
    iface: str = ""

    @classmethod
    def from_placement(cls, pl: Placement, job_id: str, dir: str = "", members: tuple = ()) -> Rendezvous:
        """Build the result from the placement rank 0 sent this participant at release.

        Args:
            pl (Placement): this participant's place.
            job_id (str), dir (str): for the result.
            members (tuple[tuple[str, str, float], ...]): (hostname, address, arrival offset in seconds)
                of every member in rank order, when known (rank 0 always; others when they asked).
        """
        world = dict(
            members=tuple(m[1] for m in members),
            member_hosts=tuple(m[0] for m in members),
            arrivals=tuple(float(m[2]) for m in members),
            dir=dir,
        )
        if pl.mode == "node":
            return cls(pl.master_addr, pl.master_port, pl.rank, pl.size, job_id, pl.generation, "node", **world)
        return cls(
            pl.master_addr,
            pl.master_port,
            pl.node_rank,
            pl.nnodes,
            job_id,
            pl.generation,
            "rank",
            rank=pl.rank,
            world_size=pl.size,
            local_rank=pl.local_rank,
            local_world_size=pl.local_world_size,
            **world,
        )

    def as_dict(self) -> dict:
        """JSON-ready dict (``fsmingle env --format json``); per-rank fields only in per-rank mode."""
        d = {
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "node_rank": self.node_rank,
            "nnodes": self.nnodes,
            "job_id": self.job_id,
            "generation": self.generation,
            "mode": self.mode,
        }
        if self.mode == "rank":
            d.update(
                rank=self.rank,
                world_size=self.world_size,
                local_rank=self.local_rank,
                local_world_size=self.local_world_size,
            )
        return d

    def folder_store_path(self) -> str:
        """``<dir>/<job_id>/gen-N/store``: this generation's FolderStore directory (see :meth:`folder_store`)."""
        from .fs.layout import store_dir

        return os.path.join(self.dir, self.job_id, store_dir(self.generation))

    def folder_store(self, **kwargs):
        """A :class:`fsmingle.FolderStore` for this released generation (imports torch).

        Every member of the world gets the same directory, ``<dir>/<job_id>/gen-N/store``: unique to
        the generation, so a re-run (a new generation) never reads this run's keys, and
        ``fsmingle clean`` removes it with its generation.  ``kwargs`` go to ``FolderStore``
        (``timeout``, ``poll_max``).
        """
        from .fs.folderstore_torch import folder_store_class

        if not self.dir:
            raise ValueError("this Rendezvous has no directory (dir is empty): build it with rendezvous()")
        return folder_store_class()(self.folder_store_path(), self.world_size or self.nnodes, **kwargs)

    def env(self, environ: dict | None = None) -> dict[str, str]:
        """Environment variables for the command: torch's names, torchrun's ``PET_*`` and fsmingle's own.

        Args:
            environ (dict | None): the command's environment before these are added
                (default ``os.environ``): ``*_SOCKET_IFNAME`` set there are the user's and are left alone.

        Node mode: ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``NNODES``,
        ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, ``PET_NODE_RANK``,
        ``PET_NNODES`` (torchrun reads these as its flags' defaults,
        ``torch/distributed/argparse_util.py``), ``FSMINGLE_JOB_ID``,
        ``FSMINGLE_GENERATION``.  Per-rank mode: ``RANK``, ``WORLD_SIZE``,
        ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
        ``GROUP_RANK``/``NODE_RANK``, ``NNODES`` and the ``FSMINGLE_*`` ones
        (no ``PET_*``: there is no torchrun to read them).

        Both modes: ``NCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` = :attr:`iface`,
        each unless ``environ`` already has it, so NCCL and gloo listen on the
        interface of the address this node announced instead of guessing one
        (gloo otherwise resolves the hostname, often to 127.0.1.1; NCCL takes the
        first non-loopback interface, often docker0 or a management network:
        NCCL issues 913, 1581).
        """
        e = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "NODE_RANK": str(self.node_rank),
            "NNODES": str(self.nnodes),
            "FSMINGLE_JOB_ID": self.job_id,
            "FSMINGLE_GENERATION": str(self.generation),
        }
        if self.mode == "node":
            e.update(
                PET_MASTER_ADDR=self.master_addr,
                PET_MASTER_PORT=str(self.master_port),
                PET_NODE_RANK=str(self.node_rank),
                PET_NNODES=str(self.nnodes),
            )
        else:
            e.update(
                RANK=str(self.rank),
                WORLD_SIZE=str(self.world_size),
                LOCAL_RANK=str(self.local_rank),
                LOCAL_WORLD_SIZE=str(self.local_world_size),
                GROUP_RANK=str(self.node_rank),
            )
        e.update(socket_ifname_env(self.iface, environ))
        return e


def rendezvous(dir: str | None = None, job_id: str | None = None, **kwargs) -> Rendezvous:
    """Block until the world is complete; return the master and this participant's place in it.

        Node mode (``nnodes``/``node_rank``): one participant per node, e.g. before
        ``torchrun``.  Per-rank mode (``world_size``/``rank``): one per process,
        e.g. before ``init_process_group(init_method="env://")``.  Unset values
        come from the scheduler's environment (see :mod:`fsmingle.config`); an
        unset rank means first-come assignment (rank 0 included).

        The option keywords are the rows of :data:`fsmingle.options.OPTIONS`
        (the signature is generated from it; None = unset):

    {OPTION_DOCS}

        Other keywords:
            values (fsmingle.options.Values | None): all options in one object
                (what the CLI passes); then no option keyword may be given.
            timing (Timing | None): all polling settings; ``stale_after`` and
                ``poll_max``, when given, override its fields.
            on_progress (Callable[[Progress], None] | None): progress callback.
            env (dict | None): environment to read fallbacks from (default ``os.environ``).

        Returns:
            Rendezvous: frozen; ``.env()`` gives the variables to export.

        Raises:
            TypeError: an unknown keyword, or ``values`` together with option keywords.
            ConfigError: invalid or missing parameters (the message names the flag),
                ``poll_max`` above ``stale_after``/4, an ``addr`` that is not this
                host's (without ``addr_not_local``), an unknown interface, a busy
                ``port``, or participants that disagree on the world size.
            UnsafeDirectoryError: the directory is not safely ours.
            StorageError: the directory is missing (it is never created here: a
                missing ``dir`` on one node is usually a typo or a missing mount),
                not writable, read-only or full.
            RankConflictError: the requested rank is held by a live process.
            RendezvousTimeoutError: incomplete after ``timeout`` seconds (names the missing ranks).
            CorruptStateError: the release record stayed unusable.
            GpuPreflightError: ``gpus_per_node`` set and this node has fewer usable GPUs
                (raised before the directory is touched; see :mod:`fsmingle.preflight.gpu`).
            UnsupportedFilesystemError: link() does not work in the directory (s3fs and other
                object-store mounts): no claim could be exclusive (see :mod:`fsmingle.fs.fscheck`).
    """
    timing: Timing | None = kwargs.pop("timing", None)
    want_members: bool = bool(kwargs.pop("want_members", False))
    on_progress = kwargs.pop("on_progress", None)
    env: dict | None = kwargs.pop("env", None)
    values = kwargs.pop("values", None)
    unknown = sorted(set(kwargs) - _API_OPTIONS)
    if unknown:
        raise TypeError(f"rendezvous() got unexpected keyword argument(s) {', '.join(unknown)}")
    if values is None:
        values = options.Values(**{**{n: None for n in _API_OPTIONS}, "dir": dir, "job_id": job_id, **kwargs})
    elif kwargs or dir is not None or job_id is not None:
        raise TypeError("rendezvous(): pass either values= or option keywords, not both")
    if timing is not None:
        # Unset stale_after/poll_max keep the caller's Timing; set ones override it.
        values = replace(
            values,
            stale_after=values.stale_after if values.stale_after is not None else timing.stale_after,
            poll_max=values.poll_max
            if values.poll_max is not None
            else min(timing.poll_max, (values.stale_after or timing.stale_after) / 4),
        )
    v = options.validate(values)
    s = resolve(
        dir=v.dir,
        job_id=v.job_id,
        nnodes=v.nnodes,
        node_rank=v.node_rank,
        world_size=v.world_size,
        rank=v.rank,
        env=env,
    )
    environ = os.environ if env is None else env
    address = choose_address(v.addr, v.iface, env=environ)
    gpus = v.gpus_per_node
    if gpus is None and environ.get("FSMINGLE_GPUS_PER_NODE"):
        gpus = options.get("gpus_per_node").parse(environ["FSMINGLE_GPUS_PER_NODE"], source="FSMINGLE_GPUS_PER_NODE")
    if gpus:
        from .preflight.gpu import require_gpus

        require_gpus(gpus, env=dict(environ))  # before the job directory is touched: a node short of GPUs never joins
    port, timeout = v.port, v.timeout
    timing = replace(
        timing or Timing(),
        stale_after=v.stale_after,
        poll_max=v.poll_max,
        poll_min=min((timing or Timing()).poll_min, v.poll_max),
    )
    log.debug(
        "options: %s",
        ", ".join(
            f"{o.flag} {getattr(v, o.name)}"
            for o in options.OPTIONS
            if not o.cli_only and getattr(v, o.name) not in (None, False)
        ),
    )
    log.debug(
        "resolved: dir %s, job %s, %s mode, size %d, rank %s, address %s, restart count %d",
        s.dir,
        s.job_id,
        s.mode,
        s.size,
        "first-come" if s.rank is None else s.rank,
        address,
        s.restart_count,
    )
    for note in s.notes:
        log.debug("%s", note)
    if s.scheduler:
        log.debug("scheduler: %s", ", ".join(f"{k} {val}" for k, val in s.scheduler))
    log.debug(
        "timing: poll %g..%g s, heartbeat every %g s, stale after %g s, timeout %g s",
        timing.poll_min,
        timing.poll_max,
        timing.heartbeat_period,
        timing.stale_after,
        timeout,
    )
    queue = _queue_watch(v, s, environ)
    store = open_job_dir(s.dir, s.job_id, create_base=False)
    log.debug("job directory %s", store.root)
    p = Participant(
        store,
        job_id=s.job_id,
        mode=s.mode,
        size=s.size,
        rank=s.rank,
        addr=address,
        instance=secrets.token_hex(8),
        me=this_process(),
        timeout=timeout,
        timing=timing,
        master_port=port,
        restart_count=s.restart_count,
        slurm_job_id=s.slurm_job_id,
        scheduler=s.scheduler,
        queue=queue,
        spare_timeout=v.spare_timeout,
        clock=SystemClock(),
        local_alive=local_process_alive,
        transport=TcpTransport(ping_interval=timing.ping_interval),
        on_progress=on_progress,
        cleaner=locked_cleaner(store, timing.stale_after),
        version=__version__,
        rank_order=v.rank_order or environ.get("FSMINGLE_RANK_ORDER") or "arrival",
        topology_key=v.topology_key or environ.get("FSMINGLE_TOPOLOGY_KEY") or "",
        nodelist=_nodelist(environ),
        want_members=want_members,
        check_mesh=bool(v.check_mesh) or environ.get("FSMINGLE_CHECK_MESH", "") in ("1", "true", "yes"),
    )
    placement = p.run()
    r = Rendezvous.from_placement(placement, s.job_id, dir=s.dir, members=p.released_members)
    return replace(r, iface=interface_of(address) or "")


_API_OPTIONS = frozenset(o.name for o in options.OPTIONS if not o.cli_only)


def _queue_watch(v, s, env):
    """Peer jobs to ask the scheduler about (``--peer-jobs``, ``FSMINGLE_PEER_JOBS``, a job array's
    tasks): a :class:`~fsmingle.protocol.queue.QueueWatch`, or None when there are none."""
    from .protocol.queue import QueueWatch, peers_from_env

    given = v.peer_jobs or env.get("FSMINGLE_PEER_JOBS")
    nn = env.get("SLURM_NNODES", "")
    if not given and s.mode == "node" and nn.isdigit() and s.size <= int(nn):
        return None  # the training fits in this job: other array tasks are other trainings
    peers, mine, rank_of_task = peers_from_env(env, given)
    if not peers:
        return None
    task = env.get("SLURM_ARRAY_TASK_ID", "")
    if rank_of_task and not (task.isdigit() and s.rank == int(task) - rank_of_task[1]):
        rank_of_task = None  # ranks are not the array's task indexes
    log.debug("peer jobs: %s (this job %s); scheduler queried every %g s", ",".join(peers[:16]), mine, v.queue_poll)
    return QueueWatch(peers, mine, v.queue_poll, v.queue_timeout, rank_of_task)


def _nodelist(env) -> tuple[str, ...]:
    """``SLURM_JOB_NODELIST`` expanded as Slurm does (for ``--rank-order nodelist``); () if unset or unparsable."""
    spec = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    try:
        return tuple(expand_nodelist(spec)) if spec else ()
    except ValueError as e:
        log.warning("cannot expand SLURM_JOB_NODELIST=%r (%s); --rank-order nodelist falls back to host order", spec, e)
        return ()


rendezvous.__signature__ = options.api_signature(
    extra=tuple(  # type: ignore[attr-defined]
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None)
        for n in ("values", "timing", "on_progress", "env")
    )
)
rendezvous.__doc__ = rendezvous.__doc__.replace("{OPTION_DOCS}", options.api_docs())
