"""A cluster on one machine, for tests.

``Cluster`` creates K "hosts" as network namespaces on a private bridge.  Every
process started on a host runs inside the host's network namespace and in a
fresh private UTS + mount namespace, where it has

* the host's own hostname (``node0``, ``node1``, ...);
* a private ``/etc/hosts`` (and an empty ``/etc/resolv.conf``);
* the host's own NFS-like FUSE view of ONE shared backing directory, mounted at
  the same path (``cluster.shared``) on every host: ``bindfs`` with
  ``attr_timeout``/``entry_timeout``/``negative_timeout`` = ``cache_timeout``,
  so a file created on host A can stay invisible to ``stat``/``open`` on host B
  for up to ``cache_timeout`` seconds (``os.listdir`` shows it at once), just
  like NFS's lookup cache.  bindfs does not forward locks by default, so
  ``flock``/``fcntl`` locks are node-local: they succeed and exclude nothing
  across hosts (like NFS mounted with ``local_lock``).

Inside a host there is NO default route (only ``lo`` and ``eth0``): a tool that
picks its own address by "route to 8.8.8.8" must fall back to ``eth0``.

``SlurmCluster`` runs a real Slurm (munged + slurmctld + one slurmd per host;
with ``accounting=True`` also slurmdbd on a MariaDB of its own, for ``sacct``)
on top of such a cluster; ``sbatch``/``wait``/``output`` drive it.

Network rule: traffic goes only to loopback and to namespaces created here.
Every run picks a random private /24 (10.<100-250>.<0-255>.0/24) not used on
the machine and a random name prefix, so concurrent runs cannot collide.  The
bridge gets its address before anything is sent.  Teardown always runs
(context manager, pytest fixture finalizers, ``atexit``), and a run killed
with SIGKILL is swept by the next one (see ``sweep_stale``).

Pytest fixtures (import them in conftest.py, e.g. ``from conftest_cluster
import *``): ``make_cluster``, ``cluster``, ``make_slurm``, ``slurm_cluster``,
``slurm_cluster_module``.

The package, one module per concern (each re-exported here, so ``import cluster as cl`` and
``cl.Cluster`` work as they did when it was one file):

==================  ==========================================================================
``plumbing``        commands with a timeout, /proc and mountinfo readers, FUSE aborts, ports
``registry``        what a run created, on disk, so the next run sweeps a killed one; teardown
``capabilities``    the filesystems (``FILESYSTEMS``), their tools, the skip naming what lacks
``hosts``           ``Host``: a network namespace, its hostname, mounts and pid namespace
``core``            ``Cluster``: the bridge, the hosts, the shared filesystem
``fs_base``         a filesystem's servers and FUSE clients (base class; bindfs)
``gluster``         GlusterFS (two cache profiles)
``moosefs``         MooseFS
``cephfs``          CephFS
``juicefs``         JuiceFS (Redis metadata, a local bucket; two cache profiles)
``s3fs``            s3fs over moto (refused by fsmingle)
``slurm``           ``SlurmCluster``: munged, slurmctld, slurmd per host
``accounting``      MariaDB and slurmdbd for ``sacct``
``fixtures``        the pytest fixtures
==================  ==========================================================================
"""

from .capabilities import (
    FILESYSTEMS,
    MOTO_VENV_DEFAULT,
    MOTO_VENV_ENV,
    fs_tools,
    missing_capabilities,
    moto_server_path,
    require_capabilities,
)
from .cephfs import CEPH_FS_SETTINGS
from .core import Cluster
from .fixtures import cluster, make_cluster, make_slurm, slurm_cluster, slurm_cluster_module
from .gluster import GLUSTER_PROFILES
from .hosts import Host
from .juicefs import JUICEFS_PROFILES
from .moosefs import MFS_MOUNT_OPTS
from .plumbing import (
    KEEP_ENV,
    PYTHON_BIN,
    REGISTRY_DIR,
    REQUIRE_ENV,
    _fuse_abort,
    _mount_dev_minor,
    _mounts_under,
)
from .registry import sweep_stale
from .slurm import JobResult, SlurmCluster

__all__ = [
    "Cluster",
    "Host",
    "SlurmCluster",
    "JobResult",
    "missing_capabilities",
    "require_capabilities",
    "sweep_stale",
    "PYTHON_BIN",
    "make_cluster",
    "cluster",
    "make_slurm",
    "slurm_cluster",
    "slurm_cluster_module",
    # also used by tests beside the list above
    "FILESYSTEMS",
    "GLUSTER_PROFILES",
    "MFS_MOUNT_OPTS",
    "CEPH_FS_SETTINGS",
    "JUICEFS_PROFILES",
    "MOTO_VENV_DEFAULT",
    "MOTO_VENV_ENV",
    "KEEP_ENV",
    "REGISTRY_DIR",
    "REQUIRE_ENV",
    "fs_tools",
    "moto_server_path",
    "_fuse_abort",
    "_mount_dev_minor",
    "_mounts_under",
]
