"""Pause points that make a protocol window reachable by tests with real processes; inert unless set.

Some windows of the protocol last microseconds: rank 0 between creating ``release.json`` and
sending the last ``go`` (the commit window, ``docs/protocol.md``).  A test that must land a
signal there sets ``FSMINGLE_TEST_PAUSE=<point>:<seconds>`` in one participant's environment, and
that participant sleeps at the named point.  Points: ``commit`` (rank 0, after ``release.json``
was created, before any ``go``); ``beacon`` (any participant, after writing its beacon: a member
that claimed its rank has not said hello yet, so its world is full but cannot be released); ``ack``
(a member, just after its ``ack`` left: rank 0 may release while the member's signal lands).  Nothing else reads the variable; unset, :func:`pause` is one
dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("fsmingle")

ENV = "FSMINGLE_TEST_PAUSE"


def pause(point: str) -> None:
    """Sleep here if ``FSMINGLE_TEST_PAUSE`` names ``point`` (``commit:5``: 5 seconds; no number: 5)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, secs = spec.partition(":")
    if name == point:
        log.warning("%s: pausing %s s at %r (a test hook)", ENV, secs or "5", point)
        time.sleep(float(secs or 5))
