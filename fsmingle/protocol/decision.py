"""Rank 0's release decision as a pure function: what it knows in, one action out.

The driver (:mod:`fsmingle.protocol.rank0.coordinator`) gathers facts from the channel and
the filesystem into a :class:`CoordinatorView`; :func:`decide` says what to do
next.  Nothing here touches a socket, a file or a clock, so every rule can be
tested directly (torch's ``_RendezvousOpExecutor`` / ``_Action`` split in
``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`` is the model).

The rule behind every branch: **never release on absence of evidence.**  A
member is part of a release only if, right now, it holds a verified connection
to rank 0 and has acknowledged the release it is about to be part of; silence,
a lost connection or a missing acknowledgement void the generation instead.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from ..fs.records import Member


class Action(enum.Enum):
    WAIT = "wait"  # not complete yet, nothing wrong
    PREPARE = "prepare"  # every member connected and verified: ask each to acknowledge the release
    COMMIT = "commit"  # every member acknowledged: create release.json, then send the go
    VOID = "void"  # a member is gone or silent: create the restart decision, everyone regroups


@dataclass(frozen=True)
class CoordinatorView:
    """Everything rank 0 knows that matters for the decision.

    Attributes:
        size (int): world size (nnodes or world size).
        connected (AbstractSet[int]): ranks other than 0 holding a verified connection now
            (rank 0 passes a live view of its table: O(1) per decision, not O(N)).
        silent (dict[int, float]): seconds since they last sent anything, for connected ranks --
            at least those silent for ``stale_after`` (rank 0 passes only those silent for
            half of it, refreshed twice a second: a world of N would cost O(N) per decision).
        lost (dict[int, str]): verified ranks whose connection dropped, and why.
        dead_claimers (dict[int, str]): ranks claimed on the filesystem, never connected, and judged
            dead there (process gone, or heartbeat silent for ``stale_after``).
        preparing_for (float | None): seconds since the prepare was sent; None if not preparing.
        acked (AbstractSet[int]): member ranks (1..size-1) that acknowledged the prepare.
        stale_after (float): seconds of silence that make a connected member dead.
        ack_timeout (float): seconds a member has to acknowledge the prepare.
        spares (AbstractSet[int]): present ranks (0 included) held by participants started as
            spares (:mod:`fsmingle.protocol.outside`).  A world made of spares alone is never
            released: it waits for a survivor or a re-run (docs/protocol.md, "Spares").
    """

    size: int
    connected: AbstractSet[int]
    silent: dict[int, float] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    dead_claimers: dict[int, str] = field(default_factory=dict)
    preparing_for: float | None = None
    acked: AbstractSet[int] = frozenset()
    stale_after: float = 30.0
    ack_timeout: float = 2.0
    spares: AbstractSet[int] = frozenset()


SPARES_ALONE = "a world made of spares alone is never released: it waits for a survivor or a re-run"


def decide(v: CoordinatorView) -> tuple[Action, str]:
    """The next action and, for :attr:`Action.VOID`, the reason (for logs, the decision record and members)."""
    for r, why in sorted(v.lost.items()):
        return Action.VOID, f"rank {r} lost its connection to the master ({why})"
    for r, why in sorted(v.dead_claimers.items()):
        return Action.VOID, f"rank {r} {why}"
    for r, quiet in sorted(v.silent.items()):
        if quiet >= v.stale_after:
            return (
                Action.VOID,
                f"rank {r} was silent on its connection for {quiet:.0f} s (no answer is no proof of life)",
            )
    if len(v.spares) >= v.size:
        # Every rank held by a spare: releasing it would start a second world of a job that is
        # running (issue 29).  Never prepared; should it be preparing (a spare's word changed?),
        # it is voided rather than committed.
        return (Action.VOID, SPARES_ALONE) if v.preparing_for is not None else (Action.WAIT, "")
    if v.preparing_for is not None:
        # Counted first: acks arrive one by one, and listing who is missing on each would be O(N^2).
        if len(v.acked) >= v.size - 1 and not set(range(1, v.size)) - set(v.acked):
            return Action.COMMIT, ""
        if v.preparing_for >= v.ack_timeout:
            missing = sorted(set(range(1, v.size)) - set(v.acked))
            return Action.VOID, (
                f"rank {missing[0]} did not acknowledge the release within {v.ack_timeout:g} s "
                "(unreachable or stopped); an unanswered member is never released into the world"
            )
        return Action.WAIT, ""
    if len(v.connected) == v.size - 1:
        return Action.PREPARE, ""
    return Action.WAIT, ""


@dataclass(frozen=True)
class Placement:
    """Where one member stands in a released world: what it is told at release, over the channel.

    O(1) per member on the wire whatever the world size; the full member list
    stays in ``release.json``.

    Attributes:
        generation (int): the released generation.
        master_addr (str), master_port (int): rank 0's address and the port it held for torch.
        mode (str): ``"node"`` or ``"rank"``.
        size (int): nnodes (node mode) or world size (per-rank mode).
        rank (int): this member's rank (node rank in node mode).
        node_rank (int), nnodes (int): in per-rank mode, the index of this member's host among
            the distinct hosts in rank order, and their count; in node mode, rank and size.
        local_rank (int), local_world_size (int): index among the members on the same host, and their count.
    """

    generation: int
    master_addr: str
    master_port: int
    mode: str
    size: int
    rank: int
    node_rank: int
    nnodes: int
    local_rank: int = 0
    local_world_size: int = 1

    def as_wire(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_wire(cls, d: dict) -> Placement:
        """Rebuild from a wire dict.

        Raises:
            ValueError: a field is missing or of the wrong type (a broken peer).
        """
        if not isinstance(d, dict):
            raise ValueError(f"placement is {type(d).__name__}, not an object")
        kw = {}
        for name, typ in (
            ("generation", int),
            ("master_addr", str),
            ("master_port", int),
            ("mode", str),
            ("size", int),
            ("rank", int),
            ("node_rank", int),
            ("nnodes", int),
            ("local_rank", int),
            ("local_world_size", int),
        ):
            v = d.get(name)
            if not isinstance(v, typ) or isinstance(v, bool):
                raise ValueError(f"placement field {name!r} is {v!r}")
            kw[name] = v
        return cls(**kw)


def placements(members: list[Member], mode: str, master_port: int, generation: int) -> list[Placement]:
    """Each member's :class:`Placement`, in rank order.

    Per-rank mode groups members by host (boot id, hostname, address): node
    ranks number the distinct hosts in order of their lowest rank, local ranks
    number the members of one host in rank order -- what torchrun's
    ``LOCAL_RANK``/``GROUP_RANK`` mean.
    """
    size = len(members)
    master = members[0].addr
    if mode == "node":
        return [Placement(generation, master, master_port, mode, size, m.rank, m.rank, size) for m in members]

    def key(m: Member):
        return (m.host.boot_id, m.host.hostname, m.addr)

    hosts: dict = {}
    local: dict = {}
    for m in members:
        hosts.setdefault(key(m), len(hosts))
        local.setdefault(key(m), []).append(m.rank)
    return [
        Placement(
            generation,
            master,
            master_port,
            mode,
            size,
            m.rank,
            hosts[key(m)],
            len(hosts),
            local[key(m)].index(m.rank),
            len(local[key(m)]),
        )
        for m in members
    ]


# ---------------------------------------------------------------- rank order (who becomes which rank)

RANK_ORDERS = ("arrival", "host", "nodelist", "key")


def natural_key(s: str) -> tuple:
    """Sort key that orders digit runs by value: ``node2`` before ``node10``."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", s) if part)


