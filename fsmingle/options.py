"""Every rendezvous option, declared once: :data:`OPTIONS`.

One :class:`Option` row holds an option's name, its command-line flags
(torchrun's spelling first where the two overlap), type, default, unit, the
environment variables it falls back to, its validation and its help text.
Everything else is derived from the table:

* the ``fsmingle run`` / ``fsmingle env`` options (:func:`typer_parameters`,
  :func:`rendezvous_command`), which hand the command one :class:`Values`;
* the keyword parameters of :func:`fsmingle.rendezvous` (:func:`api_signature`);
* the option table of ``docs/cli.md`` (:func:`markdown_table`, kept in sync by
  ``tests/test_docs.py``);
* the torchrun backend's ``--rdzv-conf`` keys that mean the same thing
  (:func:`from_rdzv_conf`);
* the scheduler fallbacks :func:`fsmingle.config.resolve` reads (``Option.env``).

**Adding an option** = one ``Option(...)`` row below, plus the code that uses
its value (``values.<name>`` in :mod:`fsmingle.api`).  The model is submitit's
single source of parameters: in ``submitit/slurm/slurm.py`` the ``sbatch``
options are the keyword parameters of ``_make_sbatch_string`` and
``_get_default_parameters`` reads them back with ``inspect``; its
``JobEnvironment`` classes map names to scheduler variables in a table
(``_env``).  A signature carries only a name and a default, and fsmingle
needs flags, a unit, fallbacks and a check per option, so here the table is
the source and the signatures (CLI and API) are generated from it.

Nothing here imports torch, and click/typer only inside the functions that
build the command line.
"""

from __future__ import annotations

import dataclasses
import inspect
import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = [
    "OPTIONS",
    "Option",
    "Values",
    "api_signature",
    "from_rdzv_conf",
    "get",
    "local_addresses",
    "markdown_table",
    "rendezvous_command",
    "typer_parameters",
    "validate",
]


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
    from .decision import RANK_ORDERS

    return None if v in RANK_ORDERS else f"{v!r} is not one of {', '.join(RANK_ORDERS)}"


def _job_id(v: str) -> str | None:
    if not v:
        return None  # empty: fall back to the environment (config.resolve says what is missing)
    from .config import (
        validate_job_id,  # config imports this module; import here to avoid a cycle
    )

    validate_job_id(v)  # raises ConfigError with its own complete message
    return None


@dataclass(frozen=True)
class Option:
    """One option of the rendezvous (a row of :data:`OPTIONS`).

    Attributes:
        name (str): Python name: ``Values`` field and :func:`fsmingle.rendezvous` keyword.
        flags (tuple[str, ...]): command-line spellings, the canonical one first.
        type (type): ``int``, ``float``, ``str`` or ``bool`` (a flag).
        help (str): one or two sentences for ``--help`` and ``docs/cli.md``.
        default (Any): value when neither the flag nor a fallback is set (None: unset).
        unit (str): ``"s"`` for seconds, else "".
        env (tuple[str, ...]): environment variables it falls back to, first set wins
            (read by :func:`fsmingle.config.resolve` / :mod:`fsmingle.netaddr`).
        envvar (str | None): the one variable click itself reads for the flag (shown in ``--help``).
        check (Callable | None): ``check(value) -> str | None``: what is wrong with a value.
        conf_key (str | None): the torchrun ``--rdzv-conf`` key with the same meaning.
        cli_only (bool): not a keyword of :func:`fsmingle.rendezvous` (output settings).
        default_text (str | None): how the default reads in help and docs when it is computed.
        metavar (str | None): placeholder in usage lines (default: from the type).
    """

    name: str
    flags: tuple[str, ...]
    type: type
    help: str
    default: Any = None
    unit: str = ""
    env: tuple[str, ...] = ()
    envvar: str | None = None
    check: Callable[[Any], str | None] | None = None
    conf_key: str | None = None
    cli_only: bool = False
    default_text: str | None = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def type_name(self) -> str:
        """Placeholder for the value: ``SECONDS``, ``INT``, ``IP``..."""
        if self.metavar:
            return self.metavar
        return "SECONDS" if self.unit == "s" else {int: "INT", float: "FLOAT", str: "TEXT"}.get(self.type, "")

    def parse(self, raw: Any, source: str | None = None) -> Any:
        """Convert ``raw`` (a string from the command line, the environment or ``--rdzv-conf``) and check it.

        Args:
            raw: the value; None passes through; values already of ``type`` are only checked.
            source (str | None): how the user gave it, for the message (default: the flag).

        Returns:
            The value as ``self.type``.

        Raises:
            ConfigError: not convertible, or ``check`` refuses it; one line naming ``source``.
        """
        if raw is None:
            return None
        source = source or self.flag
        value = raw
        if self.type is bool:
            if not isinstance(raw, bool):
                text = str(raw).strip().lower()
                if text not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ConfigError(f"{source} {raw!r} is not a yes/no value; give true or false")
                value = text in ("1", "true", "yes", "on")
        elif not (isinstance(raw, self.type) and not isinstance(raw, bool)) and not (
            self.type is float and isinstance(raw, int) and not isinstance(raw, bool)
        ):
            try:
                value = self.type(str(raw).strip())
            except ValueError:
                what = {int: "a whole number", float: "a number"}.get(self.type, self.type.__name__)
                example = "29500" if self.name == "port" else {int: "2", float: "30"}.get(self.type, "")
                raise ConfigError(
                    f"{source} {raw!r} is not {what}" + (f"; give e.g. {source} {example}" if example else "")
                ) from None
        if self.type is float:
            value = float(value)
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ConfigError(f"{source} {problem}" if not problem.startswith(source) else problem)
        return value


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


