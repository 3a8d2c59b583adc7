"""Issue 24 for the torchrun backend: peer jobs waiting in the scheduler's queue hold ``join_timeout``.

Two layers:

* handlers in one process (threads) with a fake scheduler query (the only way to make a job
  PENDING or CANCELLED at a chosen moment without Slurm): the hold, the ended peer, one asker,
  ``queue_timeout``, the ``--rdzv-conf`` keys;
* real ``torchrun --rdzv-backend fsmingle`` agents in a real Slurm (``tests/cluster/``): a
  2-task array whose task 1 is held past ``join_timeout`` and then released (the training
  runs), and one whose held task is cancelled (the waiting agent fails at once, naming it).
"""

from __future__ import annotations

import threading
import time

import pytest
from slurm_tasks import job_state, task_output, wait_task_done

pytest.importorskip("torch")

from torch.distributed.elastic.rendezvous import RendezvousParameters

from fsmingle.errors import ConfigError, PeerJobEndedError, RendezvousTimeoutError
from fsmingle.protocol.queue import JobState
from fsmingle.torchrun import handler, queuehold

pytestmark = pytest.mark.torch

ARRAY = {
    "SLURM_ARRAY_JOB_ID": "77",
    "SLURM_ARRAY_TASK_ID": "0",
    "SLURM_ARRAY_TASK_MIN": "0",
    "SLURM_ARRAY_TASK_MAX": "2",
    "SLURM_ARRAY_TASK_COUNT": "3",
    "SLURM_JOB_ID": "78",
    "SLURM_NNODES": "1",
}
FAST = {"keep_alive_interval": 1, "keep_alive_max_attempt": 2, "queue_poll": "0.2"}


def _params(tmp_path, min_nodes, max_nodes=None, **conf):
    return RendezvousParameters(
        backend="fsmingle",
        endpoint=str(tmp_path / "rdzv"),
        run_id="job1",
        min_nodes=min_nodes,
        max_nodes=max_nodes or min_nodes,
        addr="127.0.0.1",
        **{**FAST, **conf},
    )


class FakeScheduler:
    """The scheduler query, answering from ``jobs`` (task id -> state, reason); counts its calls."""

    def __init__(self, **jobs: tuple[str, str]):
        self.jobs = jobs
        self.calls = 0

    def __call__(self, ids):
        self.calls += 1
        return {k: JobState(k, *v) for k, v in self.jobs.items() if k.split("_")[0] in {i.split("_")[0] for i in ids}}


def _agent(tmp_path, monkeypatch, fake, min_nodes, max_nodes=None, env=ARRAY, **conf):
    for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "FSMINGLE_PEER_JOBS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    h = handler.create_rdzv_handler(_params(tmp_path, min_nodes, max_nodes, **conf))
    if fake is not None:
        assert isinstance(h._op_executor, queuehold.HoldingExecutor)
        h._op_executor.watch.query = fake
    return h


class Joining:
    """``next_rendezvous`` in a thread: its result or its exception, and when it came."""

    def __init__(self, h):
        self.h, self.info, self.error, self.at = h, None, None, None
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._go, daemon=True)
        self.thread.start()

    def _go(self):
        try:
            self.info = self.h.next_rendezvous()
        except BaseException as e:
            self.error = e
        self.at = time.monotonic() - self.t0

    def wait(self, timeout=60):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "next_rendezvous did not return"
        return self


def test_pending_peer_holds_join_timeout_then_the_round_completes(tmp_path, monkeypatch):
    fake = FakeScheduler(**{"77_1": ("PENDING", "JobHeldUser"), "77_2": ("PENDING", "Priority")})
    a = Joining(_agent(tmp_path, monkeypatch, fake, 3, join_timeout=3))
    time.sleep(8)  # past join_timeout + torch's 5 s rollback: without the hold, TimeoutError by now
    assert a.at is None, a.error
    fake.jobs["77_1"] = ("RUNNING", "None")
    b = Joining(_agent(tmp_path, monkeypatch, None, 3, join_timeout=3, env={**ARRAY, "SLURM_ARRAY_TASK_ID": "1"}))
    time.sleep(3)
    assert a.at is None and b.at is None, (a.error, b.error)  # b reads a's findings: held too
    fake.jobs["77_2"] = ("RUNNING", "None")
    c = Joining(_agent(tmp_path, monkeypatch, None, 3, join_timeout=3, env={**ARRAY, "SLURM_ARRAY_TASK_ID": "2"}))
    for j in (a, b, c):
        j.wait()
        assert j.error is None, j.error
    assert sorted(j.info.rank for j in (a, b, c)) == [0, 1, 2]
    for j in (a, b, c):
        j.h.shutdown()


