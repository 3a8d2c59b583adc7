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

import os

from ..mounts import MountInfo

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
    ``cephfs``, ``juicefs``, ``beegfs``, ``object-store``, ``fuse`` (another FUSE filesystem: bindfs,
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
    if sub == "juicefs" or src.startswith("juicefs:"):  # `juicefs mount`: fuse.juicefs, JuiceFS:VOLUME
        return "juicefs"
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


def gluster_caches(mount_point: str) -> dict | None:
    """The caching translators of the GlusterFS client mounted at ``mount_point``, read from its
    ``.meta`` directory (the meta translator every FUSE client loads: one directory per translator
    of the active client graph, ``<VOL>-<name>/options/<key>``); None if there is none to read.

    Returns ``{"volume", "nl_cache", "nl_cache_timeout", "md_cache_timeout", "upcalls"}``:
    ``nl_cache`` is True when the negative-lookup cache (``performance.nl-cache``) is in the graph
    and not in pass-through; ``upcalls`` is md-cache's ``cache-invalidation`` (the client half of
    upcall coherence: ``performance.cache-invalidation``; the servers' half,
    ``features.cache-invalidation``, is not visible to a client).

    Why it matters (GlusterFS ``xlators/performance/nl-cache``): ``nlc_lookup_cbk`` caches every
    ENOENT a lookup gets, per parent directory, for ``nl-cache-timeout``, and ``nlc_lookup``
    answers a later lookup of that name from the cache unless the name is linked in the client's
    inode table.  The kernel looks a name up just before ``mkdir``/``link()``, so the node that
    loses a create race has cached "missing" for the winner's name.  Only an upcall from the
    servers clears it (``nlc_invalidate``): never without upcalls, and not when the invalidation
    overtakes that lookup's own ENOENT reply (the entry is added after the clear).
    """
    g = os.path.join(mount_point, ".meta", "graphs", "active")
    try:
        names = os.listdir(g)
    except OSError:
        return None

    def options(xl: str | None) -> dict:
        out = {}
        if xl:
            d = os.path.join(g, xl, "options")
            try:
                for k in os.listdir(d):
                    with open(os.path.join(d, k)) as f:
                        out[k] = f.read().strip()
            except OSError:
                pass
        return out

    def seconds(v: str | None, default: float) -> float:
        try:
            return float(v) if v is not None else default
        except ValueError:
            return default

    nl = next((n for n in names if n.endswith("-nl-cache")), None)
    md = next((n for n in names if n.endswith("-md-cache")), None)
    nlo, mdo = options(nl), options(md)
    on = ("on", "true", "yes", "enable", "1")
    nl_on = nl is not None and nlo.get("pass-through", "off").lower() not in on
    vol = nl[: -len("-nl-cache")] if nl else md[: -len("-md-cache")] if md else None
    return {
        "volume": vol,
        "nl_cache": nl_on,
        # defaults: glusterfs's nl-cache-timeout 60 and md-cache-timeout 1 (gluster volume set help)
        "nl_cache_timeout": seconds(nlo.get("nl-cache-timeout"), 60.0) if nl_on else None,
        "md_cache_timeout": seconds(mdo.get("md-cache-timeout"), 1.0) if md else None,
        "upcalls": mdo.get("cache-invalidation", "off").lower() in on,
    }


def gluster_nl_cache_warning(mount_point: str, volume_hint: str = "VOL") -> str | None:
    """One line saying a GlusterFS client caches negative lookups and how to turn it off, or None."""
    gc = gluster_caches(mount_point)
    if not gc or not gc["nl_cache"]:
        return None
    vol = gc["volume"] or volume_hint
    coherence = "with upcall invalidation" if gc["upcalls"] else "without upcall invalidation"
    # Without upcalls nothing but the timer clears a directory's negative entries, and that timer
    # fires once: nlc_init_invalid_ctx (nl-cache-helper.c) re-validates an expired cache with
    # gf_tw_mod_timer_pending, which re-arms only a timer still pending (timer-wheel.c) -- so
    # from then on the directory's negative entries never expire.
    how_long = (
        "for up to that long"
        if gc["upcalls"]
        else "for that long, and for good once that directory's cache expired once"
    )
    return (
        f"GlusterFS nl-cache is on ({coherence}, nl-cache-timeout {gc['nl_cache_timeout']:g} s): a node "
        f"that loses a race to create a name can find it missing by name {how_long} "
        f"(fsmingle retries from directory listings; a job directory created by racing nodes can fail, "
        f"and so can a FolderStore rank that loses a race). "
        f"Fix: gluster volume set {vol} performance.nl-cache off"
    )