#: All option values of one rendezvous, one field per row of :data:`OPTIONS` (frozen).
Values = dataclasses.make_dataclass(
    "Values", [(o.name, o.type | None, dataclasses.field(default=o.default)) for o in OPTIONS], frozen=True
)
Values.__module__ = __name__
Values.__doc__ = "The option values of one rendezvous; one field per row of fsmingle.options.OPTIONS."


def local_addresses() -> list[str]:
    """Every IP address assigned to an interface of this host (``psutil.net_if_addrs``), sorted."""
    import psutil

    out = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name in ("AF_INET", "AF_INET6"):
                out.add(a.address.split("%", 1)[0])
    return sorted(out)


def _is_local(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    # The whole of 127.0.0.0/8 answers on lo although only 127.0.0.1 is listed.
    return ip.is_loopback or any(ipaddress.ip_address(a) == ip for a in local_addresses())


def validate(values: Any) -> Any:
    """Check every value and the combinations that cannot work; fill computed defaults.

    Args:
        values (Values): as given (None: unset).

    Returns:
        Values: checked; ``poll_max`` filled in (0.28 s, or ``stale_after``/4 if smaller).

    Raises:
        ConfigError: a value its option refuses (the message names the flag);
            ``--poll-max`` above ``--stale-after``/4 (a participant that reads
            that rarely is judged dead by the others: the rule of
            ``Timing.heartbeat_period`` = stale_after/3 leaves no margin); an
            ``--addr`` that is no address of this host without ``--addr-not-local``.
    """
    changes = {}
    for o in OPTIONS:
        v = getattr(values, o.name)
        if v is None and o.default is not None:
            v = o.default
        changes[o.name] = o.parse(v) if v is not None else None
    v = dataclasses.replace(values, **changes)
    limit = v.stale_after / 4
    if v.poll_max is None:
        v = dataclasses.replace(v, poll_max=min(POLL_MAX_DEFAULT, limit))
    elif v.poll_max > limit:
        raise ConfigError(
            f"--poll-max {v.poll_max:g} is too long for --stale-after {v.stale_after:g}: it must be at most "
            f"--stale-after/4 = {limit:g} s, or waiting participants are judged dead; lower --poll-max or "
            "raise --stale-after"
        )
    if v.addr is not None and not v.addr_not_local and not _is_local(v.addr):
        raise ConfigError(
            f"--addr {v.addr} is not an address of this host (this host has: {', '.join(local_addresses())}); "
            "give one of them, or add --addr-not-local if a NAT or port forward sends that address here"
        )
    return v


# ---------------------------------------------------------------- the Python API


def api_signature(
    first: tuple[str, ...] = ("dir", "job_id"), extra: tuple[inspect.Parameter, ...] = ()
) -> inspect.Signature:
    """Signature of :func:`fsmingle.rendezvous`: ``first`` positional-or-keyword, every other option keyword-only.

    Every option defaults to None ("unset": its fallbacks and default apply).
    """
    params = [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=get(n).type | None)
        for n in first
    ]
    params += [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=o.type | None)
        for o in OPTIONS
        if not o.cli_only and o.name not in first
    ]
    return inspect.Signature(params + list(extra))


