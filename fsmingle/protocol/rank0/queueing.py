"""Rank 0 asks the scheduler about peer jobs that have not joined (:mod:`fsmingle.protocol.queue`).

Only rank 0 asks (one query for all peers, at most every ``--queue-poll`` seconds, in a thread);
its findings go to every member in the status message (``queue``: hold, lines, ended), into the
progress line and into rank 0's beacon for ``fsmingle status``.  A peer job that ended without
joining: the status goes out first, then rank 0 fails (withdrawing voids the generation), and
the members fail on the status they received.  Mixed into
:class:`~fsmingle.protocol.rank0.coordinator.Coordinator`.
"""

from __future__ import annotations

from ...errors import PeerJobEndedError


class Queueing:
    def _queue_step(self, now: float) -> None:
        p = self.p
        q = p.queue
        if q is None:
            return
        before = (q.hold, q.lines, q.ended)
        jobs = {q.mine} | {self.member_jobs.get(r, "") for r in self.rank_conn}
        q.poll(now, jobs, len(self._missing()))
        if (q.hold, q.lines, q.ended) == before:
            return
        self.status_dirty = True
        p.queue_news()
        if q.hold and not before[0]:
            # A hold the members must hear before their --timeout runs out: at once, not after the
            # status gap (N / 500 s past 500 members); at most once per --queue-poll.
            self._push_status(now)
        if q.ended:
            self._push_status(now)  # the members learn why before the void
            raise PeerJobEndedError(
                f"rendezvous for job {p.job_id} cannot complete: {q.ended} (generation {p.gen})", q.ended
            )
