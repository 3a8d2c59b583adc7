"""Partition scenarios against the model (issue 31, the adversary of the partition fix).

A *cut* isolates a node's network while its filesystem keeps working: connections to and from it
fail (``connect`` times out, established ones hold their data), as :meth:`fakenet.FakeNet.partition`
models it.  :class:`PartNet` adds what the fake cannot express alone: a *pair* cut (two hosts cannot
reach each other, both reach the rest) and a *one-way* cut (one direction of every connection of a
host holds its data; a ``connect`` fails either way, the handshake needs both).

:class:`PartScenario` is a small job that forms a world, then restarts every node into the next
generation (the world failed: the collective timed out), with a spare optionally.  A cut is placed
*before* every step of every process of the fault-free run (:func:`cut_points`): rank 0 before or
after its claim, after some hellos, in the commit window, after release; a member before its hello,
after its ack; the spare; each joiner of the next generation.  After the script the cut lasts
:data:`CUT_FOR` seconds, then heals.  Oracles (:func:`check_cut_run`), besides every oracle of
:class:`model_world.World` on every action:

* safety: nobody is released into a master it cannot reach at that moment (``released-cut``); one
  release per generation and one world per generation (the world's own oracles);
* liveness while cut: when the live nodes reachable from each other are enough for a world (the
  spare counted), none of them waits at the end of the cut (``stuck-while-cut``);
* honesty: a node that waits at the end of the cut says why, naming the unreachable node (its
  host, address or rank) or saying what it cannot reach (``silent``);
* liveness after the heal: every slot is released within the world's bound (``stuck-after-heal``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

try:
    import fakenet
    from model_enum import EnumWorld, Point, final_oracles
    from model_oracles import LONG, TIMING
    from model_world import Proc, World
except ImportError:  # tests/ imported as a package
    from tests import fakenet
    from tests.model_enum import EnumWorld, Point, final_oracles
    from tests.model_oracles import LONG, TIMING
    from tests.model_world import Proc, World

from fsmingle.fs.layout import GEN_RE
from fsmingle.net.channel import Outcome, hostport

CUT_FOR = 12 * TIMING.stale_after  # how long a cut lasts after the script (fake seconds)


class PartTransport(fakenet.FakeTransport):
    def connect(self, addr: str, port: int, timeout: float):
        net = self.net
        target = net.addr_host.get(addr)
        if target is not None and target != self.host and net.cut_between(self.host, target):
            net.connect_timeouts += 1
            net.advance(timeout)
            return Outcome.UNREACHABLE, None, f"no answer from {hostport(addr, port)} within {timeout:g} s"
        return super().connect(addr, port, timeout)


class PartNet(fakenet.FakeNet):
    """:class:`fakenet.FakeNet` with pair cuts (``cut_pair``) and one-way cuts (``cut_oneway``)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.pairs: set[frozenset] = set()
        self.oneway: set[tuple] = set()  # (src, dst): data from src to dst is held

    def transport(self, host, owner, ping_interval: float = 1.0):
        return PartTransport(self, host, owner, ping_interval)

    def cut_between(self, a, b) -> bool:
        return a != b and (
            a in self.partitioned
            or b in self.partitioned
            or frozenset((a, b)) in self.pairs
            or (a, b) in self.oneway
            or (b, a) in self.oneway
        )

    def cut_pair(self, a, b) -> None:
        self.pairs.add(frozenset((a, b)))

    def cut_oneway(self, src, dst) -> None:
        self.oneway.add((src, dst))

    def _dir_blocked(self, pipe, direction: int) -> bool:
        link_host, hub_host = pipe.hosts()
        if link_host == hub_host:
            return False
        if super().blocked(pipe) or frozenset((link_host, hub_host)) in self.pairs:
            return True
        src, dst = (link_host, hub_host) if direction == fakenet.TO_HUB else (hub_host, link_host)
        return (src, dst) in self.oneway

    def blocked(self, pipe) -> bool:
        return self._dir_blocked(pipe, fakenet.TO_HUB) or self._dir_blocked(pipe, fakenet.TO_LINK)

    def transmit(self, pipe, direction: int, item: tuple) -> None:
        if pipe.reset:
            return
        if self._dir_blocked(pipe, direction) or pipe.held[direction]:
            pipe.held[direction].append(item)
            return
        self._deliver(pipe, direction, item)

    def heal(self, host=None) -> None:
        if host is None:
            self.pairs.clear()
            self.oneway.clear()
            self.partitioned.clear()
        else:
            self.partitioned.discard(host)
            self.pairs = {p for p in self.pairs if host not in p}
            self.oneway = {p for p in self.oneway if host not in p}
        for pipe in self.pipes:
            for direction in (fakenet.TO_HUB, fakenet.TO_LINK):
                if self._dir_blocked(pipe, direction):
                    continue
                q = pipe.held[direction]
                while q:
                    self._deliver(pipe, direction, q.popleft())


