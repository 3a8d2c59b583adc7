"""Peer jobs waiting in the scheduler's queue, for the torchrun backend (issue 24).

``fsmingle run`` holds its ``--timeout`` while peer jobs are PENDING (:mod:`fsmingle.protocol.queue`).
Here the same :class:`~fsmingle.protocol.queue.QueueWatch` holds torch's ``join_timeout``:

* **The hook.** torch's ``DynamicRendezvousHandler.next_rendezvous`` computes one deadline
  (``_get_deadline(timeout.join)``) and hands it to ``self._op_executor.run(join_op, deadline,
  ...)``; the executor passes it to every call of ``_RendezvousJoinOp(ctx, deadline)``, which is
  where it is compared with ``time.monotonic()`` (and where the 5 s rollback is measured from).
  :class:`HoldingExecutor` wraps ``_op_executor`` and the join operation in it, so the operation
  sees ``deadline + held``: the seconds so far during which pending peer jobs accounted for every
  missing node.  torch's own logic (rollback, ``RendezvousTimeoutError``) is unchanged.
* **Only while fewer than MIN nodes joined** a round that is not complete.  From MIN on torch's
  last-call logic rules (``last_call_timeout``) and the queue holds nothing, and a node waiting
  for the next round (wait list, redundancy list) is not held either.
* **One agent asks.**  The smallest participant of the state (the heartbeat scanner's rule) calls
  :meth:`QueueWatch.poll` (one ``squeue`` call for all peers, at most every ``queue_poll``
  seconds, in a thread) and writes its findings to ``queue.json`` in the run directory when they
  change; the other agents read that one file at most every ``min(queue_poll, 5)`` seconds.
  Findings of a writer that is no longer a participant, of another lineage or round, are ignored.
* **An ended peer job** (CANCELLED, FAILED, ...), when the peer jobs that have not ended can no
  longer bring ``MIN`` nodes (``SLURM_NNODES`` agents per job: a spare job, or enough peers for an
  elastic ``MIN``, keep the wait going), fails every waiting agent's rendezvous at once with
  :class:`fsmingle.errors.PeerJobEndedError` (exit code 13 for ``fsmingle``, the same error
  ``fsmingle run`` raises), naming job, state and reason.  An agent that sees the run closed
  (the asker failed first and closed it at shutdown) reads ``queue.json`` once more to say why.  Not a torch ``RendezvousError``
  subclass: torch's agent treats every exception out of ``next_rendezvous`` alike except
  ``RendezvousGracefulExitError`` (a quiet exit, wrong here), so a torch class would change
  nothing in torch's handling, and one cause keeps one error class across both faces.
* A RUNNING peer job counts as joining (agents do not say which job they belong to; its agent is
  starting): ``join_timeout`` runs for it as in torch.
* ``queue_timeout`` bounds the held time: after it the wait fails with
  :class:`fsmingle.errors.RendezvousTimeoutError` naming the pending jobs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from .. import options
from ..protocol.queue import ENDED, QueueWatch, peers_from_env
from ._torch_private import JoinOp

log = logging.getLogger("fsmingle.torchrun")

QUEUE_NAME = "queue.json"
_QUEUE_OPTIONS = ("peer_jobs", "queue_timeout", "queue_poll")


def queue_watch(config: Mapping[str, Any], env: Mapping[str, str], max_nodes: int) -> QueueWatch | None:
    """The peer jobs of this torchrun agent (``--rdzv-conf peer_jobs=...``, else ``FSMINGLE_PEER_JOBS``,
    else a job array's tasks), or None when there are none.

    Args:
        config (Mapping[str, Any]): torch's ``RendezvousParameters.config``.
        env (Mapping[str, str]): the agent's environment (Slurm's variables).
        max_nodes (int): ``MAX`` of ``--nnodes``.

    Returns:
        QueueWatch | None: ``interval`` = ``queue_poll`` (seconds), ``queue_timeout`` (seconds or None).

    Raises:
        ConfigError: a value the option's row refuses (names ``--rdzv-conf KEY=VALUE``, or the variable).
    """
    conf = options.from_rdzv_conf({k: v for k, v in config.items() if k in _QUEUE_OPTIONS})
    v = {}
    for name in _QUEUE_OPTIONS:
        o = options.get(name)
        fallback = next((env[e] for e in o.env if env.get(e)), None)
        v[name] = conf.get(name, o.parse(fallback, source=o.env[0]) if fallback else o.default)
    nn = env.get("SLURM_NNODES", "")
    if not v["peer_jobs"] and nn.isdigit() and max_nodes <= int(nn):
        return None  # the training fits in this job: other array tasks are other trainings
    peers, mine, _ = peers_from_env(env, v["peer_jobs"])
    if not peers:
        return None
    log.info("peer jobs: %s (this job %s); scheduler asked every %g s", ",".join(peers[:16]), mine, v["queue_poll"])
    # Ranks come from the sorted node list, not from task indexes: lines say "missing: job ...".
    return QueueWatch(peers, mine, v["queue_poll"], v["queue_timeout"], None)


class _Held:
    """What :meth:`QueueWatch.tick` moves: the seconds added to torch's join deadline."""

    def __init__(self, job_id: str) -> None:
        self.deadline = 0.0  # seconds held so far (tick adds to it)
        self.job_id, self.gen, self.missing_hint = job_id, 0, []

    def emit(self) -> None:
        """No progress line under torchrun: :meth:`HoldingExecutor.step` logs the lines on change."""


