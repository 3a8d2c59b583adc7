"""The ``fsmingle`` command: ``run``, ``env``, ``status``, ``clean``, ``demo``.

A thin layer over :func:`fsmingle.rendezvous`; torch is never imported here, so
``fsmingle --help`` answers fast.  The rendezvous options of ``run`` and ``env``
are generated from :data:`fsmingle.options.OPTIONS`; exit codes are those of
:func:`fsmingle.errors.exit_codes` (``run`` then returns the command's own code).
Every failure is one line on stderr, ``fsmingle: error: ...``.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shlex
import signal
import sys
import time

import typer
import typer.core

try:  # typer >= 0.2x vendors its own click; its exceptions are not click's
    from typer._click import exceptions as click
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click

from .. import options
from .._version import __version__
from ..errors import (
    ConfigError,
    FsmingleError,
    StorageError,
    UnsafeDirectoryError,
    help_lines,
)

log = logging.getLogger("fsmingle")

app = typer.Typer(
    name="fsmingle",
    help="Rendezvous for multi-node PyTorch through a shared directory: no etcd, no known endpoint.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

INTERRUPTED = 130  # SIGINT and SIGTERM alike while waiting; see Terminated
TERMINATED_AFTER_RELEASE = 143  # 128 + SIGTERM: too late to withdraw


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by the SIGTERM handler while a participant waits.

    A KeyboardInterrupt so that it unwinds exactly like Ctrl-C: through
    ``Participant.run``, which withdraws this participant from its generation.
    The command then exits 130 like for SIGINT (documented in
    :func:`fsmingle.errors.exit_codes`): "interrupted while waiting, withdrew
    cleanly" is what a caller needs to know.  After the release the handler
    is :func:`_after_release` (exit 143: too late to withdraw).
    """


def _setup_logging(quiet: bool, verbose: bool) -> None:
    level = logging.ERROR if quiet else logging.DEBUG if verbose else logging.INFO
    logger = logging.getLogger("fsmingle")
    logger.setLevel(level)
    fmt = "fsmingle %(asctime)s.%(msecs)03d %(name)s %(levelname)s: %(message)s" if verbose else "fsmingle: %(message)s"
    for h in logger.handlers:
        h.setFormatter(logging.Formatter(fmt, "%H:%M:%S"))
    if not logger.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter(fmt, "%H:%M:%S"))
        logger.addHandler(h)
        logger.propagate = False


def _fail(e: FsmingleError) -> typer.Exit:
    # One clear line, no traceback: every message says what is wrong and what to do.
    typer.echo(f"fsmingle: error: {e}", err=True)
    return typer.Exit(e.exit_code)


_interrupted: list[str] = []  # the signals that interrupted the wait, for what happens once it returns


def _on_sigterm(signum, frame):
    _interrupted.append("SIGTERM")
    raise Terminated()


def _on_sigint(signum, frame):
    _interrupted.append("SIGINT")
    raise KeyboardInterrupt()


def _after_release(r, signame: str = "SIGTERM"):
    def handler(signum, frame):
        sys.stderr.write(
            f"fsmingle: terminated ({signame}) after job {r.job_id} generation {r.generation} was released "
            "with this participant in it, before its command started; the others will not find it\n"
        )
        sys.stderr.flush()
        os._exit(TERMINATED_AFTER_RELEASE)  # no unwinding: nothing is left to withdraw

    return handler


