"""Separate jobs and job arrays (issue 24): node ranks not taken from another job's numbering,
the scheduler identity in the beacon, and (below) queue-aware waiting against a fake scheduler."""

from __future__ import annotations

import json
import logging

from fsmingle.config import resolve
from fsmingle.fs.records import Beacon, HostId, decode, encode

ARRAY_TASK = {
    "SLURM_JOB_ID": "4245",
    "SLURM_ARRAY_JOB_ID": "4242",
    "SLURM_ARRAY_TASK_ID": "3",
    "SLURM_ARRAY_TASK_MIN": "1",
    "SLURM_ARRAY_TASK_MAX": "3",
    "SLURM_ARRAY_TASK_COUNT": "3",
    "SLURM_JOB_PARTITION": "debug",
    "SLURM_NNODES": "1",
    "SLURM_NODEID": "0",
}


def test_array_task_with_its_own_job_id_and_nnodes_is_first_come_not_node_0():
    """Measured bug: `fsmingle env --job-id X --nnodes 3` in three array tasks took node rank 0
    from SLURM_NODEID in each (each task is node 0 of its own 1-node job)."""
    s = resolve(dir="/x", job_id="X", nnodes=3, env=ARRAY_TASK)
    assert (s.size, s.rank) == (3, None)
    assert any("SLURM_NODEID" in n and "--nnodes 3 exceeds SLURM_NNODES=1" in n for n in s.notes)
    # separate jobs (no array), same rule
    s = resolve(dir="/x", job_id="X", nnodes=2, env={"SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SLURM_NODEID": "0"})
    assert s.rank is None and s.notes
    # one multi-node job: SLURM_NODEID is the training's node rank, as before
    s = resolve(dir="/x", job_id="X", nnodes=3, env={"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_NODEID": "2"})
    assert (s.rank, s.notes) == (2, ())
    # an explicit --node-rank always wins
    assert resolve(dir="/x", job_id="X", nnodes=3, node_rank=1, env=ARRAY_TASK).rank == 1


def test_array_task_rank_from_task_index_also_with_explicit_nnodes():
    s = resolve(dir="/x", env=ARRAY_TASK)
    assert (s.job_id, s.size, s.rank) == ("4242", 3, 2)
    s = resolve(dir="/x", nnodes=3, env=ARRAY_TASK)
    assert (s.job_id, s.size, s.rank) == ("4242", 3, 2)
    # a different world size than the array's: the task index means nothing, first-come
    s = resolve(dir="/x", nnodes=5, env=ARRAY_TASK)
    assert (s.size, s.rank) == (5, None)


def test_verbose_says_why_no_node_rank_was_taken(tmp_path, caplog):
    import fsmingle
    from fsmingle.errors import RendezvousTimeoutError

    caplog.set_level(logging.DEBUG, logger="fsmingle")
    (tmp_path / "d").mkdir(mode=0o700)
    try:
        fsmingle.rendezvous(dir=str(tmp_path / "d"), job_id="X", nnodes=3, timeout=0.3, env=dict(ARRAY_TASK))
    except RendezvousTimeoutError:
        pass
    assert "not taking the node rank from SLURM_NODEID=0" in caplog.text
    assert "scheduler: slurm_job 4245, array_job 4242, array_task 3, partition debug" in caplog.text


def _beacon(**kw) -> Beacon:
    return Beacon(
        job_id="j",
        generation=1,
        instance="ab" * 8,
        mode="node",
        size=3,
        rank=None,
        addr="10.0.0.1",
        master_port=None,
        heartbeat=0,
        restart_count=0,
        host=HostId("h", "b", "pid:[1]", 1, 1.0),
        **kw,
    )


def test_scheduler_identity_in_the_beacon_is_optional_and_tolerated():
    ident = resolve(dir="/x", env=ARRAY_TASK).scheduler
    assert dict(ident) == {"slurm_job": "4245", "array_job": "4242", "array_task": "3", "partition": "debug"}
    b = _beacon(scheduler=ident)
    raw = json.loads(encode(b))
    assert raw["scheduler"]["array_task"] == "3"
    assert dict(decode(encode(b), Beacon).scheduler) == dict(ident)
    # absent (an older writer): empty; an older reader ignores the unknown key (decode ignores extras)
    assert "scheduler" not in json.loads(encode(_beacon()))
    assert decode(encode(_beacon()), Beacon).scheduler == ()
    # junk is dropped, never a reason to refuse the beacon
    raw["scheduler"] = {"slurm_job": 5, "BAD KEY": "x", "partition": "p\n"}
    assert decode(json.dumps(raw).encode(), Beacon).scheduler == ()
    raw["scheduler"] = "nonsense"
    assert decode(json.dumps(raw).encode(), Beacon).scheduler == ()
    pbs = resolve(dir="/x", env={"PBS_JOBID": "12.pbs", "PBS_QUEUE": "workq", "PBS_NUM_NODES": "1"}, nnodes=2)
    assert dict(pbs.scheduler) == {"pbs_job": "12.pbs", "pbs_queue": "workq"}


