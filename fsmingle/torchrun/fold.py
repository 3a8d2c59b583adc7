"""Fold heartbeat verdicts into the state torch's handler reads.

torch judges liveness in ``_BackendRendezvousStateHolder._sanitize``
(``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``): a node whose
``last_heartbeats`` entry is older than ``keep_alive_interval *
keep_alive_max_attempt`` is removed.  Here every entry is replaced, on the
way to torch, by ``now - age`` with ``age`` from the heartbeat files
(:class:`~fsmingle.torchrun.heartbeat.LivenessView`), so torch's rule runs
unchanged on evidence that never needs the shared state to be written.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ._torch_private import NodeDesc, RendezvousState
from .codec import copy_state
from .heartbeat import LivenessView


def fold_state(st: RendezvousState, me: NodeDesc | None, view: LivenessView, own_age: float) -> RendezvousState:
    """A copy of ``st`` whose ``last_heartbeats`` say what this observer knows.

    For each node torch tracks (the keys of ``last_heartbeats``) the time
    becomes ``now - age``: ``own_age`` for this node, else the seconds since
    its heartbeat counter last grew on this observer's monotonic clock.  While
    this node takes part in a completed round, only waiting and redundant
    nodes are judged (the others count as alive now): the participants run
    together, a dead one surfaces as a worker failure and a new round, which
    judges everyone.  That keeps an idle agent at zero heartbeat reads per poll.

    Args:
        st (_RendezvousState): the stored state (not modified).
        me (_NodeDesc | None): this node, if known.
        view (LivenessView): this observer's verdicts (its members are updated).
        own_age (float): this node's heartbeat age as others see it, seconds.

    Returns:
        _RendezvousState: the copy torch gets.
    """
    view.set_members(set(st.participants) | st.wait_list | st.redundancy_list)
    tracked = set(st.last_heartbeats)
    if me is not None and st.complete and me in st.participants:
        judged = (st.wait_list | st.redundancy_list) & tracked
    else:
        judged = set(tracked)
    judged.discard(me)  # type: ignore[arg-type]
    view.observe(judged)
    now = datetime.now(timezone.utc)
    out = copy_state(st)
    for n in tracked:
        age = own_age if n == me else view.age(n) if n in judged else 0.0
        out.last_heartbeats[n] = now - timedelta(seconds=age)
    return out
