"""Shared pytest setup: keep torchrun/torch temp files inside each test's tmp dir."""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def repo_root() -> str:
    return REPO

from conftest_cluster import *  # noqa: F401,F403,E402  (cluster fixtures: make_cluster, cluster, make_slurm, ...)
