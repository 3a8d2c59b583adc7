"""A network partition at every step of every role, enumerated on the model (issue 31).

A node whose network is cut while its shared filesystem works (:meth:`fakenet.FakeNet.partition`:
its connections fail both ways, silently; its filesystem view is untouched) must not block the
nodes that still reach each other.  For each small world below, the fault-free run is recorded
once (:mod:`model_enum`: every step of every process that touches the store, the network or the
scheduler, with the role it held -- ``rank0``, ``member``, ``asker``, ``spare``, or its state while
it joins); then, for each such step, the run is repeated with that process's host cut off just
before that step, for good (the partition never heals).  Oracles, besides every invariant of
:class:`model_world.World` on every action:

* **no release into an unreachable master**: no release created after the cut names the cut node
  together with any other node (a release created before it is the commit window's business,
  checked by the world's own oracles);
* **the reachable form a world**: when the processes that are not cut are enough for the world
  (a spare fills in) and no world was released before the cut, a world made of them only is
  released within :data:`BOUND` fake seconds of the cut;
* **the cut node says why it waits**: still waiting at the end, it has a note, and if reachable
  processes wait in its generation, the note names the master it cannot reach, or that nobody
  reached it as rank 0.

Before the fix (``fsmingle/protocol/rank0/reach.py``, ``fsmingle/protocol/partition.py``) a cut
node that held rank 0 kept it for as long as the partition lasted ("no answer proves nothing"),
and "the reachable form a world" failed at every step where the cut node held or was about to
take rank 0.  The counts are printed; ``docs/protocol.md`` keeps the last measured ones.
"""

from __future__ import annotations

import time

import pytest

try:
    from model_enum import EnumWorld, Scenario
    from model_oracles import TIMING
except ImportError:  # tests/ imported as a package
    from tests.model_enum import EnumWorld, Scenario
    from tests.model_oracles import TIMING

# Fake seconds after the cut within which the reachable nodes must have formed a world: a cut
# rank 0 steps down after stale_after of seeing a live peer (itself seen after two heartbeats),
# its void is read within a heartbeat period, and the next generation forms in a few polls; a
# member holding a rank withdraws after 2 x stale_after, and rank 0 judges its claim dead
# stale_after later.  Eight stale_after covers either path with a generation to spare.
BOUND = 8 * TIMING.stale_after
REASONS = ("cannot reach the master", "reached by none", "nobody reached", "no participant reached", "never connected")

SCENARIOS = [
    Scenario("2 first-come + spare", 2, spares=1),
    Scenario("3 first-come + spare", 3, spares=1),
    Scenario("2 first-come", 2),
    Scenario("2 explicit", 2, explicit=True),
    Scenario("3 explicit", 3, explicit=True),
]


class CutWorld(EnumWorld):
    """An :class:`EnumWorld` that cuts the host of process ``cut[0]`` just before its step ``cut[1]``."""

    def __init__(self, *a, cut: tuple[int, int] | None = None, **kw):
        super().__init__(*a, **kw)
        self.cut, self.cut_at, self.cut_proc = cut, None, None

    def step(self, q, **kw):
        if self.cut is not None and self.cut_at is None and not kw:
            if (self.procs.index(q), self.steps_of.get(q.instance, 0)) == self.cut:
                self.net.partition(q.host.key)
                self.cut_at, self.cut_proc = self.fs.now, q
                self.say(f"enumeration: the network of {q.host.node} ({q.instance[:4]}) is cut for good")
        return super().step(q, **kw)


def cut_points(sc: Scenario) -> list[tuple[int, int, str]]:
    """Every (process, step, role) of the fault-free run that touches the store, network or scheduler."""
    w = sc.world(record=True, cls=CutWorld)
    sc.script(w)
    return sorted({(pt.proc, pt.step, pt.role) for pt in w.points})


def run_cut(sc: Scenario, proc: int, step: int) -> str | None:
    """Run ``sc`` with process ``proc``'s host cut before its step ``step``; the first oracle broken."""
    w = sc.world(cls=CutWorld, cut=(proc, step))
    try:
        sc.script(w)
        if w.cut_at is None:
            return None  # the process ended before that step (its world released first)
        w.tick(max(0.0, w.cut_at + BOUND - w.fs.now), stop=lambda: _formed(w) is not None)
        w.tick(TIMING.stale_after)  # a while longer: a late wrong release would show
        _check(w, sc)
    except AssertionError as e:
        return str(e).split("\n", 1)[0][:300]
    return None


def _formed(w: CutWorld) -> int | None:
    """A generation released after the cut to processes that are not cut (None: none yet)."""
    cut = w.cut_proc.host.key
    for g, rel in w.releases.items():
        if w.release_time[g] >= w.cut_at and all(w.by_instance[m.instance].host.key != cut for m in rel.members):
            return g
    return None


def _check(w: CutWorld, sc: Scenario) -> None:
    cut = w.cut_proc.host.key
    for g, rel in w.releases.items():
        hosts = {w.by_instance[m.instance].host.key for m in rel.members}
        assert not (w.release_time[g] > w.cut_at and cut in hosts and len(hosts) > 1), (
            f"generation {g} was released after the cut with the cut node and others: {sorted(hosts)}"
        )
    before = any(w.release_time[g] <= w.cut_at for g in w.releases)
    reachable = [q for q in w.procs if q.alive and q.host.key != cut]
    if not before and len(reachable) >= sc.size and not sc.explicit:
        assert _formed(w) is not None, (
            f"no world of the {len(reachable)} reachable processes within {BOUND:g} s of the cut: "
            + ", ".join(
                f"{q.instance[:4]}({q.p.state.value}, gen {q.p.gen}, rank {q.p.rank}, {q.p.note[:60]!r})"
                for q in w.running()
            )
        )
    q = w.cut_proc
    if q.status == "running":
        # Waiting with others it blocks: it names the master it cannot reach, or its step-down;
        # alone (the others were released): any note (a late participant, a spare) will do.
        blocked = [x for x in w.running() if x is not q and x.p.gen == q.p.gen and x.host.key != cut]
        assert q.p.note and (not blocked or any(r in q.p.note for r in REASONS)), (
            f"the cut node waits without saying why: {q.p.state.value}, gen {q.p.gen}, rank {q.p.rank}, "
            f"note {q.p.note!r}, with {[x.instance[:4] for x in blocked]}"
        )


pytestmark = pytest.mark.usefixtures("quiet_fsmingle")  # thousands of worlds: their warnings are expected


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("sc", SCENARIOS, ids=[sc.name for sc in SCENARIOS])
def test_a_cut_at_every_step_of_every_role(sc: Scenario, capsys):
    t0 = time.process_time()
    points = cut_points(sc)
    roles: dict[str, int] = {}
    broken = []
    for proc, step, role in points:
        roles[role] = roles.get(role, 0) + 1
        why = run_cut(sc, proc, step)
        if why is not None:
            broken.append(f"cut of proc {proc} before step {step} ({role}): {why}")
    with capsys.disabled():
        print(
            f"\n[partition enumeration] {sc.name}: {len(points)} cut points "
            f"({', '.join(f'{r} {n}' for r, n in sorted(roles.items()))}); {len(broken)} failed; "
            f"{time.process_time() - t0:.1f} CPU s"
        )
    assert not broken, f"{len(broken)} cuts broke an oracle:\n" + "\n".join(broken[:20])
