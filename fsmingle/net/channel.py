"""The direct channel: rank 0 and every member prove to each other, over TCP, that they are alive and reachable.

Protocol v2 keeps the shared filesystem for what only it can do -- discovery without a known
endpoint, exclusive rank claims and the durable decision record -- and moves liveness and the
release itself onto a TCP connection from each member to rank 0, on the master address and port
that NCCL/gloo use a second later.  A connection that exists proves both ends are reachable on
exactly that path; a silent connection proves nothing, so silence is judged as failure.

Wire format: newline-terminated UTF-8 JSON objects, each at most
:data:`MAX_LINE` bytes, with a type field ``t``.  ``ping`` messages are sent
by the I/O layer whenever a connection has been quiet for ``ping_interval``
seconds and are consumed there: the policy only sees :meth:`silent_for`, the
seconds since the peer last sent anything.

Both ends are event-driven (:mod:`selectors`, non-blocking sockets), never a thread per
connection, so rank 0 can hold thousands of members; the open-file soft limit is raised towards
the hard limit when rank 0 starts listening, and the hub never holds more connections than that
limit less what the filesystem needs (:mod:`fsmingle.net.fdlimit`; rank 0 sheds unanswered ones
first, :mod:`fsmingle.protocol.rank0.door`).

The classes here are the real implementation of :class:`Transport`; the model
tests swap in an in-memory network with the same interface.
"""

from __future__ import annotations

import abc
import enum
import errno
import ipaddress
import logging
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError, StorageError
from . import ports
from .fdlimit import connection_room, ensure_fd_capacity
from .wire import MAX_LINE, SealedMsg, decode_msg, encode_msg, peer_host

log = logging.getLogger("fsmingle.channel")


class Outcome(enum.Enum):
    """How an attempt to connect to rank 0 ended."""

    CONNECTED = "connected"
    REFUSED = "refused"  # nothing listens there: the master process is gone (RST)
    UNREACHABLE = "unreachable"  # no answer at all (timeout, no route): proves nothing


class EventKind(enum.Enum):
    ACCEPTED = "accepted"  # a new connection (``peer``: its source address); rank 0 challenges it
    MESSAGE = "message"
    LOST = "lost"


@dataclass(frozen=True)
class HubEvent:
    """Something that happened on one of rank 0's member connections."""

    kind: EventKind
    conn: int
    msg: dict | None = None
    why: str = ""
    peer: str = ""  # ACCEPTED: the source address (an IPv4-mapped IPv6 address as IPv4)


# Authentication (per-generation secret, challenge, HMAC, seals) lives above this layer:
# fsmingle/protocol/rank0/door.py and sealing.py, docs/protocol.md ("Threat model").
# A ping is the same bytes every time: encoded once, recognised before any JSON parsing.
_PING = encode_msg({"t": "ping"})
_PING_LINE = _PING[:-1]


def _family(addr: str) -> int:
    return socket.AF_INET6 if ipaddress.ip_address(addr.split("%")[0]).version == 6 else socket.AF_INET


class _Conn:
    __slots__ = ("sock", "rbuf", "wbuf", "last_rx", "last_tx", "lost", "why", "wwait", "cid")

    def __init__(self, sock: socket.socket, now: float, cid: int = 0):
        self.sock, self.cid = sock, cid  # cid: the hub's id of the connection
        self.rbuf = self.wbuf = b""
        self.last_rx = now
        self.last_tx = now
        self.lost = False
        self.why = ""
        self.wwait = False  # registered for EVENT_WRITE (a partial send left bytes in wbuf)