def _rendezvous(values, want_members: bool = False) -> object:
    """Run the rendezvous for ``run``/``env``; exits the process on failure (one line, documented code).

    ``want_members``: ask rank 0 for the whole member list at release (``env --format hostfile|json``).
    """
    from ..api import rendezvous
    from ..errors import InterruptedInCommitWindow
    from ..protocol.participant import Timing
    from .progress import Reporter, fmt_duration

    _setup_logging(bool(values.quiet), bool(values.verbose))
    _interrupted.clear()
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_sigint)
    reporter = Reporter(quiet=bool(values.quiet))
    t0 = time.monotonic()
    try:
        # status_interval 10 s: a waiting non-coordinator refreshes the "who is missing" line that often.
        r = rendezvous(
            values=values, timing=Timing(status_interval=10.0), on_progress=reporter, want_members=want_members
        )
    except FsmingleError as e:
        reporter.close()
        raise _fail(e)
    except InterruptedInCommitWindow as e:
        reporter.close()
        typer.echo(
            f"fsmingle: {_interrupted[0] if _interrupted else 'interrupted'}: {e}; this participant did not "
            "withdraw (the others may start without it)",
            err=True,
        )
        raise typer.Exit(TERMINATED_AFTER_RELEASE)
    except Terminated:
        reporter.close()
        typer.echo(
            "fsmingle: terminated (SIGTERM) while waiting; this participant withdrew from the rendezvous", err=True
        )
        raise typer.Exit(INTERRUPTED)
    except KeyboardInterrupt:
        reporter.close()
        typer.echo("fsmingle: interrupted (SIGINT); this participant withdrew from the rendezvous", err=True)
        raise typer.Exit(INTERRUPTED)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _interrupted:
        # Interrupted in the commit window, and the release stands with this participant in it
        # (Participant.run read it back): too late to withdraw, and the signal still means stop.
        reporter.close()
        _after_release(r, _interrupted[0])(None, None)
    # Released: the others were released with this participant in their world, so a SIGTERM from
    # here on can no longer withdraw it.  Say exactly that and exit 143 (128 + SIGTERM, what a shell
    # reports); the command, once exec'd, gets SIGTERM's default action again (execve(2)).
    signal.signal(signal.SIGTERM, _after_release(r))
    reporter.close()
    elapsed = time.monotonic() - t0
    where = (
        f"node rank {r.node_rank}/{r.nnodes}"
        if r.mode == "node"
        else f"rank {r.rank}/{r.world_size} (local {r.local_rank}/{r.local_world_size}, node {r.node_rank}/{r.nnodes})"
    )
    log.info(
        "%s released: master %s:%d, %s, generation %d, after %s",
        r.job_id,
        r.master_addr,
        r.master_port,
        where,
        r.generation,
        fmt_duration(elapsed) if elapsed >= 1 else f"{elapsed * 1000:.0f}ms",
    )
    return r


class _PlainArgument(typer.core.TyperArgument):
    """An argument whose help line shows only its metavar (no ``<list[str]>``)."""

    def display_type_rich(self, ctx) -> str:
        return ""


class RunCommand(typer.core.TyperCommand):
    """``fsmingle run``: usage ``fsmingle run [OPTIONS] [--] COMMAND [ARGS]...``."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        for p in self.params:
            if isinstance(p, typer.core.TyperArgument):
                p.__class__ = _PlainArgument

    def collect_usage_pieces(self, ctx) -> list[str]:
        return ["[OPTIONS]", "[--] COMMAND [ARGS]..."]


_COMMAND_ARG = inspect.Parameter(
    "command",
    inspect.Parameter.KEYWORD_ONLY,
    annotation=list[str],
    default=typer.Argument(
        ...,
        metavar="COMMAND [ARGS]...",
        show_default=False,
        help="The command to exec once released, e.g. torchrun --nproc-per-node 4 train.py. "
        "Put -- before it: everything after -- is the command's own.",
    ),
)


RUN_HELP = f"""Wait for the world, then exec COMMAND with MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES and PET_* set.

Per-rank mode (--world-size/--rank) sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE instead of PET_*.

Write -- between fsmingle's options and COMMAND (fsmingle run --nnodes 2 -- torchrun ... train.py). Parsing
stops at the first word of COMMAND anyway, so the command's own flags are never taken for fsmingle's.

