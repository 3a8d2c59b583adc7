"""Choosing the address this node announces, holding the master port, and probing the master.

Address choice (``choose_address``), in order:

1. ``--addr IP``: used as given (must be an IP literal assigned here or not --
   we trust the user, e.g. a pod IP from the downward API).
2. ``--iface NAME``, else ``NCCL_SOCKET_IFNAME``, else ``GLOO_SOCKET_IFNAME``:
   the first IPv4 address of that interface (for the NCCL variables only the
   first comma-separated name without ``^``/``=`` prefixes is used).
3. The interface of the IPv4 default route (``/proc/net/route``).
4. With no default route (many compute nodes, network namespaces): the one
   non-loopback interface that is up; if several, the first by name.
5. Loopback, only when nothing else exists (a single-machine job).

IPv6: where an interface has no IPv4 address, its first global (or unique
local) IPv6 address is used; link-local ``fe80::`` addresses are skipped (they
need a scope id that other hosts cannot use).  The master port is held by
:class:`fsmingle.net.channel.Hub`, in the family of the announced address.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket

import psutil

from ..errors import ConfigError

log = logging.getLogger("fsmingle.net")

HANDSHAKE_PREFIX = b"fsmingle "


def _ip_of(iface: str) -> str | None:
    """The interface's first IPv4 address, else its first usable IPv6 address."""
    addrs = psutil.net_if_addrs().get(iface, [])
    for a in addrs:
        if a.family == socket.AF_INET:
            return a.address
    for a in addrs:
        if a.family == socket.AF_INET6:
            ip = ipaddress.ip_address(a.address.split("%")[0])
            if not (ip.is_link_local or ip.is_loopback or ip.is_multicast):
                return str(ip)
    return None


def _ipv6_default_route_iface() -> str | None:
    # /proc/net/ipv6_route: dest, dest-len, ..., flags (col 8), iface (last); ::/0 is the default.
    try:
        with open("/proc/net/ipv6_route") as f:
            for line in f:
                parts = line.split()
                if (
                    len(parts) >= 10
                    and parts[0] == "0" * 32
                    and parts[1] == "00"
                    and parts[9] != "lo"
                    and int(parts[8], 16) & 1
                ):  # RTF_UP
                    return parts[9]
    except (OSError, ValueError):
        pass
    return None


def default_route_iface() -> str | None:
    """Name of the interface carrying the IPv4 default route, from ``/proc/net/route``; None if none."""
    try:
        with open("/proc/net/route") as f:
            next(f)
            for line in f:
                parts = line.split()
                if len(parts) > 3 and parts[1] == "00000000" and int(parts[3], 16) & 1:  # RTF_UP
                    return parts[0]
    except (OSError, StopIteration, ValueError):
        pass
    return None


def _nccl_ifname(value: str) -> str | None:
    # NCCL_SOCKET_IFNAME syntax: comma list; "^" excludes, "=" means exact match.
    for item in value.split(","):
        item = item.strip()
        if item and not item.startswith("^"):
            return item.lstrip("=")
    return None


def choose_address(addr: str | None = None, iface: str | None = None, env: dict | None = None) -> str:
    """Pick the IP address this participant announces (see the module doc for the order).

    Args:
        addr (str | None): explicit ``--addr``.
        iface (str | None): explicit ``--iface``.
        env (dict | None): environment to read ``NCCL_SOCKET_IFNAME`` /
            ``GLOO_SOCKET_IFNAME`` from (default ``os.environ``).

    Returns:
        str: an IPv4 or IPv6 literal.

    Raises:
        ConfigError: ``addr`` is not an IP literal, or the requested interface
            does not exist or has no IPv4 address.
    """
    env = os.environ if env is None else env
    if addr:
        try:
            return str(ipaddress.ip_address(addr))
        except ValueError:
            raise ConfigError(
                f"--addr {addr!r} is not an IP address; give the IP other nodes reach this one at"
            ) from None
    source = "--iface"
    if not iface:
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            if env.get(var):
                iface, source = _nccl_ifname(env[var]), var
                if iface:
                    break
    if iface:
        ifaces = psutil.net_if_addrs()
        # NCCL treats a name as a prefix unless "=" is given: eth matches eth0.
        cands = [iface] if iface in ifaces else sorted(n for n in ifaces if n.startswith(iface))
        for name in cands:
            ip = _ip_of(name)
            if ip:
                return ip
        raise ConfigError(
            f"{source} {iface!r}: no such interface with an IPv4 or global IPv6 address on this host "
            f"(have: {', '.join(sorted(ifaces))}); pass an existing --iface or --addr"
        )
    dr = default_route_iface() or _ipv6_default_route_iface()
    if dr:
        ip = _ip_of(dr)
        if ip:
            return ip
    stats = psutil.net_if_stats()
    for name in sorted(psutil.net_if_addrs()):
        st = stats.get(name)
        ip = _ip_of(name)
        if ip and st and st.isup and not ipaddress.ip_address(ip).is_loopback:
            return ip
    return "127.0.0.1"


SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def socket_ifname_env(iface: str, environ=None) -> dict[str, str]:
    """The interface variables to hand NCCL and gloo: ``{var: iface}`` for each of
    :data:`SOCKET_IFNAME_VARS` that ``environ`` (default ``os.environ``) leaves unset or empty.

    The address a node announced is the one its peers reach it on, so the collectives must
    bind the interface that carries it; otherwise NCCL/gloo pick their own (NCCL: the first
    interface not ``lo``/``docker``, gloo: the address its hostname resolves to -- often
    loopback), the commonest multi-node failure (NCCL issues 913, 1581).  A value the user set
    is theirs and is never replaced.

    Args:
        iface (str): interface name; "" (none carries the announced address) gives ``{}``.
        environ (Mapping[str, str] | None): where the user's settings are read.

    Returns:
        dict[str, str]: the variables to export (possibly empty).
    """
    environ = os.environ if environ is None else environ
    return {var: iface for var in SOCKET_IFNAME_VARS if iface and not environ.get(var)}


def interface_of(addr: str) -> str | None:
    """Name of the local interface that has ``addr`` (e.g. ``eth0``); None if none has it,
    or if ``addr`` is a host name (torchrun's ``--local-addr`` may be one), not an IP address."""
    try:
        want = ipaddress.ip_address(addr.split("%")[0])
    except ValueError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    if ipaddress.ip_address(a.address.split("%")[0]) == want:
                        return name
                except ValueError:
                    continue
    return None
