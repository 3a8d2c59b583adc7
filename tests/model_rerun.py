"""Enumeration worlds with a *re-run*: the job is released and ends, then the same job id runs again
on the same hosts, whose views cache "absent" answers (``neg_ttl``) and lag their listings.

The hole these close (CI, commit 910eb5b): a re-run read the previous generation's ``release.json``
"absent" by name -- a negative dentry its own host's earlier joiner left when it looked the name up
before the decision existed (bindfs ``negative_timeout``, NFS lookupcache, GlusterFS nl-cache) --
took that released generation for one abandoned after ``prepare_next``, joined it, met its rank
claimed and failed with RankConflictError (exit 6).  The first enumeration worlds had no re-run and
no negative cache, so no fault point could reach it.

:class:`RerunScenario` is a :class:`model_enum.Scenario` whose script runs the job twice; only the
re-run's processes are fault points (the first run is the worlds of ``test_exhaustive.py``
already).  Oracles on top of :class:`model_world.World`'s: a re-run process never fails with
RankConflictError (each holds its own rank, distinct; the only holder of its rank is the previous
run's, which ended), and once faults stop the re-run is released in a generation of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fsmingle.errors import RankConflictError

try:
    from model_enum import EnumWorld, Scenario
    from model_world import Proc, World
except ImportError:  # tests/ imported as a package
    from tests.model_enum import EnumWorld, Scenario
    from tests.model_world import Proc, World

NEG_TTL = 600.0  # seconds a looked-up-too-early name stays "absent": longer than both runs together
LAG = 1.0  # seconds every view's listings and reads lag the truth
RERUN_CONFLICT = "re-run-conflict"


class RerunWorld(EnumWorld):
    """An :class:`EnumWorld` of two runs of one job (module doc).  ``rerun_from``: the index of the
    re-run's first process (steps before it are neither fault points nor faulted); ``first_gen``:
    the generation the first run was released in."""

    def __init__(self, *a, neg_ttl: float = NEG_TTL, listing_cures: bool = False, **kw):
        self.neg_ttl, self.listing_cures = neg_ttl, listing_cures
        self.rerun_from = math.inf
        self.first_gen = 0
        super().__init__(*a, **kw)

    def host(self, key: int):
        new = key not in self.hosts
        h = super().host(key)
        if new:
            h.store.neg_ttl, h.store.listing_cures = self.neg_ttl, self.listing_cures
        return h

    def is_rerun(self, q: Proc) -> bool:
        return self.procs.index(q) >= self.rerun_from

    def step(self, q: Proc, **kw):
        if not kw and not self.is_rerun(q):
            return World.step(self, q)  # the first run: no fault point
        return super().step(q, **kw)

    def end_first_run(self) -> None:
        """The first run is released and ends (training done; its processes exit, sockets close)."""
        first = [q for q in self.procs if q.slot is not None]
        assert all(q.status == "done" for q in first), "the first run was not released"
        (self.first_gen,) = {q.result.generation for q in first}
        for q in first:
            self._die(q, "ended")
        self.rerun_from = len(self.procs)
        self.say(f"the first run (generation {self.first_gen}) ended; the re-run starts")

    def check(self) -> None:
        # The base oracle per run: one world among the released processes of each run, no rank twice.
        for run in (self.procs[: len(self.procs) - len(self.rerun())], self.rerun()):
            done = [q for q in run if q.result is not None]
            worlds = {(q.result.master_addr, q.result.master_port, q.result.generation) for q in done}
            assert len(worlds) <= 1, f"participants of one run released into different worlds: {sorted(worlds)}"
            ranks = [(q.result.generation, q.result.rank) for q in done]
            assert len(set(ranks)) == len(ranks), f"two participants released with one rank: {sorted(ranks)}"

    def rerun(self) -> list[Proc]:
        return self.procs[self.rerun_from :] if self.rerun_from < math.inf else []

    def _check_exception(self, q: Proc, e: BaseException, prev_step: float | None) -> None:
        if self.is_rerun(q) and isinstance(e, RankConflictError) and not self.is_injected(e):
            raise AssertionError(
                f"{RERUN_CONFLICT}: re-run {q.instance} (rank {q.p.want_rank}) failed RankConflictError in "
                f"generation {q.p.gen} (the first run's: {self.first_gen}): {e}"
            )
        super()._check_exception(q, e, prev_step)

    def released_any(self) -> bool:
        return any(g > self.first_gen for g in self.releases) if self.first_gen else bool(self.releases)

    def run_to_completion(self) -> float | None:
        """Faults stop; a slot whose re-run process is gone starts again; the re-run must be
        released in one generation above the first run's, every slot's live process in it."""
        if not self.first_gen:  # the first run never ended (a fault before the re-run: none here)
            return super().run_to_completion()
        self.stop_faults()
        for s in range(self.size):
            cur = self.current(s)
            if cur is None or not cur.alive:
                self.start(s)
        start, bound = self.fs.now, self.bound()
        self.tick(bound, stop=lambda: self.released_any() and not self.waiting_named())
        late = [g for g in self.releases if g > self.first_gen]
        running = ", ".join(
            f"{q.instance[:4]}(slot {q.slot}, {q.p.state.value}, gen {q.p.gen}, rank {q.p.rank})"
            for q in self.running()
        )
        assert late, f"the re-run was not released within {bound:.0f} fake seconds: {running}"
        assert len(late) == 1, f"the re-run was released in generations {late}"
        stuck = self.waiting_named()
        assert not stuck, f"named in a release but not released after {bound:.0f} s: {[q.instance for q in stuck]}"
        left_out = [q for q in self.running() if q.slot is not None]
        rel = self.releases[late[0]]
        dead = [m.instance for m in rel.members if not self.by_instance[m.instance].alive]
        assert not left_out or dead, f"generation {late[0]} was released without live {running}"
        return self.fs.now - start


@dataclass(frozen=True)
class RerunScenario(Scenario):
    """A :class:`Scenario` run twice (module doc): the world of ``size`` slots is released, ends,
    and starts again with the same job id on the same hosts; ``gap``: fake seconds in between."""

    gap: float = 0.0
    neg_ttl: float = NEG_TTL
    listing_cures: bool = False  # GlusterFS nl-cache (fakefs.FakeStore.listing_cures)

    def world(self, plan=None, record: bool = False, cls=None, **options) -> RerunWorld:
        return super().world(
            plan,
            record,
            cls=RerunWorld,
            neg_ttl=self.neg_ttl,
            listing_cures=self.listing_cures,
            staleness=LAG,
            initial_lag=1.0,
            **options,
        )

    def script(self, w: RerunWorld) -> None:
        for s in range(self.size):
            w.start(s)
        w.tick(60.0, stop=lambda: all(q.status != "running" for q in w.procs))
        w.end_first_run()
        w.tick(self.gap)
        for s in range(self.size):
            w.start(s)
        w.tick(60.0, stop=lambda: all(q.status != "running" for q in w.rerun()))
