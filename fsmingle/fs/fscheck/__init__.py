"""What filesystem a directory is on, whether it can hold an exclusive claim, and which settings to use.

Two users:

* :func:`unsupported` -- the refusal the first rank claim raises
  (:meth:`fsmingle.fs.store.PosixStore.create`) where ``link()`` cannot make a claim
  exclusive (s3fs, gcsfuse, blobfuse, goofys, rclone mounts...): the real link()
  decides, not the type string: s3fs mounted with ``-o fsname=X`` shows as plain
  ``fuse`` in /proc/self/mountinfo, and bindfs or MooseFS look the same.
* :func:`check` -- the ``fsmingle check`` doctor: type and mount options that
  matter, link()/rename()/O_EXCL behaviour probed for real, owner and permissions
  of the directory, and a verdict with the ``--stale-after``/``--poll-max`` to
  use.  With ``peers > 1`` the same command run on that many nodes at once
  rendezvouses through a scratch directory inside DIR and also proves cross-node
  exclusivity of link() and O_EXCL and measures how long a file one node creates
  stays invisible by name on another (the negative lookup cache).

Sources: link(2) and open(2) (``O_EXCL`` and NFS), nfs(5) (``actimeo``,
``lookupcache``, ``local_lock``), Lustre's mount options (``flock``,
``localflock``), proc(5) (mountinfo fields), and the measurements in
``docs/filesystems/`` (GlusterFS, MooseFS, s3fs run here).

Modules, one job each (the names below are re-exported here, so ``fsmingle.fs.fscheck.X`` works):

* :mod:`.mounts` -- /proc/self/mountinfo: which mount a path is on (:func:`find_mount`).
* :mod:`.families` -- the mount-type table: :func:`family`, the options that matter, cache lengths.
* :mod:`.probes` -- link(), rename() and O_EXCL tried for real (:func:`probe_link`).
* :mod:`.refusal` -- :func:`unsupported` and :func:`refusal_message`: the refusal (exit 10) the first claim raises.
* :mod:`.doctor` -- :func:`check`: probes, owner, verdict and settings.
* :mod:`.peers` -- ``--peers N``: cross-node races and visibility delays.
* :mod:`.report` -- the ``fsmingle check`` command: rich tables or JSON, exit code (:func:`main`).
"""

from __future__ import annotations

from ..mounts import MountInfo, find_mount
from ..refusal import REFUSE_ERRNOS, refusal_message, unsupported
from .doctor import check
from .families import family
from .probes import LinkProbe, errno_name, probe_link
from .report import main, render

__all__ = [
    "REFUSE_ERRNOS",
    "LinkProbe",
    "MountInfo",
    "check",
    "errno_name",
    "family",
    "find_mount",
    "main",
    "probe_link",
    "refusal_message",
    "render",
    "unsupported",
]