Exit codes: {help_lines()}
"""


@app.command(cls=RunCommand, help=RUN_HELP, context_settings={"allow_interspersed_args": False})
@options.rendezvous_command(after=(_COMMAND_ARG,))
def run(values, command: list[str]):
    r = _rendezvous(values)
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


_FORMAT_ARG = inspect.Parameter(
    "format",
    inspect.Parameter.KEYWORD_ONLY,
    annotation=str,
    default=typer.Option(
        "sh",
        "--format",
        help="sh (export lines for eval), json (with every member: rank, host, "
        "address, arrival), dotenv, or hostfile (`host slots=N` per node in rank order, for "
        "deepspeed --hostfile and mpirun --hostfile).",
    ),
)
_SLOTS_ARG = inspect.Parameter(
    "slots",
    inspect.Parameter.KEYWORD_ONLY,
    annotation=int | None,
    default=typer.Option(
        None,
        "--slots",
        min=1,
        metavar="N",
        help="--format hostfile: slots per node [default: --gpus-per-node, else this node's GPU count, else 1].",
    ),
)


@app.command("env")
@options.rendezvous_command(after=(_FORMAT_ARG, _SLOTS_ARG))
def env_cmd(values, format: str, slots: int | None):
    """Wait for the world, then print the result: `eval "$(fsmingle env ...)"`, --format json or hostfile."""
    if format not in ("sh", "json", "dotenv", "hostfile"):
        raise _fail(ConfigError(f"--format {format!r}: choose sh, json, dotenv or hostfile"))
    if slots is not None and format != "hostfile":
        raise _fail(ConfigError(f"--slots applies to --format hostfile only (got --format {format})"))
    if format == "hostfile" and slots is None:
        from .hostfile import default_slots

        slots = default_slots(values.gpus_per_node)  # before joining: nvidia-smi may take seconds
    r = _rendezvous(values, want_members=format in ("json", "hostfile"))
    if format == "hostfile":
        from .hostfile import hostfile

        typer.echo(hostfile(r, slots), nl=False)
    elif format == "json":
        from .hostfile import members_json

        typer.echo(json.dumps({**r.as_dict(), "members": members_json(r)}, sort_keys=True))
    else:
        prefix = "export " if format == "sh" else ""
        for k, v in sorted(r.env().items()):
            typer.echo(f"{prefix}{k}={shlex.quote(v)}")


@app.command()
def status(
    job_id: str | None = typer.Argument(None, help="One job to show in detail; omit to list all jobs."),
    dir: str | None = options.typer_option(options.get("dir")),
    stale_after: float = options.typer_option(options.get("stale_after")),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    watch: bool = typer.Option(False, "--watch", help="Refresh every --interval seconds until Ctrl-C."),
    interval: float = typer.Option(2.0, "--interval", help="Seconds between refreshes with --watch."),
    timeline: bool = typer.Option(
        False, "--timeline", help="Draw the released members' arrivals on a time axis (who was slow)."
    ),
    plot: str | None = typer.Option(
        None,
        "--plot",
        metavar="FILE.png",
        help="Also draw the arrivals into a PNG picture (needs matplotlib: pip install 'fsmingle[plot]').",
    ),
):
    """Show jobs, generations and participants. Exit 0 if the (newest) generation is released, else 1.

    A participant on this host is judged by its process (alive, or exited); one on another host by the age
    of its heartbeat against --stale-after (the rendezvous's own rule), so use the --stale-after of the job.
    """
    from .status import status_main

    _setup_logging(False, False)
    raise typer.Exit(
        status_main(dir, job_id, as_json, watch, interval, stale_after=stale_after, timeline=timeline, plot=plot)
    )


@app.command()
def clean(
    job_id: str | None = typer.Argument(None, help="Job to clean; omit to clean every job of yours under --dir."),
    dir: str | None = options.typer_option(options.get("dir")),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be removed."),
    stale_after: float = typer.Option(
        0.0,
        "--stale-after",
        help="Watch remote heartbeats this many seconds to "
        "judge them dead (0: a generation with remote participants is kept).",
    ),
):
    """Remove stale generations: old decided ones and those whose participants are all dead.

    Never touches a generation with a live participant. Without JOB_ID, job directories of other users are
    skipped with a note on stderr (exit 0); a JOB_ID that is not yours is exit 4.
    """
    from ..fs.jobdir import check_owned_dir
    from ..fs.layout import validate_job_id
    from ..fs.store import PosixStore
    from ..protocol.cleanup import clean_job

    _setup_logging(False, False)
    base = dir or os.environ.get("FSMINGLE_DIR")
    try:
        if not base:
            raise ConfigError("no rendezvous directory: pass --dir or set FSMINGLE_DIR")
        jobs = (
            [validate_job_id(job_id)]
            if job_id
            else sorted(n for n in os.listdir(base) if not n.startswith(".") and os.path.isdir(os.path.join(base, n)))
        )
        for j in jobs:
            path = os.path.join(base, j)
            if not os.path.isdir(path):
                raise ConfigError(f"no job {j!r} under {base}")
            try:
                check_owned_dir(path, "job directory")
            except UnsafeDirectoryError as e:
                if job_id:
                    raise
                typer.echo(f"fsmingle: skipping {e}", err=True)
                continue
            for g, why in clean_job(PosixStore(path), stale_after=stale_after, dry_run=dry_run):
                typer.echo(f"{'would remove' if dry_run else 'removed'} {j}/gen-{g:08d}: {why}")
    except FsmingleError as e:
        raise _fail(e)
    except OSError as e:
        raise _fail(
            StorageError(
                f"cannot read --dir {base}: {e.strerror}; check --dir (and that the shared "
                "filesystem is mounted on this node)"
            )
        )


@app.command()
def demo(
    script: str | None = typer.Option(None, "--script", help="Training script [default: examples/train_ddp.py]."),
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
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."
    ),
):
    """Rendezvous for multi-node PyTorch through a shared directory."""


def _usage_hint(e: click.ClickException) -> str:
    ctx = getattr(e, "ctx", None)
    return f"; see `{ctx.command_path} --help`" if ctx is not None else "; see `fsmingle --help`"


def _click_failure(e: click.ClickException) -> tuple[str, int]:
    """click's error as fsmingle's one line and exit code (most specific class first)."""
    if isinstance(e, click.MissingParameter):  # a BadParameter, but a usage error: exit 2
        return e.format_message().rstrip(".") + _usage_hint(e), 2
    if isinstance(e, options.BadOptionValue):
        # Option.parse already wrote the whole line: the flag, the value, what to give instead.
        return e.message, ConfigError.exit_code
    if isinstance(e, click.BadParameter):
        return e.format_message(), ConfigError.exit_code
    if isinstance(e, click.UsageError):
        return e.format_message().rstrip(".") + _usage_hint(e), 2
    return e.format_message(), e.exit_code


def main(argv: list[str] | None = None, prog_name: str | None = None) -> None:
    """Console-script entry point: every failure is one line and a code of :func:`fsmingle.errors.exit_codes`.

    click's own errors are reworded into that line: a value an option refuses
    (``--nnodes two``) is exit 3 like every other invalid value; an unknown
    option or a missing argument is a usage error, exit 2.
    """
    try:
        rv = app(args=argv, standalone_mode=False, prog_name=prog_name)
    except click.NoArgsIsHelpError as e:
        e.show()
        sys.exit(e.exit_code)
    except click.ClickException as e:
        message, code = _click_failure(e)
        typer.echo(f"fsmingle: error: {message}", err=True)
        sys.exit(code)
    except typer.Abort:
        typer.echo("fsmingle: aborted", err=True)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)


@app.command("check")
def check_cmd(
    dir: str | None = typer.Option(
        None, "--dir", envvar="FSMINGLE_DIR", help="Directory to examine (the --dir of run/env)."
    ),
    peers: int = typer.Option(
        1, "--peers", help="Run on this many nodes at once to prove cross-node exclusivity and measure visibility."
    ),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the other peers."),
    session: str = typer.Option("default", "--session", help="Scratch rendezvous name in DIR, the same on every peer."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts instead of a table."),
):
    """Examine DIR's filesystem: type, mount options, link()/rename()/O_EXCL probed for real, owner, a verdict and the
    --stale-after/--poll-max to use.  Exit 0 usable (ok or local), 10 unsafe; 3 bad option, 5 unusable dir, 7 peers missing."""
    from ..fs.fscheck import main as check_main

    raise typer.Exit(check_main(dir, peers, timeout, session, as_json))


if __name__ == "__main__":
    main()
