"""The event loop: virtual time, one local clock per participant, optional CPU cores."""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass, field

from fsmingle.fs.records import HostId

from ..opkinds import KINDS, fs_ops
from .mds import MDS, CostModel, SimFS, SimStore
from .net import SimNet, SimTransport, ping_messages

try:  # protocol v2 keeps Timing in fsmingle.protocol.participant; later versions may move it
    from fsmingle.protocol.participant import Participant, Timing
except ImportError:  # pragma: no cover
    from fsmingle.protocol.participant import Participant
    from fsmingle.protocol.timing import Timing

EPOCH = 1.7e9


class SimClock:
    """A participant's local clock (``monotonic``/``time``/``sleep`` of :class:`fsmingle.protocol.participant.Clock`)."""

    __slots__ = ("t",)

    def __init__(self, t: float):
        self.t = t

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return EPOCH + self.t

    def sleep(self, s: float) -> None:
        self.t += max(0.0, s)


@dataclass
class Config:
    """One simulated run.

    Attributes:
        n (int): participants (node mode, first-come ranks, one address each).
        cost (CostModel): the metadata server.
        net_latency (float): one-way message latency, seconds.
        arrival_spread (float): the N-1 early participants arrive uniformly in [0, spread] s.
        settle (float): virtual seconds between "rank 0 has every early member connected" and the
            last arrival (the steady state whose load is measured).
        cores (int): CPU cores shared by all participants; 0 = each participant has its own machine.
        cpu_scale (float): factor on the CPU time the policy code takes in this process.
        syscall_cost (float): CPU seconds per filesystem operation or message (kernel + I/O layer).
        timing (Timing): fsmingle's timing (defaults as the CLI's).
        horizon (float): give up after this much virtual time.
        seed (int): arrival times and jitter.
    """

    n: int
    cost: CostModel = field(default_factory=CostModel)
    net_latency: float = 0.0001
    arrival_spread: float = 2.0
    settle: float = 5.0
    cores: int = 0
    cpu_scale: float = 1.0
    syscall_cost: float = 0.0
    timing: Timing = field(default_factory=Timing)
    horizon: float = 3600.0
    seed: int = 1
    want_members: int = 0  # every k-th participant asks for the member list (env --format hostfile); 0: none
    check_lines: bool = False  # a message over wire.MAX_LINE loses its connection, as on the real channel


def run(cfg: Config) -> dict:
    """Simulate the last-arrival scenario once; returns the measurements (see ``__main__``)."""
    n = cfg.n
    rng = random.Random(cfg.seed)
    mds = MDS(cfg.cost)
    fs = SimFS(mds)
    clocks = [SimClock(0.0) for _ in range(n)]
    counts = [dict.fromkeys((*KINDS, "msgs_in", "msgs_out", "connects"), 0) for _ in range(n)]
    heap: list[tuple[float, int, int]] = []
    next_wake = [float("inf")] * n
    seq = [0]

    def wake(i: int, t: float) -> None:
        if t < next_wake[i]:
            next_wake[i] = t
            seq[0] += 1
            heapq.heappush(heap, (t, seq[0], i))

    net = SimNet(cfg.net_latency, clocks, counts, wake, check_lines=cfg.check_lines)
    parts: list = [None] * n
    arrive = sorted(rng.uniform(0, cfg.arrival_spread) for _ in range(n - 1))
    arrival = [*arrive, float("inf")]
    for i in range(n - 1):
        wake(i, arrival[i])
    released: dict[int, tuple[float, int]] = {}
    cores = [0.0] * cfg.cores
    heapq.heapify(cores)
    window: dict = {}
    steps = 0
    wall0 = time.process_time()
    rank0 = None
    last_scheduled = False

    def make(i: int, t: float):
        clocks[i].t = t
        return Participant(
            SimStore(fs, clocks[i], counts[i]),
            job_id="sim",
            mode="node",
            size=n,
            rank=None,
            addr=f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
            instance=f"{i + 1:016x}",
            me=HostId(hostname=f"h{i}", boot_id=f"b{i}", pidns="p", pid=1000 + i, pid_start=1.0),
            timeout=cfg.horizon,
            timing=cfg.timing,
            clock=clocks[i],
            transport=SimTransport(net, i),
            rng=random.Random(cfg.seed * 1_000_003 + i),
            want_members=bool(cfg.want_members) and i % cfg.want_members == 0,
        )

    while heap and len(released) < n:
        t, _, i = heapq.heappop(heap)
        if t != next_wake[i]:
            continue
        next_wake[i] = float("inf")
        if t > cfg.horizon:
            break
        c = clocks[i]
        if cores:
            start = max(t, heapq.heappop(cores))
        else:
            start = t
        if parts[i] is None:
            parts[i] = make(i, start)
        p = parts[i]
        c.t = max(c.t, start)
        before = fs_ops(counts[i]) + counts[i]["msgs_in"] + counts[i]["msgs_out"]
        cpu0 = time.thread_time()
        placement = p.step()
        cpu = (time.thread_time() - cpu0) * cpu_scale_of(cfg)
        steps += 1
        if cores:
            cpu += cfg.syscall_cost * (fs_ops(counts[i]) + counts[i]["msgs_in"] + counts[i]["msgs_out"] - before)
            c.t += cpu
            heapq.heappush(cores, start + cpu)
        if placement is not None:
            released[i] = (c.t, placement.rank)
            continue
        if p.rank == 0 and p.role is not None and hasattr(p.role, "rank_conn"):
            rank0 = i
            if not last_scheduled and len(p.role.rank_conn) >= n - 2:
                # Every early member is connected and verified: steady state, then the last arrival.
                last_scheduled = True
                t_ready = c.t
                t_last = t_ready + cfg.settle
                arrival[n - 1] = t_last
                wake(n - 1, t_last)
                window = {"t_ready": t_ready, "t_last": t_last, "before": [dict(x) for x in counts]}
        if window and "after" not in window and c.t >= window["t_last"]:
            window["after"] = [dict(x) for x in counts]
        # Messages that arrived after this step's poll (their wake-up was absorbed by an earlier
        # one) must wake it too.
        nxt = c.t + p.next_delay()
        role = p.role
        link = getattr(role, "link", None)
        if link is not None and not link.lost and not link.inbox and not getattr(role, "inbox", None):
            # A connected member wakes every ping interval to ping and to check rank 0's
            # silence; pings are not simulated (silent_for is 0 on an open link), so until a
            # message arrives (it wakes the member) only its timers can make a step do anything:
            # its beacon heartbeat, a repeated ask, the deadline.  Skipping the empty steps in
            # between changes no count and no time; it makes N = 131,072 fit in minutes.
            timers = [p.next_hb, p.deadline, getattr(role, "ask_again", None) or float("inf")]
            nxt = max(nxt, min(timers))
        for box in (getattr(p.hub, "inbox", None), getattr(getattr(p.role, "link", None), "inbox", None)):
            if box:
                nxt = min(nxt, max(c.t, min(t for t, _ in box)))
        wake(i, nxt)
    wall = time.process_time() - wall0
    out = _measure(cfg, n, counts, released, arrival, window, mds, steps, wall, rank0, parts)
    out["long_lines"] = net.long_lines
    if cfg.want_members:
        out["members_asked"] = sum(1 for p in parts if p is not None and p.want_members)
        out["members_ok"] = sum(1 for p in parts if p is not None and p.want_members and len(p.released_members) == n)
    return out


