"""``fsmingle check --peers N``: N nodes prove cross-node exclusivity and measure visibility delays.

The nodes rendezvous through a scratch directory ``DIR/.fsmingle-check/SESSION`` (barriers by
directory listing), then measure how long a file one node creates stays invisible by name on
another (the negative lookup cache) and in listings, and race link() and O_CREAT|O_EXCL on the
same names: exactly one winner per race is what a claim needs.  Everything written is removed
afterwards, also on failure.

Sources: link(2) (link() may report failure after succeeding over NFS, nfs(5)), rename(2), and
the GlusterFS md-cache behaviour measured in ``docs/filesystems/glusterfs.md``.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import time

from ...errors import RendezvousTimeoutError
from ..lookup import link_count as server_link_count
from .probes import _remove

_CHECK_DIR = ".fsmingle-check"


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


def _tidy(d: str, base: str, names: list[str], settle: float = 0.0) -> None:
    """Remove scratch files ``names`` from ``d``, then ``d`` and ``base`` if they are empty (a
    directory another peer still uses stays: rmdir refuses a non-empty one).  ``settle``: seconds
    the last peer to tidy keeps retrying an rmdir refused as not empty."""
    _remove(*(os.path.join(d, name) for name in names))
    for q in (d, base):
        for _ in range(1 + round(settle / 0.2)):
            try:
                os.rmdir(q)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                # ENOTEMPTY: another peer's files, or on GlusterFS a replica still catching up
                # with an unlink (seen once: the scratch directory was left in a stop-19 test run).
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ESTALE, errno.EBUSY):
                    break
                time.sleep(0.2)


def _until_seen(others: list[str], probe, t0: float, deadline: float, failure: str) -> dict[str, float]:
    """Every 20 ms, ask ``probe(pending)`` which of the peers not seen yet are visible now (one
    round of filesystem calls each time), until all are; returns seconds after ``t0`` for each.

    Raises:
        RendezvousTimeoutError: past ``deadline`` (monotonic) with some still unseen; the message
            names them, then ``failure``.
    """
    seen_at: dict[str, float] = {}
    while len(seen_at) < len(others):
        now = time.monotonic()
        for o in probe([o for o in others if o not in seen_at]):
            seen_at[o] = now - t0
        if now > deadline:
            raise RendezvousTimeoutError(f"fsmingle check: the files of {sorted(set(others) - set(seen_at))} {failure}")
        time.sleep(0.02)
    return seen_at


def _peer_check(directory: str, n: int, timeout: float, session: str, races: int) -> dict:
    deadline = time.monotonic() + timeout
    base = os.path.join(directory, _CHECK_DIR)
    d = os.path.join(base, session)
    for p in (base, d):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            # Another peer made it first; a create-race loser may not find it by name on
            # GlusterFS nl-cache without a listing (store.stat_existing; imported here because
            # store imports fscheck).
            from ..store import stat_existing

            try:
                stat_existing(p)
            except FileNotFoundError:
                pass  # the barrier below reports a peer that never shows
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

        def by_name(pending: list[str]) -> set[str]:
            found = set()
            for o in pending:
                try:
                    with open(os.path.join(d, f"mark-{o}"), "rb"):
                        found.add(o)
                except OSError:
                    pass
            return found

        seen_open = _until_seen(others, by_name, t0, deadline, f"stayed invisible by name in {d} for {timeout:g} s")
        # In listings: a second file each, after everyone has seen the first ones by name.
        put(f"named-{me}", {})
        _barrier(d, "named-", n, deadline, "named")
        t1 = time.monotonic()
        put(f"lmark-{me}", {})

        def in_listing(pending: list[str]) -> set[str]:
            return set(pending) & _listed(d, "lmark-")  # one listing per round

        seen_list = _until_seen(
            others, in_listing, t1, deadline, f"never showed in listings of {d} within {timeout:g} s"
        )
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
                    if server_link_count(srcs[k]) == 2:  # a lost reply's retransmitted LINK: read past the cache
                        wins["link"].append(k)
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
            scratch = ("join-", "ready-", "mark-", "named-", "lmark-", "result-", "read-", "rl-", "rx-")
            _tidy(d, base, [name for name in os.listdir(d) if name.startswith(scratch)], settle=2.0)
        mine.clear()
    finally:
        if mine:  # only on failure: leave nothing of ours behind (the dirs only if nobody else is in them)
            _tidy(d, base, mine)
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
