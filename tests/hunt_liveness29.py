"""A targeted hunt for issue 29's open liveness failure (not collected by pytest: run it by hand).

The model machine once failed "not released within 267 fake seconds" in a world of 3 explicit
ranks with ranks 0 and 1 behind a silent partition and repeated EIO on the ``release.json``
create; a fixed sweep of that pattern never reproduced it.  This is the machine of
``model_machine.py`` with its setup pinned to that pattern (the rest drawn) and one more rule that
arms EIO on a host's next release creates (before or after the effect, with or without a negative
entry left behind), drawn fresh each run::

    FSMINGLE_HUNT_EXAMPLES=4000 python -m pytest -q -p no:cacheprovider tests/hunt_liveness29.py

A failure it finds becomes a replay test (``test_model_replays.py``).  Run so far (2026-11-27):
8,000 examples, none failed.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from fsmingle.fs.layout import RELEASE

try:
    from model_machine import RendezvousMachine
    from model_oracles import GLUSTER_NEG
except ImportError:  # tests/ imported as a package
    from tests.model_machine import RendezvousMachine
    from tests.model_oracles import GLUSTER_NEG


class Hunt(RendezvousMachine):
    @initialize(
        staleness=st.sampled_from([0.0, 1.0, 2.5]),
        pidns=st.sampled_from(["host", "pod"]),
        cleaner=st.booleans(),
        joined=st.integers(0, 3),
        initial_lag=st.sampled_from([0.0, 0.5, 1.0]),
        mode=st.sampled_from(["node", "rank"]),
        fixed_port=st.booleans(),
        rank_order=st.sampled_from(["arrival", "host"]),
        peers=st.sampled_from([False, False, True]),
    )
    def setup(self, staleness, pidns, cleaner, joined, initial_lag, mode, fixed_port, rank_order, peers):
        RendezvousMachine.setup(
            self,
            size=3,
            mode=mode,
            rank_policy="explicit",
            staleness=staleness,
            pidns=pidns,
            cleaner=cleaner,
            partitioned={0, 1},
            fixed_port=fixed_port,
            short_timeout=5,  # not 0: --timeout never fires, so liveness is checked
            mixed_seed=0,
            joined=joined,
            initial_lag=initial_lag,
            rank_order=rank_order,
            peers=peers,
        )

    @rule(
        h=st.integers(0, 3),
        k=st.integers(0, 2),
        after_effect=st.booleans(),
        blind=st.sampled_from([0.0, 0.0, 5.0, GLUSTER_NEG]),
    )
    def release_eio(self, h, k, after_effect, blind):
        """Host ``h``'s k-th next create of a ``release.json`` fails with EIO."""
        host = self._host(h)
        if host is not None:
            self.w.say(f"{host.node}: EIO on its {k}-th next release create (took effect: {after_effect})")
            host.store.arm_io_error(
                k, lambda n: n.endswith(RELEASE), ops=("create",), after_effect=after_effect, blind_for=blind
            )


Hunt.TestCase.settings = settings(
    max_examples=int(os.environ.get("FSMINGLE_HUNT_EXAMPLES", "400")),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=False,  # a hunt: fresh examples every run (never in CI)
)
TestHunt = Hunt.TestCase
