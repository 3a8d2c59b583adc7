"""The small worlds of the fault enumeration (issue 29): :data:`SCENARIOS`, each enumerated at every fault
point by ``test_exhaustive.py``, aimed at DECIDING by ``adversary_deciding_enum.py`` and digested by
``replay_digest.py`` (:mod:`model_enum` says how a world runs; :mod:`model_rerun` the re-run worlds)."""

from __future__ import annotations

try:
    from model_enum import Scenario
    from model_rerun import RerunScenario
except ImportError:  # tests/ imported as a package
    from tests.model_enum import Scenario
    from tests.model_rerun import RerunScenario

SCENARIOS = [
    Scenario("2 explicit", 2, explicit=True),
    Scenario("2 first-come", 2),
    Scenario("3 explicit", 3, explicit=True),
    Scenario("3 first-come", 3),
    Scenario("2 first-come per-rank --port", 2, mode="rank", master_port=29500),
    Scenario("2 first-come + spare", 2, spares=1),
    Scenario("3 explicit, peer jobs, relay", 3, explicit=True, peers=True),
    Scenario("2 explicit, peer jobs, relay + spare", 2, explicit=True, spares=1, peers=True),
    # A re-run of a released job on hosts whose views cache "absent" (neg_ttl 5 s: longer than a
    # run, shorter than stale_after) and lag their listings by model_rerun.LAG; only the re-run's points.
    RerunScenario("2 explicit re-run, negative caches", 2, explicit=True, neg_ttl=5.0),
    RerunScenario("2 first-come re-run, negative caches", 2, neg_ttl=5.0),
]
# Elastic MIN:MAX worlds: fsmingle has no elastic size (a world is exactly --nnodes), so none here.