def test_without_peer_jobs_join_timeout_runs_as_in_torch(tmp_path, monkeypatch):
    from torch.distributed.elastic.rendezvous import RendezvousTimeoutError as TorchTimeout

    h = _agent(tmp_path, monkeypatch, None, 2, env={"SLURM_JOB_ID": "78", "SLURM_NNODES": "1"}, join_timeout=1)
    assert not isinstance(h._op_executor, queuehold.HoldingExecutor)
    j = Joining(h).wait()
    assert isinstance(j.error, TorchTimeout)
    h.shutdown()


def test_ended_peer_fails_every_waiting_agent_at_once_and_only_one_asks(tmp_path, monkeypatch):
    fake_a = FakeScheduler(**{"77_1": ("RUNNING", "None"), "77_2": ("PENDING", "JobHeldUser")})
    fake_b = FakeScheduler(**fake_a.jobs)
    a = Joining(_agent(tmp_path, monkeypatch, fake_a, 3, join_timeout=600))
    b = Joining(_agent(tmp_path, monkeypatch, fake_b, 3, join_timeout=600, env={**ARRAY, "SLURM_ARRAY_TASK_ID": "1"}))
    time.sleep(3)
    assert a.at is None and b.at is None
    # The smallest participant asks, the other reads its findings (it may have asked once while
    # it was alone in the state).
    before = (fake_a.calls, fake_b.calls)
    time.sleep(2)
    grew = [f.calls - n for f, n in zip((fake_a, fake_b), before)]
    assert sorted(grew)[0] == 0 and sorted(grew)[1] >= 2, grew
    asker = fake_a if grew[0] else fake_b
    asker.jobs["77_2"] = ("CANCELLED", "None")
    for j in (a, b):
        j.wait(20)
        assert isinstance(j.error, PeerJobEndedError), j.error
        assert "peer job 77_2 CANCELLED without joining" in str(j.error) and "77_1" not in str(j.error)
        assert j.error.exit_code == 13
        j.h.shutdown()


def test_an_ended_peer_with_a_spare_left_is_no_reason_to_fail(tmp_path, monkeypatch):
    # a 3-task array for --nnodes 2: task 1 cancelled, task 2 still pending can take its place
    fake = FakeScheduler(**{"77_1": ("CANCELLED", "None"), "77_2": ("PENDING", "Priority")})
    a = Joining(_agent(tmp_path, monkeypatch, fake, 2, join_timeout=600))
    time.sleep(3)
    assert a.at is None and fake.calls >= 2, a.error
    fake.jobs["77_2"] = ("RUNNING", "None")
    c = Joining(_agent(tmp_path, monkeypatch, None, 2, join_timeout=600, env={**ARRAY, "SLURM_ARRAY_TASK_ID": "2"}))
    for j in (a, c):
        j.wait()
        assert j.error is None, j.error
        j.h.shutdown()


def test_queue_timeout_bounds_the_hold(tmp_path, monkeypatch):
    fake = FakeScheduler(**{"77_1": ("PENDING", "JobHeldUser"), "77_2": ("PENDING", "Resources")})
    j = Joining(_agent(tmp_path, monkeypatch, fake, 3, join_timeout=1, queue_timeout="3")).wait()
    assert isinstance(j.error, RendezvousTimeoutError), j.error
    assert "job 77_1 PENDING (JobHeldUser)" in str(j.error) and "queue-timeout 3 s" in str(j.error)
    j.h.shutdown()


def test_once_min_joined_the_queue_holds_nothing(tmp_path, monkeypatch):
    # --nnodes 1:3: the first agent alone is MIN; torch's last call completes the round
    # although two peers are pending.
    fake = FakeScheduler(**{"77_1": ("PENDING", "JobHeldUser"), "77_2": ("PENDING", "Resources")})
    j = Joining(_agent(tmp_path, monkeypatch, fake, 1, 3, join_timeout=60, last_call_timeout=1)).wait()
    assert j.error is None and j.info.world_size == 1
    assert fake.calls == 0
    j.h.shutdown()


