"""What a run created, on disk under ``REGISTRY_DIR``, so a run killed with SIGKILL is swept by the
next one; the teardown of everything a run recorded."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time

from .plumbing import (
    KEEP_ENV,
    REGISTRY_DIR,
    _fuse_abort,
    _kill_all,
    _kill_netns,
    _mounts_under,
    _pids_with_arg,
    _proc_start_time,
    _proc_state,
    _sh,
    _unmount,
)


def _register(prefix: str, state: dict) -> None:
    REGISTRY_DIR.mkdir(mode=0o700, exist_ok=True)
    tmp = REGISTRY_DIR / f".{prefix}.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, REGISTRY_DIR / f"{prefix}.json")


def _unregister(prefix: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (REGISTRY_DIR / f"{prefix}.json").unlink()


def _cleanup_state(state: dict) -> None:
    """Undo everything a (possibly dead) run recorded.  Only names it created."""
    for mp in state.get("fuse_mounts", []):  # real filesystems: a hung client must not hang teardown
        _fuse_abort(mp)
    for ns in state.get("netns", []):
        if os.path.exists(f"/run/netns/{ns}"):
            _kill_netns(ns)
    _stop_servers(state)
    for pid in state.get("pids", []):  # root-namespace daemons (munged, bindfs)
        start = state.get("pid_start", {}).get(str(pid))
        if start and _proc_start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for mp in state.get("mounts", []):
        if _mounts_under(mp):
            _unmount(mp)
    for mp in state.get("tmpfs", []):  # MooseFS chunk store, after its chunkserver stopped
        if _mounts_under(mp):
            _sh(["umount", "-l", mp], check=False)
    for ns in state.get("netns", []):
        if os.path.exists(f"/run/netns/{ns}"):
            _sh(["ip", "netns", "del", ns], check=False)
    for link in state.get("links", []):
        if os.path.exists(f"/sys/class/net/{link}"):
            _sh(["ip", "link", "del", link], check=False)
    wd = state.get("workdir")
    if wd and os.path.isdir(wd) and not _mounts_under(wd) and os.environ.get(KEEP_ENV) != "1":
        shutil.rmtree(wd, ignore_errors=True)


def sweep_stale() -> list[str]:
    """Clean up clusters whose owning process is gone (e.g. pytest was SIGKILLed).
    Returns the prefixes swept.  Called automatically by ``Cluster.start``."""
    swept = []
    if not REGISTRY_DIR.is_dir():
        return swept
    for f in REGISTRY_DIR.glob("*.json"):
        try:
            state = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        owner, start = state.get("owner"), state.get("owner_start")
        if owner and _proc_start_time(owner) == start:
            continue  # still alive
        _cleanup_state(state)
        _unregister(f.stem)
        swept.append(f.stem)
    return swept


def _stop_servers(state: dict) -> None:
    """Stop what a run recorded: its Gluster volume (and glusterd if it started it and no volume
    is left), its daemons (``pids``; by start time, never a recycled pid).  Idempotent."""
    vol = state.pop("gluster_volume", None)
    if vol:
        _sh(["gluster", "--mode=script", "volume", "stop", vol, "force"], check=False, timeout=60)
        _sh(["gluster", "--mode=script", "volume", "delete", vol], check=False, timeout=60)
    own = state.get("glusterd_own")
    if own and _proc_start_time(own[0]) == own[1]:
        p = _sh(["gluster", "volume", "list"], check=False)
        if "No volumes" in p.stdout + p.stderr:  # printed on stderr
            with contextlib.suppress(ProcessLookupError):
                os.kill(own[0], signal.SIGTERM)
            deadline = time.monotonic() + 10  # the next run must not find it dying
            while _proc_state(own[0]) not in (None, "Z") and time.monotonic() < deadline:
                time.sleep(0.1)
            state.pop("glusterd_own", None)
    conf = state.pop("ceph_conf", None)
    if conf:
        # CephFS: osd and mds ignore SIGTERM for seconds once the monitor is gone, and memstore
        # holds nothing worth saving: SIGKILL every daemon and client naming this cluster's conf.
        _kill_all(lambda: _pids_with_arg(conf))
    for pid in state.get("pids", []):
        start = state.get("pid_start", {}).get(str(pid))
        if start and _proc_start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for pid in state.get("pids", []):
        start = state.get("pid_start", {}).get(str(pid))
        while start and _proc_start_time(pid) == start and _proc_state(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
