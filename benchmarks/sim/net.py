"""In-memory network with the interface of :mod:`fsmingle.net.channel` (Transport, Hub, Link).

A message sent at the sender's local time ``t`` arrives at ``t + latency`` and wakes the
receiver (the engine's ``wake``).  Connecting costs one round trip; the hub learns of the
connection (an ``ACCEPTED`` event) one latency after ``connect`` returns and answers with its
challenge, so a member's first message leaves one round trip later, as on the real channel.  Pings are not simulated:
nothing fails in the simulated scenario, so ``silent_for`` is 0 on an open connection (the real
channel pings every ``ping_interval`` of quiet; :func:`ping_messages` counts them analytically).
"""

from __future__ import annotations

from fsmingle.net.channel import EventKind, HubEvent, Outcome, Transport
from fsmingle.net.wire import MAX_LINE, encode_msg


class SimHub:
    def __init__(self, net: SimNet, owner: int, addr: str, port: int):
        self.net, self.owner, self.addr, self.port = net, owner, addr, port
        self.inbox: list[tuple[float, HubEvent]] = []
        self.links: dict[int, SimLink] = {}
        self.closed = False
        self.last_delivery = 0.0

    def _now(self) -> float:
        return self.net.clocks[self.owner].t

    def poll(self, timeout: float = 0.0) -> list[HubEvent]:
        now = self._now()
        if not self.inbox:  # not sorted: senders' local clocks differ
            return []
        out = [ev for t, ev in self.inbox if t <= now]
        self.inbox = [(t, ev) for t, ev in self.inbox if t > now]
        self.net.counts[self.owner]["msgs_in"] += len(out)
        return out

    def send(self, conn: int, msg: dict) -> None:
        link = self.links.get(conn)
        if link is None or link.lost:
            return
        t = self._now() + self.net.latency
        if self.net.check_lines and len(encode_msg(msg)) > MAX_LINE:
            # The real reader drops a connection whose line passes MAX_LINE (channel._Endpoint._read).
            self.net.long_lines += 1
            link._lose(t, f"the peer sent a line over {MAX_LINE} bytes")
            return
        self.last_delivery = max(self.last_delivery, t)
        self.net.counts[self.owner]["msgs_out"] += 1
        link.inbox.append((t, msg))
        self.net.wake(link.owner, t)

    def silent_for(self, conn: int) -> float:
        link = self.links.get(conn)
        return float("inf") if link is None or link.lost else 0.0

    def silent_among(self, conns: dict, seconds: float) -> list:
        return [(k, c) for k, c in conns.items() if self.silent_for(c) >= seconds]

    def drop(self, conn: int) -> None:
        link = self.links.pop(conn, None)
        if link is not None:
            link._lose(self._now() + self.net.latency, "dropped")

    def open_connections(self) -> int:
        return len(self.links)

    def drain(self, timeout: float) -> None:
        # Members close once they read the release; rank 0 returns when the last close is back.
        c = self.net.clocks[self.owner]
        c.t = max(c.t, min(self.last_delivery + self.net.latency, c.t + timeout))

    def close(self) -> None:
        self.closed = True
        self.net.hubs.pop((self.addr, self.port), None)
        for link in list(self.links.values()):
            link._lose(self._now() + self.net.latency, "closed")
        self.links.clear()


class SimLink:
    def __init__(self, net: SimNet, owner: int, hub: SimHub, conn: int):
        self.net, self.owner, self.hub, self.conn = net, owner, hub, conn
        self.inbox: list[tuple[float, dict]] = []
        self._lost, self._why = False, ""
        self.lost_at: float | None = None

    @property
    def lost(self) -> bool:
        return self._lost or (self.lost_at is not None and self.lost_at <= self.net.clocks[self.owner].t)

    @property
    def why(self) -> str:
        return self._why

    def _lose(self, t: float, why: str) -> None:
        if self.lost_at is None:
            self.lost_at, self._why = t, why
            self.net.wake(self.owner, t)

    def poll(self, timeout: float = 0.0) -> list[dict]:
        now = self.net.clocks[self.owner].t
        if not self.inbox:
            return []
        out = [m for t, m in self.inbox if t <= now]
        self.inbox = [(t, m) for t, m in self.inbox if t > now]
        self.net.counts[self.owner]["msgs_in"] += len(out)
        return out

    def send(self, msg: dict) -> None:
        if self.lost or self.hub.closed:
            return
        t = self.net.clocks[self.owner].t + self.net.latency
        self.net.counts[self.owner]["msgs_out"] += 1
        self.hub.inbox.append((t, HubEvent(EventKind.MESSAGE, self.conn, msg)))
        self.net.wake(self.hub.owner, t)

    def silent_for(self) -> float:
        return float("inf") if self.lost else 0.0

    def close(self) -> None:
        if self._lost:
            return
        self._lost, self._why = True, "closed"
        if self.hub.links.pop(self.conn, None) is not None:
            t = self.net.clocks[self.owner].t + self.net.latency
            self.hub.inbox.append((t, HubEvent(EventKind.LOST, self.conn, why="the peer closed the connection")))
            self.net.wake(self.hub.owner, t)


class SimTransport(Transport):
    def __init__(self, net: SimNet, owner: int):
        self.net, self.owner = net, owner

    def listen(self, addr: str, port: int, size: int) -> SimHub:
        port = port or self.net.next_port()
        hub = SimHub(self.net, self.owner, addr, port)
        self.net.hubs[(addr, port)] = hub
        return hub

    def connect(self, addr: str, port: int, timeout: float):
        c = self.net.clocks[self.owner]
        c.t += 2 * self.net.latency  # SYN, SYN-ACK
        hub = self.net.hubs.get((addr, port))
        if hub is None or hub.closed:
            return Outcome.REFUSED, None, f"{addr}:{port} refused the connection (nothing listens there)"
        conn = self.net.next_conn()
        link = SimLink(self.net, self.owner, hub, conn)
        hub.links[conn] = link
        # Rank 0 learns of the connection when the handshake's last ACK reaches it (the real Hub's
        # ACCEPTED event, which it answers with its challenge): one latency after connect returns.
        t = c.t + self.net.latency
        hub.inbox.append((t, HubEvent(EventKind.ACCEPTED, conn, peer=f"sim-{self.owner}")))
        self.net.wake(hub.owner, t)
        self.net.counts[self.owner]["connects"] += 1
        return Outcome.CONNECTED, link, ""


class SimNet:
    """All hubs; ``clocks[i]`` is participant i's local clock; ``wake(i, t)`` schedules it."""

    def __init__(self, latency: float, clocks: list, counts: list, wake, check_lines: bool = False):
        self.latency, self.clocks, self.counts, self.wake = latency, clocks, counts, wake
        self.check_lines, self.long_lines = check_lines, 0
        self.hubs: dict[tuple[str, int], SimHub] = {}
        self._port, self._conn = 29400, 0

    def next_port(self) -> int:
        self._port += 1
        return self._port

    def next_conn(self) -> int:
        self._conn += 1
        return self._conn


def ping_messages(n_members: int, seconds: float, ping_interval: float) -> float:
    """Pings the real channel would send in ``seconds`` of quiet waiting: one each way per connection per interval."""
    return 2 * n_members * seconds / ping_interval
