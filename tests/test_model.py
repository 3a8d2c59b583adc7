"""Model-checking protocol v2 (fsmingle.protocol.participant.Participant) on a stale in-memory filesystem and a fake network.

The real policy code -- :mod:`fsmingle.protocol.participant`, :mod:`fsmingle.protocol.rank0.coordinator`,
:mod:`fsmingle.protocol.member`, :mod:`fsmingle.protocol.decision` -- runs unchanged against
:mod:`fakefs` (bounded stale reads, negative caches of any length, spurious
``ENOENT``, lagging listings, linearisable exclusive create with lost replies,
crashes in the middle of store operations, corrupt files), :mod:`fakenet`
(connections, pings, refused and unanswered connects, silent partitions,
resets, dead processes' sockets closing) and a fake clock.  A
``RuleBasedStateMachine`` interleaves joins, steps, crashes, restarts, time,
staleness, caches, partitions, resets and corruption, and checks (issue 11):

* never two released instances of one rank;
* every member of a released world was alive, connected to its master and had
  acknowledged the release when ``release.json`` was created (or its death or
  loss was not observable by rank 0 yet: a partition held its FIN, or it
  happened after rank 0's last look at its connections);
* no release of a world containing a participant that had left the generation
  (rejoined another, or exited);
* everyone released agrees on (master address, port, generation), and each
  placement is what :func:`fsmingle.protocol.decision.placements` gives for that
  generation's authentic decision;
* exceptions are the documented ones, in their documented situations:
  RankConflictError only when the other holder is (recently) alive or was
  released; RendezvousTimeoutError only after the deadline; CorruptStateError
  only over a release the test corrupted; WorldSizeMismatchError only where the
  test gave participants different sizes; ConfigError ("port in use") only for
  an explicit --port shared by first-come processes of one host;

and, at the end of every run (liveness), that once faults stop (crashes,
partitions, lost replies; negative cache entries expire), every slot has a
live participant and time passes, everyone is released within a bound.

The machine lives in ``model_machine.py``; the world and its oracles in ``model_world.py``,
``model_oracles.py`` and ``model_queue.py``;
the deterministic scenarios in ``test_model_scenarios.py``, ``test_model_store.py`` and
``test_model_generations.py``; every fault point, enumerated, in ``test_exhaustive.py``.

Environment: ``FSMINGLE_MODEL_EXAMPLES`` (default 400 runs of up to 60 actions,
about a minute on this 2-core machine); ``FSMINGLE_MODEL_KNOWN_BUGS=1`` lets the
machine generate the situations of the known bugs (see the ``test_bug_*`` tests)
that it otherwise avoids.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

try:
    from model_machine import MODEL_EXAMPLES, RendezvousMachine
except ImportError:  # tests/ imported as a package
    from tests.model_machine import MODEL_EXAMPLES, RendezvousMachine

RendezvousMachine.TestCase.settings = settings(
    max_examples=MODEL_EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
TestRendezvousModel = RendezvousMachine.TestCase
