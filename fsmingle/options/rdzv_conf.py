"""The options the torchrun backend reads from ``--rdzv-conf`` (rows with a ``conf_key``).

The backend's own keys (``join_timeout``, ...) are declared in :mod:`fsmingle.torchrun.conf`;
the keys here mean the same as an fsmingle flag and are parsed by that flag's row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .table import OPTIONS
from .values import _is_local, local_addresses


def from_rdzv_conf(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Parse the torchrun ``--rdzv-conf`` keys that are fsmingle options (``addr``, ``iface``, ``addr_not_local``,
    ``peer_jobs``, ``queue_timeout``, ``queue_poll``).

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
