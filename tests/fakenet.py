"""An in-memory network with the interface of :mod:`fsmingle.net.channel`, for model-checking protocol v2.

:class:`FakeNet` is the truth of every host, listening port and connection on
the fake time of a :class:`fakefs.FakeFS` (``fs.now``); each process gets a
:class:`FakeTransport` (``net.transport(host, owner)``) that implements
:class:`fsmingle.net.channel.Transport`: ``listen`` returns a :class:`FakeHub`
(rank 0's end, the API of :class:`fsmingle.net.channel.Hub`), ``connect`` a
:class:`FakeLink` (a member's end, the API of :class:`fsmingle.net.channel.Link`).

What the model says about TCP (each a kernel behaviour the real channel meets):

* **Delivery is immediate and in order** between hosts that can reach each
  other, and always within one host (loopback does not cross the link).
  Messages round-trip through :func:`fsmingle.net.wire.encode_msg` /
  :func:`~fsmingle.net.wire.decode_msg`, so only JSON data passes, and a line
  over :data:`~fsmingle.net.wire.MAX_LINE` bytes loses the connection.
* **Pings** are sent by an endpoint's ``poll`` when it has sent nothing for
  ``ping_interval`` seconds, as the real I/O layer does; they are consumed on
  arrival and only move ``silent_for`` back to 0.  A process that does not
  step sends no pings: its peers see it go silent.
* **A closed endpoint** (``close``, ``drop``, or the death of its process:
  :meth:`FakeNet.kill`, the kernel closes the sockets) sends a FIN after the
  data already sent: the peer reads that data, then sees the connection lost
  (``LOST`` event / ``link.lost``).
* **A silent partition** of a host (:meth:`FakeNet.partition`: its link is
  down, no RST, no answer): ``connect`` across it returns ``UNREACHABLE``
  after the whole timeout (the fake time advances by it, as a blocking
  ``connect`` takes that long); established connections across it stop
  delivering in both directions -- data and FINs are held, as TCP retransmits
  them, and delivered in order when the partition heals -- so ``silent_for``
  grows on both ends.  An address no host owns never answers either.
* **Connect to a port nothing listens on**: ``REFUSED`` at once (RST).
* **An accepted connection** is reported to the hub as an ``ACCEPTED`` event (with the
  connecting host's first address as ``peer``) before anything sent on it, as the real Hub does.
* **A dropped connection** (:meth:`FakeNet.reset`, a RST from a middlebox or
  a crashing NIC): both ends see it lost at once; data in flight is lost, and
  with ``lose_unread`` so is data received but not yet read (Linux discards
  the receive queue on a reset).
* **A busy port**: ``listen`` on a port an open hub of the same host holds
  raises :class:`~fsmingle.errors.ConfigError` with the real Hub's message.
* **An exception inside a network call** (:meth:`FakeNet.arm_fault`): a
  process's k-th ``send`` or ``poll`` raises (a ``KeyboardInterrupt`` from
  SIGTERM lands wherever the process is), before or after it takes effect.
* **Observers** (``FakeNet.on_send``): every message a process sends is shown
  to the test at the moment it is sent (the oracle on ``void``).

Everything is deterministic: no randomness, no real time, no threads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fsmingle.errors import ConfigError
from fsmingle.net.channel import EventKind, HubEvent, Outcome, Transport, hostport
from fsmingle.net.wire import MAX_LINE, decode_msg, encode_msg

__all__ = ["FakeHub", "FakeLink", "FakeNet", "FakeTransport", "Pipe"]

_MSG, _FIN = "msg", "fin"
TO_HUB, TO_LINK = 0, 1


@dataclass(eq=False)
class Pipe:
    """One TCP connection between a member's :class:`FakeLink` and rank 0's :class:`FakeHub`.

    The test reads it for its oracles: ``acked`` holds the generations of the
    ``ack`` messages that reached the hub, ``hub_lost``/``link_closed`` whether
    either end is gone.
    """

    net: FakeNet
    hub: FakeHub
    cid: int
    link: FakeLink
    seq: int
    held: tuple = field(default_factory=lambda: (deque(), deque()))  # per direction, while partitioned
    hub_last_rx: float = 0.0
    link_last_rx: float = 0.0
    hub_last_tx: float = 0.0
    link_last_tx: float = 0.0
    hub_closed: bool = False  # the hub's end was closed (drop, close, death): it sends nothing more
    link_closed: bool = False  # the link's end was closed
    hub_lost: bool = False  # the hub has been told (LOST event queued) or dropped it itself
    reset: bool = False
    acked: set = field(default_factory=set)
    fin_to_hub_delivered: bool = False
    lost_seq: int | None = None  # net.seq when the hub's end learned (LOST queued) that the connection is gone

    @property
    def open(self) -> bool:
        """Neither end closed and not reset (data may still be held by a partition)."""
        return not (self.hub_closed or self.link_closed or self.reset)

    def hosts(self) -> tuple[Any, Any]:
        return self.link.host, self.hub.host


class FakeHub:
    """Rank 0's end on the fake network (the interface of :class:`fsmingle.net.channel.Hub`)."""

    def __init__(self, net: FakeNet, host, port: int, owner, ping_interval: float):
        self.net, self.host, self.port, self.owner, self.ping_interval = net, host, port, owner, ping_interval
        self.conns: dict[int, Pipe] = {}
        self.events: list[HubEvent] = []
        self.closed = False
        self.polls = 0
        self.last_poll_seq = -1

    def poll(self, timeout: float = 0.0) -> list[HubEvent]:
        """What arrived since the last poll (``timeout`` is ignored: time is the test's); pings go out."""
        self.net.fault_point(self.owner, "poll", after=False)
        out = self._poll()
        self.net.fault_point(self.owner, "poll", after=True)  # what was read is lost with the exception
        return out

    def _poll(self) -> list[HubEvent]:
        self.polls += 1
        self.last_poll_seq = self.net.tick_seq()
        if self.closed:
            return []
        out, self.events = self.events, []
        for ev in out:
            if ev.kind is EventKind.LOST:
                self.conns.pop(ev.conn, None)
        now = self.net.now()
        for pipe in list(self.conns.values()):
            if not pipe.hub_closed and now - pipe.hub_last_tx >= self.ping_interval:
                self._send(pipe, {"t": "ping"})
        return out

    def _send(self, pipe: Pipe, msg: dict) -> None:
        pipe.hub_last_tx = self.net.now()
        if pipe.link_closed or pipe.reset:
            return  # the peer is gone: the data is discarded (its FIN/RST tells us soon)
        self.net.transmit(pipe, TO_LINK, (_MSG, encode_msg(msg)))

    def send(self, conn: int, msg: dict) -> None:
        self.net.fault_point(self.owner, "send", after=False, msg=msg)
        pipe = self.conns.get(conn)
        if pipe is not None and not pipe.hub_closed and not self.closed:
            self.net.sent(pipe, TO_LINK, msg)
            self._send(pipe, msg)
        self.net.fault_point(self.owner, "send", after=True, msg=msg)

    def silent_for(self, conn: int) -> float:
        pipe = self.conns.get(conn)
        return float("inf") if pipe is None else self.net.now() - pipe.hub_last_rx

    def silent_among(self, conns: dict, seconds: float) -> list:
        return [(k, c) for k, c in conns.items() if self.silent_for(c) >= seconds]

    def drop(self, conn: int) -> None:
        pipe = self.conns.pop(conn, None)
        if pipe is not None:
            pipe.hub_lost = True
            self.net.close_end(pipe, hub_side=True, why="rank 0 closed the connection")

    def open_connections(self) -> int:
        return len(self.conns)

    def drain(self, timeout: float) -> None:
        """Everything sent is already on its way (delivery is immediate or held by a partition)."""
        self.poll(0)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for pipe in list(self.conns.values()):
            pipe.hub_lost = True
            self.net.close_end(pipe, hub_side=True, why="the peer closed the connection")
        self.conns.clear()
        self.net.hubs.pop((self.host, self.port), None)


