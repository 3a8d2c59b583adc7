"""The Python API: :func:`rendezvous` and its result, :class:`Rendezvous`.

The CLI (``fsmingle run`` / ``fsmingle env``) is a thin layer over this.
Nothing here imports torch.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass, replace

from . import __version__
from .cleanup import locked_cleaner
from .config import resolve
from .errors import ConfigError, RecordError
from .hostinfo import local_process_alive, this_process
from .netaddr import PortReservation, choose_address, probe_master
from .protocol import Participant, Progress, SystemClock, Timing
from .records import Release, validate_port
from .fscheck import require_claimable
from .store import open_job_dir

log = logging.getLogger("fsmingle")

__all__ = ["Rendezvous", "rendezvous", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 600.0


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
        members (tuple[str, ...]): members' addresses in rank order.
        dir (str): the rendezvous directory.
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

    @classmethod
    def from_release(cls, rel: Release, rank: int, dir: str = "") -> "Rendezvous":
        """Build the result for the member at ``rank`` of a released record."""
        addrs = tuple(m.addr for m in rel.members)
        if rel.mode == "node":
            return cls(rel.master_addr, rel.master_port, rank, rel.size, rel.job_id, rel.generation,
                       "node", members=addrs, dir=dir)

        def host_key(m):
            return (m.host.boot_id, m.host.hostname, m.addr)

        hosts: list = []
        for m in rel.members:
            if host_key(m) not in hosts:
                hosts.append(host_key(m))
        mine = host_key(rel.members[rank])
        same = [m.rank for m in rel.members if host_key(m) == mine]
        return cls(rel.master_addr, rel.master_port, hosts.index(mine), len(hosts), rel.job_id, rel.generation,
                   "rank", rank=rank, world_size=rel.size, local_rank=same.index(rank),
                   local_world_size=len(same), members=addrs, dir=dir)

    def as_dict(self) -> dict:
        """JSON-ready dict (``fsmingle env --format json``); per-rank fields only in per-rank mode."""
        d = {"master_addr": self.master_addr, "master_port": self.master_port, "node_rank": self.node_rank,
             "nnodes": self.nnodes, "job_id": self.job_id, "generation": self.generation, "mode": self.mode}
        if self.mode == "rank":
            d.update(rank=self.rank, world_size=self.world_size, local_rank=self.local_rank,
                     local_world_size=self.local_world_size)
        return d

    def env(self) -> dict[str, str]:
        """Environment variables for the command: torch's names, torchrun's ``PET_*`` and fsmingle's own.

        Node mode: ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``, ``NNODES``,
        ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, ``PET_NODE_RANK``,
        ``PET_NNODES`` (torchrun reads these as its flags' defaults,
        ``torch/distributed/argparse_util.py``), ``FSMINGLE_JOB_ID``,
        ``FSMINGLE_GENERATION``.  Per-rank mode: ``RANK``, ``WORLD_SIZE``,
        ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
        ``GROUP_RANK``/``NODE_RANK``, ``NNODES`` and the ``FSMINGLE_*`` ones
        (no ``PET_*``: there is no torchrun to read them).
        """
        e = {"MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
             "NODE_RANK": str(self.node_rank), "NNODES": str(self.nnodes),
             "FSMINGLE_JOB_ID": self.job_id, "FSMINGLE_GENERATION": str(self.generation)}
        if self.mode == "node":
            e.update(PET_MASTER_ADDR=self.master_addr, PET_MASTER_PORT=str(self.master_port),
                     PET_NODE_RANK=str(self.node_rank), PET_NNODES=str(self.nnodes))
        else:
            e.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank),
                     LOCAL_WORLD_SIZE=str(self.local_world_size), GROUP_RANK=str(self.node_rank))
        return e


def rendezvous(
    dir: str | None = None,
    job_id: str | None = None,
    *,
    nnodes: int | None = None,
    node_rank: int | None = None,
    world_size: int | None = None,
    rank: int | None = None,
    addr: str | None = None,
    iface: str | None = None,
    port: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    stale_after: float | None = None,
    timing: Timing | None = None,
    on_progress=None,
    env: dict | None = None,
) -> Rendezvous:
    """Block until the world is complete; return the master and this participant's place in it.

    Node mode (``nnodes``/``node_rank``): one participant per node, e.g. before
    ``torchrun``.  Per-rank mode (``world_size``/``rank``): one per process,
    e.g. before ``init_process_group(init_method="env://")``.  Unset values
    come from the scheduler's environment (see :mod:`fsmingle.config`); an
    unset rank means first-come assignment (rank 0 included).

    Args:
        dir (str | None): shared rendezvous directory (``FSMINGLE_DIR``).
        job_id (str | None): job id, the same on every participant
            (``FSMINGLE_JOB_ID``, else the scheduler's job id).
        nnodes, node_rank, world_size, rank (int | None): see above.
        addr (str | None): IP address to announce; ``iface`` (str | None): or
            the interface to take it from (see :func:`fsmingle.netaddr.choose_address`).
        port (int | None): master port rank 0 should hold; None: a free one.
        timeout (float): seconds before giving up (default 600).
        stale_after (float | None): seconds without a heartbeat change after
            which a remote participant is dead (default 30).
        timing (Timing | None): all polling settings (``stale_after`` overrides its field).
        on_progress (Callable[[Progress], None] | None): progress callback.
        env (dict | None): environment to read fallbacks from (default ``os.environ``).

    Returns:
        Rendezvous: frozen; ``.env()`` gives the variables to export.

    Raises:
        ConfigError: invalid or missing parameters, an unknown interface, a busy
            ``port``, or participants that disagree on the world size.
        UnsafeDirectoryError: the directory is not safely ours.
        StorageError: the directory is missing, not writable, read-only or full.
        RankConflictError: the requested rank is held by a live process.
        RendezvousTimeoutError: incomplete after ``timeout`` seconds (names the missing ranks).
        CorruptStateError: the release record stayed unusable.
        UnsupportedFilesystemError: link() does not work in the directory (s3fs and other
            object-store mounts): no claim could be exclusive (see :mod:`fsmingle.fscheck`).
    """
    s = resolve(dir=dir, job_id=job_id, nnodes=nnodes, node_rank=node_rank, world_size=world_size, rank=rank, env=env)
    if port is not None:
        try:
            validate_port(port)
        except RecordError as e:
            raise ConfigError(f"--port: {e}") from None
    if not timeout > 0:
        raise ConfigError(f"--timeout must be positive seconds, got {timeout}")
    address = choose_address(addr, iface, env=os.environ if env is None else env)
    timing = timing or Timing()
    if stale_after is not None:
        if not stale_after > 0:
            raise ConfigError(f"--stale-after must be positive seconds, got {stale_after}")
        timing = replace(timing, stale_after=stale_after)
    store = open_job_dir(s.dir, s.job_id)
    require_claimable(store.root)  # before any claim: no exclusive create here -> UnsupportedFilesystemError (exit 10)
    p = Participant(
        store, job_id=s.job_id, mode=s.mode, size=s.size, rank=s.rank, addr=address,
        instance=secrets.token_hex(8), me=this_process(), timeout=timeout, timing=timing, master_port=port,
        restart_count=s.restart_count, slurm_job_id=s.slurm_job_id, clock=SystemClock(), local_alive=local_process_alive, probe=probe_master,
        reserve_port=PortReservation, on_progress=on_progress, cleaner=locked_cleaner(store, timing.stale_after),
        version=__version__,
    )
    rel = p.run()
    return Rendezvous.from_release(rel, p.rank, dir=s.dir)
