"""Issue 24: a node that arrives when the world is full (or released) waits as a spare, is shown
as one by ``fsmingle status``, and takes a place when the world comes back for one (a member
died, the survivors re-run under their restart loop)."""

from __future__ import annotations

import json
import shlex
import sys
import time

from helpers import (
    FSMINGLE,
    assert_one_world,
    clean_env,
    release_of,
    results,
    run_cli,
    wait_claimed,
    wait_for,
    wait_text,
)


def _status(d, job: str) -> dict:
    return json.loads(run_cli("status", job, "--dir", d, "--json").stdout or "{}")


def test_spare_takes_the_place_of_a_dead_member(procs, d):
    a = procs.env(d, "sp", "--nnodes", 2, timeout=60, name="a")
    b = procs.env(d, "sp", "--nnodes", 2, timeout=60, name="b")
    first = [a.result(30), b.result(30)]
    assert {r["generation"] for r in first} == {1}
    # The world of generation 1 is running (its fsmingle processes exec'd or returned). A third
    # node arrives: a spare, waiting in generation 2.
    # Given --spare-timeout, its --timeout (3 s) does not run while it is a spare: it outlives it.
    c = procs.env(d, "sp", "--nnodes", 2, "--spare-timeout", "inf", timeout=3, name="c")
    st = wait_for(
        lambda: (lambda s: s if s.get("generation") == 2 and s["participants"] else None)(_status(d, "sp")), 20, "c"
    )
    assert [p["spare_for"] for p in st["participants"]] == [1], st
    text = run_cli("status", "sp", "--dir", d).stdout
    assert "generation 2" in text
    assert "is a spare for generation 1: it takes a place when one opens" in " ".join(text.split()), text
    wait_text(c, "a spare for gen 1, timeout held")  # its progress line
    while c.elapsed < 6:  # twice its --timeout
        assert c.poll() is None, c.stderr()
        time.sleep(0.2)
    # Member b's training dies; a's restart loop runs fsmingle again: the spare takes b's place.
    t0 = time.monotonic()
    a2 = procs.env(d, "sp", "--nnodes", 2, timeout=60, name="a2")
    second = [a2.result(30), c.result(30)]
    took = time.monotonic() - t0
    print(
        f"world of generation 2 released {took:.2f} s after the survivor's fsmingle started (python start-up included)"
    )
    assert {r["generation"] for r in second} == {2}
    assert sorted(r["node_rank"] for r in second) == [0, 1]
    # How fast (python start-up included) is printed above, never asserted: under load 20-40 a start-up
    # alone took several seconds.  The results' 30 s bound is under a2's --timeout (60 s).


def test_a_member_killed_before_the_release_leaves_its_place_to_the_waiting_spare(procs, d):
    """A world of 2, full but not released (member b claimed its rank and wrote its beacon, then
    holds before its hello: ``FSMINGLE_TEST_PAUSE=beacon``), a third participant watching it as a
    spare past its own --timeout; b is SIGKILLed: the survivor and the spare are released together
    in a later generation, with a live master."""
    a = procs.env(d, "kb", "--nnodes", 2, timeout=60, name="a")
    wait_claimed(d, "kb", 1, [0], procs=[a])
    b = procs.env(d, "kb", "--nnodes", 2, timeout=60, name="b", extra_env={"FSMINGLE_TEST_PAUSE": "beacon:60"})
    wait_claimed(d, "kb", 1, [0, 1], procs=[a, b])
    c = procs.env(d, "kb", "--nnodes", 2, "--spare-timeout", 3600, timeout=5, name="c")
    wait_text(c, "all 2 ranks of generation 1 are claimed")
    wait_text(c, "a spare for gen 1, timeout held")
    # Its beacon (written at its first heartbeat) shows it as the spare of generation 1.
    wait_for(lambda: [p["spare_for"] for p in _status(d, "kb")["participants"] if p["rank"] is None] == [1], 10, "c")
    while c.elapsed < 8:  # past its --timeout: a spare's does not run
        assert c.poll() is None and a.poll() is None, c.stderr()
        time.sleep(0.2)
    assert release_of(d, "kb", 1) is None  # still full, not released
    b.kill()
    t0 = time.monotonic()
    res = results([a, c], timeout=30)
    took = time.monotonic() - t0
    print(f"survivor and spare released {took:.2f} s after the member's SIGKILL (generation {res[0]['generation']})")
    assert_one_world(res, 2)
    assert res[0]["generation"] >= 2
    assert release_of(d, "kb", 1)["state"] == "restart"  # nobody was released with the dead member
    master = [p for p, r in zip((a, c), res) if r["node_rank"] == 0][0]
    assert master.pid != b.pid and "a place opened" in c.stderr(), c.stderr()
    # How fast is printed above, never asserted (a loaded machine): that it took the place opened by
    # the death, not a's --timeout (60 s), is what the results' 30 s bound and "a place opened" say.