class HoldingExecutor:
    """``DynamicRendezvousHandler._op_executor`` with the join operation's deadline held (module doc).

    Args:
        inner: torch's ``_DistributedRendezvousOpExecutor``.
        watch (QueueWatch): the peer jobs.
        store (Store): the run directory (``queue.json``).
        backend: :class:`~fsmingle.torchrun.backend.FsRendezvousBackend` (its ``epoch``).
        run_id (str): for messages.
        nodes_per_job (int): agents each peer job brings (this job's ``SLURM_NNODES``).
        clock: monotonic seconds.
    """

    def __init__(
        self, inner, watch: QueueWatch, store, backend, run_id: str, nodes_per_job: int = 1, clock=time.monotonic
    ):
        self._inner, self.watch, self._store, self._backend, self._clock = inner, watch, store, backend, clock
        self._run_id, self._nodes_per_job = run_id, max(1, nodes_per_job)
        self._published: dict | None = None
        self._read_at = float("-inf")
        self._logged: tuple = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def run(self, state_handler: Any, deadline: float, update_deadline: Any = None) -> None:
        """torch's ``run``; a join operation sees ``deadline`` plus the held seconds.

        Raises:
            PeerJobEndedError: a peer job ended without joining (while fewer than MIN joined).
            RendezvousTimeoutError: fsmingle's, when peer jobs stayed pending past ``queue_timeout``.
            RendezvousError: torch's, as the inner executor raises them.
        """
        if isinstance(state_handler, JoinOp):
            state_handler = _HeldJoin(state_handler, self, _Held(self._run_id))
        self._inner.run(state_handler, deadline, update_deadline)

    def step(self, ctx: Any, held: _Held) -> None:
        """One call of the join operation: ask or read, then hold or fail (``QueueWatch.tick``)."""
        state, q, now = ctx.state, self.watch, self._clock()
        held.gen = state.round  # "(generation R)" in the messages: torch's round
        nmissing = ctx.settings.min_nodes - len(state.participants)
        waiting = not state.closed and not state.complete and nmissing > 0
        if waiting and ctx.node in state.participants:
            if min(state.participants) == ctx.node:
                q.poll(now, {q.mine}, nmissing)
                # Agents do not say which job they belong to; a RUNNING peer job's agent has joined or
                # is starting (join_timeout's business, not the queue's): count it as here.
                q.judge({q.mine} | {k for k, j in q.jobs.items() if j.state == "RUNNING"}, nmissing)
                if q.ended and self._reachable(ctx.settings.min_nodes):
                    q.ended = ""  # a spare or the other peers can still make MIN: not a reason to fail
                self._publish(state, ctx.node)
            else:
                self._read(state, now)
        elif state.closed and ctx.node in state.participants and not state.complete:
            # The asker failed on an ended peer and its shutdown closed the run: say why, not
            # just "closed" (its findings stay readable; it has left the participants).
            self._read(state, now, closing=True)
        elif not waiting:
            q.forget()
        if q.lines and tuple(q.lines) != self._logged:
            log.warning("waiting for peer jobs in the scheduler's queue: %s", "; ".join(q.lines))
        self._logged = tuple(q.lines)
        q.tick(held, now, waiting)

    def _reachable(self, min_nodes: int) -> bool:
        """Whether the peer jobs that have not ended (and this one) can still bring ``MIN`` nodes,
        counting ``nodes_per_job`` agents per job (one torchrun per node)."""
        alive = [j for j in self.watch.jobs.values() if j.state not in ENDED and j.id != self.watch.mine]
        return (len(alive) + 1) * self._nodes_per_job >= min_nodes

    def _publish(self, state: Any, me: Any) -> None:
        doc = {**self.watch.as_wire(), "epoch": self._backend.epoch, "round": state.round, "writer": str(me)}
        if doc == self._published:
            return  # written on change only: one small file per change, never per poll
        try:
            self._store.publish(QUEUE_NAME, json.dumps(doc).encode())
            self._published = doc
        except OSError as e:
            log.warning("cannot publish %s: %s", QUEUE_NAME, e)

    def _read(self, state: Any, now: float, closing: bool = False) -> None:
        if now - self._read_at < min(self.watch.interval, 5.0) and not closing:
            return
        self._read_at = now
        try:
            doc = json.loads(self._store.read(QUEUE_NAME) or b"{}")
        except (OSError, ValueError):
            doc = {}
        # Another lineage's or round's findings, or a writer that left (died: torch dropped it),
        # say nothing about this wait; the next smallest participant asks and writes anew.
        ours = isinstance(doc, dict) and doc.get("epoch") == self._backend.epoch and doc.get("round") == state.round
        if closing:
            if ours and doc.get("ended"):
                self.watch.from_wire(doc)
        elif ours and any(str(n) == doc.get("writer") for n in state.participants):
            self.watch.from_wire(doc)
        else:
            self.watch.forget()


class _HeldJoin:
    """torch's ``_RendezvousJoinOp``, called with its deadline moved by the held seconds."""

    def __init__(self, op: Any, ex: HoldingExecutor, held: _Held) -> None:
        self._op, self._ex, self._held = op, ex, held

    def __call__(self, ctx: Any, deadline: float) -> Any:
        self._ex.step(ctx, self._held)
        return self._op(ctx, deadline + self._held.deadline)
