"""Pytest fixtures of the cluster harness (tests/conftest_cluster.py imports them)."""

from __future__ import annotations

from .capabilities import require_capabilities
from .core import Cluster
from .slurm import SlurmCluster

try:
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    def _started(cls):
        """Body of a factory fixture: yields ``factory(*args, **kw) -> cls(*args, **kw).start()``;
        closes every object it made after the test, last first, even when the test fails."""
        made = []

        def factory(*args, **kw):
            obj = cls(*args, **kw)
            made.append(obj)
            return obj.start()

        yield factory
        for obj in reversed(made):
            obj.close()

    @pytest.fixture
    def make_cluster():
        """Factory: ``make_cluster(n_hosts=3, cache_timeout=2.0, **kw) -> Cluster``
        (started); all are torn down after the test, even when it fails."""
        require_capabilities()
        yield from _started(Cluster)

    @pytest.fixture
    def cluster(make_cluster) -> Cluster:
        """3 hosts, cache_timeout=2 s."""
        return make_cluster(3)

    @pytest.fixture
    def make_slurm():
        """Factory: ``make_slurm(n_nodes=3, **cluster_kw) -> SlurmCluster`` (started,
        probe job done); torn down after the test."""
        require_capabilities(slurm=True)
        yield from _started(SlurmCluster)

    @pytest.fixture
    def slurm_cluster(make_slurm) -> SlurmCluster:
        """3-node Slurm, cache_timeout=2 s."""
        return make_slurm(3)

    @pytest.fixture(scope="module")
    def slurm_cluster_module() -> SlurmCluster:
        """3-node Slurm shared by the tests of one module (saves ~3.5 s per test).
        Tests must not depend on job ids or leave jobs running."""
        require_capabilities(slurm=True)
        with SlurmCluster(3) as s:
            yield s
