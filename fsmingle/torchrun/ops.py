"""The handler's own rendezvous operations, run by torch's op executor like its join and exit.

torch's ``_DistributedRendezvousOpExecutor.run(op, deadline)`` calls ``op(ctx, deadline)``
until it returns ``_Action.FINISH`` (``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from ._torch_private import Action, RendezvousContext
from .backend import FsRendezvousBackend


class GuardedCloseOp:
    """torch's close operation, limited to the lineage this node was a member of."""

    def __init__(self, backend: FsRendezvousBackend) -> None:
        self._backend = backend

    def __call__(self, ctx: RendezvousContext, deadline: float) -> Action:
        if ctx.state.closed:
            return Action.FINISH
        member = self._backend.member_epoch
        if member is None or self._backend.epoch != member:
            # We never joined this lineage (or a newer run took over): not ours to close.
            return Action.FINISH
        if time.monotonic() > deadline:
            return Action.ERROR_TIMEOUT
        return Action.MARK_RENDEZVOUS_CLOSED


class LeaveOp:
    """Remove this node from the state: its agent is exiting."""

    def __call__(self, ctx: RendezvousContext, deadline: float) -> Action:
        s, n = ctx.state, ctx.node
        if n in s.participants:
            action = Action.REMOVE_FROM_PARTICIPANTS
        elif n in s.wait_list:
            action = Action.REMOVE_FROM_WAIT_LIST
        elif n in s.redundancy_list:
            action = Action.REMOVE_FROM_REDUNDANCY_LIST
        else:
            return Action.FINISH
        if n not in s.last_heartbeats:
            # torch's removal actions delete the heartbeat entry too.
            s.last_heartbeats[n] = datetime.now(timezone.utc)
        if time.monotonic() > deadline:
            return Action.ERROR_TIMEOUT
        return action
