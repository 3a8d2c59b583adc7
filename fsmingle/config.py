"""Where the rendezvous parameters come from: explicit values, then the scheduler's environment.

Fallback order for each value (first one set wins):

=================  ==========================================================================
value              sources
=================  ==========================================================================
dir                ``--dir``, ``FSMINGLE_DIR``
job id             ``--job-id``, ``FSMINGLE_JOB_ID``, ``SLURM_JOB_ID`` (for an array task
                   ``SLURM_ARRAY_JOB_ID``, so all tasks of the array share it), ``PBS_JOBID``,
                   ``LSB_JOBID``, ``JOB_ID`` (SGE), ``TORCHELASTIC_RUN_ID``
nnodes             ``--nnodes``, for a job array (job id from ``SLURM_ARRAY_JOB_ID``)
                   ``SLURM_NNODES`` x ``SLURM_ARRAY_TASK_COUNT``, else ``SLURM_NNODES``, ``PET_NNODES``
node rank          ``--node-rank``, for a job array (task index - min) x ``SLURM_NNODES`` +
                   ``SLURM_NODEID``, else ``SLURM_NODEID``, ``JOB_COMPLETION_INDEX`` (Kubernetes
                   Indexed Job), ``PET_NODE_RANK``; none: first-come.  ``SLURM_NODEID`` is not
                   taken when nnodes exceeds ``SLURM_NNODES`` (array tasks or separate jobs
                   given ``--job-id``/``--nnodes``: it numbers the nodes of *this* job, and
                   every job would claim node rank 0); ``--verbose`` says so
world size         ``--world-size``, ``SLURM_NTASKS``
rank               ``--rank``, ``SLURM_PROCID``; none: first-come
restart count      ``SLURM_RESTART_COUNT`` (0 if unset), compared only between participants
                   with the same ``SLURM_JOB_ID``: separate jobs count their requeues apart
=================  ==========================================================================

The variables of each row are the ``env`` column of :data:`fsmingle.options.OPTIONS`
(the one place to change them); the job-array and per-rank rules are here.

Per-rank mode is chosen by ``--world-size``/``--rank`` (or by
``SLURM_NTASKS`` > ``SLURM_NNODES`` when neither ``--nnodes`` nor
``--world-size`` is given, i.e. one ``srun`` task per rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import ConfigError
from .fs.layout import validate_job_id
from .options import get as _option


def _int_env(env: dict, name: str) -> int | None:
    v = env.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"environment variable {name}={v!r} is not an integer") from None


def _first_int(env: dict, names: tuple[str, ...]) -> int | None:
    for n in names:
        v = _int_env(env, n)
        if v is not None:
            return v
    return None


def _first(env: dict, *names: str) -> tuple[str | None, str | None]:
    for n in names:
        if env.get(n):
            return env[n], n
    return None, None


@dataclass(frozen=True)
class Settings:
    """Resolved rendezvous parameters (see :func:`resolve`)."""

    dir: str
    job_id: str
    mode: str  # "node" or "rank"
    size: int  # nnodes or world size
    rank: int | None  # node rank or global rank; None: first-come
    restart_count: int
    slurm_job_id: str = ""  # restart counts are compared only between beacons of one Slurm job
    notes: tuple[str, ...] = ()  # why a scheduler variable was not taken (logged with --verbose)
    scheduler: tuple[tuple[str, str], ...] = ()  # this job's identity (scheduler_identity), for the beacon


#: Beacon field ``scheduler``: key -> the variables it is read from (first set wins).
SCHEDULER_IDENTITY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("slurm_job", ("SLURM_JOB_ID",)),
    ("array_job", ("SLURM_ARRAY_JOB_ID",)),
    ("array_task", ("SLURM_ARRAY_TASK_ID",)),
    ("partition", ("SLURM_JOB_PARTITION",)),
    ("pbs_job", ("PBS_JOBID",)),
    ("pbs_array_index", ("PBS_ARRAY_INDEX", "PBS_ARRAYID")),
    ("pbs_queue", ("PBS_QUEUE",)),
    ("lsf_job", ("LSB_JOBID",)),
    ("lsf_array_index", ("LSB_JOBINDEX",)),
    ("lsf_queue", ("LSB_QUEUE",)),
)


def scheduler_identity(env) -> tuple[tuple[str, str], ...]:
    """This job as its scheduler knows it (Slurm job, array job and task, partition; PBS/LSF ids
    where their environment gives them): the ``scheduler`` field of the beacon, which ``status``
    shows and rank 0 asks the scheduler about.  Values are cut to 64 characters; unset keys left out."""
    out = []
    for key, names in SCHEDULER_IDENTITY:
        v, _ = _first(env, *names)
        if v and not (key == "lsf_array_index" and v == "0"):
            out.append((key, str(v)[:64]))
    return tuple(out)


def resolve(
    dir: str | None = None,
    job_id: str | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    world_size: int | None = None,
    rank: int | None = None,
    env: dict | None = None,
) -> Settings:
    """Fill unset values from the environment and validate them all.

    Raises:
        ConfigError: no dir, no job id, an invalid job id, nnodes/world size
            missing or below 1, a rank outside 0..size-1, node and per-rank
            options mixed, or a non-integer scheduler variable.
    """
    env = os.environ if env is None else env
    dir = dir or _first(env, *_option("dir").env)[0]
    if not dir:
        raise ConfigError("no rendezvous directory: pass --dir or set FSMINGLE_DIR to a directory every node sees")
    source = "--job-id"
    if not job_id:
        job_id, source = _first(env, *_option("job_id").env)
    job_id = validate_job_id(job_id or "")
    array = source == "SLURM_ARRAY_JOB_ID" and env.get("SLURM_ARRAY_TASK_COUNT")
    if (world_size is not None or rank is not None) and (nnodes is not None or node_rank is not None):
        raise ConfigError(
            "give either --nnodes/--node-rank (node mode) or --world-size/--rank (per-rank mode), not both"
        )
    notes: list[str] = []
    mode = "rank" if (world_size is not None or rank is not None) else "node"
    if mode == "node" and nnodes is None:
        ntasks, nn = _int_env(env, "SLURM_NTASKS"), _int_env(env, "SLURM_NNODES")
        if ntasks and nn and ntasks > nn and node_rank is None:
            mode = "rank"  # one srun task per rank
    if mode == "rank":
        size = world_size if world_size is not None else _first_int(env, _option("world_size").env)
        if rank is None:
            rank = _first_int(env, _option("rank").env)
        what = "--world-size (or SLURM_NTASKS)"
    else:
        size = nnodes
        if array:
            # A job array shares SLURM_ARRAY_JOB_ID, but each task sees only its
            # own SLURM_NNODES/SLURM_NODEID: the world is every task's nodes.
            per = _int_env(env, "SLURM_NNODES") or 1
            whole = per * (_int_env(env, "SLURM_ARRAY_TASK_COUNT") or 1)
            size = whole if size is None else size
            if node_rank is None and size == whole:
                idx = (_int_env(env, "SLURM_ARRAY_TASK_ID") or 0) - (_int_env(env, "SLURM_ARRAY_TASK_MIN") or 0)
                node_rank = idx * per + (_int_env(env, "SLURM_NODEID") or 0)
        if size is None:
            for n in _option("nnodes").env:
                v = env.get(n)
                if v and ":" in v:
                    raise ConfigError(f"{n}={v} is an elastic range; the static rendezvous needs one number (--nnodes)")
                size = _int_env(env, n)
                if size is not None:
                    break
        if node_rank is None:
            names = _option("node_rank").env
            slurm_nn = _int_env(env, "SLURM_NNODES")
            if size is not None and slurm_nn is not None and size > slurm_nn and env.get("SLURM_NODEID"):
                # This job has fewer nodes than the training: it is one of several jobs (array
                # tasks, separate sbatch), and SLURM_NODEID numbers the nodes of this job only --
                # each job's first node would claim node rank 0.
                names = tuple(n for n in names if n != "SLURM_NODEID")
                notes.append(
                    f"not taking the node rank from SLURM_NODEID={env['SLURM_NODEID']}: --nnodes {size} exceeds "
                    f"SLURM_NNODES={slurm_nn}, so SLURM_NODEID numbers this job's nodes, not the training's "
                    "(pass --node-rank to choose one)"
                )
            node_rank = _first_int(env, names)
        rank = node_rank
        what = "--nnodes (or SLURM_NNODES)"
    if size is None:
        raise ConfigError(f"how many participants? pass {what}")
    if size < 1:
        raise ConfigError(f"{what.split()[0]} is {size}; it must be at least 1")
    if size > 100_000:
        raise ConfigError(f"{what.split()[0]} is {size}; at most 100000 are supported")
    if rank is not None and not 0 <= rank < size:
        flag = "--rank" if mode == "rank" else "--node-rank"
        raise ConfigError(f"{flag} is {rank} but must be in 0..{size - 1} for a world of {size}")
    return Settings(
        dir=dir,
        job_id=job_id,
        mode=mode,
        size=size,
        rank=rank,
        restart_count=_int_env(env, "SLURM_RESTART_COUNT") or 0,
        slurm_job_id=str(env.get("SLURM_JOB_ID", ""))[:64],
        notes=tuple(notes),
        scheduler=scheduler_identity(env),
    )
