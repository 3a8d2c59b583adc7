"""Shared pytest setup and the fixtures every scenario uses.

* ``procs``: the one way to start participants (:class:`helpers.Procs`), here or
  on a network-namespace host (``procs.env(..., host=cluster[k])``); whatever a
  test leaves running is killed at teardown.
* ``d``: a rendezvous directory (``--dir``), made 0700 the way users make it once.
* cluster fixtures (``make_cluster``, ``cluster``, ``make_slurm``...) from ``conftest_cluster``.
"""

import os
import sys

import pytest

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
def d(tmp_path):
    path = tmp_path / "rdv"
    path.mkdir(mode=0o700)  # --dir must exist: fsmingle never creates it (a typo fails at once)
    return path


from conftest_cluster import *  # noqa: F403  (cluster fixtures: make_cluster, cluster, make_slurm, ...)
