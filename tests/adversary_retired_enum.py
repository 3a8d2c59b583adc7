"""Every fault kind at every fault point of the worlds of :mod:`model_retired` (session 7, ``adv7``): a member held in
DECIDING while the others go on through a void and a second generation meets its generation retired under it.

    nice -n 19 python tests/adversary_retired_enum.py [--hold F] [--nth N] [scenario-substring ...]

``--hold F``: the member is held ``F`` x ``stale_after`` (each world's own otherwise: 4); ``--nth N``: at its N-th read
of the decision (each world's own otherwise; 2: after its first listing of the root set ``Timers.retired_check``
ahead).  Each first fault
``interrupt`` also gets every kind at every call of its handler (``model_enum._enumerate_handler``).  Prints one
line per world (fault points per role, runs, failures, runs that rejoined by the branch) and each failure.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from fsmingle.errors import RendezvousTimeoutError

try:
    from model_enum import EFFECT_THEN_EIO, HANDLED, _enumerate_handler, run_one
    from model_oracles import TIMING
    from model_retired import SCENARIOS, RetiredScenario, count_points
except ImportError:  # tests/ imported as a package
    from tests.model_enum import EFFECT_THEN_EIO, HANDLED, _enumerate_handler, run_one
    from tests.model_oracles import TIMING
    from tests.model_retired import SCENARIOS, RetiredScenario, count_points


@dataclass
class RetiredReport:
    """What :func:`enumerate_retired` ran: fault points per role, runs, the runs (with one fault) that rejoined by
    the "retired under it" branch, and the failures (point, kind, the oracle's first line)."""

    scenario: str
    points: Counter = field(default_factory=Counter)
    runs: int = 0
    reached: int = 0
    cpu: float = 0.0
    failures: list[tuple[str, str, str]] = field(default_factory=list)

    def line(self) -> str:
        roles = ", ".join(f"{r} {n}" for r, n in sorted(self.points.items()))
        return (
            f"{self.scenario}: {sum(self.points.values())} fault points ({roles}); {self.runs} runs in "
            f"{self.cpu:.1f} CPU s; {self.reached} rejoined by the 'retired under it' branch; "
            f"{len(self.failures)} failed"
        )


def run_retired(sc: RetiredScenario, faults):
    """``model_enum.run_one``, but the first restart of slot 0 exiting at its --timeout (the script's: it voids
    generation 2) is no failure to read back a write that took effect and reported EIO (``transient_oracle``, the
    last oracle checked: every other one held).  Its timeout was checked at its deadline (``_check_exception``)."""
    why, w = run_one(sc, faults)
    if why is not None and why.startswith(EFFECT_THEN_EIO):
        q = w.procs[faults[0][0].proc]
        if isinstance(q.error, RendezvousTimeoutError) and q.p.timers.timeout == sc.restart_timeout:
            return None, w
    return why, w


def enumerate_retired(sc: RetiredScenario, *, handlers: bool = True, hold_only: bool = False) -> RetiredReport:
    """Every point of ``sc`` x every kind it admits, one fault a run; ``hold_only``: only the points of the steps
    taken while the member is held and of its own steps from then (``RetiredWorld.during_hold``)."""
    rep = RetiredReport(sc.name)
    c0 = time.process_time()
    points, w = count_points(sc)
    points = [pt for pt in points if not hold_only or (pt.proc, pt.step) in w.during_hold]
    rep.points.update(pt.role for pt in points)
    for pt in points:
        for kind in pt.kinds():
            why, w = run_retired(sc, [(pt, kind)])
            rep.runs += 1
            rep.reached += w.reached > 0
            if why is not None:
                rep.failures.append((str(pt), kind, why))
            elif handlers and kind == HANDLED:
                rep.runs += _enumerate_handler(sc, pt, kind, rep)
    rep.cpu = time.process_time() - c0
    return rep


def main(argv: list[str]) -> int:
    change: dict = {}
    while argv[:1] in (["--hold"], ["--nth"]):
        if argv[0] == "--hold":
            change["hold"] = float(argv[1]) * TIMING.stale_after
        else:
            change["hold_nth"] = int(argv[1])
        argv = argv[2:]
    logging.getLogger("fsmingle").disabled = True  # thousands of worlds: their warnings are expected
    bad = 0
    for sc in SCENARIOS:
        if argv and not any(a in sc.name for a in argv):
            continue
        sc = dataclasses.replace(sc, **change)
        rep = enumerate_retired(sc)
        where = f"hold {sc.hold / TIMING.stale_after:g} x stale_after at read {sc.hold_nth}"
        print(f"[{where}] {rep.line()}", flush=True)
        for f in rep.failures:
            print("  FAIL", *f, sep=" | ", flush=True)
        bad += len(rep.failures)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
