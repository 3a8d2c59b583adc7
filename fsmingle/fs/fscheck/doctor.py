"""``fsmingle check``'s examination of a directory: :func:`check` and its verdict.

Mount and family (:mod:`.mounts`, :mod:`.families`), the three probes (:mod:`.probes`), owner
and permissions, optionally several nodes at once (:mod:`.peers`), then a verdict (``ok``,
``local``, ``unsafe``) with its reasons and the ``--stale-after``/``--poll-max`` to use on this
mount.  Printing the result is :mod:`.report`'s job.

Sources: nfs(5) (lookupcache, local_lock), Lustre's mount options (localflock), mfsmount(8),
``juicefs mount --help`` (its caches, read from the mount's ``.config``: :mod:`.juicefs`),
fsmingle.protocol.participant.Timing (how ``--stale-after`` relates to heartbeats).
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict

from ...errors import ConfigError, StorageError
from ..mounts import MountInfo, find_mount
from .families import _RELEVANT_OPTIONS, _SHARED, _cache_seconds, family, gluster_caches, gluster_nl_cache_warning
from .juicefs import juicefs_cache_seconds, juicefs_config, juicefs_notes, juicefs_options
from .peers import _peer_check
from .probes import LinkProbe, _probe_excl, _probe_rename, probe_link


def _settings(cache_s: float | None) -> dict:
    """--stale-after and --poll-max for a mount whose caches hold for ``cache_s`` seconds.

    stale_after must exceed the time a replaced beacon's new content can stay hidden (the
    attribute cache) several times over (fsmingle.protocol.participant.Timing): max(30, 3 x cache + 10).
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
    if fam == "juicefs":  # client options, not mount options: from the mount's .config
        opts.update(juicefs_options(juicefs_config(m.mount_point)))
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


def _ceph_notes(m: MountInfo) -> list[str]:
    """What fsmingle users should know about a CephFS mount (mount.ceph(8), ceph-fuse(8); measured
    in docs/filesystems/cephfs.md)."""
    notes = [
        "CephFS keeps clients coherent through MDS capabilities, not timeouts: names and replaced "
        "beacons show on other nodes at once; a node cut off from the cluster keeps its capabilities "
        "until the MDS times its session out (`ceph fs get FS`: session_timeout, default 60 s), and "
        "other nodes' reads of its files wait meanwhile"
    ]
    if m.fstype.lower().startswith("fuse"):
        notes.append(
            "ceph-fuse: its cache settings (client_cache_size, client_oc, fuse_*) are in ceph.conf's "
            "[client] section, not in the mount options; the defaults suit fsmingle"
        )
    if "nowsync" in m.options:
        notes.append(
            "nowsync: creates and unlinks may return before the MDS confirmed them; fsmingle's claims "
            "(link) and generations (mkdir) stay synchronous"
        )
    if m.options.get("recover_session") == "clean":
        notes.append(
            "recover_session=clean: a node the MDS blocklisted reconnects by itself, dropping its dirty "
            "data; fsmingle's participant on it has already failed or will be judged dead"
        )
    return notes


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
    if fam == "cephfs":
        reasons += _ceph_notes(m)
    if fam == "juicefs":
        # its caches are client options, not mount options: read from the client's .config
        jc = juicefs_config(m.mount_point)
        r["juicefs"] = jc
        cache_s = max(cache_s or 0.0, juicefs_cache_seconds(jc))
        reasons += juicefs_notes(jc, m.mount_point)
    if fam == "glusterfs":
        gc = gluster_caches(m.mount_point)
        r["gluster"] = gc
        if gc and not gc["upcalls"]:
            # without upcalls md-cache and nl-cache answer from their caches until they expire
            cache_s = max(cache_s or 0.0, gc["md_cache_timeout"] or 0.0, gc["nl_cache_timeout"] or 0.0)
        warn = gluster_nl_cache_warning(m.mount_point)
        if warn:
            reasons.append(warn)
    shared = fam in _SHARED
    if unsafe:
        verdict = "unsafe"
        reasons.append(
            "use a POSIX shared filesystem (NFS, Lustre, GPFS, CephFS, GlusterFS, MooseFS, JuiceFS, BeeGFS) "
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
