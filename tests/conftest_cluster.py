"""Cluster-on-one-machine pytest fixtures, for tests/conftest.py to import:

    from conftest_cluster import *  # noqa: F401,F403

Fixtures: make_cluster, cluster, make_slurm, slurm_cluster, slurm_cluster_module
(see tests/cluster.py for the Cluster / Host / SlurmCluster API;
``Cluster(fs=...)`` picks bindfs or a real filesystem from ``FILESYSTEMS``).
"""

try:
    from cluster import (
        FILESYSTEMS,
        PYTHON_BIN,
        Cluster,
        Host,
        JobResult,
        SlurmCluster,
        cluster,
        make_cluster,
        make_slurm,
        missing_capabilities,
        require_capabilities,
        slurm_cluster,
        slurm_cluster_module,
    )
except ImportError:  # tests/ imported as a package
    from tests.cluster import (  # noqa: F401
        FILESYSTEMS,
        PYTHON_BIN,
        Cluster,
        Host,
        JobResult,
        SlurmCluster,
        cluster,
        make_cluster,
        make_slurm,
        missing_capabilities,
        require_capabilities,
        slurm_cluster,
        slurm_cluster_module,
    )

__all__ = ["make_cluster", "cluster", "make_slurm", "slurm_cluster", "slurm_cluster_module"]
