"""THE table: every rendezvous option, declared once (:data:`OPTIONS`), and the checks its rows use.

**Adding an option** = one ``Option(...)`` row in :data:`OPTIONS` below (name, flags, type,
default, unit, fallback variables, check, help, ``--rdzv-conf`` key), plus the code that uses
its value (``values.<name>`` in :mod:`fsmingle.api`); then ``python tests/test_docs.py --write``
regenerates the option table of ``docs/cli.md``.  Everything else is derived from the rows
(see :mod:`fsmingle.options`).  A check returns what is wrong with a value (a phrase that
:meth:`.spec.Option.parse` puts the flag in front of), None when it is fine, or raises a
complete ``ConfigError`` itself (``_job_id``).
"""

from __future__ import annotations

import ipaddress

from ..fs.layout import validate_job_id
from .spec import Option

# ---------------------------------------------------------------- checks (return what is wrong, or None)


def _positive(v: float) -> str | None:
    return None if v > 0 else f"must be a positive number of seconds, got {v:g}"


def _port(v: int) -> str | None:
    return None if 1 <= v <= 65535 else f"{v} is outside 1..65535; choose a free port in 1..65535"


def _ip(v: str) -> str | None:
    try:
        ipaddress.ip_address(v.split("%", 1)[0])
    except ValueError:
        return f"{v!r} is not an IP address; give the IP other nodes reach this one at"
    return None


def _count(v: int) -> str | None:
    return None if v >= 0 else f"must be 0 or more, got {v}"


def _rank_order(v: str) -> str | None:
    from ..protocol.decision import RANK_ORDERS

    return None if v in RANK_ORDERS else f"{v!r} is not one of {', '.join(RANK_ORDERS)}"


def _job_id(v: str) -> str | None:
    if not v:
        return None  # empty: fall back to the environment (config.resolve says what is missing)
    validate_job_id(v)  # raises ConfigError with its own complete message
    return None


def _peer_jobs(v: str) -> str | None:
    from ..protocol.queue import parse_peer_jobs

    parse_peer_jobs(v)  # raises ConfigError with its own complete message
    return None


# ---------------------------------------------------------------- THE table: one row per option

