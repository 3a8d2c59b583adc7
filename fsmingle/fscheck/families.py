"""The mount-type table: which family a mount belongs to and what its mount options mean.

* :func:`family` -- ``nfs``, ``lustre``, ``glusterfs``, ``moosefs``, ``object-store``... from the
  mountinfo type and source (a hint for ``fsmingle check``; the link() probe in
  :mod:`.probes` is what decides whether a claim can be exclusive).
* ``_RELEVANT_OPTIONS`` -- the mount options ``fsmingle check`` shows, per family.
* ``_SHARED`` -- families seen by several machines (the rest count as local).
* :func:`_cache_seconds` -- the longest attribute/lookup cache a mount's options promise.

Sources: nfs(5) (``actimeo``, ``ac*``, ``noac``, ``lookupcache``, ``local_lock``), Lustre's mount
options (``flock``, ``localflock``), glusterfs(8), mfsmount(8), mount.ceph(8), bindfs(1), and the
measurements in ``docs/filesystems/``.
"""

from __future__ import annotations

from .mounts import MountInfo

# Filesystems that expose an object store as files: whole-object PUTs, no hard links, no
# cross-mount exclusive create.  Matched against the mountinfo type and source (a warning in
# `check`; the link() probe is what refuses).
_OBJECT_STORE = (
    "s3fs",
    "gcsfuse",
    "blobfuse",
    "blobfuse2",
    "goofys",
    "rclone",
    "mountpoint-s3",
    "geesefs",
    "s3backer",
    "azurefile-fuse",
    "ossfs",
    "cosfs",
    "obsfs",
)

# Mount options that change what fsmingle can rely on, per filesystem family (nfs(5); Lustre
# mount options; glusterfs(8); mfsmount(8); bindfs(1)).
_RELEVANT_OPTIONS = {
    "nfs": (
        "actimeo",
        "acregmin",
        "acregmax",
        "acdirmin",
        "acdirmax",
        "noac",
        "lookupcache",
        "local_lock",
        "nolock",
        "vers",
        "nfsvers",
        "sync",
        "hard",
        "soft",
        "timeo",
        "retrans",
    ),
    "lustre": ("flock", "localflock", "noflock", "lazystatfs"),
    "glusterfs": ("attribute-timeout", "entry-timeout", "negative-timeout", "direct-io-mode", "acl", "use-readdirp"),
    "moosefs": (
        "mfsattrcacheto",
        "mfsentrycacheto",
        "mfsnegentrycacheto",
        "mfsdirentrycacheto",
        "mfsnobsdlocks",
        "mfsnoposixlocks",
        "mfstimeout",
    ),
    # mount.ceph(8), the kernel client (type ``ceph``).  ceph-fuse (type ``fuse.ceph-fuse``) shows
    # none of its settings in mountinfo: they live in ceph.conf's [client] section.
    "cephfs": (
        "wsync",
        "nowsync",
        "recover_session",
        "dcache",
        "nodcache",
        "caps_wanted_delay_min",
        "caps_wanted_delay_max",
        "mount_timeout",
        "fs",
        "mds_namespace",
        "noshare",
        "ms_mode",
    ),
    "fuse": ("attr_timeout", "entry_timeout", "negative_timeout", "allow_other", "default_permissions"),
}

# Families that are shared between machines (everything else is treated as local).
_SHARED = {
    "nfs",
    "lustre",
    "gpfs",
    "glusterfs",
    "moosefs",
    "cephfs",
    "beegfs",
    "object-store",
    "fuse",
    "cifs",
    "9p",
    "virtiofs",
    "weka",
    "juicefs",
}


def family(m: MountInfo) -> str:
    """Filesystem family of a mount: ``nfs``, ``lustre``, ``gpfs``, ``glusterfs``, ``moosefs``,
    ``cephfs``, ``beegfs``, ``object-store``, ``fuse`` (another FUSE filesystem: bindfs,
    sshfs...), ``tmpfs`` or ``local``."""
    t, src = m.fstype.lower(), m.source.lower()
    sub = t.split(".", 1)[1] if t.startswith(("fuse.", "fuseblk.")) else ""
    if t.startswith("nfs"):
        return "nfs"
    if t == "lustre":
        return "lustre"
    if t == "gpfs":
        return "gpfs"
    if t in ("ceph", "fuse.ceph", "fuse.ceph-fuse") or sub.startswith("ceph"):
        return "cephfs"
    if t == "beegfs":
        return "beegfs"
    if sub == "glusterfs" or t == "glusterfs":
        return "glusterfs"
    if sub in ("mfs", "moosefs") or src.startswith("mfs#"):
        return "moosefs"
    if sub in _OBJECT_STORE or any(src == n or src.startswith(n + ":") for n in _OBJECT_STORE):
        return "object-store"
    if t.startswith("fuse"):
        return "fuse"
    if t in ("tmpfs", "ramfs"):
        return "tmpfs"
    if t in ("cifs", "smb3", "9p", "virtiofs", "wekafs"):
        return t
    return "local"


def _cache_seconds(fam: str, opts: dict) -> float | None:
    """Longest attribute/lookup cache a mount option promises, in seconds (None: not visible)."""

    def num(k):
        try:
            return float(opts[k])
        except (KeyError, ValueError):
            return None

    if fam == "nfs":
        if "noac" in opts:
            return 0.0
        vals = [v for v in (num("actimeo"), num("acregmax"), num("acdirmax")) if v is not None]
        return max(vals) if vals else 60.0  # nfs(5): acregmax 60, acdirmax 60 by default
    if fam == "moosefs":
        vals = [v for v in (num("mfsattrcacheto"), num("mfsentrycacheto"), num("mfsnegentrycacheto")) if v is not None]
        return max(vals) if vals else None
    if fam == "cephfs":
        # No time-based cache: the MDS grants capabilities and revokes them before another client
        # changes what they cover (a name looked up, then created elsewhere: visible in 5-7 ms,
        # measured; docs/filesystems/cephfs.md).
        return 0.0
    vals = [
        v
        for v in (
            num("attr_timeout"),
            num("entry_timeout"),
            num("negative_timeout"),
            num("attribute-timeout"),
            num("entry-timeout"),
            num("negative-timeout"),
        )
        if v is not None
    ]
    return max(vals) if vals else None
