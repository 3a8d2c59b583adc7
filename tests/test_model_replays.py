"""The machine of ``test_model.py`` (``model_machine.py``) run with the paths of big worlds forced, and the machine's own
shrunk runs of bugs it found, replayed step by step (each failed before its fix)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

try:
    from model_machine import MODEL_EXAMPLES, RendezvousMachine, replay
except ImportError:  # tests/ imported as a package
    from tests.model_machine import MODEL_EXAMPLES, RendezvousMachine, replay


# ---------------------------------------------------------------------------------------------
# The paths only big worlds take: first-come joiners whose blind guesses collide ask rank 0 for
# a free rank (fsmingle.protocol.member, "asking"), and connected members heartbeat their own beacons
# rarely, so judges rely on rank 0's vouch (GenerationReader.judge_rank).  Small worlds never
# take them, so the machine above is run again with both forced: every first-come joiner makes
# one guess and then asks, and a connected member never heartbeats again.


def test_model_with_the_paths_of_big_worlds(monkeypatch):
    from hypothesis.stateful import run_state_machine_as_test

    from fsmingle.protocol import joining, member

    monkeypatch.setattr(joining, "SPREAD_ABOVE", 1)
    monkeypatch.setattr(joining, "BLIND_GUESSES", 1)
    monkeypatch.setattr(member, "MEMBER_BEACONS_PER_S", 1e-6)
    run_state_machine_as_test(
        RendezvousMachine,
        settings=settings(
            max_examples=max(50, MODEL_EXAMPLES // 2),
            stateful_step_count=60,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )


def test_an_asker_tries_rank0_again_after_port_busy(monkeypatch):
    """Found by the machine above (shrunk): with a fixed --port, an asker's try at rank 0 met
    "port busy" (a peer on its host still held the port as rank 0 of the generation before);
    it never tried again, the peer then claimed rank 3, and ranks 1-3 waited for a rank 0
    that nobody would take.  The machine's own steps, replayed; teardown asserts the release."""
    from fsmingle.protocol import joining, member

    monkeypatch.setattr(joining, "SPREAD_ABOVE", 1)
    monkeypatch.setattr(joining, "BLIND_GUESSES", 1)
    monkeypatch.setattr(member, "MEMBER_BEACONS_PER_S", 1e-6)
    m = replay(
        monkeypatch,
        size=4, mode="rank", rank_policy="first", staleness=0.0, pidns="pod", cleaner=False,
        partitioned={0}, fixed_port=True, short_timeout=1, mixed_seed=0, joined=4, initial_lag=0.0,
        rank_order="arrival",
    )  # fmt: skip
    for _ in range(3):
        m.crash_in_step(after_effect=False, i=0, k=0)
    m.stall(dt=2.0, i=0)
    m.crash_in_step(after_effect=False, i=0, k=0)
    m.teardown()


def test_a_joiner_blind_to_its_generation_past_stale_after_waits_for_the_port_holding_rank0(monkeypatch):
    """Found by the issue-24 adversary's runs of the machine: two processes of one host with a
    fixed --port; the first holds it as rank 0 of generation 1, the second's connection to it is
    reset and the host is blind to gen-1 for 20 s (> --stale-after 10 s).  The second's one read of
    claim 0 before failing found nothing (a read behind a lying cache proves nothing) and it exited
    3 ("no other node took rank 0") with the master alive.  Now only a listing that shows the
    generation without a claim 0 fails it.  The machine's steps, replayed; teardown asserts the release."""
    m = replay(
        monkeypatch,
        size=2, mode="rank", rank_policy="first", staleness=0.0, pidns="host", cleaner=False,
        partitioned=set(), fixed_port=True, short_timeout=1, mixed_seed=0, joined=2, initial_lag=0.0,
        rank_order="arrival", peers=False,
    )  # fmt: skip
    m.step(i=0, n=1)
    m.step(i=1, n=1)
    m.reset_connection(i=0, lose_unread=False)
    m.spurious_enoent(h=0, i=0, secs=20.0)
    m.teardown()


def test_an_asker_that_loses_rank0_while_blind_joins_again(monkeypatch):
    """Found by the machine (small worlds ask rank 0 too): rank 0 crashed while the other
    participant was asking; its fallback listing of the generation met a lying cache (ENOENT),
    and it was left waiting with no role (AttributeError).  The machine's steps, replayed."""
    m = replay(
        monkeypatch,
        size=2, mode="node", rank_policy="first", staleness=0.0, pidns="host", cleaner=False,
        partitioned=set(), fixed_port=False, short_timeout=0, mixed_seed=0, joined=2, initial_lag=0.0,
        rank_order="arrival",
    )  # fmt: skip
    m.preempt(i=1, j=0, k=0)
    m.spurious_enoent(h=1, i=0, secs=0.5)
    m.crash(i=0)
    m.tick(dt=0.5)
    m.teardown()


