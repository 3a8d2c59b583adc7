"""Exhaustive small-scope fault enumeration on the model (issue 29): instead of a random fault
somewhere, every fault point of every role, each with every fault kind.

A :class:`Scenario` is a small world and a script (who starts when).  :func:`count_points` runs it
once without faults and records every *fault point*: each store operation (``read``, ``listdir``,
``publish``, ``create``, ``mkdir``, ``remove``, ``retire``), each network ``send`` and ``poll``
(receive) and each scheduler query of each step of each process, with the role the process held
at that step (``rank0``, ``member``, ``asker``, ``spare``, or its state while it joins).
:func:`run_one` then runs the same script again with one fault (or two, :data:`DEPTH`) placed at
such a point -- the runs are deterministic (the fake clock and network, seeded jitter), so the
n-th step of the i-th process is the same step until the fault lands -- and checks every oracle of
:class:`model_world.World` on every action, then :meth:`~model_oracles.WorldOracles.run_to_completion`
(liveness once faults stop) and :func:`final_oracles`.

Fault kinds (:data:`STORE_KINDS`, :data:`NET_KINDS`, :data:`SCHED_KINDS`): an interrupt (SIGTERM:
``KeyboardInterrupt``) before the operation or after its effect, or after its effect with the
others running for :data:`LATE` seconds before the handler does (true concurrency: rank 0 acts on an
acknowledgement while the member's signal handler has not run yet; ``eio-late`` the same with EIO); ``StorageError``/``OSError`` EIO
before it or after its effect; a lost reply of a ``create`` (it took effect, EEXIST on the
retransmission); the death of the process there (before or after the effect); a pause of
``stale_after`` there (the others run meanwhile).  Reads have no effect to land after: only the
"before" kinds are tried on them.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field

try:
    import fakefs
    from model_oracles import LONG, TIMING
    from model_queue import FakeScheduler
    from model_world import Proc, World
except ImportError:  # tests/ imported as a package
    from tests import fakefs
    from tests.model_oracles import LONG, TIMING
    from tests.model_queue import FakeScheduler
    from tests.model_world import Proc, World

Crash = fakefs.Crash
DEPTH = int(os.environ.get("FSMINGLE_ENUM_DEPTH", "1"))
WRITES = ("publish", "create", "mkdir", "remove", "retire")
# kind -> (exception kind of World.exc_factory, or "crash"/"pause"/"lost"; after the effect?)
STORE_KINDS = {
    "interrupt": ("interrupt", False),
    "interrupt-after": ("interrupt", True),
    "interrupt-late": ("late", True),
    "eio": ("storage", False),
    "eio-after": ("storage", True),
    "eio-late": ("late-storage", True),
    "lost-reply": ("lost", True),
    "death": ("crash", False),
    "death-after": ("crash", True),
    "pause": ("pause", False),
}
NET_KINDS = {
    "interrupt": ("interrupt", False),
    "interrupt-after": ("interrupt", True),
    "interrupt-late": ("late", True),
    "eio": ("oserror", False),
    "eio-after": ("oserror", True),
    "eio-late": ("late-oserror", True),
    "death": ("crash", False),
    "death-after": ("crash", True),
    "pause": ("pause", False),
}
LATE = 2.0  # seconds the others run between an effect and the interrupt that follows it ("interrupt-late")
SCHED_KINDS = {"interrupt": ("interrupt", False), "eio": ("oserror", False), "death": ("crash", False)}


@dataclass(frozen=True)
class Point:
    """One fault point: the ``k``-th ``where`` call (store, net, sched) of the ``step``-th step of
    the ``proc``-th process started, which held ``role`` then; ``op``: what the call was."""

    proc: int
    step: int
    where: str
    k: int
    role: str
    op: str

    def kinds(self) -> list[str]:
        if self.where == "sched":
            return list(SCHED_KINDS)
        if self.where == "net":
            return list(NET_KINDS)
        verb = self.op.split(" ", 1)[0]
        kinds = [k for k, (_, after) in STORE_KINDS.items() if verb in WRITES or not after]
        return [k for k in kinds if k != "lost-reply" or verb == "create"]

    def __str__(self) -> str:
        return f"proc {self.proc} step {self.step} ({self.role}) {self.where} #{self.k} {self.op}"


def role_of(q: Proc) -> str:
    p = q.p
    if q.slot is None:
        return "spare"
    queue = getattr(p, "queue", None)
    if queue is not None and queue.relay.asking:
        return "asker"
    kind = type(p.role).__name__ if p.role is not None else ""
    return {"Coordinator": "rank0", "Member": "member"}.get(kind, p.state.value)


class EnumWorld(World):
    """A :class:`World` whose steps are numbered per process: records fault points, or places the
    planned faults (``plan``: (process index, step number) -> [(point, kind)])."""

    def __init__(self, *a, plan=None, record: bool = False, **kw):
        super().__init__(*a, **kw)
        self.plan: dict[tuple[int, int], list[tuple[Point, str]]] = {}
        for pt, kind in plan or ():
            self.plan.setdefault((pt.proc, pt.step), []).append((pt, kind))
        self.steps_of: dict[str, int] = {}
        self.points: list[Point] | None = [] if record else None
        self.fired: list[tuple[Point, str]] = []
        self.paused: list[Proc] = []
        # The handler of the first fault (Participant.withdraw in the process it hit): its calls are
        # recorded (handler_ops: [(where, op)]) or one of them gets ``handler`` (where, k, kind).
        self.handler_ops: list[tuple[str, str]] | None = None
        self.handler: tuple[str, int, str] | None = None
        self._handled = False

    def start(self, *a, **kw) -> Proc:
        q = super().start(*a, **kw)
        orig = q.p.withdraw
        q.p.withdraw = lambda reason: self._withdraw(q, orig, reason)
        return q

    def _withdraw(self, q: Proc, orig, reason: str):
        if self._handled or not self.fired or q is not self.procs[self.fired[0][0].proc]:
            return orig(reason)
        self._handled = True
        store, net = q.host.store, self.net
        if self.handler_ops is not None:
            store.trace, net.trace = [], []
            try:
                return orig(reason)
            finally:
                self.handler_ops.extend(("store", f"{op} {name}") for op, name in store.trace)
                self.handler_ops.extend(("net", f"{w} {t}".strip()) for o, w, t in net.trace if o == q.instance)
                store.trace = net.trace = None
        if self.handler is None:
            return orig(reason)
        where, k, kind = self.handler
        self.say(f"enumeration: {kind} at {where} #{k} of {q.instance[:4]}'s handler (withdraw)")
        exc, after = (STORE_KINDS if where == "store" else NET_KINDS)[kind]
        make = (lambda what: Crash(what)) if exc == "crash" else self.exc_factory(exc)
        if exc == "pause":
            make = lambda what: self.pause(q, self.timing.stale_after)
        if where == "net":
            net.arm_fault(q.instance, k, make, after)
        elif exc == "pause":
            store.arm_hook(k, lambda: make(""))
        elif exc == "lost":
            store.arm_lost_reply(0, None)
        else:
            store.arm_crash(k, after, exc=None if exc == "crash" else make)
        try:
            return orig(reason)
        finally:
            store.disarm()
            net.disarm(q.instance)
            store._lost_reply_at = store._lost_reply_match = None

    def stop_faults(self) -> None:
        """Faults stop (liveness is judged from here): no planned fault fires and no point is
        recorded any more (a fault point is one of the script, before this)."""
        self.faults_stopped = True
        super().stop_faults()

    def step(self, q: Proc, **kw):
        if kw or getattr(self, "faults_stopped", False):
            return super().step(q, **kw)
        idx = self.procs.index(q)
        n = self.steps_of.get(q.instance, 0)
        self.steps_of[q.instance] = n + 1
        if self.points is not None:
            return self._recorded(q, idx, n)
        faults = self.plan.pop((idx, n), None)
        if not faults:
            return super().step(q)
        (pt, kind), *rest = faults
        if rest:  # two faults in one step (depth 2): the second at the process's next step
            self.plan.setdefault((idx, n + 1), []).extend(rest)
        self.fired.append((pt, kind))
        self.say(f"enumeration: {kind} at {pt}")
        gen = q.p.gen
        try:
            return self._faulted(q, pt, kind)
        except Crash as e:  # died inside its handler (World.step handles deaths in the step proper)
            self.say(f"crash in the handler of {q.instance[:4]}: {e}")
            self._die(q, "crashed")
        except AssertionError:
            raise
        except BaseException as e:  # the handler itself raised: the process exits with that
            q.error = e
            self.say(f"exit {q.instance[:4]} from its handler: {e.__class__.__name__}: {e}")
            self._die(q, "exited")
            self._note_left(q, gen)
            self._check_exception(q, e, None)
        return None

    def _recorded(self, q: Proc, idx: int, n: int):
        role, store, net = role_of(q), q.host.store, self.net
        store.trace, net.trace = [], []
        sched = self.scheduler
        asked = len(sched.calls) if sched is not None else 0
        try:
            return super().step(q)
        finally:
            ops = [f"{op} {name}" for op, name in store.trace]
            msgs = [f"{what} {t}".strip() for owner, what, t in net.trace if owner == q.instance]
            store.trace = net.trace = None
            self.points.extend(Point(idx, n, "store", k, role, op) for k, op in enumerate(ops))
            self.points.extend(Point(idx, n, "net", k, role, op) for k, op in enumerate(msgs))
            if sched is not None:
                calls = len(sched.calls) - asked
                self.points.extend(Point(idx, n, "sched", k, role, "squeue") for k in range(calls))

    def pause(self, q: Proc, seconds: float) -> None:
        """``q`` stops inside its step (SIGSTOP, swapping) while the others run for ``seconds``."""
        self.say(f"enumeration: {q.instance[:4]} paused {seconds:g} s inside its step")
        self.paused.append(q)
        try:
            self.tick(seconds)
        finally:
            self.paused.remove(q)

    def running(self) -> list[Proc]:
        # A process paused inside its step takes no other step meanwhile (not even on a message).
        return [q for q in super().running() if q not in self.paused]

    def _late(self, q: Proc, exc: str):
        make = self.exc_factory(exc.split("-", 1)[1] if "-" in exc else "interrupt")

        def late(what: str) -> BaseException:
            self.pause(q, LATE)
            return make(what)

        return late

    def _faulted(self, q: Proc, pt: Point, kind: str):
        stale = self.timing.stale_after
        if pt.where == "store":
            exc, after = STORE_KINDS[kind]
            store = q.host.store
            if exc == "crash":
                return super().step(q, crash_at=pt.k, after_effect=after)
            if exc.startswith("late"):
                store.arm_crash(pt.k, True, exc=self._late(q, exc))
                return super().step(q)
            if exc == "pause":
                store.arm_hook(pt.k, lambda: self.pause(q, stale))
                return super().step(q)
            if exc == "lost":
                name = pt.op.split(" ", 1)[1]
                store.arm_lost_reply(0, lambda x: x == name)
                try:
                    return super().step(q)
                finally:
                    store._lost_reply_at = store._lost_reply_match = None
            return super().step(q, fault=("store", pt.k, exc), after_effect=after)
        if pt.where == "net":
            exc, after = NET_KINDS[kind]
            if exc == "crash":
                self.net.arm_fault(q.instance, pt.k, lambda what: Crash(what), after)
                return super().step(q)
            if exc == "pause":
                self.net.arm_fault(q.instance, pt.k, lambda what: self.pause(q, stale), False)
                return super().step(q)
            if exc.startswith("late"):
                self.net.arm_fault(q.instance, pt.k, self._late(q, exc), True)
                return super().step(q)
            return super().step(q, fault=("net", pt.k, exc), after_effect=after)
        exc, _ = SCHED_KINDS[kind]
        mine = f"j_{q.slot}"
        factory = (lambda what: Crash(what)) if exc == "crash" else self.exc_factory(exc)
        self.scheduler.raise_in = (mine, factory)
        try:
            return super().step(q)
        finally:
            self.scheduler.raise_in = None


@dataclass(frozen=True)
class Scenario:
    """A small world: ``size`` slots (``ranks``: explicit; None: first-come), ``spares`` extra
    first-come processes (``--spare-timeout inf``), ``peers``: every slot an array task of a
    :class:`FakeScheduler` and rank 0's job pending at first (the relay asks for it)."""

    name: str
    size: int
    explicit: bool = False
    spares: int = 0
    peers: bool = False
    mode: str = "node"
    master_port: int | None = None

    def world(self, plan=None, record: bool = False, cls=None, **options) -> EnumWorld:
        """The world (``cls``, default :class:`EnumWorld`, with ``options`` for its constructor)."""
        w = (cls or EnumWorld)(
            self.size,
            ranks=list(range(self.size)) if self.explicit else None,
            mode=self.mode,
            master_port=self.master_port,
            timeout=LONG,
            pidns="pod",
            plan=plan,
            record=record,
            **options,
        )
        if self.peers:
            w.scheduler = FakeScheduler(lambda: w.fs.now, {"j_0": "PENDING"})
        return w

    def script(self, w: EnumWorld) -> None:
        """Everyone starts (with peer jobs: rank 0's job later; spares once the world is released);
        the world runs until the slots' processes end, and a spare a while longer."""
        first = 1 if self.peers else 0
        for s in range(first, self.size):
            w.start(s)
        if not self.peers:
            for _ in range(self.spares):
                w.start(None, spare_timeout=math.inf)
        if self.peers:
            w.tick(3 * TIMING.heartbeat_period)  # the lowest present rank asks for rank 0's job
            w.scheduler.states["j_0"] = "RUNNING"
            w.start(0)
        n = len(w.procs)
        w.tick(60.0, stop=lambda: len(w.procs) > n or all(q.status != "running" for q in w.procs if q.slot is not None))
        if self.peers:
            for _ in range(self.spares):
                w.start(None, spare_timeout=math.inf)
        if self.spares:
            w.tick(1.5 * TIMING.stale_after)  # the spare waits on in the next generation