class _Endpoint:
    """Shared buffering, framing and pinging of both ends."""

    def __init__(self, clock: Callable[[], float], ping_interval: float):
        self.clock = clock
        self.ping_interval = ping_interval
        self.sel = selectors.DefaultSelector()

    def _read(self, c: _Conn) -> list[dict]:
        out: list[dict] = []
        try:
            data = c.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return out
        except OSError as e:
            self._lose(c, f"connection error: {e.strerror or e}")
            return out
        if not data:
            self._lose(c, "the peer closed the connection")
            return out
        c.last_rx = self.clock()
        c.rbuf += data
        while b"\n" in c.rbuf:
            line, c.rbuf = c.rbuf.split(b"\n", 1)
            if line == _PING_LINE:
                continue
            msg = decode_msg(line)
            if msg is None:
                self._lose(c, "the peer sent something that is not fsmingle's protocol")
                return out
            if msg["t"] != "ping":
                out.append(msg)
        if len(c.rbuf) > MAX_LINE:
            self._lose(c, f"the peer sent a line over {MAX_LINE} bytes")
        return out

    def _queue(self, c: _Conn, msg: dict | bytes) -> None:
        if c.lost:
            return
        kind = type(msg)  # a sealed message carries its wire line (wire.Sealer): not encoded twice
        c.wbuf += msg if kind is bytes else msg.wire if kind is SealedMsg else encode_msg(msg)
        c.last_tx = self.clock()
        self._flush(c)

    def _flush(self, c: _Conn) -> None:
        while c.wbuf and not c.lost:
            try:
                n = c.sock.send(c.wbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self._lose(c, f"connection error: {e.strerror or e}")
                return
            c.wbuf = c.wbuf[n:]
        if not c.lost and c.wwait != bool(c.wbuf):
            # Only on a change: a message almost always leaves in one send(), so no epoll_ctl per send.
            c.wwait = bool(c.wbuf)
            try:
                self.sel.modify(c.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if c.wwait else 0), c)
            except (KeyError, ValueError):
                pass

    def _ping_quiet(self, conns) -> None:
        now = self.clock()
        for c in conns:
            if not c.lost and now - c.last_tx >= self.ping_interval:
                self._queue(c, _PING)

    def _lose(self, c: _Conn, why: str) -> None:
        if c.lost:
            return
        c.lost, c.why = True, why
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()