def expand_nodelist(spec: str) -> list[str]:
    """Expand a Slurm hostlist (``SLURM_JOB_NODELIST``) as Slurm does, in its order.

    ``"node[1-3,7],gpu[08-10]"`` -> ``node1 node2 node3 node7 gpu08 gpu09 gpu10``;
    zero padding is kept, several bracket groups in one name multiply
    (``rack[1-2]-n[1-2]``).  Rules from Slurm's ``hostlist.c`` / ``scontrol show hostnames``.

    Raises:
        ValueError: unbalanced brackets or a bad range.
    """
    out: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(spec + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in {spec!r}")
        elif ch == "," and depth == 0:
            item = spec[start:i].strip()
            if item:
                out.extend(_expand_one(item))
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in {spec!r}")
    return out


def _expand_one(name: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", name)
    if not m:
        return [name]
    head, tail = name[: m.start()], name[m.end() :]
    values: list[str] = []
    for part in m.group(1).split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {part!r} in {name!r}")
            values += [str(v).zfill(len(lo)) for v in range(int(lo), int(hi) + 1)]
        elif part:
            values.append(part)
    return [h for v in values for h in _expand_one(head + v + tail)]


def order_members(
    slots: dict[int, Member], explicit: set[int], order: str, keys: dict[int, str], nodelist: list[str]
) -> list[Member]:
    """The members in final rank order: explicit ranks stay; first-come members fill the other slots by ``order``.

    Args:
        slots (dict[int, Member]): the member holding each claimed rank.
        explicit (set[int]): ranks that were asked for explicitly (``--node-rank``/``--rank``): they win.
        order (str): ``arrival`` (claim order: no change), ``host`` (natural hostname order),
            ``nodelist`` (position in ``nodelist``, then natural hostname), ``key`` (natural order
            of each member's topology key, hostname breaking ties).  Members of one host stay
            together in claim order, so their local ranks are contiguous.
        keys (dict[int, str]): topology key per rank (``--topology-key``).
        nodelist (list[str]): expanded ``SLURM_JOB_NODELIST``.

    Returns:
        list[Member]: ``len(slots)`` members, ``rank`` fields renumbered to their final rank.
    """
    size = len(slots)
    if order == "arrival":
        movable_order = sorted(r for r in slots if r not in explicit)
    else:
        pos = {h.split(".")[0]: i for i, h in enumerate(nodelist)}

        def sort_key(r: int):
            host = slots[r].host.hostname
            short = host.split(".")[0]
            first = (
                natural_key(keys.get(r, ""))
                if order == "key"
                else (pos.get(short, len(pos)),)
                if order == "nodelist"
                else ()
            )
            return (*first, natural_key(host), slots[r].host.boot_id, r)

        movable_order = sorted((r for r in slots if r not in explicit), key=sort_key)
    free = sorted(r for r in slots if r not in explicit)
    final: dict[int, Member] = {r: slots[r] for r in explicit}
    for slot, src in zip(free, movable_order):
        final[slot] = slots[src]
    return [dataclasses.replace(final[r], rank=r) for r in range(size)]
