"""What filesystem a directory is on, whether it can hold an exclusive claim, and which settings to use.

Two users:

* :func:`require_claimable` -- called once per process before anything is claimed
  (:func:`fsmingle.api.rendezvous`): it probes ``link()`` for real in the job
  directory and raises :class:`~fsmingle.errors.UnsupportedFilesystemError` where
  a claim cannot be exclusive (s3fs, gcsfuse, blobfuse, goofys, rclone mounts...).
  The probe decides, not the type string: s3fs mounted with ``-o fsname=X`` shows
  as plain ``fuse`` in /proc/self/mountinfo, and bindfs or MooseFS look the same.
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
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import stat
import time
from dataclasses import asdict, dataclass, field

from .errors import (
    ConfigError,
    RendezvousTimeoutError,
    StorageError,
    UnsupportedFilesystemError,
)

__all__ = [
    "REFUSE_ERRNOS",
    "MountInfo",
    "check",
    "errno_name",
    "family",
    "find_mount",
    "probe_link",
    "refusal_message",
    "require_claimable",
]

# errno values of link() that mean "this filesystem has no hard links" (link(2)): EPERM "the
# filesystem does not support the creation of hard links", EOPNOTSUPP/ENOTSUP (s3fs, gcsfuse),
# ENOSYS (a FUSE daemon without a link handler), EXDEV (a union/overlay that splits one directory
# across filesystems).  Any of them: no exclusive claim is possible, and O_EXCL is no substitute
# (s3fs: two mounts both "won" 100 of 100 O_EXCL races here).
REFUSE_ERRNOS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV})

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

_PROBE_PREFIX = ".fsmingle-probe-"
_CHECK_DIR = ".fsmingle-check"


@dataclass(frozen=True)
class MountInfo:
    """One line of /proc/self/mountinfo (proc(5)): the mount a path lives on.

    Attributes:
        mount_point (str): where it is mounted.
        fstype (str): filesystem type (``nfs4``, ``lustre``, ``fuse.glusterfs``, ``fuse``...).
        source (str): mount source (``server:/export``, ``mfs#host:port``, the backing dir of bindfs).
        options (dict[str, str]): per-mount and superblock options merged (``"actimeo": "60"``;
            flags map to ``""``).
        device (str): ``MAJOR:MINOR``; for FUSE the minor is the connection number in /sys/fs/fuse/connections.
    """

    mount_point: str
    fstype: str
    source: str
    options: dict = field(default_factory=dict)
    device: str = ""

    def describe(self) -> str:
        return f"{self.fstype} filesystem {self.source!r} mounted at {self.mount_point}"


def _unescape(s: str) -> str:
    # mountinfo escapes space, tab, newline, backslash and '#' as \ooo octal (proc(5))
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1 : i + 4].isdigit():
            out.append(chr(int(s[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _parse_options(*groups: str) -> dict:
    opts: dict = {}
    for g in groups:
        for o in g.split(","):
            if o:
                k, _, v = o.partition("=")
                opts[k] = v
    return opts


def find_mount(path: str, mountinfo: str = "/proc/self/mountinfo") -> MountInfo:
    """The mount that ``path`` lives on: the longest mount point that prefixes its real path;
    among equal ones the last line (the mount on top).  Reads mountinfo only, never stat()s a
    mount point (a hung network client would hang us).

    Raises:
        StorageError: mountinfo cannot be read (not Linux, /proc not mounted).
    """
    real = os.path.realpath(path)
    best: MountInfo | None = None
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise StorageError(f"cannot read {mountinfo} to tell which filesystem {path} is on: {e.strerror}") from None
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        a, b = left.split(), right.split()
        if len(a) < 6 or len(b) < 2:
            continue
        mp = _unescape(a[4])
        if not (real == mp or mp == "/" or real.startswith(mp.rstrip("/") + "/")):
            continue
        if best is None or len(mp) >= len(best.mount_point):
            best = MountInfo(mp, b[0], _unescape(b[1]), _parse_options(a[5], b[2] if len(b) > 2 else ""), a[2])
    if best is None:
        raise StorageError(f"no mount found for {path} in {mountinfo}")
    return best


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


# --------------------------------------------------------------------------- link() probe


@dataclass(frozen=True)
class LinkProbe:
    """Result of one link() probe.

    Attributes:
        ok (bool): link() made a second name for the file (link count 2).
        errno (int | None): the errno link() failed with (None: it succeeded or the probe file
            could not be created).
        detail (str): one line, for messages.
    """

    ok: bool
    errno: int | None
    detail: str


_probe_cache: dict[str, LinkProbe] = {}


def errno_name(code: int) -> str:
    """Symbolic name of an errno value; 95 is EOPNOTSUPP (= ENOTSUP on Linux), as link(2) names it."""
    return "EOPNOTSUPP" if code == errno.EOPNOTSUPP else errno.errorcode.get(code, str(code))


def _scratch_name(directory: str, tag: str) -> str:
    return os.path.join(
        directory, f"{_PROBE_PREFIX}{tag}-{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(4)}"
    )


def probe_link(directory: str) -> LinkProbe:
    """Create a hidden scratch file in ``directory``, link() it to a second hidden name, check
    the link count is 2, remove both.  Never raises for the filesystem's answers; raises
    OSError only if the scratch file cannot be created (not writable, read-only, full: the
    caller's normal error path reports those)."""
    src = _scratch_name(directory, "a")
    dst = src + ".l"
    fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"fsmingle link probe\n")
    finally:
        os.close(fd)
    try:
        try:
            os.link(src, dst)
        except OSError as e:
            return LinkProbe(False, e.errno, f"link() failed with {errno_name(e.errno)} ({os.strerror(e.errno)})")
        try:
            n = os.stat(src).st_nlink
        except OSError as e:
            return LinkProbe(False, None, f"stat() after link() failed: {e.strerror}")
        if n != 2:
            # A filesystem that "links" by copying: a claim made this way is not exclusive proof.
            return LinkProbe(False, None, f"link() succeeded but the link count is {n}, not 2")
        return LinkProbe(True, None, "link() made a second name (link count 2)")
    finally:
        for p in (dst, src):
            try:
                os.unlink(p)
            except OSError:
                pass


def refusal_message(directory: str, why: str, m: MountInfo | None = None) -> str:
    """The one-paragraph refusal: which filesystem, why no exclusive claim, what to use instead."""
    if m is None:
        try:
            m = find_mount(directory)
        except StorageError:
            m = None
    fs = m.describe() if m else "its filesystem"
    return (
        f"{directory} is on {fs}: {why}. fsmingle claims a rank with link(), the only exclusive "
        f"create that works across nodes here, and will not fall back to O_CREAT|O_EXCL, which "
        f"object-store and some FUSE filesystems do not make exclusive across mounts (two nodes "
        f"could both hold one rank). Use a POSIX shared filesystem for --dir (NFS, Lustre, GPFS, "
        f"CephFS, GlusterFS, MooseFS, BeeGFS); `fsmingle check --dir DIR` tells whether one is usable"
    )


def require_claimable(directory: str) -> None:
    """Refuse a directory where no exclusive claim is possible; at most one probe per process
    and directory (the answer is cached: a filesystem does not gain or lose hard links mid-run).

    Raises:
        UnsupportedFilesystemError: link() fails with EPERM/EOPNOTSUPP/ENOSYS/EXDEV or does not
            yield a link count of 2.  Other errors (EACCES, EROFS, ENOSPC) are left to the
            store, which reports them as StorageError when it first writes.
    """
    key = os.path.realpath(directory)
    res = _probe_cache.get(key)
    if res is None:
        try:
            res = probe_link(directory)
        except OSError:
            return
        _probe_cache[key] = res
    if res.ok or (res.errno is not None and res.errno not in REFUSE_ERRNOS):
        return
    try:
        m = find_mount(directory)
    except StorageError:
        m = None
    raise UnsupportedFilesystemError(
        refusal_message(directory, f"it cannot hold an exclusive claim ({res.detail})", m),
        fstype=m.fstype if m else "",
        source=m.source if m else "",
        mount_point=m.mount_point if m else "",
    )


# --------------------------------------------------------------------------- the doctor


def _probe_rename(directory: str) -> tuple[bool, str]:
    """Replace a file by rename() and read it back: the new content, never a mix."""
    a = _scratch_name(directory, "r")
    b = a + ".t"
    try:
        with open(a, "wb") as f:
            f.write(b"old")
        with open(b, "wb") as f:
            f.write(b"new")
            f.flush()
            os.fsync(f.fileno())
        os.replace(b, a)
        with open(a, "rb") as f:
            got = f.read()
        return (
            got == b"new",
            "rename() replaced the file atomically"
            if got == b"new"
            else f"after rename() the file reads {got!r}, not the new content",
        )
    except OSError as e:
        return False, f"rename() failed: {errno_name(e.errno)} ({e.strerror})"
    finally:
        for p in (a, b):
            try:
                os.unlink(p)
            except OSError:
                pass


def _probe_excl(directory: str) -> tuple[bool, str]:
    """O_CREAT|O_EXCL twice on one name: the second must fail with EEXIST (on this node)."""
    a = _scratch_name(directory, "x")
    try:
        os.close(os.open(a, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            os.close(os.open(a, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return False, "a second O_CREAT|O_EXCL of the same name succeeded"
        except FileExistsError:
            return True, "a second O_CREAT|O_EXCL of the same name failed with EEXIST"
    except OSError as e:
        return False, f"O_CREAT|O_EXCL failed: {errno_name(e.errno)} ({e.strerror})"
    finally:
        try:
            os.unlink(a)
        except OSError:
            pass


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


def _settings(cache_s: float | None) -> dict:
    """--stale-after and --poll-max for a mount whose caches hold for ``cache_s`` seconds.

    stale_after must exceed the time a replaced beacon's new content can stay hidden (the
    attribute cache) several times over (fsmingle.protocol.Timing): max(30, 3 x cache + 10).
    poll_max: polling faster than the cache refreshes gains nothing and loads the metadata
    server; keep the default 0.28 s when caches are short, 1 s otherwise.
    """
    c = cache_s or 0.0
    stale = max(30.0, 3 * c + 10)
    return {"stale_after": round(stale), "poll_max": 0.28 if c <= 3 else 1.0}


def _owner_report(directory: str) -> dict:
    st = os.stat(directory)
    mode = stat.S_IMODE(st.st_mode)
    problems = []
    if st.st_uid != os.geteuid():
        problems.append(
            f"owned by uid {st.st_uid}, not you (uid {os.geteuid()}): fsmingle creates an owner-only "
            f"job directory inside it, which is fine if DIR is a sticky scratch dir"
        )
    if mode & 0o002 and not mode & 0o1000:
        problems.append(
            "world-writable without the sticky bit: other users could replace your job directory "
            "(chmod +t or chmod o-w)"
        )
    return {
        "uid": st.st_uid,
        "gid": st.st_gid,
        "mode": f"{mode:04o}",
        "writable": os.access(directory, os.W_OK),
        "problems": problems,
    }


def check(directory: str, peers: int = 1, timeout: float = 120.0, session: str = "default", races: int = 20) -> dict:
    """Examine ``directory`` the way ``fsmingle check`` prints it.

    Args:
        directory (str): the directory to examine (``--dir``); must exist and be writable.
        peers (int): number of nodes running this check at once (1: this node only).
        timeout (float): seconds to wait for the other peers (and for their files to become visible).
        session (str): name of the scratch rendezvous (``DIR/.fsmingle-check/SESSION``), the same
            on every peer; lets several checks share one DIR.
        races (int): exclusive-create races per kind between the peers.

    Returns:
        dict: ``{"dir", "mount", "family", "options", "probes", "owner", "peers", "verdict",
        "reasons", "settings"}``; ``verdict`` is ``"ok"``, ``"local"`` (works, but only this
        machine sees the directory) or ``"unsafe"``.

    Raises:
        ConfigError: ``peers`` < 1, ``timeout`` <= 0 or a bad session name.
        StorageError: the directory is missing or not writable.
        RendezvousTimeoutError: the other peers did not all show up within ``timeout``.
    """
    if peers < 1:
        raise ConfigError(f"--peers must be at least 1, got {peers}")
    if not timeout > 0:
        raise ConfigError(f"--timeout must be positive seconds, got {timeout}")
    if not session or not all(c.isalnum() or c in "-_." for c in session) or session.startswith("."):
        raise ConfigError(f"--session {session!r}: use letters, digits, '-', '_' and '.' (not first)")
    if not os.path.isdir(directory):
        raise StorageError(f"--dir {directory} does not exist or is not a directory (is the filesystem mounted here?)")
    if not os.access(directory, os.W_OK):
        raise StorageError(f"--dir {directory} is not writable by you: fsmingle needs to create files in it")
    m = find_mount(directory)
    fam = family(m)
    opts = {
        k: v
        for k, v in m.options.items()
        if k in _RELEVANT_OPTIONS.get(fam, ())
        or (k in _RELEVANT_OPTIONS["fuse"] and fam in ("fuse", "glusterfs", "object-store"))
    }
    try:
        link = probe_link(directory)
    except OSError as e:
        raise StorageError(f"cannot create a file in {directory}: {e.strerror}") from None
    ren_ok, ren_detail = _probe_rename(directory)
    excl_ok, excl_detail = _probe_excl(directory)
    probes = {
        "link": {"ok": link.ok, "detail": link.detail},
        "rename": {"ok": ren_ok, "detail": ren_detail},
        "o_excl": {"ok": excl_ok, "detail": excl_detail},
    }
    result = {
        "dir": os.path.realpath(directory),
        "mount": asdict(m),
        "family": fam,
        "options": opts,
        "probes": probes,
        "owner": _owner_report(directory),
        "peers": None,
    }
    if peers > 1:
        result["peers"] = _peer_check(directory, peers, timeout, session, races)
    _verdict(result, m, fam, link)
    return result


def _verdict(r: dict, m: MountInfo, fam: str, link: LinkProbe) -> None:
    reasons, unsafe = [], False
    if not link.ok:
        unsafe = True
        reasons.append(f"no exclusive claim possible: {link.detail}")
    if not r["probes"]["rename"]["ok"]:
        unsafe = True
        reasons.append(f"beacons cannot be replaced atomically: {r['probes']['rename']['detail']}")
    if fam == "object-store":
        reasons.append(
            f"{m.fstype} ({m.source}) is an object store seen as files: no hard links, whole-object "
            f"writes, O_EXCL not exclusive across mounts"
        )
    p = r.get("peers")
    cache_s = _cache_seconds(fam, m.options)
    if p:
        if p["link_double_wins"]:
            unsafe = True
            reasons.append(
                f"link() was not exclusive across nodes: {p['link_double_wins']} of {p['races']} races "
                f"had several winners"
            )
        if p["excl_double_wins"]:
            reasons.append(
                f"O_CREAT|O_EXCL was not exclusive across nodes ({p['excl_double_wins']} of {p['races']} "
                f"races had several winners); fsmingle never relies on it"
            )
        if p["open_delay_max_s"] is not None:
            cache_s = max(cache_s or 0.0, p["open_delay_max_s"])
            if p["open_delay_max_s"] > 5:
                reasons.append(
                    f"a file another node created stayed invisible by name for "
                    f"{p['open_delay_max_s']:.1f} s (negative lookup cache) while listings showed it "
                    f"after {p['list_delay_max_s']:.1f} s: expect releases up to that much later"
                )
    if fam == "nfs":
        if m.options.get("lookupcache", "all") == "all" and "noac" not in m.options:
            reasons.append(
                "NFS lookupcache=all caches 'no such file' answers: lookupcache=positive makes new "
                "beacons visible sooner (optional)"
            )
        if "local_lock" in m.options and m.options.get("local_lock") != "none" or "nolock" in m.options:
            reasons.append("locks are node-local on this mount (local_lock/nolock); fsmingle does not need them")
    if fam == "lustre" and "localflock" in m.options:
        reasons.append("Lustre localflock: flock() is node-local; fsmingle does not need it")
    if fam == "moosefs" and ("mfsnobsdlocks" in m.options or "mfsnoposixlocks" in m.options):
        reasons.append("MooseFS locks are node-local on this mount; fsmingle does not need them")
    shared = fam in _SHARED
    if unsafe:
        verdict = "unsafe"
        reasons.append(
            "use a POSIX shared filesystem (NFS, Lustre, GPFS, CephFS, GlusterFS, MooseFS, BeeGFS) "
            "for --dir; fsmingle run/env refuse this one (exit 10)"
        )
    elif not shared and not (p and p["peers"] > 1):
        verdict = "local"
        reasons.append(
            f"{m.fstype} is a local filesystem: only processes on this machine see {r['dir']}; "
            f"use a shared mount for multi-node jobs (or run `fsmingle check --peers N` on N nodes)"
        )
    else:
        verdict = "ok"
    r["verdict"] = verdict
    r["reasons"] = reasons
    r["cache_seconds"] = cache_s
    r["settings"] = None if unsafe else _settings(cache_s)


# --------------------------------------------------------------------------- several nodes at once


def _write(path: str, data: dict) -> None:
    tmp = os.path.join(os.path.dirname(path), f".tmp-{os.getpid()}-{secrets.token_hex(4)}")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic within one directory: readers see all of it or nothing


def _listed(d: str, prefix: str) -> set[str]:
    try:
        return {n[len(prefix) :] for n in os.listdir(d) if n.startswith(prefix)}
    except FileNotFoundError:
        return set()


def _barrier(d: str, prefix: str, n: int, deadline: float, what: str) -> set[str]:
    # Listings: on every filesystem measured here a new name shows in a directory listing at
    # once, even where lookups by name keep answering ENOENT from a negative cache.
    delay = 0.01
    while True:
        got = _listed(d, prefix)
        if len(got) >= n:
            return got
        if time.monotonic() > deadline:
            raise RendezvousTimeoutError(
                f"fsmingle check: {len(got)} of {n} peers reached the {what} step in {d} "
                f"before --timeout; start `fsmingle check --dir ... --peers {n}` on {n} "
                f"nodes at about the same time",
                present=len(got),
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.1)


def _peer_check(directory: str, n: int, timeout: float, session: str, races: int) -> dict:
    deadline = time.monotonic() + timeout
    base = os.path.join(directory, _CHECK_DIR)
    d = os.path.join(base, session)
    for p in (base, d):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass
    me = f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"
    mine: list[str] = []

    def put(name: str, data: dict) -> None:
        _write(os.path.join(d, name), data)
        mine.append(name)

    try:
        put(f"join-{me}", {"host": socket.gethostname()})
        peers = sorted(_barrier(d, "join-", n, deadline, "join"))
        others = [p for p in peers if p != me]
        # Look the others' marks up BEFORE they exist: this is what a waiting participant does,
        # and it plants the negative lookup cache entries whose lifetime we want to measure.
        for o in others:
            try:
                os.stat(os.path.join(d, f"mark-{o}"))
            except OSError:
                pass
        put(f"ready-{me}", {})
        _barrier(d, "ready-", n, deadline, "ready")
        # By name: poll open() only -- no listing meanwhile, since a listing (readdirp) refreshes
        # some clients' caches (GlusterFS md-cache) and would hide the negative-cache delay.
        t0 = time.monotonic()
        put(f"mark-{me}", {})
        seen_open: dict[str, float] = {}
        while len(seen_open) < len(others):
            now = time.monotonic()
            for o in others:
                if o not in seen_open:
                    try:
                        with open(os.path.join(d, f"mark-{o}"), "rb"):
                            pass
                        seen_open[o] = now - t0
                    except OSError:
                        pass
            if now > deadline:
                raise RendezvousTimeoutError(
                    f"fsmingle check: the files of {sorted(set(others) - set(seen_open))} "
                    f"stayed invisible by name in {d} for {timeout:g} s"
                )
            time.sleep(0.02)
        # In listings: a second file each, after everyone has seen the first ones by name.
        put(f"named-{me}", {})
        _barrier(d, "named-", n, deadline, "named")
        t1 = time.monotonic()
        put(f"lmark-{me}", {})
        seen_list: dict[str, float] = {}
        while len(seen_list) < len(others):
            now = time.monotonic()
            listed = _listed(d, "lmark-")
            for o in others:
                if o in listed and o not in seen_list:
                    seen_list[o] = now - t1
            if now > deadline:
                raise RendezvousTimeoutError(
                    f"fsmingle check: the files of {sorted(set(others) - set(seen_list))} "
                    f"never showed in listings of {d} within {timeout:g} s"
                )
            time.sleep(0.02)
        # Races: everyone goes through the same names as fast as it can; exactly one may win each.
        # One source file per race: its link count alone says whether that race's link() won
        # (link() may report failure after succeeding, nfs(5)), and nothing is unlinked mid-race.
        wins: dict = {"link": [], "excl": []}
        srcs = [os.path.join(d, f".src-{me}-{k}") for k in range(races)]
        for sp in srcs:
            with open(sp, "wb") as f:
                f.write(me.encode())
        try:
            for k in range(races):
                try:
                    os.link(srcs[k], os.path.join(d, f"rl-{k}"))
                    wins["link"].append(k)
                except OSError:
                    try:
                        if os.stat(srcs[k]).st_nlink == 2:
                            wins["link"].append(k)
                    except OSError:
                        pass
                try:
                    os.close(os.open(os.path.join(d, f"rx-{k}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                    wins["excl"].append(k)
                except OSError:
                    pass
        finally:
            for sp in srcs:
                try:
                    os.unlink(sp)
                except OSError:
                    pass
        put(
            f"result-{me}",
            {"wins": wins, "list": max(seen_list.values(), default=0.0), "open": max(seen_open.values(), default=0.0)},
        )
        _barrier(d, "result-", n, deadline, "result")
        results = {}
        for p in peers:
            while p not in results:
                try:
                    with open(os.path.join(d, f"result-{p}")) as f:
                        results[p] = json.load(f)
                except (OSError, ValueError):
                    if time.monotonic() > deadline:
                        raise RendezvousTimeoutError(f"fsmingle check: result of peer {p} unreadable in {d}") from None
                    time.sleep(0.05)
        # Everyone has read every result once all "read" files are listed; then the first peer
        # removes the scratch files (nobody else needs them any more).
        put(f"read-{me}", {})
        if me == peers[0]:
            _barrier(d, "read-", n, deadline, "read")
            for name in os.listdir(d):
                if name.startswith(("join-", "ready-", "mark-", "named-", "lmark-", "result-", "read-", "rl-", "rx-")):
                    try:
                        os.unlink(os.path.join(d, name))
                    except OSError:
                        pass
            for q in (d, base):
                try:
                    os.rmdir(q)
                except OSError:
                    pass
        mine.clear()
    finally:
        if mine:  # only on failure: leave nothing of ours behind (the dirs only if nobody else is in them)
            for name in mine:
                try:
                    os.unlink(os.path.join(d, name))
                except OSError:
                    pass
            for q in (d, base):
                try:
                    os.rmdir(q)
                except OSError:
                    pass
    link_count = {}
    excl_count = {}
    for r in results.values():
        for k in r["wins"]["link"]:
            link_count[k] = link_count.get(k, 0) + 1
        for k in r["wins"]["excl"]:
            excl_count[k] = excl_count.get(k, 0) + 1
    return {
        "peers": n,
        "hosts": sorted(peers),
        "races": races,
        "link_double_wins": sum(1 for c in link_count.values() if c > 1),
        "excl_double_wins": sum(1 for c in excl_count.values() if c > 1),
        "list_delay_max_s": round(max(r["list"] for r in results.values()), 3),
        "open_delay_max_s": round(max(r["open"] for r in results.values()), 3),
    }


# --------------------------------------------------------------------------- the command


def render(r: dict, console=None) -> None:
    """Print a :func:`check` result as tables (rich; plain text when not a terminal)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    m = {k: escape(v) if isinstance(v, str) else v for k, v in r["mount"].items()}  # paths may contain [ ]
    t = Table(title=f"fsmingle check {escape(r['dir'])}", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("filesystem", f"{m['fstype']} ({r['family']})")
    t.add_row("source", m["source"])
    t.add_row("mount point", m["mount_point"])
    t.add_row("options that matter", escape(", ".join(f"{k}={v}" if v else k for k, v in r["options"].items()) or "-"))
    for name, label in (("link", "link() claim"), ("rename", "rename() replace"), ("o_excl", "O_CREAT|O_EXCL")):
        p = r["probes"][name]
        t.add_row(label, ("[green]ok[/] " if p["ok"] else "[red]FAILS[/] ") + escape(p["detail"]))
    o = r["owner"]
    t.add_row(
        "owner / mode",
        f"uid {o['uid']} gid {o['gid']} mode {o['mode']}" + ("" if o["writable"] else " (not writable by you)"),
    )
    for prob in o["problems"]:
        t.add_row("", f"[yellow]{escape(prob)}[/]")
    p = r.get("peers")
    if p:
        t.add_row("peers", escape(f"{p['peers']}: {', '.join(p['hosts'])}"))
        t.add_row("link() races", f"{p['races']} races, {p['link_double_wins']} with several winners")
        t.add_row("O_EXCL races", f"{p['races']} races, {p['excl_double_wins']} with several winners")
        t.add_row(
            "visibility",
            f"listed after {p['list_delay_max_s']:.2f} s, openable by name after {p['open_delay_max_s']:.2f} s",
        )
    colour = {"ok": "green", "local": "yellow", "unsafe": "red"}[r["verdict"]]
    t.add_row("verdict", f"[bold {colour}]{r['verdict']}[/]")
    for why in r["reasons"]:
        t.add_row("", escape(why))
    if r["settings"]:
        s = r["settings"]
        t.add_row("settings", f"--stale-after {s['stale_after']} --poll-max {s['poll_max']}")
    console.print(t)


def main(
    directory: str | None, peers: int = 1, timeout: float = 120.0, session: str = "default", as_json: bool = False
) -> int:
    """``fsmingle check``: examine, print, and return the exit code (0 ok or local, 10 unsafe;
    3 bad option, 5 unusable directory, 7 peers missing -- those print one error line)."""
    import sys

    from .errors import FsmingleError

    try:
        if not directory:
            raise ConfigError("no directory: pass --dir or set FSMINGLE_DIR")
        r = check(directory, peers=peers, timeout=timeout, session=session)
    except FsmingleError as e:
        print(f"fsmingle: error: {e}", file=sys.stderr)
        return e.exit_code
    if as_json:
        print(json.dumps(r, indent=2, sort_keys=True))
    else:
        render(r)
    return UnsupportedFilesystemError.exit_code if r["verdict"] == "unsafe" else 0