def test_a_spare_that_waits_past_spare_timeout_fails_naming_the_generation_it_backs(procs, d):
    a = procs.env(d, "sb", "--nnodes", 2, timeout=60, name="a")
    b = procs.env(d, "sb", "--nnodes", 2, timeout=60, name="b")
    results([a, b])
    # `fsmingle run` as users start a spare: its --timeout (60 s) is held, --spare-timeout (2 s) is not.
    c = procs.env(d, "sb", "--nnodes", 2, "--spare-timeout", 2, "--", "true", timeout=60, name="c", cmd="run")
    rc = c.wait(50)  # under its --timeout (60 s), which is held: --spare-timeout ended it
    err = c.stderr()
    assert rc == 7, err
    assert "as a spare for generation 1 (--spare-timeout 2 s) and no place opened" in err, err
    # It held rank 0 of generation 2 and voided it on leaving: a survivor coming back later is not
    # kept waiting for a dead claimer.
    rel = release_of(d, "sb", 2)
    assert rel["state"] == "restart" and "--spare-timeout" in rel["reason"], rel


def test_a_spare_of_a_full_world_leaves_it_untouched_at_spare_timeout(procs, d):
    """World full, not released (b holds before its hello); a spare watching it fails at
    --spare-timeout naming generation 1, and voids nothing: it holds no rank there."""
    a = procs.env(d, "fb", "--nnodes", 2, timeout=60, name="a")
    wait_claimed(d, "fb", 1, [0], procs=[a])
    b = procs.env(d, "fb", "--nnodes", 2, timeout=60, name="b", extra_env={"FSMINGLE_TEST_PAUSE": "beacon:60"})
    wait_claimed(d, "fb", 1, [0, 1], procs=[a, b])
    c = procs.env(d, "fb", "--nnodes", 2, "--spare-timeout", 5, timeout=4, name="c")
    assert c.wait(30) == 7, c.stderr()
    assert "as a spare for generation 1 (--spare-timeout 5 s) and no place opened" in c.stderr(), c.stderr()
    assert c.elapsed > 5  # its --timeout (4 s) was held
    assert release_of(d, "fb", 1) is None and a.poll() is None and b.poll() is None  # the world is as it was


# A training stand-in for `fsmingle run` (no torch: a collective's one property that matters here):
# rank 0 listens on MASTER_PORT, the member connects, and each exits 1 when its peer goes away, as a
# collective fails when a rank dies.  It records when it started, in which world.
TRAIN = """
import json, os, socket, sys, time
rank, gen, who = int(os.environ["NODE_RANK"]), int(os.environ["FSMINGLE_GENERATION"]), os.environ["WHO"]
with open(os.path.join(sys.argv[1], f"{who}-gen{gen}.json"), "w") as f:
    json.dump({"rank": rank, "t": time.time(), "port": int(os.environ["MASTER_PORT"])}, f)
addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if rank == 0:
    conn = socket.create_server(addr).accept()[0]
else:
    for _ in range(400):
        try:
            conn = socket.create_connection(addr)
            break
        except OSError:
            time.sleep(0.05)
try:
    while conn.recv(1):
        pass
except OSError:
    pass
sys.exit(1)
"""