def test_conf_keys_are_the_options_rows(tmp_path, monkeypatch):
    h = _agent(tmp_path, monkeypatch, None, 2, env={}, peer_jobs="4300:4301", queue_poll="7", queue_timeout="90")
    w = h._op_executor.watch
    assert (w.peers, w.interval, w.queue_timeout) == (("4300", "4301"), 7.0, 90.0)
    h = _agent(tmp_path, monkeypatch, None, 2, env={}, peer_jobs="4242_[0:2-3]")
    assert h._op_executor.watch.peers == ("4242_0", "4242_2", "4242_3")
    # a job array's tasks by default, as for fsmingle run; none when the training fits in this job
    assert _agent(tmp_path, monkeypatch, None, 3)._op_executor.watch.peers == ("77_1", "77_2")
    assert not isinstance(_agent(tmp_path, monkeypatch, None, 1)._op_executor, queuehold.HoldingExecutor)
    for bad, match in [
        ({"peer_jobs": "4300:x"}, "'x' is not a job id"),
        ({"queue_poll": "0"}, "--rdzv-conf queue_poll="),
        ({"queue_timeout": "soon"}, "--rdzv-conf queue_timeout="),
    ]:
        with pytest.raises(ConfigError, match=match):
            _agent(tmp_path, monkeypatch, None, 2, **bad)


# --------------------------------------------------------------------------
# real torchrun agents in a real Slurm
# --------------------------------------------------------------------------

# One torchrun per array task, as a user writes it (the conf keys are this test's only tuning:
# join_timeout 10 s, the scheduler asked every second).
TORCHRUN_TASK = """#!/bin/bash
set -euo pipefail
(umask 077 && mkdir -p "$FSMINGLE_DIR")
exec timeout -k 10 "$RUN_TIMEOUT" torchrun --rdzv-backend fsmingle --rdzv-endpoint "$FSMINGLE_DIR" \\
    --rdzv-id "$SLURM_ARRAY_JOB_ID" --nnodes 2 --nproc-per-node 1 \\
    --rdzv-conf join_timeout=10,queue_poll=1 "$TRAIN" --steps 5
"""
JOIN_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def slurm(slurm_cluster_module):
    return slurm_cluster_module


def _held_torchrun_array(s) -> str:
    from helpers import slurm_job_env

    jid = s.sbatch(
        TORCHRUN_TASK,
        "--hold",
        "--array=0-1",
        f"--output={s.outdir}/slurm-%A_%a.out",
        env=slurm_job_env(s, 150),
    )
    s.scontrol("release", f"{jid}_0")
    return jid


def _waiting_on(s, jid: str) -> float:
    """Seconds until task 0's agent says it waits for the held task 1 (its log line)."""
    from helpers import wait_for

    t0 = time.monotonic()
    want = f"waiting for peer jobs in the scheduler's queue: missing: job {jid}_1 PENDING (JobHeldUser)"
    wait_for(lambda: want in task_output(s, jid, 0), 120, "task 0's agent waiting on the held task")
    return time.monotonic() - t0


@pytest.mark.root
@pytest.mark.slow
def test_torchrun_array_task_held_past_join_timeout_then_the_training_runs(slurm):
    jid = _held_torchrun_array(slurm)
    _waiting_on(slurm, jid)
    time.sleep(JOIN_TIMEOUT_S + 5 + 3)  # join_timeout, torch's 5 s rollback, and some
    assert job_state(slurm, f"{jid}_0") == "RUNNING", task_output(slurm, jid, 0)[-3000:]
    slurm.scontrol("release", f"{jid}_1")
    for task in (0, 1):
        assert wait_task_done(slurm, jid, task, 150) == "COMPLETED", task_output(slurm, jid, task)[-3000:]
    assert any("world_size=2 ranks_agree=True" in task_output(slurm, jid, t) for t in (0, 1))


@pytest.mark.root
@pytest.mark.slow
def test_torchrun_array_task_cancelled_while_held_fails_the_waiting_agent_at_once(slurm):
    jid = _held_torchrun_array(slurm)
    _waiting_on(slurm, jid)
    t0 = time.monotonic()
    r = slurm.login(["scancel", f"{jid}_1"], timeout=15)
    assert r.returncode == 0, r.stderr
    assert wait_task_done(slurm, jid, 0, 60) == "FAILED", task_output(slurm, jid, 0)[-3000:]
    print(f"task 0 failed {time.monotonic() - t0:.1f} s after scancel")
    text = task_output(slurm, jid, 0)
    assert f"PeerJobEndedError: rendezvous for job {jid} cannot complete: peer job {jid}_1 CANCELLED" in text, text[
        -3000:
    ]