class Hub(_Endpoint):
    """Rank 0's end: the master port, held from the rank-0 claim until exec, accepting members.

    The listening socket is bound on all interfaces of the announced address's
    family (as torch's TCPStore binds), with ``SO_REUSEADDR``; Python sockets
    are close-on-exec, so the port is free exactly when the exec'd torch binds it.

    Args:
        addr (str): the announced IP literal (its family -- IPv4 or IPv6 -- is the socket's).
        port (int): the port to hold; 0 picks a free one outside the kernel's ephemeral range
            (:mod:`fsmingle.net.ports`: nobody's ``bind(0)`` or ``connect()`` is handed it
            before torch binds it), a fresh random one each time, else any free one.
        clock (Callable[[], float]): monotonic seconds.
        ping_interval (float): seconds of quiet after which a ping is sent.
        backlog (int): listen backlog (members expected; at least 128).

    Raises:
        ConfigError: the port is in use on this host, or cannot be bound.
    """

    def __init__(
        self,
        addr: str,
        port: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        ping_interval: float = 1.0,
        backlog: int = 128,
    ):
        super().__init__(clock, ping_interval)
        fam = _family(addr)
        self._lsock = socket.socket(fam, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if fam == socket.AF_INET6:
            # Dual-stack where the kernel allows: an IPv6 master still answers v4-mapped peers.
            try:
                self._lsock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            except OSError:
                pass
        try:
            self._bind(fam, port)
        except OSError as e:
            self._lsock.close()
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"--port {port} is already in use on this host; choose another --port or omit it"
                ) from None
            raise ConfigError(
                f"cannot bind port {port} ({'IPv6' if fam == socket.AF_INET6 else 'IPv4'}): {e.strerror}"
            ) from None
        # At least 128 pending: a burst of connections from others (rank 0 drops them within a
        # step) must not fill the queue a member's connect() waits in.
        self._lsock.listen(min(max(backlog, 128), socket.SOMAXCONN))
        self._lsock.setblocking(False)
        self.port: int = self._lsock.getsockname()[1]
        self.sel.register(self._lsock, selectors.EVENT_READ, None)
        self._conns: dict[int, _Conn] = {}
        self._next = 1
        self._closed = False
        # Connections held at most: the open-file limit less what the process holds now and
        # FD_RESERVE for the filesystem.  Past it the hub stops accepting (connections wait in the
        # kernel's backlog) until rank 0 sheds unauthenticated ones (rank0/door.py, ``room``), so
        # a crowd of clients never takes the descriptors a listing or a claim read needs.
        self.limit: int = connection_room()
        self._listening = True
        self._pause_until = 0.0
        self.starved = 0  # accept()s that failed for want of descriptors (EMFILE/ENFILE)
        self._next_ping_scan = 0.0  # when poll() next looks for connections quiet for ping_interval

    def _bind(self, fam: int, port: int) -> None:
        host = "::" if fam == socket.AF_INET6 else ""
        if port:
            self._lsock.bind((host, port))
            return
        for cand in ports.candidates():
            try:
                self._lsock.bind((host, cand))
                return
            except OSError as e:
                if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                    raise
        self._lsock.bind((host, 0))  # no port outside the ephemeral range is free: any one

    def poll(self, timeout: float = 0.0) -> list[HubEvent]:
        """Accept, read and write whatever is ready, waiting up to ``timeout`` seconds for an event.

        Pings are consumed here and do not end the wait: rank 0 of N members gets N per ping
        interval, and a whole coordinator step for each, with nothing to do, was waste (issue 31).

        Returns:
            list[HubEvent]: new connections (``ACCEPTED``, with the peer's address), messages from
            members (pings excluded) and lost connections, in order.
        """
        events: list[HubEvent] = []
        if self._closed:
            return events
        if not self._listening and len(self._conns) < self.limit and self.clock() >= self._pause_until:
            self._listening = True
            self.sel.register(self._lsock, selectors.EVENT_READ, None)
        end = time.monotonic() + timeout  # real time, as select() waits, whatever self.clock is
        while True:
            ready = self.sel.select(max(0.0, timeout))
            for key, mask in ready:
                if key.data is None:
                    events.extend(self._accept())
                    continue
                c: _Conn = key.data
                if mask & selectors.EVENT_WRITE:
                    self._flush(c)
                if mask & selectors.EVENT_READ and not c.lost:
                    events.extend([HubEvent(EventKind.MESSAGE, c.cid, m) for m in self._read(c)])
                if c.lost:
                    events.append(HubEvent(EventKind.LOST, c.cid, why=c.why))
                    self._conns.pop(c.cid, None)
            now = self.clock()
            if now >= self._next_ping_scan:
                # O(N): a few times a ping interval, not at every poll (issue 31: a scan per poll made
                # gathering N members O(N^2)); a ping leaves after 1 to 1.25 intervals of quiet.
                self._next_ping_scan = now + self.ping_interval / 4
                self._ping_quiet(self._conns.values())
                for cid, c in list(self._conns.items()):
                    if c.lost:  # lost while writing a ping
                        events.append(HubEvent(EventKind.LOST, cid, why=c.why))
                        self._conns.pop(cid, None)
            timeout = end - time.monotonic()
            if events or not ready or timeout <= 0 or not self._listening:  # paused: rank 0 sheds now
                return events

    def _accept(self) -> list[HubEvent]:
        out: list[HubEvent] = []
        while True:
            if len(self._conns) >= self.limit:
                self._pause(0.0)  # until a connection goes (room)
                return out
            try:
                s, addr = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return out
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    # Out of descriptors all the same (other files of this process, or the whole
                    # system: ENFILE).  The pending connection stays in the backlog; the listener
                    # rests a moment, or it would be ready -- and fail -- in a busy loop, while
                    # rank 0 sheds unauthenticated connections (``starved``).
                    self.starved += 1
                    (log.warning if self.starved == 1 else log.debug)(
                        "cannot accept a connection: %s (holding %d); shedding unauthenticated ones",
                        e.strerror,
                        len(self._conns),
                    )
                    self._pause(0.05)
                # Anything else (ECONNABORTED: the peer reset it while queued; ENOBUFS, ENOMEM):
                # that one connection is lost, not the listener; the next poll accepts again.
                return out
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cid, self._next = self._next, self._next + 1
            c = _Conn(s, self.clock(), cid)
            self._conns[cid] = c
            self.sel.register(s, selectors.EVENT_READ, c)
            out.append(HubEvent(EventKind.ACCEPTED, cid, peer=peer_host(addr[0] if addr else "")))

    def _pause(self, seconds: float) -> None:
        """Stop accepting for ``seconds`` at least, and until there is room (``poll`` resumes)."""
        self._pause_until = self.clock() + seconds
        if self._listening:
            self._listening = False
            try:
                self.sel.unregister(self._lsock)
            except (KeyError, ValueError):
                pass

    def room(self) -> int:
        """Connections the hub may still accept before it stops (its ``limit`` less those held);
        at most 0 while ``accept()`` lacks descriptors (a recent EMFILE/ENFILE)."""
        room = self.limit - len(self._conns)
        return min(room, 0) if self.clock() < self._pause_until else room

    def send(self, conn: int, msg: dict) -> None:
        """Queue ``msg`` to one member (dropped silently if that connection is gone: its LOST event says so)."""
        c = self._conns.get(conn)
        if c is not None:
            self._queue(c, msg)

    def silent_for(self, conn: int) -> float:
        """Seconds since member ``conn`` last sent anything (pings included); inf if it is gone."""
        c = self._conns.get(conn)
        return float("inf") if c is None else self.clock() - c.last_rx

    def silent_among(self, conns: dict, seconds: float) -> list:
        """The ``(key, conn)`` pairs of ``conns`` (key -> connection) with ``silent_for(conn) >= seconds``,
        in one pass without a call per connection (rank 0 looks over all N twice a second)."""
        get, cutoff = self._conns.get, self.clock() - seconds
        return [(k, cid) for k, cid in conns.items() if (c := get(cid)) is None or c.last_rx <= cutoff]

    def drop(self, conn: int) -> None:
        """Close one member connection (after a reject)."""
        c = self._conns.pop(conn, None)
        if c is not None:
            self._flush(c)
            self._lose(c, "dropped")

    def open_connections(self) -> int:
        return len(self._conns)

    def drain(self, timeout: float) -> None:
        """Flush every queued message and wait up to ``timeout`` seconds for members to close first.

        Members close as soon as they read the release, so the TIME_WAIT state
        lands on their side, not on the master port torch binds next.
        """
        end = self.clock() + timeout
        while self._conns and self.clock() < end:
            self.poll(min(0.05, max(0.0, end - self.clock())))

    def close(self) -> None:
        """Close every connection and free the port."""
        if self._closed:
            return
        self._closed = True
        for c in list(self._conns.values()):
            self._lose(c, "closed")
        self._conns.clear()
        self._listening = False
        try:
            self.sel.unregister(self._lsock)
        except (KeyError, ValueError):
            pass
        self._lsock.close()
        self.sel.close()