def test_a_spare_replaces_a_dead_member_under_fsmingle_runs_restart_loop(procs, d, tmp_path):
    """Node a runs `fsmingle run` in a restart loop (as a Slurm script does); b once; c arrives as a
    spare; b dies: a's training fails, its loop runs fsmingle again, and c takes b's place."""
    (tmp_path / "train.py").write_text(TRAIN)
    out = tmp_path / "out"
    out.mkdir()
    args = ["run", "--dir", d, "--job-id", "rl", "--nnodes", 2, "--stale-after", 3, "--addr", "127.0.0.1"]
    train = ["--", sys.executable, tmp_path / "train.py", out]
    once = shlex.join(str(x) for x in [*FSMINGLE, *args, "--timeout", 60, *train])
    a = procs.spawn(["bash", "-c", f"for i in 1 2 3; do {once}; done"], name="a", env=clean_env({"WHO": "a"}))
    b = procs.spawn([*FSMINGLE, *map(str, [*args, "--timeout", 60, *train])], name="b", env=clean_env({"WHO": "b"}))
    wait_for(lambda: (out / "a-gen1.json").exists() and (out / "b-gen1.json").exists(), 30, "generation 1 training")
    spare = [*args, "--timeout", 3, "--spare-timeout", 3600, *train]
    c = procs.spawn([*FSMINGLE, *map(str, spare)], name="c", env=clean_env({"WHO": "c"}))
    wait_text(c, "a spare for gen 1, timeout held")
    while c.elapsed < 5:  # past its --timeout
        assert c.poll() is None, c.stderr()
        time.sleep(0.2)
    b.kill()
    killed = time.time()
    wait_for(lambda: (out / "a-gen2.json").exists() and (out / "c-gen2.json").exists(), 30, "the new world")
    world = [json.loads((out / f"{w}-gen2.json").read_text()) for w in "ac"]
    took = max(w["t"] for w in world) - killed
    print(f"the new world's training started {took:.2f} s after a member's SIGKILL (restart loop, python start-up)")
    assert sorted(w["rank"] for w in world) == [0, 1] and world[0]["port"] == world[1]["port"], world
    assert not (out / "a-gen3.json").exists() and a.poll() is None and c.poll() is None, a.stderr()
    # How fast is printed above, never asserted (python start-ups under load): within the 30 s wait
    # for the new world, under a's --timeout of 60 s.


def test_without_spare_timeout_a_rerun_whose_peer_never_comes_times_out_naming_it(procs, d):
    """A re-run with the same job id finds generation 1 released without it, exactly as a spare
    does; without --spare-timeout nothing is held: it fails after --timeout, naming the rank that
    never came (a spare's wait is asked for, never the default)."""
    a = procs.env(d, "rr", "--nnodes", 2, timeout=60, name="a")
    b = procs.env(d, "rr", "--nnodes", 2, timeout=60, name="b")
    assert {a.result(30)["generation"], b.result(30)["generation"]} == {1}
    again = procs.env(d, "rr", "--nnodes", 2, timeout=3, name="again")  # its peer is never started
    # Not held: a held --timeout would never end (no --spare-timeout), so the 40 s wait is the bound;
    # how soon after its 3 s (python start-up included) is not asserted on a loaded machine.
    assert again.wait(40) == 7, again.stderr()
    err = " ".join(again.stderr().split())
    assert again.elapsed >= 3, again.elapsed
    assert "timed out after 3 s in generation 2: missing node ranks 1" in err, err
    assert "as a spare" in err and "--spare-timeout" not in err.split("timed out", 1)[1].split(".")[0], err


def test_two_spares_alone_are_never_released_and_a_survivor_still_is_with_one(procs, d):
    """Issue 29 (measured 7): a world of 2 released and training; two nodes started as spares
    (``--spare-timeout inf``) wait in generation 2 -- and are never released there together (a second
    training of the running job).  The survivor's restart (no --spare-timeout) is released with one
    of them; the other spare waits on."""
    a = procs.env(d, "ss", "--nnodes", 2, timeout=60, name="a")
    b = procs.env(d, "ss", "--nnodes", 2, timeout=60, name="b")
    assert {a.result(30)["generation"], b.result(30)["generation"]} == {1}
    c = procs.env(d, "ss", "--nnodes", 2, "--spare-timeout", "inf", timeout=3, name="c")
    e = procs.env(d, "ss", "--nnodes", 2, "--spare-timeout", "inf", timeout=3, name="e")
    wait_claimed(d, "ss", 2, [0, 1], procs=[c, e])  # the two spares hold both ranks of generation 2
    while c.elapsed < 8 or e.elapsed < 8:  # past their --timeout (3 s): held, both of them
        assert c.poll() is None and e.poll() is None, c.stderr() + e.stderr()
        time.sleep(0.2)
    assert release_of(d, "ss", 2) is None, release_of(d, "ss", 2)  # not released: no second world
    for q in (c, e):
        assert "a spare for gen 1, timeout held" in q.stderr() and "a place opened" not in q.stderr(), q.stderr()
    a2 = procs.env(d, "ss", "--nnodes", 2, timeout=60, name="a2")  # a survivor restarted by its loop
    got = a2.result(30)
    deadline = time.monotonic() + 30
    while c.poll() is None and e.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    joined, waiting = (c, e) if c.poll() is not None else (e, c)
    res = joined.result(5)
    assert_one_world([got, res], 2)
    assert got["generation"] >= 3, got
    # It voided the generation of spares (that record may be cleaned by now: its words are in the log).
    assert "all 2 ranks of generation 2 are held by spares" in " ".join(a2.stderr().split()), a2.stderr()
    assert waiting.poll() is None, waiting.stderr()  # the other spare waits on, for the next place
