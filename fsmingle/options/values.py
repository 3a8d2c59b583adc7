"""The option values of one rendezvous (:class:`Values`) and their validation as a whole (:func:`validate`).

:class:`Values` is generated from :data:`fsmingle.options.OPTIONS`: one frozen field per row.
:func:`validate` checks each value with its row and the combinations no single row can judge
(``--poll-max`` against ``--stale-after``; an ``--addr`` that is no address of this host).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

from ..errors import ConfigError
from .table import OPTIONS, POLL_MAX_DEFAULT

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
