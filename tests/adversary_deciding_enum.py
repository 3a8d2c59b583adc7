"""Depth 2 on the model, aimed at DECIDING (session 6, ``adv``: ``Timers.retired_check``, dbd9cfe).

For every scenario of :mod:`enum_scenarios` and every first fault (every point x kind), the run with
it is recorded; where some process then reaches DECIDING, every later fault point that process has
in DECIDING (the decision's read, the root's listing once per ``stale_after``, the rejoin) gets
every kind.  A pair ``FSMINGLE_ENUM_DEPTH=2`` would run too, without the other pairs (hours).

    nice -n 19 python tests/adversary_deciding_enum.py [--stall F] [scenario-substring ...]

``--stall F``: a pause that hits a process in DECIDING lasts ``F`` x ``stale_after`` (else one, as everywhere).

Prints one line per scenario (first faults, those reaching DECIDING, pair runs, failures) and each
failure's schedule.
"""

from __future__ import annotations

import logging
import sys
import time

import model_enum
from enum_scenarios import SCENARIOS
from model_enum import count_points, points_after, run_one
from model_rerun import RerunScenario

from fsmingle.protocol import leaving

# The only world of these whose member sits in DECIDING long enough to list the root (its own lookup hid its
# release: GlusterFS nl-cache, test_exhaustive's last replay); in SCENARIOS, no node in DECIDING ever lists it.
NL_CACHE = RerunScenario("2 explicit re-run, GlusterFS nl-cache", 2, explicit=True, neg_ttl=61.0, listing_cures=True)


STALL = 1.0  # ``--stall F``: a pause of a process in DECIDING lasts F x stale_after (a SIGSTOP, a swap storm)


def _stalled_pause(orig):
    def pause(self, q, seconds):
        deciding = getattr(getattr(q.p, "seat", None), "state", None) is not None and q.p.seat.state.value == "deciding"
        return orig(self, q, seconds * STALL if deciding else seconds)

    return pause


SEEN = {"listings": 0, "retired": 0}  # root listings in DECIDING (retired_check moved), and "retired under it" rejoins


def _counting(orig):
    def step(self):
        before = self.timers.retired_check
        try:
            return orig(self)
        finally:
            SEEN["listings"] += self.timers.retired_check != before
            SEEN["retired"] += "retired while" in self.seat.note

    return step


def main(argv: list[str]) -> int:
    global STALL
    leaving.Leaving._step_deciding = _counting(leaving.Leaving._step_deciding)
    if argv[:1] == ["--stall"]:
        STALL, argv = float(argv[1]), argv[2:]
        model_enum.EnumWorld.pause = _stalled_pause(model_enum.EnumWorld.pause)
    logging.getLogger("fsmingle").disabled = True  # thousands of worlds: their warnings are expected
    bad = 0
    for sc in [*SCENARIOS, NL_CACHE]:
        if argv and not any(a in sc.name for a in argv):
            continue
        t0 = time.monotonic()
        SEEN.update(listings=0, retired=0)
        firsts = reaching = runs = 0
        failures = []
        for pt in count_points(sc):
            for kind in pt.kinds():
                firsts += 1
                why, _ = run_one(sc, [(pt, kind)])
                runs += 1
                if why is not None:
                    failures.append((f"{pt}", kind, why))
                    continue
                later = [q for q in points_after(sc, pt, kind) if q.role == "deciding"]
                if not later:
                    continue
                reaching += 1
                for q in later:
                    for kind2 in q.kinds():
                        why, _ = run_one(sc, [(pt, kind), (q, kind2)])
                        runs += 1
                        if why is not None:
                            failures.append((f"{pt} then {q}", f"{kind} then {kind2}", why))
        print(
            f"{sc.name}: {firsts} first faults, {reaching} reach DECIDING; {runs} runs in "
            f"{time.monotonic() - t0:.0f} s; {len(failures)} failed; DECIDING listed the root {SEEN['listings']} "
            f"times, saw its generation retired {SEEN['retired']} times",
            flush=True,
        )
        for f in failures:
            print("  FAIL", *f, sep=" | ", flush=True)
        bad += len(failures)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