class FakeLink:
    """A member's end on the fake network (the interface of :class:`fsmingle.net.channel.Link`)."""

    def __init__(self, net: FakeNet, host, owner, ping_interval: float):
        self.net, self.host, self.owner, self.ping_interval = net, host, owner, ping_interval
        self.pipe: Pipe | None = None
        self.inbox: list[dict] = []
        self.peer_closed = False
        self.peer_why = ""
        self._lost = False
        self._why = ""
        self.closed = False

    @property
    def lost(self) -> bool:
        return self._lost

    @property
    def why(self) -> str:
        return self._why

    def poll(self, timeout: float = 0.0) -> list[dict]:
        self.net.fault_point(self.owner, "poll", after=False)
        out = self._poll()
        self.net.fault_point(self.owner, "poll", after=True)
        return out

    def _poll(self) -> list[dict]:
        if self._lost:
            return []
        out, self.inbox = self.inbox, []
        if self.peer_closed:
            self._lost, self._why = True, self.peer_why  # EOF after the data sent before it
            return out
        if self.net.now() - self.pipe.link_last_tx >= self.ping_interval:
            self._send({"t": "ping"})
        return out

    def send(self, msg: dict) -> None:
        self.net.fault_point(self.owner, "send", after=False, msg=msg)
        self._send(msg)
        self.net.fault_point(self.owner, "send", after=True, msg=msg)

    def _send(self, msg: dict) -> None:
        if self._lost or self.closed:
            return
        pipe = self.pipe
        pipe.link_last_tx = self.net.now()
        if pipe.hub_closed or pipe.reset:
            return
        if msg.get("t") != "ping":
            self.net.sent(pipe, TO_HUB, msg)
        self.net.transmit(pipe, TO_HUB, (_MSG, encode_msg(msg)))

    def silent_for(self) -> float:
        return float("inf") if self._lost else self.net.now() - self.pipe.link_last_rx

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self._lost:
            self._lost, self._why = True, "closed"
        self.net.close_end(self.pipe, hub_side=False, why="the peer closed the connection")