class Link(_Endpoint):
    """A member's connection to rank 0.  Create with :meth:`TcpTransport.connect`."""

    def __init__(self, sock: socket.socket, *, clock: Callable[[], float], ping_interval: float):
        super().__init__(clock, ping_interval)
        sock.setblocking(False)
        self._c = _Conn(sock, clock())
        self.sel.register(sock, selectors.EVENT_READ, self._c)

    @property
    def lost(self) -> bool:
        """True once the connection is gone (EOF, reset, protocol error)."""
        return self._c.lost

    @property
    def why(self) -> str:
        return self._c.why

    def poll(self, timeout: float = 0.0) -> list[dict]:
        """Read what rank 0 sent, waiting up to ``timeout`` seconds for something; pings are consumed."""
        out: list[dict] = []
        if not self._c.lost:
            for _key, mask in self.sel.select(max(0.0, timeout)):
                if mask & selectors.EVENT_WRITE:
                    self._flush(self._c)
                if mask & selectors.EVENT_READ and not self._c.lost:
                    out.extend(self._read(self._c))
            self._ping_quiet([self._c])
        return out

    def send(self, msg: dict) -> None:
        self._queue(self._c, msg)

    def silent_for(self) -> float:
        """Seconds since rank 0 last sent anything; inf once the connection is lost."""
        return float("inf") if self._c.lost else self.clock() - self._c.last_rx

    def close(self) -> None:
        if not self._c.lost:
            self._flush(self._c)
            self._lose(self._c, "closed")
        self.sel.close()


class Transport(abc.ABC):
    """How a participant listens (rank 0) and connects (members); tests swap in a fake network."""

    @abc.abstractmethod
    def listen(self, addr: str, port: int, size: int) -> Hub:
        """Hold ``port`` (0: any) for a world of ``size``.

        Raises:
            ConfigError: the port is busy, or the open-file limit cannot fit ``size`` members.
        """

    @abc.abstractmethod
    def connect(self, addr: str, port: int, timeout: float) -> tuple[Outcome, Link | None, str]:
        """Connect to rank 0; returns the outcome, the link when connected, and a reason for humans."""


class TcpTransport(Transport):
    """The real transport (TCP, IPv4 or IPv6 following the address).

    Args:
        clock (Callable[[], float]): monotonic seconds, shared with the policy.
        ping_interval (float): seconds of quiet after which either end pings.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, ping_interval: float = 1.0):
        self.clock, self.ping_interval = clock, ping_interval

    def listen(self, addr: str, port: int, size: int) -> Hub:
        ensure_fd_capacity(size)
        return Hub(addr, port, clock=self.clock, ping_interval=self.ping_interval, backlog=size)

    def connect(self, addr: str, port: int, timeout: float) -> tuple[Outcome, Link | None, str]:
        try:
            s = socket.create_connection((addr, port), timeout=timeout)
        except ConnectionRefusedError:
            return Outcome.REFUSED, None, f"{_hostport(addr, port)} refused the connection (nothing listens there)"
        except TimeoutError:
            return Outcome.UNREACHABLE, None, f"no answer from {_hostport(addr, port)} within {timeout:g} s"
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise StorageError(f"cannot open a socket: {e.strerror}; raise the open-file limit") from None
            return Outcome.UNREACHABLE, None, f"cannot reach {_hostport(addr, port)}: {e.strerror or e}"
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return Outcome.CONNECTED, Link(s, clock=self.clock, ping_interval=self.ping_interval), ""


def _hostport(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


hostport = _hostport