def test_no_delay_at_the_deadline_after_a_lying_cache_is_no_spin(monkeypatch):
    """Found by a random run of the machine: a 40 s --timeout, rank 0 partitioned, and a member's
    host blind to its generation for 20 s.  At the deadline ``next_delay`` is 0 (it caps the wait
    at the deadline: the next step times out), and the model's bug-7 oracle counted that as a
    zero-delay retry after ENOENT.  The oracle now counts a spin only before the deadline.  The
    machine's steps, replayed; teardown checks the oracles."""
    m = replay(
        monkeypatch,
        size=3, mode="node", rank_policy="explicit", staleness=0.0, pidns="host", cleaner=False,
        partitioned=set(), fixed_port=False, short_timeout=0, mixed_seed=0, joined=3, initial_lag=0.0,
        rank_order="arrival", peers=False,
    )  # fmt: skip
    m.scheduler_says(i=0, state="PENDING")
    m.partition(h=4)
    for _ in range(3):
        m.partition(h=0)
    for dt in (0.1, 0.1, 7.0):
        m.tick(dt=dt)
    m.scheduler_says(i=0, state="PENDING")
    m.spurious_enoent(h=1, i=0, secs=20.0)
    for _ in range(8):
        m.partition(h=0)
    for dt in (3.0, 7.0, 7.0):
        m.tick(dt=dt)
    m.teardown()


def test_a_contester_that_finds_its_own_claim_holds_it(monkeypatch):
    """Found by a random run of the machine: rank 0's claim create in generation 2 took effect and
    reported EIO, and the negative lookup entry the error left (5 s) hid the claim from the
    read-back and after the retry's EEXIST.  The node went on to contest rank 0, read the claim
    once the entry expired -- its own instance -- judged its own beacon alive and failed itself
    with RankConflictError (the oracle: ``holder is not q``).  A contester that finds its own
    claim now holds the rank.  The machine's steps, replayed; teardown checks the oracles."""
    m = replay(monkeypatch, size=3, mode='node', rank_policy='explicit', staleness=0.0, fixed_port=False, pidns='host', cleaner=False, partitioned=set(), short_timeout=0, mixed_seed=0, joined=3, initial_lag=0.0, rank_order='arrival', peers=False)  # fmt: skip
    m.restart(crash_at=None, i=0, new_host=False)
    m.partition(h=0)
    m.partition(h=0)
    m.partition(h=4)
    m.partition(h=4)
    m.tick(dt=0.1)
    m.partition(h=0)
    m.partition(h=1)
    m.partition(h=0)
    m.partition(h=0)
    m.partition(h=0)
    m.partition(h=0)
    m.partition(h=0)
    m.partition(h=0)
    m.partition(h=0)
    m.partition(h=0)
    m.spurious_enoent(h=4, i=63, secs=5.0)
    m.spurious_enoent(h=5, i=36, secs=20.0)
    m.restart(crash_at=None, i=4, new_host=True)
    m.spurious_enoent(h=5, i=22, secs=20.0)
    m.spurious_enoent(h=2, i=27, secs=61.0)
    m.spurious_enoent(h=0, i=6, secs=61.0)
    m.partition(h=6)
    m.spurious_enoent(h=7, i=54, secs=0.5)
    m.io_error(after_effect=True, blind=0.0, h=3, k=1, ops=("publish",), which="claim")
    m.io_error(after_effect=True, blind=0.0, h=1, k=0, ops=("publish",), which="release")
    m.io_error(after_effect=False, blind=0.0, h=4, k=0, ops=("create",), which="claim")
    m.partition(h=5)
    m.restart(crash_at=8, i=3, new_host=False)
    m.spurious_enoent(h=2, i=31, secs=20.0)
    m.restart(crash_at=None, i=2, new_host=True)
    m.tick(dt=7.0)
    m.spurious_enoent(h=1, i=3, secs=61.0)
    m.io_error(after_effect=True, blind=5.0, h=5, k=2, ops=("create",), which="release")
    m.io_error(after_effect=True, blind=61.0, h=6, k=0, ops=("create", "publish"), which="claim")
    m.io_error(after_effect=False, blind=0.0, h=1, k=2, ops=("create", "publish"), which="release")
    m.tick(dt=0.5)
    m.io_error(after_effect=False, blind=61.0, h=2, k=1, ops=("create",), which="release")
    m.tick(dt=7.0)
    m.io_error(after_effect=True, blind=5.0, h=0, k=0, ops=("create", "publish"), which="claim")
    m.tick(dt=7.0)
    m.teardown()