def cpu_scale_of(cfg: Config) -> float:
    return cfg.cpu_scale


def _measure(cfg, n, counts, released, arrival, window, mds, steps, wall, rank0, parts) -> dict:
    t_last = arrival[n - 1]
    done = len(released) == n
    per = [fs_ops(c) for c in counts]
    res = {
        "n": n,
        "completed": done,
        "released": len(released),
        "steps": steps,
        "sim_cpu_s": wall,
        "cost": vars(cfg.cost),
        "net_latency": cfg.net_latency,
        "cores": cfg.cores,
        "cpu_scale": cfg.cpu_scale,
        "syscall_cost": cfg.syscall_cost,
        "fs_ops_per_participant_mean": sum(per) / n,
        "fs_ops_max": max(per),
        "fs_ops_rank0": per[rank0] if rank0 is not None else None,
        "entries_per_participant_mean": sum(c["entries"] for c in counts) / n,
        "entries_rank0": counts[rank0]["entries"] if rank0 is not None else None,
        "per_kind_mean": {k: sum(c[k] for c in counts) / n for k in KINDS},
        "msgs_per_participant_mean": sum(c["msgs_in"] + c["msgs_out"] for c in counts) / n,
        "mds_ops": mds.ops,
        "mds_busy_s": mds.busy,
        "mds_peak_ops_per_s": max(mds.per_second.values()) if mds.per_second else 0,
        "generations": sorted({p.gen for p in parts if p is not None and p.gen is not None}),
    }
    if done:
        rel_times = [released[i][0] for i in range(n)]
        res["last_own_s"] = released[n - 1][0] - t_last
        res["last_all_s"] = max(rel_times) - t_last
        ranks = sorted(r for _, r in released.values())
        res["valid"] = ranks == list(range(n))
        res["time_to_ready_s"] = window.get("t_ready")
    if window.get("after"):
        secs = window["t_last"] - window["t_ready"]
        waiters = [i for i in range(n - 1) if i != rank0]
        b, a = window["before"], window["after"]
        rates = [(fs_ops(a[i]) - fs_ops(b[i])) / secs for i in waiters]
        res["waiter_fs_ops_per_s_mean"] = sum(rates) / len(rates) if rates else None
        res["rank0_fs_ops_per_s"] = (fs_ops(a[rank0]) - fs_ops(b[rank0])) / secs
        res["window_s"] = secs
        res["ping_msgs_per_s_at_rank0"] = ping_messages(n - 1, 1.0, cfg.timing.ping_interval)
    return res
