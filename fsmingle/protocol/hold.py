"""Time during which a participant's ``--timeout`` does not run, and the bound on that time.

Two waits are not the world failing to form, so ``--timeout`` must not count them: peer jobs
pending in the scheduler's queue (:mod:`fsmingle.protocol.queue`, bound ``--queue-timeout``)
and a spare waiting for a place in a running world (:mod:`fsmingle.protocol.outside`, bound
``--spare-timeout``).  Both move ``Participant.deadline`` forward by the time held, step by step,
and count that time against their own bound; this class is that mechanism, once.
"""

from __future__ import annotations


class DeadlineHold:
    """Moves a participant's deadline forward while a hold lasts, and counts the time held.

    Args:
        bound (float | None): seconds the deadline may be held in all (None: no bound).
    """

    def __init__(self, bound: float | None = None):
        self.bound = bound
        self.held_for = 0.0  # seconds held so far (seconds)
        self._last: float | None = None  # the previous counted tick (monotonic seconds), None: none

    def tick(self, p, now: float, counting: bool, holding: bool) -> bool:
        """One step of ``p`` (anything with a ``deadline``: a ``Participant``, its ``Timers``) at ``now`` (monotonic seconds).

        The time since the previous counted tick is held (``p.deadline`` moves forward by it) when
        ``holding``; ``counting`` False (the participant is not in the wait this hold is about)
        forgets the previous tick, so nothing before it is ever held.

        Returns:
            bool: True once the time held reached ``bound``.
        """
        last, self._last = self._last, (now if counting else None)
        if holding and last is not None:
            p.deadline += now - last
            self.held_for += now - last
        return self.bound is not None and self.held_for >= self.bound
