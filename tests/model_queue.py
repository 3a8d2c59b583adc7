"""Issue 24 on the model: a fake scheduler (``squeue`` as :class:`fsmingle.protocol.queue.QueueWatch`
asks it) whose array tasks ``j_s`` are the world's slots, and the worlds the queue tests start from."""

from __future__ import annotations

from fsmingle.protocol.queue import ENDED, JobState, QueueWatch

try:
    from model_world import Proc, World
except ImportError:  # tests/ imported as a package
    from tests.model_world import Proc, World


class FakeScheduler:
    """Slot ``s`` is array task ``j_s``; ``states`` what squeue says (absent: RUNNING); ``calls`` who
    asked (``mine``) and when (fake seconds)."""

    def __init__(self, w_now, states=None, interval: float = 2.0):
        self.now, self.states, self.interval = w_now, dict(states or {}), interval
        self.calls: list[tuple[str, float]] = []
        self.raise_in: tuple | None = None  # (a QueueWatch.mine, a factory of what its next query raises)
        self.ever_ended = {j for j, st in self.states.items() if st in ENDED}

    def say(self, job: str, state: str) -> None:
        self.states[job] = state
        if state in ENDED:
            self.ever_ended.add(job)

    def watch(self, size: int, slot: int) -> QueueWatch:
        mine = f"j_{slot}"

        def query(ids, mine=mine):
            self.calls.append((mine, self.now()))
            if self.raise_in is not None and self.raise_in[0] == mine:
                make, self.raise_in = self.raise_in[1], None
                raise make(f"{mine}'s squeue call")
            return {i: JobState(i, self.states.get(i, "RUNNING"), "JobHeldUser") for i in ids}

        peers = tuple(f"j_{i}" for i in range(size))
        return QueueWatch(peers, mine, self.interval, None, ("j", 0), query=query, threaded=False)

    def askers(self, since: float = 0.0) -> set[str]:
        return {m for m, t in self.calls if t >= since}


def rank0_held(**kw) -> tuple[World, FakeScheduler]:
    """Ranks 1 and 2 of 3 waiting (timeout 30 s) while rank 0's job is PENDING."""
    w = World(3, ranks=[0, 1, 2], staleness=1.0, pidns="pod", timeout=30.0, **kw)
    w.scheduler = FakeScheduler(lambda: w.fs.now, {"j_0": "PENDING"})
    w.start(1)
    w.start(2)
    return w, w.scheduler


def asker_due_afresh(w: World) -> Proc:
    """Rank 1, the asker, about to take up asking as if new: its next step lists the generation,
    reads rank 2's beacon (its scheduler job), asks the scheduler, and writes its word."""
    from fsmingle.protocol.queue_relay import Relay

    one = w.current(1)
    assert one.p.queue.relay.asking
    relay = one.p.queue.relay = Relay()
    relay.gen = one.p.gen
    one.p.queue.next_query = 0.0
    one.wake = w.fs.now
    return one