class FakeTransport(Transport):
    """One process's view of the fake network (listen on its host, connect from it)."""

    def __init__(self, net: FakeNet, host, owner, ping_interval: float = 1.0):
        self.net, self.host, self.owner, self.ping_interval = net, host, owner, ping_interval

    def listen(self, addr: str, port: int, size: int) -> FakeHub:
        """Hold ``port`` (0: a free one) on this host, on all its addresses (as the real Hub binds).

        Raises:
            ConfigError: an open hub of this host holds ``port`` (the real Hub's message).
        """
        net = self.net
        if port == 0:
            port = net.free_port(self.host)
        elif (self.host, port) in net.hubs:
            raise ConfigError(f"--port {port} is already in use on this host; choose another --port or omit it")
        hub = FakeHub(net, self.host, port, self.owner, self.ping_interval)
        net.hubs[(self.host, port)] = hub
        net.endpoints.setdefault(self.owner, []).append(hub)
        return hub

    def port_holder(self, port: int) -> str:
        """What holds ``port`` on this host, as :func:`fsmingle.net.hostinfo.port_holder` says it."""
        hub = self.net.hubs.get((self.host, port))
        return "nothing (it was freed since)" if hub is None else f"fake process {hub.owner[:4]} (fsmingle)"

    def connect(self, addr: str, port: int, timeout: float):
        net = self.net
        target = net.addr_host.get(addr)
        if target is None or (target != self.host and (target in net.partitioned or self.host in net.partitioned)):
            net.connect_timeouts += 1
            net.advance(timeout)  # a blocking connect() waits out its whole timeout
            return Outcome.UNREACHABLE, None, f"no answer from {hostport(addr, port)} within {timeout:g} s"
        hub = net.hubs.get((target, port))
        if hub is None or hub.closed:
            return Outcome.REFUSED, None, f"{hostport(addr, port)} refused the connection (nothing listens there)"
        link = FakeLink(net, self.host, self.owner, self.ping_interval)
        now = net.now()
        net.next_cid += 1
        pipe = Pipe(
            net,
            hub,
            net.next_cid,
            link,
            net.tick_seq(),
            hub_last_rx=now,
            link_last_rx=now,
            hub_last_tx=now,
            link_last_tx=now,
        )
        link.pipe = pipe
        hub.conns[pipe.cid] = pipe
        # The real Hub reports each accepted connection with its source address (rank 0
        # challenges it at once): the first address of the connecting host.
        peer = next((a for a, h in net.addr_host.items() if h == self.host), str(self.host))
        hub.events.append(HubEvent(EventKind.ACCEPTED, pipe.cid, peer=peer))
        net.pipes.append(pipe)
        net.endpoints.setdefault(self.owner, []).append(link)
        net.wake(hub.owner)
        return Outcome.CONNECTED, link, ""


