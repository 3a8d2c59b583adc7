"""``--check-mesh``: before the release, each node proves it reaches its ring neighbours on their announced addresses.

The wrong interface is the most common multi-node failure (NCCL issues 913
and 1581: "connection refused" or a hang at init).  Rank 0 proves only the
member -> master paths; ring collectives also need member -> member paths.
With ``--check-mesh`` every participant listens on a probe port while it
waits, and at the release each one connects to its previous and next rank in
final rank order.  A TCP handshake with the neighbour's kernel on the
neighbour's port proves the path and that the neighbour process still holds
the port; a failure names both hosts, both addresses and the interface, and
the generation is voided (no release on absence of evidence).
"""

from __future__ import annotations

from ..errors import RecordError
from ..fs.records import validate_addr
from .channel import Outcome, hostport
from .netaddr import interface_of


def mesh_probe(p, neighbours: list) -> str:
    """Connect to each neighbour ``[rank, host, addr, port]``; "" if all answer, else what failed.

    Args:
        p (fsmingle.protocol.participant.Participant): this participant (its transport, address, timing).
        neighbours (list[list]): from rank 0's prepare message.
    """
    for entry in neighbours:
        try:
            rank, host, addr, port = entry
        except (TypeError, ValueError):
            return f"rank 0 sent a malformed neighbour entry {entry!r}"
        if type(port) is not int or not 0 < port < 65536:
            return f"ring neighbour rank {rank} ({host}, {addr}) has no probe port: run every node with --check-mesh"
        try:
            addr = validate_addr(addr if isinstance(addr, str) else repr(addr))
        except RecordError:
            return f"rank 0 sent a malformed neighbour address {addr!r}"
        outcome, link, why = p.transport.connect(addr, port, p.timing.probe_timeout)
        if outcome is Outcome.CONNECTED:
            link.close()
            continue
        iface = interface_of(p.addr) or "?"
        return (
            f"{p.me.hostname} ({p.addr}, interface {iface}) cannot reach its ring neighbour rank {rank} "
            f"({host}, {hostport(addr, port)}): {why}; check routes and firewalls between them, or the "
            "interface each announces (--iface/--addr)"
        )
    return ""
