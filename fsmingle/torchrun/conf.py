"""``--rdzv-conf`` keys of the ``fsmingle`` torchrun backend, declared once.

Two kinds of keys:

* torch's own keys of its dynamic rendezvous (``torch/distributed/elastic/
  rendezvous/dynamic_rendezvous.py``, ``create_handler``), spelled as torch
  spells them, plus ``read_timeout``: the :data:`TORCH_KEYS` table below.
  They have no ``fsmingle run`` counterpart (``--timeout`` bounds a whole
  rendezvous of the beacon protocol, ``join_timeout`` torch's round), so they
  are declared here and not in :mod:`fsmingle.options`.
* Keys that are fsmingle options (``addr``, ``iface``, ``addr_not_local``, ``peer_jobs``,
  ``queue_timeout``, ``queue_poll``):
  parsed by :func:`fsmingle.options.from_rdzv_conf`, the one declaration the
  CLI and the Python API use too.

The docs' table in ``docs/torchrun-backend.md`` is :func:`markdown_table`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import options
from ..errors import ConfigError
from ..net.netaddr import choose_address
from .codec import ADDR_RE


@dataclass(frozen=True)
class ConfKey:
    """One integer ``--rdzv-conf`` key (seconds or a count)."""

    name: str
    default: int | None  # None: torch's default (RendezvousTimeout._DEFAULT_TIMEOUTS)
    shown_default: int
    minimum: int
    help: str


TORCH_KEYS: tuple[ConfKey, ...] = (
    ConfKey(
        "join_timeout", None, 600, 1, "the rendezvous must complete within this time, else `RendezvousTimeoutError`"
    ),
    ConfKey("last_call_timeout", None, 30, 1, "once `MIN` nodes joined, wait this much longer for more (up to `MAX`)"),
    ConfKey("close_timeout", None, 30, 1, 'time to write "closed" at shutdown'),
    ConfKey(
        "heartbeat_timeout",
        None,
        5,
        1,
        "torch's time limit for one keep-alive write of the shared state; accepted, but unused here: "
        "keep-alives are heartbeat files",
    ),
    ConfKey("keep_alive_interval", 5, 5, 1, "seconds between a node's heartbeat-file writes"),
    ConfKey(
        "keep_alive_max_attempt",
        3,
        3,
        1,
        "a node whose heartbeat counter has not grown for `interval × attempts` (15 s) on the observer's clock is dead",
    ),
    ConfKey("read_timeout", 60, 60, 1, "how long agents wait for rank 0's store address; also the TCPStore timeout"),
)
_OPTION_KEYS = {o.conf_key for o in options.OPTIONS if o.conf_key}
# "timeout" is added by torchrun's LaunchConfig for etcd; not used here.
KNOWN_KEYS = frozenset({k.name for k in TORCH_KEYS} | _OPTION_KEYS | {"timeout", "store"})
STORE_KINDS = ("tcp", "folder")
STORE_HELP = (
    "the agents' c10d store: `tcp`, a TCPStore on the round's rank-0 agent; `folder`, a FolderStore in the run "
    "directory (`agentstore-<E>-<R>/`, the newest 4 kept; docs/folderstore.md): agents need no port of rank 0's for it. Workers "
    "still get `MASTER_ADDR`/`MASTER_PORT` (rank 0's agent hosts their TCPStore), and NCCL still opens its own "
    "TCP connections between nodes"
)


@dataclass(frozen=True)
class RdzvConf:
    """Checked ``--rdzv-conf`` values (seconds; None = torch's default)."""

    join_timeout: int | None
    last_call_timeout: int | None
    close_timeout: int | None
    heartbeat_timeout: int | None
    keep_alive_interval: int
    keep_alive_max_attempt: int
    read_timeout: int
    addr: str
    store: str = "tcp"

    @property
    def liveness_s(self) -> float:
        """``keep_alive_interval * keep_alive_max_attempt``: torch's death rule, in seconds."""
        return float(self.keep_alive_interval * self.keep_alive_max_attempt)


def _int(params: Any, k: ConfKey) -> int | None:
    try:
        v = params.get_as_int(k.name, k.default)
    except ValueError:
        raise ConfigError(f"--rdzv-conf {k.name}={params.get(k.name)!r} is not a whole number of seconds") from None
    if v is not None and v < k.minimum:
        raise ConfigError(f"--rdzv-conf {k.name}={v} must be at least {k.minimum}")
    return v


def parse(params: Any) -> RdzvConf:
    """Check every ``--rdzv-conf`` key and choose the announced address.

    Args:
        params (RendezvousParameters): torchrun's parameters (``config`` and ``local_addr``).

    Returns:
        RdzvConf: the values.

    Raises:
        ConfigError: a value is not an integer or below its minimum, ``addr``
            is not an IP address of this host (without ``addr_not_local``),
            ``iface`` does not exist, or ``--local-addr`` is malformed.
    """
    values = {k.name: _int(params, k) for k in TORCH_KEYS}
    store = str(params.config.get("store") or "tcp")
    if store not in STORE_KINDS:
        raise ConfigError(f"--rdzv-conf store={store!r} is not one of {', '.join(STORE_KINDS)}")
    return RdzvConf(**values, addr=_local_addr(params), store=store)


def _local_addr(params: Any) -> str:
    # Order: addr, torchrun's --local-addr, iface / NCCL_SOCKET_IFNAME /
    # GLOO_SOCKET_IFNAME, default route (fsmingle.net.netaddr.choose_address).
    opts = options.from_rdzv_conf(params.config)
    if opts.get("addr"):
        return choose_address(addr=opts["addr"])
    if params.local_addr:
        if not ADDR_RE.match(params.local_addr):
            raise ConfigError(f"--local-addr {params.local_addr!r} is not a host name or IP address")
        return params.local_addr
    return choose_address(iface=opts.get("iface"))


def markdown_table() -> str:
    """The table of torch's keys for ``docs/torchrun-backend.md``."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    rows += [f"| `{k.name}` | {k.shown_default} | {k.help} |" for k in TORCH_KEYS]
    rows.append(f"| `store` | tcp | {STORE_HELP} |")
    for o in options.OPTIONS:
        if o.conf_key:
            rows.append(f"| `{o.conf_key}` | {_shown_default(o)} | {o.help} |")
    return "\n".join(rows) + "\n"


def _shown_default(o: options.Option) -> str:
    if o.default_text:
        return o.default_text
    if isinstance(o.default, bool):
        return str(o.default).lower()
    return "—" if o.default is None else f"{o.default:g}" if isinstance(o.default, float) else str(o.default)
