"""An enumeration world that reaches the "retired under it" rejoin of a node in DECIDING (session 7, ``adv7``).

``Leaving._step_deciding``: a member that acknowledged generation g's release and lost rank 0 reads g's decision;
once per ``stale_after`` it lists the job directory, and g + 2 without g (retired by
``cleanup.retire_decided_below``) makes it rejoin.  No world of ``test_exhaustive`` goes on two generations while a
member sits in DECIDING, so no fault point reached that branch (session 6's ``adv``).  :class:`RetiredScenario`'s
script does, with no fault:

1. slots 0 (A, rank 0) and 1 (B) start; B acknowledges generation 1's release; A dies at its create of
   ``release.json`` (before the effect: nothing was released);
2. B, in DECIDING (its void lost to another member's), is held (SIGSTOP, a swap storm) at its first read of the decision for ``hold`` seconds, its
   beacon still;
3. a supervisor (Slurm ``--requeue``, a pod's restart) restarts a dead or exited slot process ``restart_delay``
   seconds later on the same host.  A' (its ``--timeout`` short: ``restart_timeout``) judges A and B dead, voids
   generation 1, is rank 0 of generation 2 without rank 1, times out (its void makes generation 3) and exits;
4. A'' is rank 0 of generation 3; its cleaner retires generation 1 (decided, two below);
5. B resumes: generation 1's decision is gone, the listing shows 3 without 1 -- the branch -- and B rejoins;
   generation 3 is released with A'' and B.

Every fault point of that run (:func:`count_points`) then gets every fault kind (``model_enum``), with the
oracles of :class:`model_world.World`; :attr:`RetiredWorld.reached` counts the rejoins by that branch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from fsmingle.fs.layout import release_name
from fsmingle.fs.records import Release, decode
from fsmingle.protocol.states import State

try:
    from model_enum import EnumWorld, Point, Scenario
    from model_oracles import TIMING
    from model_world import Proc
except ImportError:  # tests/ imported as a package
    from tests.model_enum import EnumWorld, Point, Scenario
    from tests.model_oracles import TIMING
    from tests.model_world import Proc

RETIRED_NOTE = "was decided and retired while this node read its decision"  # Leaving._step_deciding's note


class RetiredWorld(EnumWorld):
    """An :class:`EnumWorld` with the module doc's script hooks: rank 0 of generation 1 dies at its release, the
    member in DECIDING is held, a supervisor restarts dead slot processes.

    Attributes:
        reached (int): rejoins by the "retired under it" branch (a step that set :data:`RETIRED_NOTE`).
        held (Proc | None): the process held in DECIDING (once per run).
        during_hold (set[tuple[int, int]]): (process index, step number) of every step taken while it is held, and
            of its own steps from the one it is held in.
    """

    def __init__(
        self,
        *a,
        hold: float,
        hold_nth: int,
        trap_after: bool,
        restart_delay: float,
        restart_timeout: float,
        max_restarts: int,
        **kw,
    ):
        self.hold_for, self.hold_nth, self.trap_after, self.restart_delay = hold, hold_nth, trap_after, restart_delay
        self.deciding_reads = 0  # reads of a decision in DECIDING before the hold
        self.restart_timeout, self.max_restarts = restart_timeout, max_restarts
        self.held: Proc | None = None
        self.trapped = False
        self.reached = 0
        self.restarts: Counter = Counter()
        self.pending: list[tuple[float, int]] = []  # (when, slot) of the supervisor's restarts
        self.stepping: list[Proc] = []
        self.during_hold: set[tuple[int, int]] = set()  # (process index, step number) of the steps taken in the hold
        super().__init__(*a, **kw)

    # ------------------------------------------------------------------ the script's hooks
    def host(self, key: int):
        new = key not in self.hosts
        h = super().host(key)
        if new:
            store = h.store
            read, create = store.read, store.create
            store.read = lambda name: self._hold_then(read, name)
            store.create = lambda name, data, fsync=True: self._trap_then(store, create, name, data, fsync)
        return h

    def _trap_then(self, store, create, name: str, data: bytes, fsync: bool):
        # Rank 0 of generation 1 (slot 0's host) dies at the create of its release, before the effect: every
        # member acknowledged, nothing is released.  Armed as model_enum's "death" kind is (FakeStore.arm_crash).
        if not self.trapped and name == release_name(1) and self._slot_now() == 0:
            if decode(data, Release).state == "released":
                self.trapped = True
                self.say(
                    f"script: rank 0 of generation 1 dies at its create of release.json (after: {self.trap_after})"
                )
                store.arm_crash(0, self.trap_after)
        return create(name, data, fsync)

    def _hold_then(self, read, name: str):
        q = self.stepping[-1] if self.stepping else None
        deciding = q is not None and q.slot is not None and q.p.state is State.DECIDING
        if self.held is None and deciding and name == release_name(q.p.gen):
            self.deciding_reads += 1
            if self.deciding_reads == self.hold_nth:
                self.held = q
                self.say(f"script: {q.instance[:4]} held {self.hold_for:g} s in DECIDING (generation {q.p.gen})")
                # The others' steps inside the hold record their own points (EnumWorld._recorded): keep this
                # step's.
                mine, net = q.host.store.trace, self.net.trace
                try:
                    self.pause(q, self.hold_for)
                finally:
                    q.host.store.trace, self.net.trace = mine, net
        return read(name)

    def _slot_now(self) -> int | None:
        return self.stepping[-1].slot if self.stepping else None

    def step(self, q: Proc, **kw):
        at = (self.procs.index(q), self.steps_of.get(q.instance, 0))
        self.stepping.append(q)
        note = q.p.seat.note
        try:
            return super().step(q, **kw)
        finally:
            self.stepping.pop()
            if self.held is not None and (q is self.held or self.held in self.paused):
                self.during_hold.add(at)
            if RETIRED_NOTE in q.p.seat.note and q.p.seat.note != note:
                self.reached += 1
                self.say(f"{q.instance[:4]} rejoins: {q.p.seat.note}")

    # ------------------------------------------------------------------ the supervisor
    def _die(self, q: Proc, status: str) -> None:
        super()._die(q, status)
        if q.slot is not None and self.restarts[q.slot] < self.max_restarts:
            self.restarts[q.slot] += 1
            self.pending.append((self.fs.now + self.restart_delay, q.slot))

    def _restart_due(self) -> None:
        due = [x for x in self.pending if x[0] <= self.fs.now]
        self.pending = [x for x in self.pending if x[0] > self.fs.now]
        for _, slot in sorted(due):
            cur = self.current(slot)
            if cur is None or not cur.alive:
                # The first restart of slot 0 is the one whose --timeout voids generation 2 (module doc, 3).
                first = slot == 0 and sum(1 for q in self.procs if q.slot == 0) == 1
                self.start(slot, timeout=self.restart_timeout if first else None)

    def tick(self, dt: float, stop=None) -> None:
        # In chunks of at most restart_delay: a death inside a chunk is restarted at or after its end.
        end = self.fs.now + dt
        while True:
            self._restart_due()
            if stop is not None and stop():
                return
            if self.fs.now >= end:
                return
            upto = min(end, self.fs.now + self.restart_delay, *(t for t, _ in self.pending))
            super().tick(upto - self.fs.now, stop)


@dataclass(frozen=True)
class RetiredScenario(Scenario):
    """The module doc's world: ``size`` explicit or first-come slots; ``hold``, ``restart_delay`` and
    ``restart_timeout`` in seconds; ``max_restarts`` per slot."""

    hold: float = 4 * TIMING.stale_after
    trap_after: bool = False  # rank 0 dies after its release.json took effect (the members released)
    hold_nth: int = 1  # held at its hold_nth read of the decision (2: after its first listing of the root)
    restart_delay: float = 1.0
    restart_timeout: float = 2 * TIMING.stale_after
    max_restarts: int = 3
    script_time: float = 180.0
    lag: float = 0.0  # seconds every view lags the truth (0: none)

    def world(self, plan=None, record: bool = False, cls=None, **options) -> RetiredWorld:
        return super().world(
            plan,
            record,
            cls=RetiredWorld,
            hold=self.hold,
            hold_nth=self.hold_nth,
            trap_after=self.trap_after,
            restart_delay=self.restart_delay,
            restart_timeout=self.restart_timeout,
            max_restarts=self.max_restarts,
            **({"staleness": self.lag, "initial_lag": 1.0} if self.lag else {}),
            **options,
        )

    def script(self, w: RetiredWorld) -> None:
        for s in range(self.size):
            w.start(s)

        def over() -> bool:
            if self.trap_after and w.held is not None and w.held.status != "running":
                return True  # released into generation 1 (its master dead): the rest waits in generation 3
            cur = [w.current(s) for s in range(self.size)]
            return not w.pending and all(q is not None and q.status != "running" for q in cur)

        w.tick(self.script_time, stop=over)


def count_points(sc: RetiredScenario) -> tuple[list[Point], RetiredWorld]:
    """The fault points of ``sc``'s run without faults (asserting it reached the branch and was released)."""
    w = sc.world(record=True)
    sc.script(w)
    if sc.trap_after:  # the held member's release stands (retire_decided_below keeps it): no rejoin
        q = w.held
        assert q is not None and q.status == "done" and q.result.generation == 1, "\n".join(w.log[-40:])
        return list(w.points), w
    assert w.reached, "the fault-free run never rejoined by the 'retired under it' branch:\n" + "\n".join(w.log[-40:])
    slots = [w.current(s) for s in range(sc.size)]
    assert all(q.status == "done" for q in slots), "the fault-free run did not release:\n" + "\n".join(w.log[-40:])
    return list(w.points), w


SCENARIOS = [
    RetiredScenario("3 explicit, held in DECIDING", 3, explicit=True),
    RetiredScenario("3 first-come, held in DECIDING", 3),
    # Its view lags 2 s: the first read in DECIDING finds nothing and lists the root (generation 1 still there,
    # Timers.retired_check set stale_after ahead); held at its second read, it lists again only once that passed.
    RetiredScenario("3 explicit, views lag 2 s, held at its 2nd read", 3, explicit=True, lag=2.0, hold_nth=2),
    # Rank 0 dies just after its release took effect: the held member is named by it; a late participant (the
    # restart) voids generation 2 at its --timeout and its restart is rank 0 of 3 -- the release is not retired.
    RetiredScenario("3 explicit, rank 0 dies after its release", 3, explicit=True, trap_after=True),
]