def final_oracles(w: World) -> None:
    """After the run: nobody named by a release ended as "withdrew" (exited), one world per
    generation (every released process's placement is its generation's ``release.json``)."""
    for g, rel in w.releases.items():
        for m in rel.members:
            q = w.by_instance[m.instance]
            assert q.status != "exited", (
                f"generation {g}'s release names {m.instance} (rank {m.rank}), which exited "
                f"{q.error.__class__.__name__}: {q.error} (withdrew while the others start with it)"
            )
    w.check()


EFFECT_THEN_EIO = "effect-then-EIO"


def transient_oracle(w: EnumWorld) -> None:
    """A write that took effect and then reported EIO (a soft mount's timeout, a lost reply) is read
    back, never the end of the node (issue 29, "what to build" 6): the process it hit must not exit."""
    for pt, kind in w.fired:
        verb = pt.op.split(" ", 1)[0]
        q = w.procs[pt.proc]
        if kind in ("eio-after", "eio-late") and verb in ("create", "mkdir", "publish") and q.status == "exited":
            raise AssertionError(
                f"{EFFECT_THEN_EIO}: {pt.op} took effect and reported EIO; {q.instance} failed "
                f"({q.error.__class__.__name__}) instead of reading it back"
            )


def count_points(sc: Scenario) -> list[Point]:
    w = sc.world(record=True)
    sc.script(w)
    assert all(q.status in ("done", "ended") for q in w.procs if q.slot is not None), (
        "the fault-free run did not release"
    )
    return list(w.points)


