"""Every private name of torch's elastic rendezvous that the fsmingle backend relies on.

torch's ``DynamicRendezvousHandler`` (``torch/distributed/elastic/rendezvous/
dynamic_rendezvous.py``) is the rendezvous policy this backend reuses, and it
has no public extension API beyond ``RendezvousBackend``.  The backend needs a
handful of its private classes and members; they are listed here, in one
place, so that a torch upgrade that moves one fails in :func:`missing` (run by
``tests/test_torchrun_backend.py::test_torch_private_names_exist``) with the
member's name, instead of as an ``AttributeError`` deep inside a rendezvous.

Checked against torch 2.13.0.  When one moves: read the new
``dynamic_rendezvous.py``, adapt the user named in the table below, and update
the table.
"""

from __future__ import annotations

import torch
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as _dr
from torch.distributed.elastic.rendezvous.api import RendezvousStateError

DR_MODULE = _dr.__name__

# name in dynamic_rendezvous -> what fsmingle uses it for
MODULE_NAMES = {
    "_NodeDesc": "node identity in every state file (codec)",
    "_RendezvousState": "the state the backend stores as JSON (codec)",
    "_RendezvousContext": "argument of the close/leave operations (handler)",
    "_Action": "results of the close/leave operations (handler)",
    "_RendezvousJoinOp": "the join operation whose deadline peer jobs in the queue hold (queuehold)",
}

# _Action members returned by fsmingle's own operations (handler)
ACTION_MEMBERS = (
    "FINISH",
    "ERROR_TIMEOUT",
    "MARK_RENDEZVOUS_CLOSED",
    "REMOVE_FROM_PARTICIPANTS",
    "REMOVE_FROM_WAIT_LIST",
    "REMOVE_FROM_REDUNDANCY_LIST",
)

# DynamicRendezvousHandler methods fsmingle overrides or calls (handler)
HANDLER_METHODS = {
    "_start_heartbeats": "overridden: heartbeat files instead of keep-alive writes",
    "_stop_heartbeats": "overridden: heartbeats run from the first join to shutdown",
    "_keep_alive": "overridden: never writes the shared state",
    "_get_store": "overridden: the round's TCPStore hosted by rank 0",
    "_create_tcp_store_server": "overridden: share the round's TCPStore with the workers",
    "_close": "overridden: close only this node's lineage",
    "_get_deadline": "called for close/leave deadlines",
}

# DynamicRendezvousHandler instance attributes set in its __init__ (handler)
HANDLER_ATTRIBUTES = {
    "_this_node": "this agent's node descriptor",
    "_settings": "run id and timeouts",
    "_state_holder": "the state of the round just joined",
    "_op_executor": "runs the close/leave operations; wrapped to hold the join deadline (queuehold)",
    "_heartbeat_lock": "serialises shutdown with keep-alives",
    "_bootstrap_store_info": "reset every round (new TCPStore per round)",
    "_shared_tcp_store_server": "reset every round (new TCPStore per round)",
}

# _RendezvousState fields (codec) and RendezvousSettings fields (handler, backend)
STATE_FIELDS = (
    "round",
    "complete",
    "deadline",
    "closed",
    "participants",
    "wait_list",
    "redundancy_list",
    "last_heartbeats",
)
SETTINGS_FIELDS = ("run_id", "timeout", "keep_alive_interval", "keep_alive_max_attempt")


def missing() -> list[str]:
    """Names listed in this module that the installed torch does not have.

    Returns:
        list[str]: e.g. ``["DynamicRendezvousHandler._keep_alive (overridden: ...)"]``;
        empty when everything is where fsmingle expects it.
    """
    out = []
    for name, why in MODULE_NAMES.items():
        if not hasattr(_dr, name):
            out.append(f"{DR_MODULE}.{name} ({why})")
    action = getattr(_dr, "_Action", None)
    for m in ACTION_MEMBERS:
        if action is not None and not hasattr(action, m):
            out.append(f"{DR_MODULE}._Action.{m}")
    cls = _dr.DynamicRendezvousHandler
    for name, why in HANDLER_METHODS.items():
        if not callable(getattr(cls, name, None)):
            out.append(f"DynamicRendezvousHandler.{name} ({why})")
    init_src = _source(cls.__init__)
    for name, why in HANDLER_ATTRIBUTES.items():
        if f"self.{name}" not in init_src:
            out.append(f"DynamicRendezvousHandler.{name}, set in __init__ ({why})")
    state_cls = getattr(_dr, "_RendezvousState", None)
    if state_cls is not None:
        st = state_cls()
        out += [f"_RendezvousState.{f}" for f in STATE_FIELDS if not hasattr(st, f)]
    fields = getattr(_dr.RendezvousSettings, "__dataclass_fields__", {})
    out += [f"RendezvousSettings.{f}" for f in SETTINGS_FIELDS if f not in fields]
    return out


def _source(fn: object) -> str:
    import inspect

    try:
        return inspect.getsource(fn)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""


def _require(name: str) -> object:
    try:
        return getattr(_dr, name)
    except AttributeError:
        raise ImportError(
            f"torch {torch.__version__} has no {DR_MODULE}.{name}, which the fsmingle torchrun backend "
            "needs (see fsmingle/torchrun/_torch_private.py); use torch 2.6 to 2.13 or update fsmingle"
        ) from None


NodeDesc = _require("_NodeDesc")
RendezvousState = _require("_RendezvousState")
RendezvousContext = _require("_RendezvousContext")
Action = _require("_Action")
JoinOp = _require("_RendezvousJoinOp")

__all__ = [
    "DR_MODULE",
    "Action",
    "JoinOp",
    "NodeDesc",
    "RendezvousContext",
    "RendezvousState",
    "RendezvousStateError",
    "missing",
]
