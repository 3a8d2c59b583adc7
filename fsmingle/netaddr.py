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

The master port is held open by rank 0 from the moment it claims rank 0 until
it execs the command: the socket is close-on-exec, so the port is free exactly
when torch binds it, and a peer about to write the release can connect to it to
prove the master is alive *and* reachable -- the server answers with its
instance id, so a different process on a reused port is told apart.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import threading

import psutil

from .errors import ConfigError

log = logging.getLogger("fsmingle.net")

HANDSHAKE_PREFIX = b"fsmingle "


def _ipv4_of(iface: str) -> str | None:
    for a in psutil.net_if_addrs().get(iface, []):
        if a.family == socket.AF_INET:
            return a.address
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
            raise ConfigError(f"--addr {addr!r} is not an IP address; give the IP other nodes reach this one at") from None
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
            ip = _ipv4_of(name)
            if ip:
                return ip
        raise ConfigError(
            f"{source} {iface!r}: no such interface with an IPv4 address on this host "
            f"(have: {', '.join(sorted(ifaces))}); pass an existing --iface or --addr"
        )
    dr = default_route_iface()
    if dr:
        ip = _ipv4_of(dr)
        if ip:
            return ip
    stats = psutil.net_if_stats()
    for name in sorted(psutil.net_if_addrs()):
        st = stats.get(name)
        ip = _ipv4_of(name)
        if ip and st and st.isup and not ipaddress.ip_address(ip).is_loopback:
            return ip
    return "127.0.0.1"


class PortReservation:
    """Holds a listening TCP port for the master until exec, answering liveness probes.

    The socket is bound on all interfaces (as torch's TCPStore binds), with
    ``SO_REUSEADDR`` and close-on-exec, so the port is free for torch at exec.
    A daemon thread answers each connection with ``b"fsmingle <instance>\\n"``
    and waits for the prober to close first (leaving TIME_WAIT on the prober,
    not on the port torch is about to bind).

    Args:
        port (int): the port to hold; 0 picks a free one.
        instance (str): our instance id, sent to probers.

    Raises:
        ConfigError: the port is in use on this host.
    """

    def __init__(self, port: int, instance: str):
        self.instance = instance
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind(("", port))
        except OSError as e:
            self._sock.close()
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"--port {port} is already in use on this host; choose another --port or omit it") from None
            raise ConfigError(f"cannot bind port {port}: {e.strerror}") from None
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fsmingle-master-port", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                conn.settimeout(2.0)
                conn.sendall(HANDSHAKE_PREFIX + self.instance.encode() + b"\n")
                conn.recv(1)  # wait for the prober's close
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        """Stop answering and free the port."""
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def probe_master(addr: str, port: int, instance: str, timeout: float = 2.0) -> bool | None:
    """Connect to a master's held port and check it answers with ``instance``.

    Returns:
        bool | None: True if the expected process answered; False if the
        connection was refused or another process answered (the master is
        gone); None if nothing answered within ``timeout`` seconds (unreachable
        from here: a firewall or the wrong interface; undecided).
    """
    try:
        with socket.create_connection((addr, port), timeout=timeout) as s:
            s.settimeout(timeout)
            buf = b""
            while not buf.endswith(b"\n") and len(buf) < 128:
                chunk = s.recv(128)
                if not chunk:
                    break
                buf += chunk
            return buf == HANDSHAKE_PREFIX + instance.encode() + b"\n"
    except ConnectionRefusedError:
        return False
    except (socket.timeout, TimeoutError):
        return None
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return None
        return False
