"""The ``fsmingle`` command: ``run``, ``env``, ``status``, ``clean``, ``demo``.

A thin layer over :func:`fsmingle.rendezvous`; torch is never imported here, so
``fsmingle --help`` answers fast.  Exit codes are those of
:mod:`fsmingle.errors` (``run`` then returns the command's own code).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from typing import List, Optional

import typer

from . import __version__
from .errors import ConfigError, FsmingleError

log = logging.getLogger("fsmingle")

app = typer.Typer(
    name="fsmingle",
    help="Rendezvous for multi-node PyTorch through a shared directory: no etcd, no known endpoint.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# ---- options shared by run and env (torchrun's spelling where they overlap)
DirOpt = typer.Option(None, "--dir", envvar="FSMINGLE_DIR", help="Shared rendezvous directory every node sees.")
JobOpt = typer.Option(None, "--job-id", help="Job id, the same on every node [env FSMINGLE_JOB_ID, else the scheduler's job id].")
NnodesOpt = typer.Option(None, "--nnodes", help="Number of nodes [SLURM_NNODES, PET_NNODES].")
NodeRankOpt = typer.Option(None, "--node-rank", "--node_rank", help="This node's rank [SLURM_NODEID, JOB_COMPLETION_INDEX, PET_NODE_RANK]; unset: first-come.")
WorldOpt = typer.Option(None, "--world-size", "--world_size", help="Per-rank mode: number of ranks [SLURM_NTASKS].")
RankOpt = typer.Option(None, "--rank", help="Per-rank mode: this process's rank [SLURM_PROCID]; unset: first-come.")
AddrOpt = typer.Option(None, "--addr", help="IP address to announce (e.g. the pod IP).")
IfaceOpt = typer.Option(None, "--iface", help="Interface to take the address from [default: NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, default route, the only interface up].")
PortOpt = typer.Option(None, "--port", "--master-port", help="Master port rank 0 holds for torch [default: a free port].")
TimeoutOpt = typer.Option(600.0, "--timeout", help="Seconds to wait for the world before failing (exit 7).")
StaleOpt = typer.Option(30.0, "--stale-after", help="Seconds without a heartbeat change after which a remote participant is dead.")
PollOpt = typer.Option(0.28, "--poll-max", help="Steady-state seconds between reads of the release record (raise to spare the metadata server).")
QuietOpt = typer.Option(False, "--quiet", "-q", help="Print only errors.")
VerboseOpt = typer.Option(False, "--verbose", "-v", help="Print protocol details.")


def _setup_logging(quiet: bool, verbose: bool) -> None:
    level = logging.ERROR if quiet else logging.DEBUG if verbose else logging.INFO
    logger = logging.getLogger("fsmingle")
    logger.setLevel(level)
    if not logger.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("fsmingle: %(message)s"))
        logger.addHandler(h)
        logger.propagate = False


def _fail(e: FsmingleError) -> "typer.Exit":
    # One clear line, no traceback: every message says what is wrong and what to do.
    typer.echo(f"fsmingle: error: {e}", err=True)
    return typer.Exit(e.exit_code)


def _do_rendezvous(dir, job_id, nnodes, node_rank, world_size, rank, addr, iface, port, timeout, stale_after,
                   poll_max, quiet):
    import time

    from .api import rendezvous
    from .progress import Reporter, fmt_duration
    from .protocol import Timing

    for flag, value in (("--poll-max", poll_max), ("--stale-after", stale_after), ("--timeout", timeout)):
        if not value > 0:
            raise _fail(ConfigError(f"{flag} must be a positive number of seconds, got {value:g}"))
    try:
        timing = Timing(poll_max=poll_max, poll_min=min(0.01, poll_max), stale_after=stale_after, status_interval=10.0)
    except FsmingleError as e:
        raise _fail(e)
    reporter = Reporter(quiet=quiet)
    t0 = time.monotonic()
    try:
        r = rendezvous(dir, job_id, nnodes=nnodes, node_rank=node_rank, world_size=world_size, rank=rank, addr=addr,
                       iface=iface, port=port, timeout=timeout, timing=timing, on_progress=reporter)
    except FsmingleError as e:
        reporter.close()
        raise _fail(e)
    except KeyboardInterrupt:
        reporter.close()
        typer.echo("fsmingle: interrupted; this participant withdrew from the rendezvous", err=True)
        raise typer.Exit(130)
    reporter.close()
    where = (f"node rank {r.node_rank}/{r.nnodes}" if r.mode == "node"
             else f"rank {r.rank}/{r.world_size} (local {r.local_rank}/{r.local_world_size}, node {r.node_rank}/{r.nnodes})")
    log.info("%s released: master %s:%d, %s, generation %d, after %s", r.job_id, r.master_addr, r.master_port,
             where, r.generation, fmt_duration(time.monotonic() - t0) if time.monotonic() - t0 >= 1 else
             f"{(time.monotonic() - t0) * 1000:.0f}ms")
    return r


def _install_sigterm():
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt  # unwinds through Participant.run, which withdraws

    signal.signal(signal.SIGTERM, handler)


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: List[str] = typer.Argument(..., help="The command to exec once released, e.g. torchrun ... train.py.",
                                        metavar="COMMAND [ARGS]..."),
    dir: Optional[str] = DirOpt, job_id: Optional[str] = JobOpt, nnodes: Optional[int] = NnodesOpt,
    node_rank: Optional[int] = NodeRankOpt, world_size: Optional[int] = WorldOpt, rank: Optional[int] = RankOpt,
    addr: Optional[str] = AddrOpt, iface: Optional[str] = IfaceOpt, port: Optional[int] = PortOpt,
    timeout: float = TimeoutOpt, stale_after: float = StaleOpt, poll_max: float = PollOpt,
    quiet: bool = QuietOpt, verbose: bool = VerboseOpt,
):
    """Wait for the world, then exec COMMAND with MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES and PET_* set.

    Per-rank mode (--world-size/--rank) sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE instead of PET_*.

    Exit codes: the command's own once it runs; 3 bad value, 4 unsafe directory, 5 storage, 6 rank conflict,
    7 timeout, 8 corrupt release, 126 not executable, 127 not found, 130 interrupted.
    """
    _setup_logging(quiet, verbose)
    _install_sigterm()
    r = _do_rendezvous(dir, job_id, nnodes, node_rank, world_size, rank, addr, iface, port, timeout, stale_after,
                       poll_max, quiet)
    env = dict(os.environ)
    env.update(r.env())
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)  # the master port closes here (close-on-exec), free for torch
    except FileNotFoundError:
        typer.echo(f"fsmingle: error: command not found: {command[0]}", err=True)
        raise typer.Exit(127)
    except PermissionError:
        typer.echo(f"fsmingle: error: command not executable: {command[0]}", err=True)
        raise typer.Exit(126)


@app.command("env")
def env_cmd(
    dir: Optional[str] = DirOpt, job_id: Optional[str] = JobOpt, nnodes: Optional[int] = NnodesOpt,
    node_rank: Optional[int] = NodeRankOpt, world_size: Optional[int] = WorldOpt, rank: Optional[int] = RankOpt,
    addr: Optional[str] = AddrOpt, iface: Optional[str] = IfaceOpt, port: Optional[int] = PortOpt,
    timeout: float = TimeoutOpt, stale_after: float = StaleOpt, poll_max: float = PollOpt,
    format: str = typer.Option("sh", "--format", help="sh (export lines for eval), json, or dotenv."),
    quiet: bool = QuietOpt, verbose: bool = VerboseOpt,
):
    """Wait for the world, then print the result: `eval "$(fsmingle env ...)"` or --format json."""
    if format not in ("sh", "json", "dotenv"):
        raise _fail(ConfigError(f"--format {format!r}: choose sh, json or dotenv"))
    _setup_logging(quiet, verbose)
    _install_sigterm()
    r = _do_rendezvous(dir, job_id, nnodes, node_rank, world_size, rank, addr, iface, port, timeout, stale_after,
                       poll_max, quiet)
    if format == "json":
        typer.echo(json.dumps(r.as_dict(), sort_keys=True))
    else:
        prefix = "export " if format == "sh" else ""
        for k, v in sorted(r.env().items()):
            typer.echo(f"{prefix}{k}={shlex.quote(v)}")


@app.command()
def status(
    job_id: Optional[str] = typer.Argument(None, help="One job to show in detail; omit to list all jobs."),
    dir: Optional[str] = DirOpt,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    watch: bool = typer.Option(False, "--watch", help="Refresh every --interval seconds until Ctrl-C."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes with --watch."),
):
    """Show jobs, generations and participants. Exit 0 if the (newest) generation is released, else 1."""
    from .status import status_main

    raise typer.Exit(status_main(dir, job_id, as_json, watch, interval))


@app.command()
def clean(
    job_id: Optional[str] = typer.Argument(None, help="Job to clean; omit to clean every job under --dir."),
    dir: Optional[str] = DirOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be removed."),
    stale_after: float = typer.Option(0.0, "--stale-after", help="Watch remote heartbeats this many seconds to "
                                      "judge them dead (0: a generation with remote participants is kept)."),
):
    """Remove stale generations: old decided ones and those whose participants are all dead.

    Never touches a generation with a live participant.
    """
    from .cleanup import clean_job
    from .config import validate_job_id
    from .store import check_owned_dir, PosixStore

    _setup_logging(False, False)
    base = dir or os.environ.get("FSMINGLE_DIR")
    try:
        if not base:
            raise ConfigError("no rendezvous directory: pass --dir or set FSMINGLE_DIR")
        jobs = [validate_job_id(job_id)] if job_id else sorted(
            n for n in os.listdir(base) if not n.startswith(".") and os.path.isdir(os.path.join(base, n)))
        for j in jobs:
            path = os.path.join(base, j)
            if not os.path.isdir(path):
                raise ConfigError(f"no job {j!r} under {base}")
            check_owned_dir(path, "job directory")
            for g, why in clean_job(PosixStore(path), stale_after=stale_after, dry_run=dry_run):
                typer.echo(f"{'would remove' if dry_run else 'removed'} {j}/gen-{g:08d}: {why}")
    except FsmingleError as e:
        raise _fail(e)
    except OSError as e:
        raise _fail(ConfigError(f"cannot read {base}: {e.strerror}"))


@app.command()
def demo(
    script: Optional[str] = typer.Option(None, "--script", help="Training script [default: examples/train_ddp.py]."),
    nproc_per_node: int = typer.Option(2, "--nproc-per-node", help="Worker processes per simulated node."),
    steps: int = typer.Option(100, "--steps", help="Training steps."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds before the demo gives up."),
):
    """Two simulated nodes on this machine rendezvous through a temp dir and train with torchrun."""
    from .demo import run_demo

    raise typer.Exit(run_demo(script, nproc_per_node, steps, timeout))


def _version_callback(value: bool):
    if value:
        typer.echo(f"fsmingle {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                       help="Print the version and exit.")):
    """Rendezvous for multi-node PyTorch through a shared directory."""


def main() -> None:
    """Console-script entry point."""
    app()


@app.command("check")
def check_cmd(
    dir: Optional[str] = typer.Option(None, "--dir", envvar="FSMINGLE_DIR", help="Directory to examine (the --dir of run/env)."),
    peers: int = typer.Option(1, "--peers", help="Run on this many nodes at once to prove cross-node exclusivity and measure visibility."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the other peers."),
    session: str = typer.Option("default", "--session", help="Scratch rendezvous name in DIR, the same on every peer."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts instead of a table."),
):
    """Examine DIR's filesystem: type, mount options, link()/rename()/O_EXCL probed for real, owner, a verdict and the
    --stale-after/--poll-max to use.  Exit 0 usable (ok or local), 10 unsafe; 3 bad option, 5 unusable dir, 7 peers missing."""
    from .fscheck import main as check_main

    raise typer.Exit(check_main(dir, peers, timeout, session, as_json))


if __name__ == "__main__":
    main()
