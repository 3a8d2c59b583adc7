"""The participant's state, typed: what each part of :class:`~fsmingle.protocol.participant.Participant` acts on.

The participant is built from parts (:class:`~fsmingle.protocol.joining.Joining`,
:class:`~fsmingle.protocol.leaving.Leaving`, :class:`~fsmingle.protocol.genreader.GenerationReader`,
:class:`~fsmingle.protocol.outside.OutsideWorld` and the driver) sharing one object.  As torch's
dynamic rendezvous keeps its state in one ``_RendezvousState`` and its actions apart, the
participant keeps what its parts share in the objects below, made once by the driver; each part
declares the ones it acts on in its class body (``view: GenView``), so its inputs are read from
its declaration, and ``tests/test_parts.py`` checks that no part reads a plain field another
assigns.

* :class:`Identity`: who this participant is and what it asks for (fixed for the process).
* :class:`Wiring`: what it works through (the store, the clock, the transport, callbacks).
* :class:`GenView`: what it knows of its generation (claims, who is present, the decision read),
  part of it reset on every join (:meth:`GenView.reset`).
* :class:`Seat`: where it stands in that generation (its :class:`State`, rank, role, placement).
* :class:`Timers`: the deadline, the next heartbeat and check, the polling delay.
* :class:`Spares`: its standing as a spare (``--spare-timeout``).

The rest of the engine (rank 0, the member, the queue) reaches these through ``Participant``'s
attribute names of before (``p.gen``, ``p.rank``): :func:`compat_properties`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from ..fs.records import HostId
from ..fs.store import Store
from .decision import Placement
from .hold import DeadlineHold
from .liveness import Judge
from .states import RankSet, State
from .timing import Clock, Timing


@dataclass(frozen=True)
class Identity:
    """Who this participant is and what it asks for; fixed for the life of the process.

    Attributes:
        job_id (str), mode (str: ``"node"`` or ``"rank"``), size (int: nnodes or world size).
        want_rank (int | None): the rank asked for, None for first-come.
        addr (str): the address it announces; instance (str): its unique hex id; me (HostId).
        master_port_wanted (int | None): the port rank 0 should hold (None: any free one).
        restart_count (int), slurm_job_id (str), scheduler (tuple): its scheduler identity.
        version (str); rank_order, topology_key (str), nodelist (tuple[str, ...]),
        want_members, check_mesh (bool): see :class:`~fsmingle.protocol.participant.Participant`.
    """

    job_id: str
    mode: str
    size: int
    want_rank: int | None
    addr: str
    instance: str
    me: HostId
    master_port_wanted: int | None = None
    restart_count: int = 0
    slurm_job_id: str = ""
    scheduler: tuple = ()
    version: str = ""
    rank_order: str = "arrival"
    topology_key: str = ""
    nodelist: tuple[str, ...] = ()
    want_members: bool = False
    check_mesh: bool = False


@dataclass
class Wiring:
    """What the participant works through: the same code runs on a real directory with TCP and
    on the model's fake filesystem and network (arguments of ``Participant``).  ``queue``: a
    :class:`~fsmingle.protocol.queue.QueueWatch` or None."""

    store: Store
    transport: Any
    timing: Timing
    clock: Clock
    local_alive: Callable[[HostId, HostId], bool | None]
    rng: random.Random
    queue: Any = None
    on_progress: Callable | None = None
    cleaner: Callable[[int], None] | None = None


@dataclass
class GenView:
    """What this participant knows of its generation and of the attempt so far.

    Attributes:
        gen (int | None): the generation it joined; left (int): the highest it left (never
            joined again).
        claims (dict[int, str]): rank -> instance (claims are immutable within a generation).
        judge (Judge | None): liveness of the holders, from their beacons.
        vouch_seen (tuple | None): (when, rank 0's beacon, its verdict), one read per step.
        contest_holder (str | None): the holder of the contested rank, once read; contest_life
            (bool): rank 0 was seen heartbeating while vouching for that holder (a world forms).
        release_bad_since (float | None): since when the decision has been unusable (monotonic s).
        present (RankSet | None): who is present now; present_spares (int): how many of them spares.
        master_names (list[str] | None): the joiner's listing of ``master/``, for the member's
            first look; rank0_by_creator (bool): the generation's maker is taking rank 0.
        missing_hint (list[int] | None), never_present (frozenset[int] | None): for a timeout's
            message (ranks never seen present in this attempt are the news).
        warned (dict[str, int]): files named once, then counted.
    """

    gen: int | None = None
    left: int = 0
    claims: dict[int, str] = field(default_factory=dict)
    judge: Judge | None = None
    vouch_seen: tuple | None = None
    contest_holder: str | None = None
    contest_life: bool = False
    release_bad_since: float | None = None
    present: RankSet | None = None
    present_spares: int = 0
    master_names: list[str] | None = None
    rank0_by_creator: bool = False
    missing_hint: list[int] | None = None
    never_present: frozenset[int] | None = None
    warned: dict[str, int] = field(default_factory=dict)

    def reset(self, judge: Judge) -> None:
        """Forget what was known of the previous generation (a join, or a new participant)."""
        self.claims = {}
        self.judge = judge
        self.vouch_seen = None
        self.contest_holder = None
        self.release_bad_since = None
        self.present = None
        self.present_spares = 0


@dataclass
class Seat:
    """Where this participant stands in its generation.

    Attributes:
        state (State), note (str: the latest notable event, for displays).
        waiting_why (str): the note while it is rank 0's word on whom it waits for (``rank0/reach.py``), which its
            status messages tell the members (``why``); "" once another note replaces it.
        rank (int | None): the rank it holds; role: its Coordinator or Member while it holds one;
        hub: rank 0's listening endpoint (the master port), held until exec.
        result (Placement | None): its placement once released; released_members (tuple): the
            world in rank order when asked for; in_doubt (bool): withdrew in the commit window
            without reading the decision.
        stepdowns (int): consecutive generations whose rank 0 this node was and nobody reached
            (:mod:`fsmingle.protocol.rank0.reach`), or whose unreachable rank 0 it withdrew from
            (:mod:`fsmingle.protocol.partition`); 0 after any network contact.
        rank0_held_back (bool): this node, rank 0 of a full world that a spare watched, voided its
            generation while nobody reached it: it holds back its claim of rank 0, even an explicit
            ``--node-rank 0``, until ``Timers.shy_until`` (:mod:`fsmingle.protocol.partition`).
    """

    state: State = State.JOIN
    note: str = ""
    waiting_why: str = ""
    rank: int | None = None
    role: Any = None
    hub: Any = None
    result: Placement | None = None
    released_members: tuple = ()
    in_doubt: bool = False
    stepdowns: int = 0
    rank0_held_back: bool = False

    def drop_role(self) -> None:
        """Close the Coordinator or Member this participant holds, if any (its peers see the
        connection drop at once), and forget it."""
        if self.role is not None:
            self.role.close()
            self.role = None

    def drop_hub(self) -> None:
        """Close rank 0's listening endpoint, if held: the master port is free for torch (or for
        the next rank 0) from here on."""
        if self.hub is not None:
            self.hub.close()
            self.hub = None


@dataclass
class Timers:
    """The participant's times (monotonic seconds) and delays (seconds).

    Attributes:
        started, timeout, deadline: when it started, ``--timeout``, and when it fails (moved by
            holds); grace (bool): the deadline was extended once to read a decision.
        next_hb (float): when its beacon is due; heartbeat (int): beacons written.
        next_check (float): when a world-full watcher judges the holders next.
        delay (float): the polling delay (backoff); enoent_since (float | None): since when a
            listing shows the generation a lookup calls absent.
        busy_since, busy_gen: since when, and in which generation, ``--port`` was busy.
        shy_until (float | None): until when this node leaves rank 0 to others after a step-down
            (:mod:`fsmingle.protocol.partition`).
        retired_check (float): when a node in DECIDING may list the job directory next, to see its
            generation retired under it (:mod:`fsmingle.protocol.leaving`: once per ``stale_after``).
            Kept across generations on purpose: a node that enters DECIDING again soon (a chain of voids)
            still lists the whole job directory at most once per ``stale_after``; its first look in the
            new generation comes at most ``stale_after`` late, the bound that rule answers within anyway.
    """

    started: float
    timeout: float
    deadline: float
    delay: float
    next_hb: float = 0.0
    next_check: float = 0.0
    heartbeat: int = 0
    grace: bool = False
    enoent_since: float | None = None
    busy_since: float | None = None
    busy_gen: int | None = None
    shy_until: float | None = None
    retired_check: float = 0.0

    def due(self, now: float, period: float) -> None:
        """Heartbeat and check both due one ``period`` from ``now`` (a new generation)."""
        self.next_hb = self.next_check = now + period


@dataclass
class Spares:
    """Its standing as a spare (:mod:`fsmingle.protocol.outside`).

    Attributes:
        hold (DeadlineHold): ``--timeout`` held while a spare, bounded by ``--spare-timeout``.
        spare_for (int): the released generation it arrived too late for, 0: none.
        backs (int): the generation it backs while the hold lasts, 0: none.
        spare (bool): started as a spare (never a world of spares alone).
    """

    hold: DeadlineHold
    spare_for: int = 0
    backs: int = 0
    spare: bool = False


# Participant's attribute names of before -> (state object, its field): the other modules of the
# engine (rank 0, the member, the queue) and the tests use them.
COMPAT = {
    **{n: ("ident", n) for n in Identity.__dataclass_fields__},
    **{n: ("wiring", n) for n in Wiring.__dataclass_fields__},
    **{n: ("view", n) for n in GenView.__dataclass_fields__ if n not in ("vouch_seen", "warned")},
    "_vouch_seen": ("view", "vouch_seen"),
    "_warned": ("view", "warned"),
    **{n: ("seat", n) for n in Seat.__dataclass_fields__},
    **{n: ("timers", n) for n in ("started", "timeout", "deadline", "delay", "next_hb", "next_check", "heartbeat")},
    "_grace": ("timers", "grace"),
    "_enoent_since": ("timers", "enoent_since"),
    "_busy_since": ("timers", "busy_since"),
    "_busy_gen": ("timers", "busy_gen"),
    "spare_hold": ("spares", "hold"),
    "spare_for": ("spares", "spare_for"),
    "spare_backs": ("spares", "backs"),
    "spare": ("spares", "spare"),
}


def compat_properties(cls: type) -> type:
    """Class decorator: give ``cls`` a property per :data:`COMPAT` name, reading and writing the
    state object's field (``p.gen`` is ``p.view.gen``).  The parts never use them
    (``tests/test_parts.py``)."""

    def make(holder: str, name: str) -> property:
        def put(self, value):
            setattr(getattr(self, holder), name, value)

        # attrgetter: read in C, no Python frame (rank 0 reads p.gen, p.size per member and step).
        return property(attrgetter(f"{holder}.{name}"), put, doc=f"``self.{holder}.{name}``")

    for old, (holder, name) in COMPAT.items():
        setattr(cls, old, make(holder, name))
    return cls