def run_one(sc: Scenario, faults: list[tuple[Point, str]]) -> tuple[str | None, EnumWorld]:
    """Run ``sc`` with ``faults``; the first oracle that failed (None: all held)."""
    w = sc.world(plan=faults)
    try:
        sc.script(w)
        w.run_to_completion()
        final_oracles(w)
        transient_oracle(w)
    except AssertionError as e:
        return str(e).split("\n", 1)[0][:300], w
    return None, w


@dataclass
class Report:
    scenario: str
    points: Counter = field(default_factory=Counter)  # role -> fault points
    runs: int = 0
    seconds: float = 0.0  # wall clock
    cpu: float = 0.0  # this process's CPU seconds (what a loaded shared machine does not inflate)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (point, kind, oracle)

    def line(self) -> str:
        roles = ", ".join(f"{r} {n}" for r, n in sorted(self.points.items()))
        return (
            f"{self.scenario}: {sum(self.points.values())} fault points ({roles}); "
            f"{self.runs} runs in {self.cpu:.1f} CPU s ({self.seconds:.1f} s wall); {len(self.failures)} failed"
        )


def enumerate_scenario(sc: Scenario, depth: int = DEPTH) -> Report:
    """Every fault point of ``sc`` x every kind (``depth`` 2: and every pair, the second among the
    points of the run with the first)."""
    rep = Report(sc.name)
    t0, c0 = time.monotonic(), time.process_time()
    points = count_points(sc)
    rep.points.update(pt.role for pt in points)
    for pt in points:
        for kind in pt.kinds():
            first = [(pt, kind)]
            why, _ = run_one(sc, first)
            rep.runs += 1
            if why is not None:
                rep.failures.append((str(pt), kind, why))
                continue
            if kind == HANDLED:
                rep.runs += _enumerate_handler(sc, pt, kind, rep)
            if depth < 2:
                continue
            for later in points_after(sc, pt, kind):
                for kind2 in later.kinds():
                    why, _ = run_one(sc, [*first, (later, kind2)])
                    rep.runs += 1
                    if why is not None:
                        rep.failures.append((f"{pt} then {later}", f"{kind} then {kind2}", why))
    rep.seconds, rep.cpu = time.monotonic() - t0, time.process_time() - c0
    return rep