def api_docs() -> str:
    """The option keywords, one line each, for the docstring of :func:`fsmingle.rendezvous`."""
    lines = []
    for o in OPTIONS:
        if o.cli_only:
            continue
        default = o.default_text or (
            f"{o.default:g} {o.unit}".strip() if isinstance(o.default, float) else repr(o.default)
        )
        env = f" Falls back to {', '.join(o.env)}." if o.env else ""
        lines.append(f"        {o.name} ({o.type.__name__} | None): {o.help} ``{o.flag}``; default {default}.{env}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the torchrun backend


def from_rdzv_conf(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Parse the torchrun ``--rdzv-conf`` keys that are fsmingle options (``addr``, ``iface``, ``addr_not_local``).

    Args:
        conf (Mapping[str, Any]): torch's ``RendezvousParameters.config``.

    Returns:
        dict[str, Any]: option name -> checked value, for the keys present.

    Raises:
        ConfigError: a value its option refuses; the message names ``--rdzv-conf KEY=VALUE``.
    """
    out = {}
    for o in OPTIONS:
        if o.conf_key and conf.get(o.conf_key) not in (None, ""):
            raw = conf[o.conf_key]
            out[o.name] = o.parse(raw, source=f"--rdzv-conf {o.conf_key}=")
    if out.get("addr") and not out.get("addr_not_local") and not _is_local(out["addr"]):
        raise ConfigError(
            f"--rdzv-conf addr={out['addr']} is not an address of this host (this host has: "
            f"{', '.join(local_addresses())}); add addr_not_local=true behind a NAT or port forward"
        )
    return out


# ---------------------------------------------------------------- the command line


def _parser(o: Option) -> Callable[[str], Any]:
    """typer ``parser=`` for a row: :meth:`Option.parse`, a refusal as :class:`BadOptionValue`."""

    def parse(raw: str) -> Any:
        try:
            return o.parse(raw)
        except ConfigError as e:
            raise BadOptionValue(str(e)) from None

    parse.__name__ = o.type_name.lower()
    return parse


def _bad_option_value_class():
    import typer

    class BadOptionValue(typer.BadParameter):
        """A value an option refused; ``message`` is the whole line (``cli.main``: exit 3)."""

    return BadOptionValue


def typer_option(o: Option):
    """The ``typer.Option`` of one row (its help ends with the fallbacks and the computed default)."""
    import typer

    text = o.help
    if o.env and o.envvar is None:
        text += f" [env: {', '.join(o.env)}]"
    if o.default_text:
        text += f" [default: {o.default_text}]"
    kw: dict[str, Any] = {"help": text, "envvar": o.envvar}
    if o.type is not bool:
        kw["parser"] = _parser(o)
        kw["metavar"] = o.type_name
    return typer.Option(o.default, *o.flags, **kw)


def typer_parameters(names: tuple[str, ...] | None = None) -> list[inspect.Parameter]:
    """``inspect.Parameter`` objects (defaults are ``typer.Option``) for the rows ``names`` (default: all)."""
    return [
        inspect.Parameter(
            o.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer_option(o),
            annotation=(bool if o.type is bool else o.type | None),
        )
        for o in OPTIONS
        if names is None or o.name in names
    ]


def rendezvous_command(before: tuple[inspect.Parameter, ...] = (), after: tuple[inspect.Parameter, ...] = ()):
    """Decorator: give a command function every option as a typer parameter; it receives one ``Values``.

    The decorated ``func(values, **others)`` gets ``values`` (:class:`Values`,
    unvalidated: what the user typed) and its own parameters ``before`` /
    ``after`` by name.  typer reads the generated signature.
    """

    def deco(func):
        own = [p.name for p in (*before, *after)]
        params = list(before) + typer_parameters() + list(after)

        def command(**kw):
            values = Values(**{o.name: kw.pop(o.name) for o in OPTIONS})
            return func(values, **{k: kw[k] for k in own})

        command.__name__ = func.__name__
        command.__qualname__ = func.__qualname__
        command.__doc__ = func.__doc__
        command.__module__ = func.__module__
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return deco


BadOptionValue = _bad_option_value_class()


# ---------------------------------------------------------------- docs


def markdown_table() -> str:
    """The option table of ``docs/cli.md``: flags, value, default, fallbacks, torchrun key, meaning."""
    rows = ["| option | value | default | falls back to | `--rdzv-conf` key | meaning |", "|---|---|---|---|---|---|"]
    for o in OPTIONS:
        flags = ", ".join(f"`{f}`" for f in o.flags)
        value = "" if o.type is bool else f"`{o.type_name}`"
        if o.default_text:
            default = o.default_text
        elif o.type is bool:
            default = "off"
        elif o.default is None:
            default = "—"
        else:
            default = f"{o.default:g}" if isinstance(o.default, float) else str(o.default)
        env = ", ".join(f"`{e}`" for e in o.env) or "—"
        key = f"`{o.conf_key}`" if o.conf_key else "—"
        rows.append(f"| {flags} | {value} | {default} | {env} | {key} | {o.help.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
