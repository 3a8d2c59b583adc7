"""What ``fsmingle check`` reads from a JuiceFS mount, and what it says about it.

A JuiceFS client (``juicefs mount``, mountinfo type ``fuse.juicefs``, source ``JuiceFS:VOLUME``)
shows none of its cache settings in the mount options: they are command-line options of the
client.  The client publishes them in the virtual file ``.config`` at the root of the mount (JSON;
mode 0400, so root only): durations in nanoseconds, the volume's format (``TrashDays``), the
session's ``Heartbeat``.

Measured on JuiceFS 1.4.2 with Redis (docs/filesystems/juicefs.md):

* attribute/entry caches (``--attr-cache``, ``--entry-cache``, ``--dir-entry-cache``, default 1 s):
  an unlinked name stays stat-able on another client that long, and a file replaced by rename
  serves its old content there that long (ENOENT instead with ``--trash-days 0``);
* ``--negative-entry-cache`` (default 0, off): a name a client looked up before another created it
  stays missing there by name that long (listings show it at once);
* ``--open-cache`` (default 0, off): a file opened again within that time is served from the
  attributes and chunk list cached at its last open, without asking the metadata engine;
* ``--heartbeat`` (default 12 s): a client that dies keeps its session, and every lock it held,
  until the session expires (about 5 heartbeats: 69.6 s measured) and another client's
  background job cleans it (never when every client runs ``--no-bgjob``).
"""

from __future__ import annotations

import json
import os

_NS = 1e9


def juicefs_config(mount_point: str) -> dict | None:
    """The settings of the JuiceFS client mounted at ``mount_point``, from its ``.config``.

    Returns:
        dict | None: ``{"version", "volume", "attr_cache", "entry_cache", "dir_entry_cache",
        "negative_entry_cache", "open_cache", "heartbeat", "no_bgjob", "trash_days", "read_only"}``
        (durations in seconds); None when ``.config`` cannot be read (not root: it is mode 0400;
        or not a JuiceFS mount).  Never raises.
    """
    try:
        with open(os.path.join(mount_point, ".config")) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(c, dict):
        return None
    meta, fmt = c.get("Meta") or {}, c.get("Format") or {}

    def sec(v) -> float | None:
        return round(v / _NS, 3) if isinstance(v, (int, float)) else None

    return {
        "version": c.get("Version"),
        "volume": fmt.get("Name"),
        "attr_cache": sec(c.get("AttrTimeout")),
        "entry_cache": sec(c.get("EntryTimeout")),
        "dir_entry_cache": sec(c.get("DirEntryTimeout")),
        "negative_entry_cache": sec(c.get("NegEntryTimeout")),
        "open_cache": sec(meta.get("OpenCache")),
        "heartbeat": sec(meta.get("Heartbeat")),
        "no_bgjob": bool(meta.get("NoBGJob")),
        "trash_days": fmt.get("TrashDays"),
        "read_only": bool(meta.get("ReadOnly")),
    }


def juicefs_options(cfg: dict | None) -> dict:
    """The settings of :func:`juicefs_config` that matter to fsmingle, by their ``juicefs mount``
    option names (values as strings, seconds), for ``fsmingle check``'s "options that matter"."""
    if not cfg:
        return {}
    names = {
        "attr_cache": "attr-cache",
        "entry_cache": "entry-cache",
        "dir_entry_cache": "dir-entry-cache",
        "negative_entry_cache": "negative-entry-cache",
        "open_cache": "open-cache",
        "heartbeat": "heartbeat",
    }
    out = {flag: f"{cfg[k]:g}" for k, flag in names.items() if cfg.get(k) is not None}
    if cfg.get("no_bgjob"):
        out["no-bgjob"] = ""
    return out


def juicefs_cache_seconds(cfg: dict | None) -> float:
    """The longest name or attribute cache of a client, in seconds: JuiceFS's defaults (1 s) when
    its settings could not be read."""
    if not cfg:
        return 1.0
    keys = ("attr_cache", "entry_cache", "dir_entry_cache", "negative_entry_cache")
    return max(cfg[k] or 0.0 for k in keys)


def juicefs_notes(cfg: dict | None, mount_point: str) -> list[str]:
    """What a fsmingle user should know about this JuiceFS client's settings, with the setting to
    change where one matters (one sentence each).  ``cfg``: :func:`juicefs_config`'s result."""
    if cfg is None:
        return [
            f"JuiceFS: its cache settings are in the client's command line and in {mount_point}/.config "
            f"(readable by root only); fsmingle assumed JuiceFS's defaults (1 s attribute and entry caches, "
            f"no negative-entry cache, no open cache)"
        ]
    notes = []
    a, e, d = cfg["attr_cache"] or 0.0, cfg["entry_cache"] or 0.0, cfg["dir_entry_cache"] or 0.0
    notes.append(
        f"JuiceFS {cfg['version'] or ''} caches attributes {a:g} s, entries {e:g} s, directory entries {d:g} s: "
        f"a beacon replaced on another node is seen here up to {max(a, e):g} s late (its old content, or "
        f"ENOENT with --trash-days 0); fsmingle's settings below allow for it"
        + (" (--attr-cache/--entry-cache 1, the defaults, keep it short)" if max(a, e, d) > 1 else "")
    )
    neg = cfg["negative_entry_cache"] or 0.0
    if neg > 0:
        notes.append(
            f"--negative-entry-cache {neg:g}: a name looked up here before another node created it stays "
            f"missing by name for {neg:g} s (listings show it at once; fsmingle retries from them), so "
            f"releases and joins can come that much later. Fix: mount with --negative-entry-cache 0 (the default)"
        )
    oc = cfg["open_cache"] or 0.0
    if oc > 0:
        notes.append(
            f"--open-cache {oc:g}: a file opened again within {oc:g} s is served from what was cached at its "
            f"last open; fsmingle replaces its files by rename (a new file each time), which this cache does "
            f"not cover, but other data written in place reads stale. Use --open-cache 0 (the default) for "
            f"the rendezvous directory's volume"
        )
    hb = cfg["heartbeat"]
    if hb:
        notes.append(
            f"--heartbeat {hb:g}: a client that dies keeps its session and its locks for about {5 * hb:g} s "
            f"(5 heartbeats) until another client cleans it"
            + (
                " -- never here: this client runs --no-bgjob; keep background jobs on at least one client"
                if cfg["no_bgjob"]
                else ""
            )
            + "; fsmingle takes no locks and judges a dead node by its beacon (--stale-after), not by this"
        )
    if cfg["read_only"]:
        notes.append("this JuiceFS client is mounted read-only: fsmingle cannot create its files here")
    return notes
