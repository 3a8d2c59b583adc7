"""Rank 0's side of mutual authentication: everything it sends after the challenge is sealed.

A member checks every message rank 0 sends on its connection (:class:`fsmingle.net.wire.Unsealer`)
and treats one without a valid seal as a lost connection, so whoever holds rank 0's port without
the generation's secret -- rank 0 died and another process bound its port, a user on the same
node, a host on the path that can inject packets -- cannot hand a member a ``go`` (or ``prepare``,
``void``, ``welcome``, ``members``...) that it acts on (``docs/protocol.md``, "Threat model").

The seal is applied in one place, :class:`SealedHub`, the hub as every rank-0 mixin uses it
(``self.hub``): a message to a connection that answered the challenge (:attr:`Door.sessions`)
leaves sealed with that connection's nonces and counter; the challenge itself, and the one
answer to a peer of an older wire version, leave as they are.
"""

from __future__ import annotations

from ...net.wire import SealedMsg, Sealer, canonical


class Session:
    """One authenticated connection: its :class:`~fsmingle.net.wire.Sealer` (both nonces, the HMAC
    prefix made once) and the counter of what rank 0 sent on it."""

    __slots__ = ("mnonce", "sealer", "n")

    def __init__(self, secret: str, nonce: str, mnonce: str):
        self.mnonce, self.sealer, self.n = mnonce, Sealer(secret, nonce, mnonce), 0

    def seal(self, msg: dict, body: bytes) -> SealedMsg:
        # The counter moves before the send: a send interrupted before it left leaves a gap,
        # which the member accepts (a message it never got), never a reused counter.
        n, self.n = self.n, self.n + 1
        return self.sealer.seal(n, msg, body)


class SealedHub:
    """The participant's hub (:class:`fsmingle.net.channel.Hub` or a fake) as rank 0's roles use
    it: :meth:`send` seals what goes to an authenticated connection; everything else is the hub's.

    Args:
        hub: the hub to wrap (it stays the participant's: the port outlives the generation).
        sessions (dict[int, Session]): the authenticated connections (kept by :class:`~.door.Door`).
    """

    def __init__(self, hub, sessions: dict[int, Session]):
        self._hub, self._sessions = hub, sessions
        self._last: tuple[dict | None, bytes] = (None, b"")  # the last message and its canonical JSON

    def send(self, conn: int, msg: dict) -> None:
        s = self._sessions.get(conn)
        if s is None:
            self._hub.send(conn, msg)
            return
        # A broadcast (status, prepare, void) passes one dict for every connection: its JSON is
        # made once, not N times.  Held by reference, so the identity cannot be reused; a dict
        # changed between sends would only fail the member's check (a lost connection).
        last, body = self._last
        if last is not msg:
            body = canonical(msg)
            self._last = (msg, body)
        self._hub.send(conn, s.seal(msg, body))

    def __getattr__(self, name: str):
        value = getattr(self._hub, name)
        if callable(value):
            # A method of the hub (poll, drop, silent_for...): kept here, so later calls skip this
            # lookup (rank 0 polls at every step); data (port, limit) is read through each time.
            setattr(self, name, value)
        return value
