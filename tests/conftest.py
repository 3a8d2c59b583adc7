"""Shared pytest setup and the fixtures every scenario uses.

* ``procs``: the one way to start participants (:class:`helpers.Procs`), here or
  on a network-namespace host (``procs.env(..., host=cluster[k])``); whatever a
  test leaves running is killed at teardown.
* ``d``: a rendezvous directory (``--dir``), made 0700 the way users make it once.
* cluster fixtures (``make_cluster``, ``cluster``, ``make_slurm``...) from ``conftest_cluster``.

Hypothesis searches are derandomized (the same examples on every run): a search that can fail a
CI run by chance is a flaky test (issue 29).  ``FSMINGLE_HYPOTHESIS_RANDOM=1`` draws fresh examples,
for a deeper hunt beside ``FSMINGLE_MODEL_EXAMPLES``; a failure it finds becomes a replay test.
"""

import logging
import os
import signal
import sys

import pytest
from hypothesis import settings

# Loaded before any test module builds its settings, which inherit it (hypothesis: a settings
# object's unset fields come from the profile active when it is created).
settings.register_profile("fsmingle", derandomize=not os.environ.get("FSMINGLE_HYPOTHESIS_RANDOM"))
settings.load_profile("fsmingle")

# The tests press Ctrl-C as a user at a terminal does (SIGINT to `status --watch`, `run`, `env`).  A suite
# started in the background by a shell without job control (`pytest ... &` in a script) inherits SIGINT
# ignored, and an ignored disposition survives exec (signal(7)): every process the tests start would
# ignore it, and Python would not turn it into KeyboardInterrupt (the `signal` module's docs).  A handler
# here is reset to the default in each child at exec, as a terminal's children have it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import REPO, Procs


@pytest.fixture
def repo_root() -> str:
    return str(REPO)


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path / "logs")
    yield p
    p.cleanup()


@pytest.fixture
def quiet_fsmingle():
    """fsmingle's log at CRITICAL for the test (enumerations run thousands of worlds), then as it was."""
    log = logging.getLogger("fsmingle")
    level = log.level
    log.setLevel(logging.CRITICAL)
    yield
    log.setLevel(level)


@pytest.fixture
def d(tmp_path):
    path = tmp_path / "rdv"
    path.mkdir(mode=0o700)  # --dir must exist: fsmingle never creates it (a typo fails at once)
    return path


from conftest_cluster import *  # noqa: F403  (cluster fixtures: make_cluster, cluster, make_slurm, ...)
