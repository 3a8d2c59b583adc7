"""Rank 0's messages per member do not grow with the size of the world (issue 31).

While members join, rank 0 pushed ``status`` (who is missing) to every connected member once a
second and pinged each after 1 s of quiet, whatever the size: at N = 8,192 the swarm counted 29
status messages and 15 pings per member, more of rank 0's CPU than all its other work.  Past
``STATUS_PER_S`` / ``PINGS_PER_S`` members both now go out about that many times a second in all
(``Timing.status_gap``, ``Timing.ping_interval_for``).  Run on the model's fake filesystem and
network (the real ``Participant``, a fake clock): deterministic, and the count is exact.
"""

from __future__ import annotations

from collections import Counter

from model_world import World

from fsmingle.protocol.timing import PINGS_PER_S, STATUS_PER_S

TO_HUB, TO_LINK = 0, 1


def _join_slowly(size: int, members: int) -> tuple[Counter, float]:
    """Rank 0 of a world of ``size`` and ``members`` members arriving one every 0.5 s (who is
    missing changes all the time, as in a big world's join), then 10 s more; returns the
    messages by (type, direction) and the member-seconds connected."""
    w = World(size)
    counts: Counter = Counter()
    real = w.net.transmit

    def spy(pipe, direction, item):
        payload = item[1]
        if isinstance(payload, bytes):
            for t in (b"status", b"ping"):
                if b'"t":"' + t + b'"' in payload:
                    counts[t.decode(), direction] += 1
        return real(pipe, direction, item)

    w.net.transmit = spy
    w.start(0)
    w.tick(2.0)
    starts = []
    for slot in range(1, members + 1):
        w.start(slot)
        starts.append(w.fs.now)
        w.tick(0.5)
    w.tick(10.0)
    assert len(w.rank0().p.role.rank_conn) == members  # all joined, none released (the world is bigger)
    return counts, sum(w.fs.now - t for t in starts)


def test_rank0_pushes_status_and_pings_about_a_constant_number_a_second_in_a_big_world():
    size = 8 * STATUS_PER_S  # 4,000: a status gap of 8 s, a ping interval of stale_after / 5 (2 s)
    assert size >= 4 * PINGS_PER_S
    counts, member_s = _join_slowly(size, 40)
    status = counts["status", TO_LINK] / member_s
    pings = counts["ping", TO_LINK] / member_s
    member_pings = counts["ping", TO_HUB] / member_s
    print(f"per member-second: status {status:.3f}, rank 0's pings {pings:.3f}, members' pings {member_pings:.3f}")
    # Before (measured): status 0.52 per member-second (one a second to everyone while the join
    # went on), rank 0's pings 0.84 and the members' 0.81 (after 1 s of quiet each way); after:
    # 0.10, 0.43 and 0.38.
    assert status < 0.2
    assert status + pings < 0.7
    assert member_pings < 0.7


def test_a_small_world_keeps_its_status_and_ping_pace():
    """Below the thresholds nothing changed: members hear who is missing within a second."""
    counts, member_s = _join_slowly(64, 20)
    assert counts["status", TO_LINK] / member_s > 0.3
    assert (counts["status", TO_LINK] + counts["ping", TO_LINK]) / member_s > 0.8