class FakeNet:
    """Hosts, ports and connections on the fake clock.

    Args:
        now (Callable[[], float]): the fake time (``lambda: fs.now``).
        advance (Callable[[float], None]): move the fake time forward (``fs.advance``).
        on_wake (Callable[[object], None] | None): called with a process's owner
            object when something arrives for it (its ``wait`` would return early).
    """

    def __init__(
        self, now: Callable[[], float], advance: Callable[[float], None], on_wake: Callable[[Any], None] | None = None
    ):
        self.now, self.advance, self.on_wake = now, advance, on_wake
        self.addr_host: dict[str, Any] = {}
        self.partitioned: set = set()
        self.hubs: dict[tuple, FakeHub] = {}
        self.pipes: list[Pipe] = []
        self.endpoints: dict[Any, list] = {}
        self.next_cid = 0
        self.next_port: dict[Any, int] = {}
        self.seq = 0
        self.connect_timeouts = 0
        self.on_send: Callable[[Pipe, int, dict], None] | None = None  # the test's observer of sent messages
        self.net_ops: dict[Any, int] = {}  # owner -> sends and polls counted (arm_fault)
        self.faults: dict[Any, tuple[int, Callable[[str], BaseException], bool, Callable | None]] = {}
        self._fault_due: dict[Any, Callable[[str], BaseException]] = {}
        self.trace: list[tuple[Any, str, str]] | None = None  # (owner, send|poll, message type), when a list

    # ------------------------------------------------------------------ exceptions inside calls
    def arm_fault(
        self,
        owner,
        after_ops: int,
        exc: Callable[[str], BaseException],
        after_effect: bool = False,
        match: Callable[[str, dict | None], bool] | None = None,
    ) -> None:
        """``owner``'s ``after_ops``-th next ``send`` or ``poll`` raises ``exc(what)``, before or after it takes
        effect (a ``KeyboardInterrupt`` from SIGTERM lands wherever the process is); an ``exc`` that returns
        None raises nothing (it did something there instead: the enumeration's pause).  ``match(what, msg)``:
        count only the calls it accepts (``what`` is ``send`` or ``poll``; ``msg`` what is sent)."""
        if match is None:
            at = self.net_ops.get(owner, 0) + after_ops
        else:
            at = after_ops
            self.net_ops[(owner, "match")] = 0
        self.faults[owner] = (at, exc, after_effect, match)
        self._fault_due.pop(owner, None)

    def disarm(self, owner) -> None:
        self.faults.pop(owner, None)
        self._fault_due.pop(owner, None)

    def fault_point(self, owner, what: str, *, after: bool, msg: dict | None = None) -> None:
        if after:
            exc = self._fault_due.pop(owner, None)
            e = exc(f"{what} {msg.get('t') if msg else ''} (after it took effect)") if exc is not None else None
            if e is not None:
                raise e
            return
        n = self.net_ops.get(owner, 0)
        self.net_ops[owner] = n + 1
        if self.trace is not None:
            self.trace.append((owner, what, str(msg.get("t")) if msg else ""))
        armed = self.faults.get(owner)
        if armed is None:
            return
        if armed[3] is not None:
            if not armed[3](what, msg):
                return
            n = self.net_ops[(owner, "match")]
            self.net_ops[(owner, "match")] = n + 1
        if n < armed[0]:
            return
        what = f"{what} {msg.get('t') if msg else ''}"
        del self.faults[owner]
        if armed[2]:
            self._fault_due[owner] = armed[1]
        else:
            e = armed[1](what)
            if e is not None:  # a factory may act there instead (a pause: the others run meanwhile)
                raise e

    def sent(self, pipe: Pipe, direction: int, msg: dict) -> None:
        if self.on_send is not None and msg.get("t") != "ping":
            self.on_send(pipe, direction, msg)

    # ------------------------------------------------------------------ set-up
    def add_host(self, host, *addrs: str) -> None:
        for a in addrs:
            self.addr_host[a] = host

    def transport(self, host, owner, ping_interval: float = 1.0) -> FakeTransport:
        return FakeTransport(self, host, owner, ping_interval)

    def free_port(self, host) -> int:
        p = self.next_port.get(host, 40000)
        while (host, p) in self.hubs:
            p += 1
        self.next_port[host] = p + 1
        return p

    def tick_seq(self) -> int:
        self.seq += 1
        return self.seq

    def wake(self, owner) -> None:
        if self.on_wake is not None and owner is not None:
            self.on_wake(owner)

    # ------------------------------------------------------------------ delivery
    def blocked(self, pipe: Pipe) -> bool:
        a, b = pipe.hosts()
        return a != b and (a in self.partitioned or b in self.partitioned)

    def transmit(self, pipe: Pipe, direction: int, item: tuple) -> None:
        if pipe.reset:
            return
        if self.blocked(pipe) or pipe.held[direction]:
            pipe.held[direction].append(item)
            return
        self._deliver(pipe, direction, item)

    def _deliver(self, pipe: Pipe, direction: int, item: tuple) -> None:
        kind, payload = item
        now = self.now()
        if direction == TO_HUB:
            hub = pipe.hub
            if hub.closed or pipe.hub_lost:
                return
            if kind == _FIN:
                pipe.hub_lost = pipe.fin_to_hub_delivered = True
                pipe.lost_seq = self.tick_seq()
                hub.events.append(HubEvent(EventKind.LOST, pipe.cid, why=payload))
            else:
                pipe.hub_last_rx = now
                msg = self._decode(payload)
                if msg is None:
                    pipe.hub_lost, pipe.lost_seq = True, self.tick_seq()
                    hub.events.append(
                        HubEvent(
                            EventKind.LOST, pipe.cid, why="the peer sent something that is not fsmingle's protocol"
                        )
                    )
                    self.close_end(pipe, hub_side=True, why="the peer closed the connection")
                    return
                if msg["t"] == "ping":
                    return
                if msg["t"] == "ack":
                    pipe.acked.add(msg.get("gen"))
                hub.events.append(HubEvent(EventKind.MESSAGE, pipe.cid, msg))
            self.wake(hub.owner)
        else:
            link = pipe.link
            if link.closed or link.peer_closed:
                return
            if kind == _FIN:
                link.peer_closed, link.peer_why = True, payload
            else:
                pipe.link_last_rx = now
                msg = self._decode(payload)
                if msg is None:
                    link.peer_closed, link.peer_why = True, "the peer sent something that is not fsmingle's protocol"
                    self.close_end(pipe, hub_side=False, why="the peer closed the connection")
                    return
                if msg["t"] == "ping":
                    return
                link.inbox.append(msg)
            self.wake(link.owner)

    @staticmethod
    def _decode(payload: bytes) -> dict | None:
        if len(payload) > MAX_LINE + 1:
            return None
        return decode_msg(payload.rstrip(b"\n"))

    def close_end(self, pipe: Pipe, *, hub_side: bool, why: str) -> None:
        """One end closes: a FIN follows the data it already sent."""
        if hub_side:
            if pipe.hub_closed:
                return
            pipe.hub_closed = True
            self.transmit(pipe, TO_LINK, (_FIN, why))
        else:
            if pipe.link_closed:
                return
            pipe.link_closed = True
            self.transmit(pipe, TO_HUB, (_FIN, why))

    # ------------------------------------------------------------------ faults
    def kill(self, owner) -> None:
        """The process ``owner`` died: the kernel closes its sockets (FIN after the data sent)."""
        for ep in self.endpoints.pop(owner, []):
            ep.close()

    def partition(self, host) -> None:
        """``host``'s network link goes down silently (no RST, no answer)."""
        self.partitioned.add(host)

    def heal(self, host=None) -> None:
        """The link of ``host`` (None: every host) comes back; held data and FINs arrive in order."""
        if host is None:
            self.partitioned.clear()
        else:
            self.partitioned.discard(host)
        for pipe in self.pipes:
            if self.blocked(pipe):
                continue
            for direction in (TO_HUB, TO_LINK):
                q = pipe.held[direction]
                while q:
                    self._deliver(pipe, direction, q.popleft())

    def reset(self, pipe: Pipe, lose_unread: bool = False) -> None:
        """A RST on ``pipe``: both ends see it lost at once; data in flight (and unread, if asked) is lost."""
        if pipe.reset:
            return
        for q in pipe.held:
            q.clear()
        link, hub = pipe.link, pipe.hub
        if not pipe.hub_lost and not hub.closed:
            pipe.hub_lost, pipe.lost_seq = True, self.tick_seq()
            hub.events.append(HubEvent(EventKind.LOST, pipe.cid, why="connection error: Connection reset by peer"))
            self.wake(hub.owner)
        if not link.closed and not link.peer_closed:
            if lose_unread:
                link.inbox.clear()
            link.peer_closed, link.peer_why = True, "connection error: Connection reset by peer"
            self.wake(link.owner)
        pipe.reset = True

    def open_pipes(self) -> list[Pipe]:
        return [p for p in self.pipes if p.open]
