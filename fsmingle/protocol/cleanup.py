"""Removing what is stale in job directories: old decided generations, abandoned ones.

Cleaning is a courtesy, never needed for correctness (a decided generation is
never joined again).  Only one process cleans a job directory at a time: it
holds a ``filelock.SoftFileLease`` on ``<job>/.clean.lock`` -- an
exclusive-create marker whose expiry is judged by the heartbeat rule (no refresh
seen for ``lease_duration`` seconds of the contender's monotonic clock), so a
cleaner that crashed does not block cleaning forever, and a lock that a mount
silently made node-local cannot exist (it is not flock).  Even if two cleaners
overlapped, each step is an atomic ``rename`` of a whole generation, so readers
only ever see a generation or its absence.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from enum import StrEnum

import filelock

from ..errors import RecordError
from ..fs.layout import CLAIM_RE, GEN_RE, gen_name, release_name
from ..fs.records import Beacon, Release, decode
from ..fs.store import PosixStore, Store
from ..net.hostinfo import local_process_alive, this_process

log = logging.getLogger("fsmingle.clean")

LOCK_NAME = ".clean.lock"


class GenerationState(StrEnum):
    """Where a generation stands for ``clean`` and ``status`` (a ``str``: the words they print)."""

    RELEASED = "released"
    RESTART = "restart"  # voided
    WAITING = "waiting"  # live participants, or liveness unknown
    STALE = "stale"  # nobody alive
    EMPTY = "empty"  # no beacon, no claim


@dataclass(frozen=True)
class GenerationInfo:
    """What ``clean`` and ``status`` know of one generation.

    Attributes:
        generation (int): its number.
        state (GenerationState): its decision, or whether anyone is alive there.
        release (Release | None): its decision, if any.
        beacons (list[Beacon]): readable beacons.
        alive (dict[str, bool | None]): instance -> liveness verdict.
        claims (list[int]): claimed ranks.
    """

    generation: int
    state: GenerationState
    release: Release | None
    beacons: list
    alive: dict
    claims: list


def generations(store: Store) -> list[int]:
    """Generation numbers present in a job directory, ascending."""
    return sorted(int(m.group(1)) for m in map(GEN_RE.match, store.listdir("")) if m)


def inspect(store: Store, g: int, stale_after: float = 0.0, clock=time, warnings=None) -> GenerationInfo:
    """Read one generation and judge its participants.

    Liveness of a participant in our pid space is checked directly (psutil);
    of a remote one by watching its heartbeat counter for ``stale_after``
    seconds of our monotonic clock (0: no watching; remote ones are then
    ``None`` = unknown).  Unreadable beacons and release records are skipped;
    with ``warnings`` (a :class:`fsmingle.cli.progress.WarnOnce`) each such file is
    warned about once, repeats only counted.
    """
    me = this_process()
    rel = None
    data = store.read(release_name(g))
    if data is not None:
        try:
            rel = decode(data, Release)
        except RecordError as e:
            rel = None
            if warnings is not None:
                name = f"{store.path(release_name(g)) if hasattr(store, 'path') else release_name(g)}"
                warnings.warn(name, "ignoring %s: %s", name, e)
    names = store.listdir(gen_name(g))
    claims = sorted(int(m.group(1)) for m in map(CLAIM_RE.match, names) if m)

    def read_beacons():
        out = {}
        for n in names:
            if n.startswith("beacon-") and n.endswith(".json"):
                d = store.read(f"{gen_name(g)}/{n}")
                if d is not None:
                    try:
                        b = decode(d, Beacon)
                        out[b.instance] = b
                    except RecordError as e:
                        if warnings is not None:
                            path = f"{gen_name(g)}/{n}"
                            warnings.warn(path, "ignoring %s: %s", path, e)
        return out

    beacons = read_beacons()
    alive: dict[str, bool | None] = {i: local_process_alive(me, b.host) for i, b in beacons.items()}
    unknown = [i for i, v in alive.items() if v is None]
    if unknown and stale_after > 0 and (rel is None):
        start = clock.monotonic()
        first = {i: beacons[i].heartbeat for i in unknown}
        while unknown and clock.monotonic() - start < stale_after:
            clock.sleep(min(1.0, stale_after / 4))
            now_b = read_beacons()
            for i in list(unknown):
                if i in now_b and now_b[i].heartbeat != first[i]:
                    alive[i] = True
                    unknown.remove(i)
        for i in unknown:
            alive[i] = False
    if rel is not None:
        state = GenerationState.RELEASED if rel.released else GenerationState.RESTART
    elif not beacons and not claims:
        state = GenerationState.EMPTY
    elif any(v for v in alive.values()):
        state = GenerationState.WAITING
    elif all(v is False for v in alive.values()):
        state = GenerationState.STALE
    else:
        state = GenerationState.WAITING  # unknown liveness: assume someone may be there
    return GenerationInfo(g, state, rel, list(beacons.values()), alive, claims)


def _made_ahead(store: Store, gens: list[int]) -> bool:
    """True if the newest generation follows a decided one: made ahead by its decider
    (``Participant.prepare_next``), where the next run will meet."""
    return len(gens) > 1 and gens[-2] == gens[-1] - 1 and inspect(store, gens[-2]).release is not None


def clean_job(
    store: Store, *, keep_decided: int = 1, stale_after: float = 0.0, dry_run: bool = False, below: int | None = None
) -> list[tuple[int, str]]:
    """Retire stale generations of one job directory.

    Removes decided generations (released or voided) except the newest
    ``keep_decided`` of them -- a participant slow to read its release still
    finds it -- and undecided generations whose participants are all dead.  A
    generation with any live or undecidable participant is never touched.

    Args:
        store (Store): the job directory.
        keep_decided (int): newest decided generations kept.
        stale_after (float): seconds to watch remote heartbeats (0: remote
            participants count as possibly alive, so their generation stays).
        dry_run (bool): report, remove nothing.
        below (int | None): only consider generations below this number.

    Returns:
        list[tuple[int, str]]: (generation, why) for each one retired (or that
        would be, with ``dry_run``).
    """
    gens = [g for g in generations(store) if below is None or g < below]
    decided = []
    out = []
    for g in reversed(gens):
        info = inspect(store, g, stale_after=0.0)
        if info.release is not None:
            decided.append(g)
            if len(decided) > keep_decided:
                out.append((g, f"{info.state} generation"))
        elif info.state is GenerationState.EMPTY and g == gens[-1] and below is None and _made_ahead(store, gens):
            continue  # the next generation, made ahead by whoever decided the last one: not stale
        elif info.state in (GenerationState.STALE, GenerationState.EMPTY) or (
            stale_after > 0 and inspect(store, g, stale_after).state is GenerationState.STALE
        ):
            out.append((g, "no live participants"))
    if not dry_run:
        for g, why in out:
            # Reported once, by the caller (``fsmingle clean`` prints each removal on stdout).
            if store.retire(gen_name(g)):
                log.debug("retired generation %d (%s)", g, why)
    return out


# Generations one cleaner call retires at most: a crash loop adds one generation per restart and
# each generation's rank 0 cleans once, so a job directory holds a bounded number (g - 1, g and
# the next one made ahead) after any number of restarts, and no call is long.
CLEAN_PER_CALL = 4


def retire_decided_below(store: Store, g: int, limit: int = CLEAN_PER_CALL) -> list[int]:
    """Retire up to ``limit`` decided generations below ``g - 1``, oldest first; no lock.

    ``g`` (the caller's, being joined) and ``g - 1`` (the previous one: a participant slow to
    read its release still finds it) are never touched, nor is any undecided generation
    (``fsmingle clean`` judges those by their participants' liveness), nor the newest one
    released among those looked at: its world may still run with a member that has not read
    that release yet (stopped in its commit window: SIGSTOP, swap), while late participants
    (a restarted node, a re-run) void the generations above it at their ``--timeout``; retired,
    that member would find no decision and rejoin although the release names it (found by
    ``tests/adversary_retired_enum.py``).  A newer release supersedes it: retired at a later
    call.  At most ``2 * limit`` decision lookups per call.

    Returns:
        list[int]: the generations retired.
    """
    if g <= 2:
        return []
    old = [x for x in generations(store) if x < g - 1][: 2 * limit]
    decisions = [(x, store.read(release_name(x))) for x in old]
    released = [x for x, data in decisions if data is not None and _released(data)]
    keep = max(released, default=None)
    out: list[int] = []
    for x, data in decisions:
        if len(out) >= limit:
            break
        if data is not None and x != keep and store.retire(gen_name(x)):
            out.append(x)
    return out


def _released(data: bytes) -> bool:
    """True if a decision record says released -- or cannot be read (kept: it may be one)."""
    try:
        return decode(data, Release).released
    except RecordError:
        return True


def locked_cleaner(store: PosixStore, lease_duration: float = 30.0):
    """A ``cleaner(g)`` callback for :class:`fsmingle.protocol.participant.Participant`.

    Rank 0 of generation ``g`` calls it once (``Coordinator``, not in the commit path): it
    retires up to ``CLEAN_PER_CALL`` decided generations below ``g - 1``
    (:func:`retire_decided_below`) under a non-blocking ``SoftFileLease``; if another process
    holds the lease it simply skips.
    """

    def cleaner(g: int) -> None:
        if g <= 2:
            return
        lease = filelock.SoftFileLease(os.path.join(store.root, LOCK_NAME), lease_duration=lease_duration)
        try:
            lease.acquire(timeout=0)
        except filelock.Timeout:
            return
        try:
            gone = retire_decided_below(store, g)
            if gone:
                log.debug("retired decided generation(s) %s", gone)
        finally:
            lease.release()

    return cleaner
