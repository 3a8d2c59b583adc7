"""``fsmingle env --format hostfile|json``: the released world as launchers want it.

A hostfile is one ``host slots=N`` line per node, in rank order: the format
DeepSpeed's launcher reads (``deepspeed --hostfile``, ``deepspeed/launcher/runner.py``
``_parse_hostfile``: ``hostname slots=N``, ``#`` comments) and Open MPI's
``mpirun --hostfile`` reads (``host slots=N``).  Both start the job from the
first line's host, so the order is the rendezvous's rank order.

Every node prints the same file: the member list comes from rank 0 at release
(``want_members=True``), and ``slots`` is one number for all lines (fsmingle
does not exchange GPU counts; give ``--slots`` on heterogeneous nodes).
"""

from __future__ import annotations

from ..api import Rendezvous

__all__ = ["default_slots", "hostfile", "members_json", "nodes"]


def nodes(r: Rendezvous) -> list[str]:
    """The world's nodes in rank order, one name each: hostnames, or addresses if hostnames repeat.

    Node mode: one per member (each member is a node).  Per-rank mode: each
    distinct (hostname, address) once, at its first member's place.  Two nodes
    with one hostname (containers that all call themselves ``localhost``) would
    merge into one hostfile line, so then every node is named by its address
    instead (always reachable: it is the address the node announced); if those
    repeat too (several nodes simulated on one machine), hostnames stay.

    Raises:
        ValueError: ``r`` carries no member list (it was not asked for with ``want_members``).
    """
    if not r.members:
        raise ValueError("the rendezvous result has no member list; call rendezvous(..., want_members=True)")
    hosts = r.member_hosts or r.members
    pairs = list(zip(hosts, r.members))
    if r.mode != "node":
        pairs = [p for k, p in enumerate(pairs) if p not in pairs[:k]]
    names = [h for h, _ in pairs]
    addrs = [a for _, a in pairs]
    if len(set(names)) != len(names) and len(set(addrs)) == len(addrs):
        return addrs
    return names


def hostfile(r: Rendezvous, slots: int) -> str:
    """The hostfile text: ``"<node> slots=<slots>\\n"`` per node in rank order (see :func:`nodes`)."""
    return "".join(f"{n} slots={slots}\n" for n in nodes(r))


def members_json(r: Rendezvous) -> list[dict]:
    """Every member in rank order: ``rank``, ``host``, ``addr``, ``arrival`` (seconds after the first arrival).

    ``rank`` is the node rank in node mode and the global rank in per-rank mode.
    """
    hosts = r.member_hosts or ("",) * len(r.members)
    arrivals = r.arrivals or (0.0,) * len(r.members)
    return [
        {"rank": k, "host": h, "addr": a, "arrival": round(t, 3)}
        for k, (h, a, t) in enumerate(zip(hosts, r.members, arrivals))
    ]


def default_slots(gpus_per_node: int | None = None) -> int:
    """``--slots`` when not given: ``--gpus-per-node``, else this node's usable GPU count, else 1."""
    if gpus_per_node:
        return gpus_per_node
    from ..preflight.gpu import visible

    return visible() or 1
