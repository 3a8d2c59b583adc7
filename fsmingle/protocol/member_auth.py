"""A member's side of the channel's mutual authentication (wire protocol 4).

Its messages are signed (:meth:`Sealed._sign`: an HMAC over rank 0's challenge and the member's
own nonce, keyed by the secret in rank 0's endpoint record); rank 0's are checked
(:meth:`Sealed._unseal`: every message after the challenge carries rank 0's seal,
:func:`fsmingle.net.wire.seal`).  Mixed into :class:`~fsmingle.protocol.member.Member`, which
treats a message without a valid seal as a lost connection (its module doc).
"""

from __future__ import annotations

from ..errors import ConfigError
from ..net.wire import WIRE_VERSION, auth_mac


class Sealed:
    """Signing what the member sends, checking what rank 0 sends (see the module doc)."""

    def _sign(self, msg: dict) -> dict:
        """``msg`` with its ``mac``: over this connection's challenge, our own nonce (a hello or an
        ask carries it: rank 0 seals what it says back over it) and who sends it for what."""
        p = self.p
        rank = None if msg["t"] == "ask" else p.rank
        if msg["t"] != "ack":
            msg["mnonce"] = self.mnonce
        msg["mac"] = auth_mac(self.master.secret, self.nonce, msg["t"], p.job_id, p.gen, p.instance, rank, self.mnonce)
        return msg

    def _other_version(self, v) -> None:
        """A challenge of another wire version (``v``; None: 3, which did not say).  Nobody signs a
        challenge, so its word alone ends nothing: the endpoint record (the job's own uid wrote
        it) decides -- rank 0 runs another fsmingle: fail naming both; else the connection is lost."""
        p, b = self.p, self.master
        theirs = v if type(v) is int else 3
        if b.version and p.version and b.version != p.version:
            raise ConfigError(
                f"rank 0 on {b.host.hostname} ({b.addr}) runs fsmingle {b.version}, which speaks wire protocol "
                f"{theirs}; this node runs fsmingle {p.version}, wire protocol {WIRE_VERSION}; "
                "run the same fsmingle version on every node"
            )
        self._lost(f"the process on the master port sent a challenge of wire protocol {str(theirs)[:16]}")

    def _unseal(self, msgs: list[dict]) -> tuple[list[dict], str | None]:
        """The messages (after the challenge) that carry rank 0's valid seal, up to the first one
        that does not; and what was wrong with that one (None: all were sealed)."""
        for i, m in enumerate(msgs):
            why = self.unsealer.check(m) if self.unsealer is not None else "a message before the challenge"
            if why is not None:
                return msgs[:i], why
        return msgs, None