# ---------------------------------------------------------------- queue-aware waiting, fake squeue

import os
import time

import pytest
from helpers import run_cli, wait_for

from fsmingle.errors import ConfigError
from fsmingle.protocol.queue import JobState, QueueWatch, parse_peer_jobs


def test_parse_peer_jobs():
    assert parse_peer_jobs("4300,4301 4302") == ("4300", "4301", "4302")
    assert parse_peer_jobs("4242_[0-2,5]") == ("4242_0", "4242_1", "4242_2", "4242_5")
    assert parse_peer_jobs("4242_3,4242") == ("4242_3", "4242")
    with pytest.raises(ConfigError, match="--peer-jobs: 'x' is not a job id"):
        parse_peer_jobs("4300,x")


def test_queue_watch_judges_pending_running_ended():
    q = QueueWatch(("4242_0", "4242_1", "4242_2"), "4242_0", rank_of_task=("4242", 0))
    q.jobs = {
        "4242_1": JobState("4242_1", "RUNNING", "None", "2024-01-01T14:00:00"),
        "4242_2": JobState("4242_2", "PENDING", "JobHeldUser", "2024-01-01T14:05:00"),
    }
    q.judge({"4242_0", "4242_1"}, nmissing=1)
    assert q.hold and q.lines == ["missing rank 2: job 4242_2 PENDING (JobHeldUser), expected start 14:05"]
    q.judge({"4242_0"}, nmissing=2)  # a running peer not joined: the timeout runs
    assert not q.hold
    q.jobs["4242_2"] = JobState("4242_2", "CANCELLED", "None")
    q.judge({"4242_0", "4242_1"}, nmissing=1)
    assert q.ended == "peer job 4242_2 CANCELLED without joining"


FAKE_SQUEUE = """#!/bin/sh
echo "$@ by=$SLURM_JOB_ID" >> {log}
cat {table}
"""