class CutWorld(EnumWorld):
    """An :class:`EnumWorld` on a :class:`PartNet` whose plan holds cuts: kind ``cut`` (the host of
    the process, both ways), ``pair:K`` (from the host of the K-th process started), ``in:K`` /
    ``out:K`` (one way: data into / out of the process's host from / to the K-th's host), ``heal``."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.net = PartNet(lambda: self.fs.now, self.fs.advance, on_wake=self._wake)
        self.net.on_send = self._on_send
        self.cut_at: float | None = None
        self.cut_hosts: set[int] = set()  # hosts some other cannot reach
        self.healed = False
        self.heal_at: float | None = None
        self.released_cut: list[str] = []
        self.other_net: dict = {}
        self.stepdowns: list[tuple[Proc, list[Proc], str]] = []  # rank 0 step-downs: (who, reachable peers, why)
        self.stepdowns_seen: set[int] = set()

    def _faulted(self, q: Proc, pt: Point, kind: str):
        h = q.host.key
        if kind.startswith("stall:"):
            # No cut: the process stops (SIGSTOP, swapping, a GIL-starved rank 0) for that many
            # stale_after before this step while the others run; nobody may step down for it.
            self.pause(q, float(kind.split(":")[1]) * self.timing.stale_after)
        elif kind == "heal":
            self.net.heal()
            self.healed = True
            self.say("heal")
        else:
            self.cut_at = self.fs.now
            if "+" in kind:  # "cut+D": the cut heals D seconds later (wherever everyone is then)
                kind, d = kind.split("+")
                self.heal_at = self.fs.now + float(d)
            if kind == "cut":
                self.net.partition(h)
                self.cut_hosts = {h}
            else:
                how, k = kind.split(":")
                other = self.procs[int(k)].host.key
                if how == "pair":
                    self.net.cut_pair(h, other)
                elif how == "in":
                    self.net.cut_oneway(other, h)
                else:
                    self.net.cut_oneway(h, other)
                self.cut_hosts = {h, other}
            self.say(f"cut {kind} of {q.host.node} ({q.instance[:4]}) before its step {pt.step}")
        return World.step(self, q)

    def _check_event(self, ev) -> None:
        super()._check_event(ev)
        rel = self.decided.get(self._gen_of(ev)) if ev.ok and ev.op == "create" else None
        if rel is not None and rel.state != "released" and "reached by none" in rel.reason:
            writer = self.by_instance.get(rel.writer)
            if writer is not None and rel.generation not in self.stepdowns_seen:
                self.stepdowns_seen.add(rel.generation)
                peers = [
                    q
                    for q in self.running()
                    # Claimants only: a spare watching a full world never connects (nor should it).
                    if q is not writer
                    and q.p.gen == rel.generation
                    and q.p.rank is not None
                    and self.reachable(q, writer)
                ]
                if self.heal_at is not None and self.fs.now - self.heal_at < self.timing.stale_after:
                    peers = []  # its evidence (stale_after unreached) was gathered while the cut lasted
                self.stepdowns.append((writer, peers, rel.reason))

    @staticmethod
    def _gen_of(ev) -> int | None:
        m = GEN_RE.match(ev.name.split("/", 1)[0])
        return int(m.group(1)) if m and ev.name.endswith("/release.json") else None

    def step(self, q: Proc, **kw):
        if self.heal_at is not None and self.fs.now >= self.heal_at and not self.healed:
            self.net.heal()
            self.healed = True
            self.say("heal")
        return super().step(q, **kw)

    def check(self) -> None:
        # One world per generation (the base check wants one world in all: here the job restarts).
        done = [q for q in self.procs if q.result is not None]
        per_gen: dict[int, set] = {}
        held = set()
        for q in done:
            r = q.result
            per_gen.setdefault(r.generation, set()).add((r.master_addr, r.master_port))
            assert (r.generation, r.rank) not in held, f"two released with rank {r.rank} of generation {r.generation}"
            held.add((r.generation, r.rank))
        bad = {g: ws for g, ws in per_gen.items() if len(ws) > 1}
        assert not bad, f"participants released into different worlds of one generation: {bad}"

    def reachable(self, a: Proc, b: Proc) -> bool:
        return not self.net.cut_between(a.host.key, b.host.key)

    def _check_released(self, q: Proc, pl) -> None:
        super()._check_released(q, pl)
        rel = self.releases[pl.generation]
        master = self.by_instance[rel.members[0].instance]
        if not self.reachable(q, master):
            # Released while its master is cut off: the only excuse is a cut that began after rank 0
            # wrote the release (the commit window: nothing can tell it), i.e. after release.json.
            self.released_cut.append(
                f"{q.instance[:4]} released into gen {pl.generation} whose master {master.instance[:4]} "
                f"({master.host.node}) it cannot reach (cut at t={self.cut_at}, release at "
                f"t={self.release_time[pl.generation]})"
            )


@dataclass(frozen=True)
class PartScenario:
    """``size`` slots (explicit ranks or first-come), ``spares`` (``--spare-timeout inf``); the world
    forms, every node restarts into the next generation (``restart``), and forms again."""

    name: str
    size: int
    explicit: bool = False
    spares: int = 0
    restart: bool = True

    def world(self, plan=None, record: bool = False) -> CutWorld:
        return CutWorld(
            self.size,
            ranks=list(range(self.size)) if self.explicit else None,
            timeout=LONG,
            pidns="pod",
            plan=plan,
            record=record,
        )

    def _settle(self, w: CutWorld) -> None:
        # Until everyone is released but at most the spares (a leftover waits as the next spare).
        w.tick(60.0, stop=lambda: len(w.running()) <= self.spares)

    def script(self, w: CutWorld) -> None:
        for s in range(self.size):
            w.start(s)
        for _ in range(self.spares):
            w.start(None, spare_timeout=math.inf)
        self._settle(w)
        if not self.restart:
            return
        # The world fails (a collective timed out): every released node restarts on its host.
        for s in range(self.size):
            q = w.current(s)
            if q is not None and q.status == "done":
                q.status = "ended"
                w.say(f"{q.instance[:4]} (slot {s}) ends its training; restarts")
                w.start(s)
        for q in [q for q in w.procs if q.slot is None and q.status == "done"]:
            q.status = "ended"  # a spare released into the failed world restarts as a spare
            w.say(f"{q.instance[:4]} (spare) ends its training; restarts")
            w.start(None, spare_timeout=math.inf)
        self._settle(w)


def cut_points(sc: PartScenario) -> list[Point]:
    """One point per step of every process of the fault-free run (a cut lands before that step)."""
    w = sc.world(record=True)
    sc.script(w)
    assert len(w.running()) <= sc.spares and len(w.releases) == 1 + sc.restart, "the fault-free run failed"
    seen = {}
    for pt in w.points:
        seen.setdefault((pt.proc, pt.step), pt)
    return list(seen.values())


def _waiting(w: CutWorld, spares: int) -> list[Proc]:
    """The running processes when more run than the spares (else none: the leftovers are spares)."""
    run = w.running()
    return run if len(run) > spares else []


def _names(w: CutWorld, q: Proc, cut_procs: list[Proc]) -> bool:
    note = q.p.note or ""
    if (
        "waiting for rank 0" in note
        or "cannot reach" in note
        or "never connected" in note
        or "unreachable" in note
        or "reached by none" in note
    ):
        return True
    ranks = {r for c in cut_procs for r in (c.p.want_rank, c.p.rank) if r is not None}
    return any(c.host.node in note or c.host.addr in note for c in cut_procs) or any(
        f"rank {r} " in note for r in ranks
    )


def check_cut_run(sc: PartScenario, w: CutWorld, cut_for: float = CUT_FOR) -> list[str]:
    """After the script (the cut in place): the cut lasts ``cut_for`` more seconds, then heals.
    Returns the broken oracles, each a line (empty: all held)."""
    broken: list[str] = []
    w.tick(cut_for, stop=lambda: not w.running())
    cut_hosts = set(w.cut_hosts) if not w.healed else set()
    # A release into a master cut off after the member's ack left is the commit window (nothing can
    # tell it in time: torch fails, the job restarts): counted, not a failure; the world's oracles
    # already fail a release naming a member that never acknowledged over a live connection.
    w.say(f"released into a cut master: {len(w.released_cut)}")
    if cut_hosts:
        # The live processes on hosts outside the cut; spares count for the liveness.
        healthy = [q for q in w.running() if q.host.key not in cut_hosts]
        cut_procs = [q for q in w.procs if q.host.key in cut_hosts]
        if len(cut_hosts) == 1:
            if len(healthy) >= sc.size:
                broken.append(
                    f"stuck-while-cut: {len(healthy)} reachable live nodes (>= {sc.size}) wait "
                    f"{cut_for:g} s after the script: "
                    + ", ".join(
                        f"{q.instance[:4]}({q.p.state.value} gen {q.p.gen} rank {q.p.rank}: {q.p.note[:90]!r})"
                        for q in healthy
                    )
                )
        for q in _waiting(w, sc.spares):
            undecided = q.p.gen not in w.decided
            if undecided and not _names(w, q, cut_procs) and "spare" not in (q.p.note or ""):
                broken.append(
                    f"silent: {q.instance[:4]} on {q.host.node} waits (gen {q.p.gen} rank {q.p.rank}) with "
                    f"note {q.p.note[:160]!r}"
                )
                break
    for who, peers, why in w.stepdowns:
        # A rank 0 that others could reach stepped down: fine only where the cut separates it from
        # every other participant of its generation (a 2-node world, one side cut).
        if who.host.key not in w.cut_hosts and (not w.cut_hosts or peers):
            broken.append(
                f"healthy-stepdown: {who.instance[:4]} on {who.host.node} stepped down while "
                f"{[q.instance[:4] for q in peers]} could reach it (cut: {sorted(w.cut_hosts)}): {why[:160]}"
            )
            break
    # Heal; everyone must be released.
    w.net.heal()
    w.healed = True
    w.stop_faults()
    # As the scheduler would (and run_to_completion does): a slot whose process died or failed
    # gets a new one.
    for s in range(sc.size):
        cur = w.current(s)
        if cur is not None and cur.status in ("crashed", "exited"):
            w.start(s)
    bound = w.bound() + 20
    w.tick(bound, stop=lambda: not _waiting(w, sc.spares))
    stuck = _waiting(w, sc.spares)
    if stuck:
        broken.append(
            f"stuck-after-heal ({bound:.0f} s): "
            + ", ".join(
                f"{q.instance[:4]}(slot {q.slot}, {q.p.state.value}, gen {q.p.gen}, rank {q.p.rank}: {q.p.note[:80]!r})"
                for q in stuck
            )
        )
    try:
        final_oracles(w)
    except AssertionError as e:
        broken.append("final: " + str(e).split("\n", 1)[0][:300])
    return broken


def run_cut(sc: PartScenario, plan: list[tuple[Point, str]], cut_for: float = CUT_FOR):
    """Run ``sc`` with the cuts of ``plan``; (the broken oracles, the world)."""
    w = sc.world(plan=plan)
    try:
        sc.script(w)
        broken = check_cut_run(sc, w, cut_for)
    except AssertionError as e:
        broken = ["oracle: " + str(e).split("\n", 1)[0][:300]]
    return broken, w