OPTIONS: tuple[Option, ...] = (
    Option(
        "dir",
        ("--dir",),
        str,
        "Shared rendezvous directory every node sees; it must exist (create it once with `mkdir -m 700 DIR`).",
        env=("FSMINGLE_DIR",),
        envvar="FSMINGLE_DIR",
        metavar="DIR",
    ),
    Option(
        "job_id",
        ("--job-id",),
        str,
        "Job id, the same on every node; else the scheduler's job id.",
        env=(
            "FSMINGLE_JOB_ID",
            "SLURM_ARRAY_JOB_ID",
            "SLURM_JOB_ID",
            "PBS_JOBID",
            "LSB_JOBID",
            "JOB_ID",
            "TORCHELASTIC_RUN_ID",
        ),
        check=_job_id,
        metavar="ID",
    ),
    Option("nnodes", ("--nnodes",), int, "Number of nodes (node mode).", env=("SLURM_NNODES", "PET_NNODES")),
    Option(
        "node_rank",
        ("--node-rank", "--node_rank"),
        int,
        "This node's rank; unset: first-come.",
        env=("SLURM_NODEID", "JOB_COMPLETION_INDEX", "PET_NODE_RANK"),
    ),
    Option(
        "world_size", ("--world-size", "--world_size"), int, "Per-rank mode: number of ranks.", env=("SLURM_NTASKS",)
    ),
    Option("rank", ("--rank",), int, "Per-rank mode: this process's rank; unset: first-come.", env=("SLURM_PROCID",)),
    Option(
        "addr",
        ("--addr",),
        str,
        "IP address to announce (e.g. the pod IP); it must be an address of this host unless --addr-not-local.",
        check=_ip,
        conf_key="addr",
        metavar="IP",
    ),
    Option(
        "addr_not_local",
        ("--addr-not-local",),
        bool,
        "Accept an --addr that no interface of this host has (NAT or port forwarding in front of this node).",
        default=False,
        conf_key="addr_not_local",
    ),
    Option(
        "iface",
        ("--iface",),
        str,
        "Interface to take the address from.",
        env=("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
        conf_key="iface",
        metavar="NAME",
        default_text="default route's interface, else the only one up",
    ),
    Option(
        "port",
        ("--port", "--master-port"),
        int,
        "Master port rank 0 holds for torch.",
        check=_port,
        default_text="a free port",
        metavar="PORT",
    ),
    Option(
        "timeout",
        ("--timeout",),
        float,
        "Seconds to wait for the world before failing (exit 7).",
        default=600.0,
        unit="s",
        check=_positive,
    ),
    Option(
        "peer_jobs",
        ("--peer-jobs",),
        str,
        "Scheduler jobs this training waits for (Slurm: 4300,4301, 4300:4301 or 4242_[0-3]); one process "
        "asks squeue about those not joined: pending ones hold the timeout, an ended one fails the wait (exit 13).",
        env=("FSMINGLE_PEER_JOBS",),
        envvar="FSMINGLE_PEER_JOBS",
        check=_peer_jobs,
        conf_key="peer_jobs",
        default_text="a job array's tasks",
        metavar="JOBS",
    ),
    Option(
        "queue_timeout",
        ("--queue-timeout",),
        float,
        "Seconds the wait may be held by peer jobs pending in the scheduler's queue (exit 7 after).",
        env=("FSMINGLE_QUEUE_TIMEOUT",),
        envvar="FSMINGLE_QUEUE_TIMEOUT",
        unit="s",
        conf_key="queue_timeout",
        check=_positive,
        default_text="no limit",
    ),
    Option(
        "spare_timeout",
        ("--spare-timeout",),
        float,
        "Seconds a spare (arrived when the world was full or already released) may wait for a place, "
        "`inf` for as long as the world runs; --timeout is held while it does, and runs in full once a "
        "world forms with it (exit 7 after). Unset: a spare waits --timeout like anyone (a re-run looks the same).",
        env=("FSMINGLE_SPARE_TIMEOUT",),
        envvar="FSMINGLE_SPARE_TIMEOUT",
        unit="s",
        check=_positive,
        default_text="--timeout",
    ),
    Option(
        "queue_poll",
        ("--queue-poll",),
        float,
        "Seconds between scheduler queries about peer jobs (one squeue call for all, by rank 0 or one torchrun agent).",
        default=30.0,
        env=("FSMINGLE_QUEUE_POLL",),
        envvar="FSMINGLE_QUEUE_POLL",
        unit="s",
        conf_key="queue_poll",
        check=_positive,
    ),
    Option(
        "stale_after",
        ("--stale-after",),
        float,
        "Seconds without a heartbeat change after which a remote participant is dead.",
        default=30.0,
        unit="s",
        check=_positive,
    ),
    Option(
        "poll_max",
        ("--poll-max",),
        float,
        "Steady-state seconds between reads of the release record (raise "
        "to spare the metadata server); at most --stale-after/4.",
        unit="s",
        check=_positive,
        default_text="0.28, or --stale-after/4 if smaller",
    ),
    Option(
        "rank_order",
        ("--rank-order",),
        str,
        "How first-come ranks are ordered at release: arrival, host "
        "(natural hostname order), nodelist (SLURM_JOB_NODELIST order) or key (--topology-key); explicit ranks "
        "always win.",
        env=("FSMINGLE_RANK_ORDER",),
        envvar="FSMINGLE_RANK_ORDER",
        check=_rank_order,
        default_text="arrival",
        metavar="ORDER",
    ),
    Option(
        "topology_key",
        ("--topology-key",),
        str,
        "This node's place in the network for --rank-order key "
        "(rack, switch, NVLink domain); sorted naturally, hostname breaking ties.",
        env=("FSMINGLE_TOPOLOGY_KEY",),
        envvar="FSMINGLE_TOPOLOGY_KEY",
        metavar="KEY",
    ),
    Option(
        "check_mesh",
        ("--check-mesh",),
        bool,
        "Before the release, every node proves it reaches its ring "
        "neighbours (previous and next rank) on their announced addresses; a failure names both hosts and "
        "voids the generation.",
        default=False,
        env=("FSMINGLE_CHECK_MESH",),
    ),
    Option(
        "gpus_per_node",
        ("--gpus-per-node",),
        int,
        "Before joining, check that this node sees this many "
        "usable GPUs (NVML, else nvidia-smi -L; CUDA_VISIBLE_DEVICES respected); a node short of them does not "
        "join (exit 12).",
        env=("FSMINGLE_GPUS_PER_NODE",),
        envvar="FSMINGLE_GPUS_PER_NODE",
        check=_count,
        default_text="no check",
        metavar="N",
    ),
    Option("quiet", ("--quiet", "-q"), bool, "Print only errors.", default=False, cli_only=True),
    Option(
        "verbose",
        ("--verbose", "-v"),
        bool,
        "Also print protocol details (debug lines with timestamps).",
        default=False,
        cli_only=True,
    ),
)

#: poll_max when not given: this, or stale_after/4 if that is smaller (see :func:`validate`).
POLL_MAX_DEFAULT = 0.28
_BY_NAME = {o.name: o for o in OPTIONS}


def get(name: str) -> Option:
    """The :class:`Option` called ``name`` (KeyError if there is none)."""
    return _BY_NAME[name]