HANDLED = "interrupt"  # the first fault whose handler's own calls are enumerated too
HANDLER_KINDS = ("eio", "eio-after", "lost-reply", "death", "pause")


def _enumerate_handler(sc: Scenario, pt: Point, kind: str, rep: Report) -> int:
    """The calls of the handler (``withdraw``) after ``(pt, kind)``: each gets each of
    :data:`HANDLER_KINDS` it admits (a lost reply: a create; after the effect: a write); runs made."""
    w = sc.world(plan=[(pt, kind)])
    w.handler_ops = []
    try:
        sc.script(w)
    except AssertionError:
        return 1  # reported by the run without the recording
    runs, ops = 1, w.handler_ops
    for i, (where, op) in enumerate(ops):
        k = sum(1 for x, _ in ops[:i] if x == where)
        verb = op.split(" ", 1)[0]
        for hk in HANDLER_KINDS:
            if (hk == "lost-reply" and verb != "create") or (
                hk == "eio-after" and where == "store" and verb not in WRITES
            ):
                continue
            if where == "net" and hk == "lost-reply":
                continue
            w = sc.world(plan=[(pt, kind)])
            w.handler = (where, k, hk)
            runs += 1
            why = None
            try:
                sc.script(w)
                w.run_to_completion()
                final_oracles(w)
            except AssertionError as e:
                why = str(e).split("\n", 1)[0][:300]
            if why is not None:
                rep.failures.append((f"{pt}, then its handler's {where} #{k} {op}", f"{kind} then {hk}", why))
    return runs


def points_after(sc: Scenario, pt: Point, kind: str) -> list[Point]:
    """The fault points of the run with ``(pt, kind)`` that come after it fired (every process's
    steps from then on, numbered as in that run)."""
    w = sc.world(plan=[(pt, kind)])
    orig = w._faulted

    def faulted(q, p, k):
        try:
            return orig(q, p, k)
        finally:
            w.points = []  # from now on every step is recorded

    w._faulted = faulted
    try:
        sc.script(w)
        w.run_to_completion()
    except AssertionError:
        pass
    return list(w.points or [])
