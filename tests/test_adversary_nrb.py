"""Holes the adversary's enumeration (tests/adversary_enum_roles.py) found in FolderStore's add during session 5's
"nrb" change (an add's answer without a read-back), pinned: each test enumerates one schedule's every store step
(the step numbers move with the code; the schedule does not).  /work/brief/s5/nradv-findings.md lists them."""

from __future__ import annotations

from adversary_enum_roles import one

# Findings 1-4 were fixed with nrb's change (3cac7a8: a delta's hint; 5ae140d findings 1-3, f5a905c 4), finding 5
# by the lead (EEXIST then ENOENT asks the trash).  Each test failed on main before them.


def _every_step(case, fault):
    """Run ``case`` (seal_at, prefix, role, k, intruder, lag) with ``fault`` on each of A's store steps: failures."""
    seal_at, prefix, role, k, intruder, lag = case
    _, trace, _ = one(seal_at, prefix, role, k, intruder, None, 0, "none", lag)
    bad = []
    for s in range(len(trace)):
        got, _, _ = one(seal_at, prefix, role, k, intruder, "a", s, fault, lag)
        if got:
            bad.append(f"step {s} ({trace[s]}): {got.splitlines()[0][:160]}")
    return bad


def test_an_io_error_after_a_deltas_link_never_fails_the_add():
    """seal_at 4, three adds of 1 by B (A's delta goes to version 3 of epoch 1 and reads version 2 back), B adds 10
    at A's first step, A's listings lag 2.5 s; an EIO before the effect on each of A's store calls in turn.  A call
    before the link() may fail the add (nothing was written); one after it must not: the add took effect, and a
    caller that retries a failed add counts it twice (session 3 fixed the same for the seal's retirement listing).
    On main: the read-back (step 22) and the probe of the walk; on nrb 3cac7a8: the harvest listing too."""
    bad = _every_step((4, 3, "add", 0, "add", 2.5), "eio-before") + _every_step(
        (4, 3, "add", 6, "add-seal2", 0.0), "eio-before"
    )
    assert not bad, "\n".join(bad)


def test_a_lookup_of_the_epoch_that_lies_once_after_the_link_does_not_time_the_add_out():
    """The same schedule; each of A's store steps in turn meets a negative dentry of its name (0.7 s; a listing:
    of the epoch directory).  Every add must answer within its 60 s timeout: after its link(), ``_kept_reader``'s
    probe of the epoch fails while the lookup lies, and it then looks only in the trash, where a live epoch never
    is.  Passes on main (no listing after the link there); failed on nrb 3cac7a8 and 6775f93, fixed in 5ae140d."""
    bad = _every_step((4, 3, "add", 0, "add", 2.5), "neg")
    assert not bad, "\n".join(bad)


def test_a_lost_reply_then_an_io_error_on_its_read_back_never_fails_the_add():
    """Two faults (``enumerate_pairs``): A's create takes effect and its reply is lost (EEXIST), then the read of
    that version -- whose token says whether it is A's -- fails with EIO (one flaky mount, both calls).  The add
    took effect; it must answer (read again until the deadline), not raise: a caller that retries counts it twice.
    seal_at 4, A's listings lag 2.5 s, from an empty key (epoch 0's versions are full: ``FolderKV._link``, the path
    of every set, compare_set and read-modify-write add too) and with an epoch sealed at A's middle step."""
    bad = []
    for k, intruder in ((10**6, None), (2, "seal")):
        _, trace, _ = one(4, 0, "add", k, intruder, None, 0, "none", 2.5)
        for s1 in [s for s, op in enumerate(trace) if op == "create"]:
            after = one(4, 0, "add", k, intruder, "a", s1, "lost", 2.5)[1]
            for s2 in range(s1 + 1, len(after)):
                got = one(4, 0, "add", k, intruder, "a", s1, "lost", 2.5, (s2, "eio-before"))[0]
                if got:
                    bad.append(f"lost reply at {s1}, EIO at {s2} ({after[s2]}): {got.splitlines()[0][:140]}")
    assert not bad, "\n".join(bad)


def test_a_lost_reply_whose_read_back_fails_and_whose_epoch_is_retired_meanwhile_counts_once():
    """A's create of its version takes effect and its reply is lost (EEXIST); the read-back that would tell whose
    version it is fails with EIO; while A pauses to try again, B's adds seal the epoch and retire it.  A's next
    create meets ENOENT: the version may be A's (the lost reply), so the trash must be asked (``settled_in_trash``,
    as after an EIO of the create itself) -- never "gone, write again".  Every such schedule from two start states
    (seal_at 4, lags 0 and 2.5), the seal at each of A's later steps."""
    bad = []
    for prefix in (2, 3):
        for lag in (0.0, 2.5):
            _, trace, _ = one(4, prefix, "add", 10**6, None, None, 0, "none", lag)
            for s1 in [s for s, op in enumerate(trace) if op == "create"]:
                after = one(4, prefix, "add", 10**6, None, "a", s1, "lost", lag)[1]
                for s2 in [s for s in range(s1 + 1, len(after)) if after[s] == "read"][:1]:
                    for k in range(s2, len(after) + 4):
                        for second in ("eio-before", "neg"):  # the read-back fails, or meets a negative dentry
                            case = (4, prefix, "add", k, "seal", "a", s1, "lost", lag, (s2, second))
                            got = one(*case)[0]
                            if got:
                                bad.append(f"{case}: {got.splitlines()[0][:100]}")
    assert not bad, "\n".join(bad)
