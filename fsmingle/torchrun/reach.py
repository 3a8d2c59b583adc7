"""A round's members must reach its store: confirm over it, or sit the round out.

fsmingle's keep-alive is a heartbeat file in the shared directory
(:mod:`fsmingle.torchrun.heartbeat`).  A node whose *network* is cut but whose
filesystem works keeps that file fresh, so torch's rule
(``_BackendRendezvousStateHolder._sanitize``: dead = no keep-alive for
``keep_alive_interval * keep_alive_max_attempt``) admits it to the next round.
Unchecked, that round is lost: rank 0's agent waits for every agent's
``torchelastic/role_info/<rank>`` (``SimpleElasticAgent._assign_worker_ranks``,
``store.multi_get`` in ``torch/distributed/elastic/agent/server/api.py``) for
the store's timeout (``read_timeout``, 60 s), raises, and torchrun's
``launch_agent`` calls ``rdzv_handler.shutdown()`` on the way out
(``torch/distributed/launcher/api.py``), which closes the run for every agent.

So after a round completes, and before torch's agent uses its store, every
member proves it reaches the round's store within the same bound torch gives a
keep-alive (``keep_alive_interval * keep_alive_max_attempt``, 15 s by default):

* each member sets ``fsmingle/confirm/<rank>``; rank 0 waits for all of them,
  then sets ``fsmingle/verdict``: ``ok`` (everyone reached it) or ``redo``
  (some did not: the members leave the round and join the next one);
* a member that cannot connect to the store within the bound, or gets no
  verdict within twice the bound, and rank 0 when some member did not confirm,
  ask whether *they* are the one cut off: a TCP connect to a random sample of
  at most :data:`PROBE_SAMPLE` other members of the state (participants,
  waiting, spares) on the round's store port, all at once, 2 s each, the whole
  decision bounded by 2.5 s whatever the round's size (:func:`reaches_any`); an
  answer, even a refusal (RST), means "reachable" (nodes must reach each other
  on these ports anyway, for NCCL and gloo).  A node that reaches nobody leaves
  the round (the state is on the filesystem, which it still reaches) and *sits
  out*: it joins again only once some member answers.  One that reaches
  someone joins the next round at once.

With two members and no spare, each side of a cut reaches nobody: both sit out
until the link is back (nothing can tell the cut side from the other).
A node that sat out joins again as a new member, as any late node does (a
spare when the job is full: torch's redundancy list).  The cost when nothing is
cut: one ``set`` per member and one ``wait`` on rank 0 per round.
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
import socket
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from .backend import sleep_jitter

log = logging.getLogger("fsmingle.torchrun")

CONFIRM = "fsmingle/confirm/"
VERDICT = "fsmingle/verdict"

# How many members one reachability decision probes (reaches_any).  One answer is enough to prove
# this node's network works, and a cut node gets none whatever it probes, so a sample decides as
# well as every member: a node that is not cut errs only when every sampled member is unreachable
# itself (dead hosts; a stopped process's kernel still answers), probability f**16 when a fraction
# f of the members is down (f = 1/2: 1.5e-5), and the error does not stick: sit_out draws a fresh
# sample at every poll.  Probing all of 1,024 members, 32 at a time, took 64 s of 2 s timeouts.
PROBE_SAMPLE = 16


class RoundUnreachableError(RendezvousConnectionError):
    """This agent could not connect to its round's store (rank 0's TCPStore) within the bound.

    Raised by the handler's ``_get_store``; the handler catches it, leaves the
    round and sits out (:func:`sit_out`).  A ``RendezvousConnectionError``, so
    any other caller sees torch's error for an unreachable store.
    """


def confirm_round(store: Any, rank: int, world_size: int, bound_s: float) -> str:
    """Prove over the round's store that every member reaches it.

    Args:
        store (torch.distributed.Store): the round's store (prefixed per lineage and round).
        rank (int): this agent's rank in the round.
        world_size (int): the round's number of agents.
        bound_s (float): seconds rank 0 waits for the confirmations (a member's
            keep-alive bound); others wait twice that for the verdict.

    Returns:
        str: ``"ok"``, ``"redo"`` (a member did not confirm) or ``"lost"``
        (not rank 0: no verdict, rank 0 unreachable).  Never raises for a store error: an
        error is a missing confirmation or verdict.
    """
    if world_size <= 1:
        return "ok"
    bound = timedelta(seconds=bound_s)
    try:
        store.set(f"{CONFIRM}{rank}", b"1")
        if rank != 0:
            store.wait([VERDICT], 2 * bound)
            return store.get(VERDICT).decode()
    except RuntimeError as e:  # DistStoreError (timeout), DistNetworkError: torch's store errors
        log.warning("no verdict from rank 0's store of this round: %s", e)
        return "lost"
    keys = [f"{CONFIRM}{r}" for r in range(world_size)]
    verdict = "ok"
    try:
        store.wait(keys, bound)
    except RuntimeError:
        missing = [r for r in range(1, world_size) if not store.check([keys[r]])]
        verdict = "redo"
        log.warning(
            "rank(s) %s did not reach this round's store within %.0f s: starting a round without them",
            ", ".join(map(str, missing)),
            bound_s,
        )
    try:
        store.set(VERDICT, verdict.encode())
    except RuntimeError as e:
        log.warning("cannot set this round's verdict: %s", e)
    return verdict


def reachable(addr: str, port: int, timeout_s: float = 2.0) -> bool:
    """True if a TCP connect to ``addr:port`` is answered within ``timeout_s`` seconds.

    A refusal (RST) is an answer: the host is reachable, nothing listens (a
    round's store is closed once its round is over).  A timeout or an
    unreachable host/network is not.
    """
    try:
        socket.create_connection((addr, port), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return True


def reaches_any(
    targets: Iterable[tuple[str, int]], timeout_s: float = 2.0, sample: int = PROBE_SAMPLE, grace_s: float = 0.5
) -> bool:
    """True if one of a random sample of ``targets`` (address, port) answers (:func:`reachable`).

    Args:
        targets: the members to ask, (address, port) each; any number.
        timeout_s (float): seconds each TCP connect may take.
        sample (int): at most this many targets are probed, all at once
            (:data:`PROBE_SAMPLE`: why a sample decides as well as every member).
        grace_s (float): seconds past ``timeout_s`` the decision waits for the
            probes (thread start-up under load).

    Returns:
        bool: True as soon as one probe answers; False when none did within
        ``timeout_s + grace_s`` seconds, whatever the number of targets (probes
        still running are left to end on their own timeout; none not yet
        started is run).  False for no targets.  Never raises.
    """
    targets = list(targets)
    if not targets:
        return False
    picked = random.sample(targets, min(sample, len(targets)))
    deadline = time.monotonic() + timeout_s + grace_s
    ex = concurrent.futures.ThreadPoolExecutor(max_workers=len(picked), thread_name_prefix="fsmingle-probe")
    try:
        # reachable is looked up at each call (not bound here): tests replace it.
        futures = [ex.submit(lambda t: reachable(t[0], t[1], timeout_s), t) for t in picked]
        for f in concurrent.futures.as_completed(futures, timeout=max(0.0, deadline - time.monotonic())):
            if f.exception() is None and f.result():
                return True
        return False
    except concurrent.futures.TimeoutError:
        return False
    finally:
        # Not `with`: its exit waits for every probe, the decision would last as long as the slowest.
        ex.shutdown(wait=False, cancel_futures=True)


def sit_out(
    targets: Iterable[tuple[str, int]],
    given_up: Callable[[], bool],
    why: str,
    poll_s: float = 1.0,
) -> float:
    """Wait until one of ``targets`` (address, port) answers, or ``given_up()`` is True.

    Args:
        targets: the other members' hosts and the round's store port.
        given_up: polled each try; True ends the wait (the run closed).
        why (str): logged once.
        poll_s (float): seconds between tries (jittered).

    Returns:
        float: seconds spent sitting out.
    """
    targets = list(targets)
    t0 = time.monotonic()
    shown = ", ".join(f"{a}:{p}" for a, p in targets[:4]) + (
        f" (or one of {len(targets) - 4} more)" if len(targets) > 4 else ""
    )
    log.warning("%s: sitting this round out until %s answers again", why, shown)
    while not given_up():
        if reaches_any(targets):
            break
        sleep_jitter(poll_s)
    took = time.monotonic() - t0
    log.warning("sat out %.1f s; joining the rendezvous again", took)
    return took