@pytest.fixture
def fake_squeue(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    table, log = tmp_path / "squeue.txt", tmp_path / "squeue.log"
    table.write_text("")
    (bindir / "squeue").write_text(FAKE_SQUEUE.format(log=log, table=table))
    (bindir / "squeue").chmod(0o755)
    return bindir, table, log


def _job_env(bindir, job: str, peers: str = "100,101,102") -> dict:
    return {
        "SLURM_JOB_ID": job,
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "FSMINGLE_PEER_JOBS": peers,
        "PATH": f"{bindir}:{os.environ['PATH']}",
    }


def _status_text(d, job: str) -> str:
    return run_cli("status", job, "--dir", d, "--json").stdout  # exit 1 until released


def test_pending_peer_holds_the_timeout_then_completes(procs, d, fake_squeue):
    """Three separate jobs, one held in the queue for 3x --timeout: the others neither time out
    nor fail; status and the progress line say why; the late job completes the world. rank 0
    alone asks squeue (one call for all peers per --queue-poll)."""
    bindir, table, log = fake_squeue
    table.write_text("102|PENDING|JobHeldUser|2030-01-01T14:05:00\n")
    args = ("--nnodes", 3, "--queue-poll", 0.5)
    t_start = time.monotonic()
    a = procs.env(d, "q", *args, timeout=2, extra_env=_job_env(bindir, "100"), name="a")
    b = procs.env(d, "q", *args, timeout=2, extra_env=_job_env(bindir, "101"), name="b")
    wait_for(lambda: "job 102 PENDING (JobHeldUser)" in _status_text(d, "q"), 15, "status naming job 102")
    st = json.loads(_status_text(d, "q"))
    lines = [x for x in st["participants"] if x["rank"] == 0][0]["queue"]
    assert lines == ["missing: job 102 PENDING (JobHeldUser), expected start 14:05"], st
    time.sleep(6)  # three times --timeout
    assert a.poll() is None and b.poll() is None, (a.stderr(), b.stderr())
    assert "job 102 PENDING (JobHeldUser)" in b.stderr()  # a member's progress line says why too
    # job 102 starts (squeue still says PENDING for a poll or two: its start-up must not count)
    c = procs.env(d, "q", *args, timeout=2, extra_env=_job_env(bindir, "102"), name="c")
    time.sleep(1)
    table.write_text("102|RUNNING|None|2030-01-01T14:05:00\n")
    res = [p.result(30) for p in (a, b, c)]
    assert sorted(r["node_rank"] for r in res) == [0, 1, 2]
    calls = log.read_text().splitlines()
    elapsed = time.monotonic() - t_start
    assert len(calls) <= elapsed / 0.5 + 2, (elapsed, calls)  # one per poll interval, from rank 0 only
    assert all(c.startswith("-h -r -t all -j 10") and "102" in c for c in calls), calls


def test_cancelled_peer_fails_everyone_at_once(procs, d, fake_squeue):
    bindir, table, _ = fake_squeue
    table.write_text("102|PENDING|Priority|N/A\n")
    args = ("--nnodes", 3, "--queue-poll", 0.3)
    a = procs.env(d, "c", *args, timeout=60, extra_env=_job_env(bindir, "100"), name="a")
    b = procs.env(d, "c", *args, timeout=60, extra_env=_job_env(bindir, "101"), name="b")
    wait_for(lambda: "job 102 PENDING (Priority)" in _status_text(d, "c"), 15, "status naming job 102")
    wait_for(lambda: len(json.loads(_status_text(d, "c") or "{}").get("claimed", [])) == 2, 15, "both claimed")
    t0 = time.monotonic()
    table.write_text("102|CANCELLED|None|N/A\n")
    # "At once": well before their --timeout (60 s), which is what failing otherwise waits for; the
    # seconds themselves (a --queue-poll of 0.3 s) are not asserted on a loaded machine.
    assert a.wait(45) == 13 and b.wait(45) == 13
    assert time.monotonic() - t0 < 45
    for p in (a, b):
        assert "peer job 102 CANCELLED without joining" in p.stderr(), p.stderr()


def _sole_asker_holds(d, job: str) -> dict:
    """Wait until rank 1 alone asks the scheduler and its word holds the timeout; its status.  Rank 2
    may arrive first and ask until it sees rank 1 (a --queue-poll later); rank 1 may look before
    rank 2 claimed: its first word is then "no hold" (a running peer job has not joined)."""

    def holds():
        st = json.loads(_status_text(d, job) or "{}")
        asker = [x for x in st.get("participants", []) if x["asks_scheduler"]]
        return st if [(x["rank"], x["timeout_held"]) for x in asker] == [(1, True)] else None

    return wait_for(holds, 15, "rank 1 alone asks, and its word holds the timeout")


def test_missing_rank0_the_lowest_present_rank_asks_and_the_others_hold(procs, d, fake_squeue):
    """Explicit ranks; the job that holds rank 0 waits in the queue for 3x --timeout.  Rank 1
    alone asks squeue; rank 2 reads rank 1's beacon and holds its timeout too; status and both
    progress lines say why; when job 100 starts the world completes."""
    bindir, table, log = fake_squeue
    table.write_text("100|PENDING|JobHeldUser|2030-01-01T14:05:00\n")
    args = ("--nnodes", 3, "--queue-poll", 0.5)
    b = procs.env(d, "m", *args, "--node-rank", 1, timeout=2, extra_env=_job_env(bindir, "101"), name="b")
    c = procs.env(d, "m", *args, "--node-rank", 2, timeout=2, extra_env=_job_env(bindir, "102"), name="c")

    st = _sole_asker_holds(d, "m")
    asker = [x for x in st["participants"] if x["asks_scheduler"]]
    assert asker[0]["queue"] == ["missing: job 100 PENDING (JobHeldUser), expected start 14:05"], st
    text = run_cli("status", "m", "--dir", d).stdout
    assert "rank 0 is missing: rank 1 asks the scheduler about peer jobs; timeout held" in text, text
    before = len(log.read_text().splitlines())  # rank 2 may have asked while rank 1 was not there yet
    time.sleep(6)  # three times --timeout
    assert b.poll() is None and c.poll() is None, (b.stderr(), c.stderr())
    for p in (b, c):
        assert "job 100 PENDING (JobHeldUser)" in p.stderr() and "timeout held: peer jobs pending" in p.stderr()
    calls = log.read_text().splitlines()[before:]
    assert calls and all(x.endswith("by=101") for x in calls), calls  # rank 1 only, never rank 2
    assert len(calls) <= 6 / 0.5 + 2, calls  # one per --queue-poll
    a = procs.env(d, "m", *args, "--node-rank", 0, timeout=2, extra_env=_job_env(bindir, "100"), name="a")
    time.sleep(1)
    table.write_text("100|RUNNING|None|2030-01-01T14:05:00\n")
    res = [p.result(30) for p in (a, b, c)]
    assert [r["node_rank"] for r in res] == [0, 1, 2]
    assert all(x.endswith(("by=101", "by=100")) for x in log.read_text().splitlines()[before:])


def test_missing_rank0_cancelled_fails_everyone_at_once(procs, d, fake_squeue):
    """The asker (rank 1) voids on the ended job and fails; rank 2, which never asks, fails with
    exit 13 too, naming the job and its state (from the asker's restart record)."""
    bindir, table, log = fake_squeue
    table.write_text("100|PENDING|Priority|N/A\n")
    args = ("--nnodes", 3, "--queue-poll", 0.3)
    b = procs.env(d, "k", *args, "--node-rank", 1, timeout=60, extra_env=_job_env(bindir, "101"), name="b")
    c = procs.env(d, "k", *args, "--node-rank", 2, timeout=60, extra_env=_job_env(bindir, "102"), name="c")
    _sole_asker_holds(d, "k")
    before = len(log.read_text().splitlines())
    t0 = time.monotonic()
    table.write_text("100|CANCELLED|None|N/A\n")
    assert b.wait(45) == 13 and c.wait(45) == 13
    took = time.monotonic() - t0
    # Rank 2 never asks the scheduler (the log above): it learns the state from the asker's restart
    # record, about a heartbeat period (--stale-after 3 / 3) after the void, and always well before its
    # --timeout (60 s), the only bound asserted on a loaded machine.
    print(f"both failed {took:.2f} s after the cancel")
    assert took < 45, took
    for p in (b, c):
        assert "peer job 100 CANCELLED without joining" in p.stderr(), p.stderr()
    assert all(x.endswith("by=101") for x in log.read_text().splitlines()[before:])


def test_no_squeue_is_todays_behaviour_with_one_warning(procs, d, tmp_path):
    env = {"SLURM_JOB_ID": "100", "SLURM_NNODES": "1", "FSMINGLE_PEER_JOBS": "100,101", "PATH": str(tmp_path)}
    env["PATH"] = os.path.dirname(os.path.realpath(__import__("sys").executable))  # python, but no squeue
    a = procs.env(d, "n", "--nnodes", 2, "--queue-poll", 0.2, timeout=2, extra_env=env)
    assert a.wait(20) == 7
    err = a.stderr()
    assert err.count("cannot ask the scheduler about peer jobs (squeue is not on PATH)") == 1, err


def test_a_peer_reported_then_purged_counts_as_ended():
    answers = iter([{"4242_2": JobState("4242_2", "PENDING", "JobHeldUser")}, {}])
    q = QueueWatch(("4242_0", "4242_1", "4242_2"), "4242_0", interval=0.0, query=lambda ids: next(answers))
    for now in (0.0, 1.0, 2.0):
        q.poll(now, {"4242_0", "4242_1"}, 1)
        q._thread.join()
    q.poll(3.0, {"4242_0", "4242_1"}, 1)
    assert "peer job 4242_2 GONE (no longer known to squeue or sacct) without joining" in q.ended


def test_a_task_of_a_whole_array_peer_reported_then_purged_counts_as_ended():
    """--peer-jobs 4300 (a whole array): squeue reports its tasks one by one; a task reported
    pending, then unknown to squeue and sacct, ended (the GONE rule, per task)."""
    answers = iter(
        [{"4300_0": JobState("4300_0", "PENDING", "JobHeldUser"), "4300_1": JobState("4300_1", "PENDING", "")}]
        + [{"4300_0": JobState("4300_0", "PENDING", "JobHeldUser")}] * 3
    )
    q = QueueWatch(("4300",), "4242", interval=0.0, query=lambda ids: next(answers))
    q.poll(0.0, {"4242"}, 2)
    q._thread.join()
    q.poll(1.0, {"4242"}, 2)
    assert q.hold and not q.ended
    q._thread.join()
    q.poll(2.0, {"4242"}, 2)
    assert "peer job 4300_1 GONE (no longer known to squeue or sacct) without joining" in q.ended, q.ended
    assert "4300_0" not in q.ended


def test_array_tasks_are_peers_only_when_the_training_spans_jobs():
    from fsmingle import options
    from fsmingle.api import _queue_watch

    v = options.validate(options.Values(**{o.name: None for o in options.OPTIONS}))
    q = _queue_watch(v, resolve(dir="/x", env=ARRAY_TASK), ARRAY_TASK)
    assert q.peers == ("4242_1", "4242_2") and q.mine == "4242_3" and q.rank_of_task == ("4242", 1)
    own = {**ARRAY_TASK, "SLURM_NNODES": "2"}  # each task a 2-node training of its own
    assert _queue_watch(v, resolve(dir="/x", job_id="t3", nnodes=2, env=own), own) is None


def test_the_askers_word_in_the_beacon_is_optional_and_tolerated():
    """``queue_word`` (the scheduler asker's findings while rank 0 is missing): left out when None,
    so older readers see the same record; an older writer's beacon reads as no word; junk in it
    is dropped, never a reason to refuse the beacon."""
    word = {"hold": True, "lines": ["missing rank 0: job 4242_0 PENDING (JobHeldUser)"], "ended": ""}
    raw = json.loads(encode(_beacon(queue_word=word)))
    assert raw["queue_word"] == word and decode(encode(_beacon(queue_word=word)), Beacon).queue_word == word
    assert "queue_word" not in json.loads(encode(_beacon()))
    assert decode(encode(_beacon()), Beacon).queue_word is None
    raw["queue_word"] = {"hold": "yes", "lines": "x", "ended": 5, "extra": 1}
    assert decode(json.dumps(raw).encode(), Beacon).queue_word == {"hold": False, "lines": [], "ended": ""}
    raw["queue_word"] = ["nonsense"]
    assert decode(json.dumps(raw).encode(), Beacon).queue_word is None


def test_a_restart_record_of_an_asker_on_an_ended_peer_fails_the_reader():
    from fsmingle.protocol.queue_relay import ENDED_VOID

    q = QueueWatch(("4242_0", "4242_1"), "4242_1")
    q.from_void("rank 2 lost its connection to the master: reset")
    assert q.ended == ""
    q.from_void(f"{ENDED_VOID}peer job 4242_0 CANCELLED without joining")
    assert q.ended == "peer job 4242_0 CANCELLED without joining"
    q.forget()  # a new generation: an ended peer stays ended
    assert q.ended


def test_the_progress_line_says_the_timeout_is_held():
    from fsmingle.cli.progress import describe
    from fsmingle.protocol.states import Progress, RankSet

    p = Progress("exp", 1, "node", 3, RankSet(3, [0]), (0,), 1, 130.0, 20.0, "waiting", "missing rank 0: ...")
    assert describe(p).endswith("(2m10s, timeout in 20s)")
    held = Progress("exp", 1, "node", 3, RankSet(3, [0]), (0,), 1, 130.0, 20.0, "waiting", "", held=120.0)
    assert describe(held).endswith("(2m10s, timeout held: peer jobs pending (held 2m00s))")
    bound = Progress(
        "exp", 1, "node", 3, RankSet(3, [0]), (0,), 1, 130.0, 20.0, "waiting", "", held=120.0, queue_left=480.0
    )
    assert "timeout held: peer jobs pending (held 2m00s, --queue-timeout in 8m00s)" in describe(bound)
    spare = Progress("exp", 2, "node", 3, RankSet(3, [1, 2]), (1, 2), 0, 130.0, 20.0, "waiting", "", spare_for=1)
    assert describe(spare).endswith("(2m10s, a spare for gen 1, timeout held)")
    q = QueueWatch(("4242_0",), "4242_1", queue_timeout=600.0)
    assert q.progress() == {}
    q.hold, q.held_time.held_for = True, 120.0
    assert q.progress() == {"held": 120.0, "queue_left": 480.0}


def test_a_peer_that_joined_and_then_ended_is_a_place_to_fill_not_a_fatal_never_joined():
    """Issue 29 (measured 8): a peer job that joined (present at rank 0 once, or named by a decision
    record's ``jobs``) and ended leaves a place for a spare or a re-run; --timeout runs, nothing fails.
    One that never joined still fails at once."""
    q = QueueWatch(("j_0", "j_1", "j_2"), "j_0", query=lambda ids: {}, threaded=False)
    q.poll(0.0, {"j_0", "j_1"}, nmissing=1)  # j_1 connected in this generation: it joined
    q.jobs = {"j_1": JobState("j_1", "NODE_FAIL", "None"), "j_2": JobState("j_2", "PENDING", "Priority")}
    q.judge({"j_0"}, nmissing=2)
    assert not q.ended and not q.hold, q.ended  # j_1's place is open: the timeout runs
    assert q.lines[0] == "missing: job j_1 NODE_FAIL after it joined; its place waits for a spare or a re-run"
    q.jobs["j_2"] = JobState("j_2", "CANCELLED", "None")
    q.judge({"j_0"}, nmissing=2)
    assert q.ended == "peer job j_2 CANCELLED without joining"
    # A new process (a spare, a restarted survivor) learns who joined from a decision record.
    fresh = QueueWatch(("j_0", "j_1"), "j_2")
    fresh.learn_jobs(q.record_jobs())
    fresh.jobs = {"j_0": JobState("j_0", "RUNNING"), "j_1": JobState("j_1", "NODE_FAIL")}
    fresh.judge({"j_2"}, nmissing=1)
    assert not fresh.ended and "j_1" in fresh.record_jobs() and "j_2" in fresh.record_jobs()


def test_decision_records_carry_the_jobs_that_joined_and_older_records_read_without_them():
    import dataclasses

    from fsmingle.fs.records import Release, decode, encode

    rel = Release("exp", 3, "restart", "node", 2, None, None, (), "ab" * 8, reason="x", jobs=("j_0", "j_1"))
    assert decode(encode(rel), Release).jobs == ("j_0", "j_1")
    plain = encode(dataclasses.replace(rel, jobs=()))
    assert b"jobs" not in plain and decode(plain, Release).jobs == ()  # older readers see the same record
    hostile = plain.replace(b'"kind"', b'"jobs":[1,"",{"a":1},"j_5"],"kind"')
    assert decode(hostile, Release).jobs == ("j_5",)


def test_a_spare_outlives_the_peer_job_it_replaces_and_the_survivor_is_released_with_it(procs, d, fake_squeue):
    """Issue 29 (measured 8), real processes: separate jobs 100 and 101 (``--peer-jobs``) released
    in generation 1; a spare (job 102, ``--spare-timeout inf``) waits as rank 0 of generation 2 and
    asks squeue; job 101 ends (NODE_FAIL).  It joined generation 1 (that release names it), so its
    place is the spare's: the spare keeps waiting past its --timeout (before: exit 13 "peer job 101
    NODE_FAIL ... without joining"), and job 100's restart is released with it."""
    bindir, table, _ = fake_squeue
    table.write_text("100|RUNNING|None|2030-01-01T14:00:00\n101|RUNNING|None|2030-01-01T14:00:00\n")
    args = ("--nnodes", 2, "--queue-poll", 0.3)
    a = procs.env(d, "pj", *args, timeout=60, extra_env=_job_env(bindir, "100", "100,101"), name="a")
    b = procs.env(d, "pj", *args, timeout=60, extra_env=_job_env(bindir, "101", "100,101"), name="b")
    assert {a.result(30)["generation"], b.result(30)["generation"]} == {1}
    spare_env = _job_env(bindir, "102", "100,101")
    c = procs.env(d, "pj", *args, "--spare-timeout", "inf", timeout=3, extra_env=spare_env, name="c")
    wait_for(lambda: "a spare for gen 1, timeout held" in c.stderr(), 20, "the spare waiting")
    table.write_text("100|RUNNING|None|2030-01-01T14:00:00\n101|NODE_FAIL|None|2030-01-01T14:00:00\n")
    seen = "job 101 NODE_FAIL, started 14:00 after it joined; its place waits for a spare or a re-run"
    wait_for(lambda: seen in c.stderr() or c.poll() is not None, 15, "the spare seeing job 101 end")
    assert c.poll() is None, c.stderr()  # before: exit 13, "peer job 101 NODE_FAIL ... without joining"
    while c.elapsed < 8:  # past its --timeout, and many --queue-poll
        assert c.poll() is None, c.stderr()
        time.sleep(0.2)
    a2 = procs.env(d, "pj", *args, timeout=60, extra_env=_job_env(bindir, "100", "100,101"), name="a2")
    res = [a2.result(30), c.result(30)]
    assert {r["generation"] for r in res} == {2} and sorted(r["node_rank"] for r in res) == [0, 1], res
