"""Cluster-on-one-machine pytest fixtures, for tests/conftest.py to import:

    from conftest_cluster import *  # noqa: F401,F403

Fixtures: make_cluster, cluster, make_slurm, slurm_cluster, slurm_cluster_module
(see tests/cluster/ for the Cluster / Host / SlurmCluster API;
``Cluster(fs=...)`` picks bindfs or a real filesystem from ``FILESYSTEMS``).
"""

# tests/ is on sys.path (tests/conftest.py puts it there), so the harness imports by its own name.
from cluster import cluster, make_cluster, make_slurm, slurm_cluster, slurm_cluster_module

__all__ = ["make_cluster", "cluster", "make_slurm", "slurm_cluster", "slurm_cluster_module"]
