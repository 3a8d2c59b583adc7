"""Model-checking the rendezvous policy (fsmingle.protocol.Participant) on a stale in-memory filesystem.

The real policy code runs unchanged against :mod:`fakefs` (bounded stale reads,
negative caching, lagging listings, linearisable exclusive create, crashes in
the middle of store operations, corrupt files) and a fake clock.  A
``RuleBasedStateMachine`` interleaves joins, steps, crashes, restarts, time,
staleness and corruption, and checks after every action:

* every released participant got the same (master address, port, generation);
* no two live participants were released with one rank in one generation;
* a release never names a master that was dead when the release was written;
* nobody who left (timed out) is named in a release written after it left;
* exceptions are the documented ones, in their documented situations:
  RankConflictError only when the other holder is (recently) alive or was
  released; RendezvousTimeoutError only after the deadline; CorruptStateError
  only over a release the test corrupted;

and, at the end of every run (liveness), that once crashes stop, every slot has
a live participant and time passes, everyone is released within a bound.

Environment: ``FSMINGLE_MODEL_EXAMPLES`` (default 1000 runs of up to 60 actions,
about 30 s here); ``FSMINGLE_MODEL_KNOWN_BUGS=1`` lets the machine generate the
situations of the known bugs (see the ``test_bug_*`` tests) that it otherwise avoids.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, note, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fsmingle.errors import ConfigError, CorruptStateError, RankConflictError, RecordError, RendezvousTimeoutError
from fsmingle.protocol import (
    GEN_RE,
    RELEASE,
    Participant,
    Timing,
    claim_name,
    gen_name,
    release_name,
)
from fsmingle.records import Claim, HostId, Release, decode, encode
from fsmingle.store import PosixStore, Store

try:
    import fakefs
except ImportError:  # tests/ imported as a package
    from tests import fakefs

Crash, FakeClock, FakeFS, FakeStore = fakefs.Crash, fakefs.FakeClock, fakefs.FakeFS, fakefs.FakeStore

# Fast fake-time settings: liveness judged after 10 s, views lag at most a few seconds.
TIMING = Timing(poll_min=0.05, poll_max=1.0, backoff=1.6, jitter=0.1, stale_after=10.0,
                scan_interval=1.0, status_interval=30.0, probe_timeout=2.0)
LONG = 1e6  # a timeout that never fires
JOB = "job-model"


# ---------------------------------------------------------------------------------------------
# The simulated cluster: hosts, processes, oracles and invariants (used by the machine and the
# deterministic tests alike).


class FakeReservation:
    """The master port a process holds (``reserve_port``); the probe answers while it is open."""

    def __init__(self, world: "World", proc: "Proc", port: int):
        self.world, self.proc, self.port = world, proc, port
        self.closed = False

    def close(self) -> None:
        self.closed = True


@dataclass
class Host:
    key: int
    node: str
    addr: str
    boot_id: str
    clock: FakeClock
    store: FakeStore
    next_port: int = 40000


@dataclass
class Proc:
    """One simulated fsmingle process."""

    slot: int | None  # None: an intruder (a process with a duplicate explicit rank)
    host: Host
    hid: HostId
    instance: str
    p: Participant
    status: str = "running"  # running | done | crashed | exited
    died_at: float | None = None  # fake time it crashed or exited
    wake: float = 0.0  # when its next step is due (its own next_delay())
    last_step: float | None = None
    result: Release | None = None
    error: BaseException | None = None
    reservations: list = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.status in ("running", "done")


class World:
    """A job of ``size`` slots on a :class:`FakeFS`; every action re-checks the safety invariants.

    Args:
        size (int): world size (nnodes in node mode).
        mode (str): ``node`` (a host per slot) or ``rank`` (two slots per host).
        ranks (list[int | None]): each slot's requested rank (None: first-come).
        staleness (float): the most a view may lag.
        pidns (str): ``host``: processes of a host share a pid namespace (the
            local liveness check works); ``pod``: each has its own (liveness
            only from heartbeats).
        link (bool): exclusive create by ``link()`` (else ``O_EXCL``, torn on a crash).
        cleaner (bool): participants retire old decided generations.
        unreachable (set[int]): slots whose probes of the master get no answer.
        master_port (int | None): ``--port`` for everyone (None: any free port).
        timeout (float): participants' rendezvous timeout.
    """

    def __init__(self, size: int, *, mode: str = "node", ranks=None, staleness: float = 0.0, pidns: str = "host",
                 link: bool = True, cleaner: bool = True, unreachable=(), master_port: int | None = None,
                 timeout: float = LONG, timing: Timing = TIMING, initial_lag: float = 0.0):
        self.size, self.mode, self.pidns, self.timing = size, mode, pidns, timing
        self.ranks = list(ranks) if ranks is not None else [None] * size
        self.fs = FakeFS(staleness, link=link)
        self.use_cleaner, self.unreachable = cleaner, set(unreachable)
        self.master_port, self.timeout = master_port, timeout
        self.initial_lag = initial_lag  # fraction of the staleness bound new hosts' views lag by
        self.hosts: dict[int, Host] = {}
        self.slot_host: dict[int, int] = {s: (s if mode == "node" else s // 2) for s in range(size)}
        self.procs: list[Proc] = []
        self.by_instance: dict[str, Proc] = {}
        self.by_pid: dict[int, Proc] = {}
        self.releases: dict[int, Release] = {}  # generation -> authentic "released" decision (from the events)
        self.release_time: dict[int, float] = {}
        self.decided: dict[int, Release] = {}  # generation -> any authentic decision
        self.corrupted: set[str] = set()  # names a hostile writer replaced
        self.intruders = 0
        self.log: list[str] = []
        self._counter = 0
        self.fs.listeners.append(self._on_event)

    # ------------------------------------------------------------------ helpers
    def say(self, msg: str) -> None:
        self.log.append(f"t={self.fs.now:9.3f} {msg}")

    def host(self, key: int) -> Host:
        if key not in self.hosts:
            node = f"h{key}"
            self.hosts[key] = Host(
                key=key, node=node, addr=f"10.0.{key // 250}.{key % 250 + 1}", boot_id=f"boot-{key}",
                # monotonic clocks share no origin; wall clocks are minutes apart
                clock=FakeClock(self.fs, mono_offset=1000.0 * key + 17.25, skew=(-1) ** key * 150.0 * key),
                store=self.fs.view(node),
            )
            self.hosts[key].store.lag = self.initial_lag * self.fs.max_staleness
        return self.hosts[key]

    def new_host_key(self) -> int:
        return max([*self.hosts, *self.slot_host.values()]) + 1

    def running(self) -> list[Proc]:
        return [q for q in self.procs if q.status == "running"]

    def current(self, slot: int) -> Proc | None:
        mine = [q for q in self.procs if q.slot == slot]
        return mine[-1] if mine else None

    # ------------------------------------------------------------------ oracles
    def _local_alive(self, me: HostId, other: HostId) -> bool | None:
        if not me.same_pid_space(other):
            return None
        q = self.by_pid.get(other.pid)
        return q is not None and q.alive and q.hid.pid_start == other.pid_start

    def _probe_for(self, host: Host, slot: int | None):
        def probe(addr: str, port: int, instance: str, timeout: float) -> bool | None:
            if slot in self.unreachable:
                return None
            q = self.by_instance.get(instance)
            return bool(q is not None and q.alive and q.host.addr == addr
                        and any(r.port == port and not r.closed for r in q.reservations))
        return probe

    def _reserve_for(self, proc_ref: list):
        def reserve_port(port: int, instance: str):
            q: Proc = proc_ref[0]
            if port == 0:
                q.host.next_port += 1
                port = q.host.next_port
            else:
                for other in self.procs:
                    if other.alive and other.host.addr == q.host.addr and \
                            any(r.port == port and not r.closed for r in other.reservations):
                        raise ConfigError(f"--port {port} is already in use on this host")
            res = FakeReservation(self, q, port)
            q.reservations.append(res)
            return res
        return reserve_port

    def _cleaner_for(self, store: Store):
        # fsmingle.cleanup.locked_cleaner without the lease (one process acts at a time here)
        def cleaner(g: int) -> None:
            if g <= 2:
                return
            gens = sorted(int(m.group(1)) for m in map(GEN_RE.match, store.listdir("")) if m)
            for x in gens:
                if x < g - 1 and store.read(release_name(x)) is not None:
                    store.retire(gen_name(x))
        return cleaner

    # ------------------------------------------------------------------ processes
    def start(self, slot: int | None, *, rank: int | None = None, new_host: bool = False,
              timeout: float | None = None) -> Proc:
        """Start a process for ``slot`` (its requested rank), or an intruder with ``rank``."""
        if slot is not None:
            if new_host:
                self.slot_host[slot] = self.new_host_key()
            host = self.host(self.slot_host[slot])
            rank = self.ranks[slot]
        else:
            host = self.host(self.new_host_key())
            self.intruders += 1
        self._counter += 1
        pid = 1000 + self._counter
        pidns = "pid:[1]" if self.pidns == "host" else f"pid:[{pid}]"
        hid = HostId(hostname=host.node, boot_id=host.boot_id, pidns=pidns, pid=pid, pid_start=self.fs.now)
        instance = f"{self._counter:04x}{'ab' * 6}"
        ref: list = []
        p = Participant(
            host.store, job_id=JOB, mode=self.mode, size=self.size, rank=rank, addr=host.addr,
            instance=instance, me=hid, timeout=self.timeout if timeout is None else timeout, timing=self.timing,
            master_port=self.master_port, clock=host.clock, local_alive=self._local_alive,
            probe=self._probe_for(host, slot), reserve_port=self._reserve_for(ref),
            cleaner=self._cleaner_for(host.store) if self.use_cleaner else None,
            rng=random.Random(self._counter),
        )
        q = Proc(slot=slot, host=host, hid=hid, instance=instance, p=p, wake=self.fs.now)
        ref.append(q)
        self.procs.append(q)
        self.by_instance[instance] = q
        self.by_pid[pid] = q
        self.say(f"start {instance[:4]} slot={slot} rank={rank} host={host.node}")
        return q

    def _die(self, q: Proc, status: str) -> None:
        q.status, q.died_at = status, self.fs.now
        for r in q.reservations:
            r.closed = True  # the kernel closes a dead process's sockets

    def crash(self, q: Proc) -> None:
        assert q.status == "running"
        self.say(f"crash {q.instance[:4]} (state {q.p.state}, gen {q.p.gen}, rank {q.p.rank})")
        self._die(q, "crashed")

    def step(self, q: Proc, crash_at: int | None = None, after_effect: bool = False,
             preempt: tuple[int, "Proc"] | None = None) -> Release | None:
        """One ``Participant.step`` (as ``Participant.run`` would do it), then the invariants."""
        assert q.status == "running"
        p, store = q.p, q.host.store
        prev_step = q.last_step
        q.last_step = self.fs.now
        if crash_at is not None:
            store.arm_crash(crash_at, after_effect)
        if preempt is not None:
            k, other = preempt
            store.arm_hook(k, lambda: other.status == "running" and self.step(other))
        try:
            rel = p.step()
        except Crash as e:
            self.say(f"crash in step {q.instance[:4]}: {e}")
            self._die(q, "crashed")
            return None
        except AssertionError:
            raise  # an invariant checked inside a store operation
        except BaseException as e:  # what Participant.run() does, then the process exits
            store.disarm()
            q.error = e
            if p.state not in ("done", "failed") and not isinstance(e, RendezvousTimeoutError):
                p.withdraw(f"rank {p.rank} stopped ({e.__class__.__name__})")
            self.say(f"exit {q.instance[:4]}: {e.__class__.__name__}: {e}")
            self._die(q, "exited")
            self._check_exception(q, e, prev_step)
            return None
        finally:
            store.disarm()
        q.wake = self.fs.now + p.next_delay()
        if rel is not None:
            q.status, q.result = "done", rel
            self.say(f"released {q.instance[:4]} gen {rel.generation} rank {p.rank} master {rel.master_addr}:{rel.master_port}")
            self._check_released(q, rel)
        self.check()
        return rel

    def tick(self, dt: float, stop=None) -> None:
        """Let every running process run on its own schedule for ``dt`` fake seconds."""
        end = self.fs.now + dt
        while True:
            run = self.running()
            if stop is not None and stop():
                return
            if not run:
                break
            q = min(run, key=lambda x: (x.wake, x.instance))
            if q.wake > end:
                break
            self.fs.now = max(self.fs.now, q.wake)
            self.step(q)
        self.fs.now = max(self.fs.now, end)

    # ------------------------------------------------------------------ invariants
    def _on_event(self, ev) -> None:
        try:
            self._check_event(ev)
        except AssertionError:
            raise
        except Exception as e:  # a bug of the oracle itself must not pass for the protocol's
            raise AssertionError(f"oracle failed on {ev}: {e!r}") from e

    def _check_event(self, ev) -> None:
        if not ev.ok or fakefs.basename(ev.name) != RELEASE or ev.op not in ("create", "publish"):
            return
        assert ev.op == "create", f"a release was replaced: {ev}"
        try:
            rel = decode(ev.data, Release)
        except RecordError:
            return  # a torn O_EXCL create (crash between open and write): an empty release
        g = rel.generation
        assert ev.name == release_name(g), f"{ev.name} holds generation {g}"
        assert g not in self.decided, f"generation {g} decided twice"
        self.decided[g] = rel
        self.say(f"decision gen {g}: {rel.state} by {rel.writer[:4]} {rel.reason}")
        if rel.state != "released":
            return
        self.releases[g] = rel
        self.release_time[g] = ev.t
        master = self.by_instance[rel.members[0].instance]
        assert master.alive, (
            f"generation {g} released naming master {master.instance} ({master.host.node}), "
            f"which {master.status} at t={master.died_at} before the release was written (t={ev.t})")
        assert rel.master_addr == master.host.addr
        assert any(r.port == rel.master_port and not r.closed for r in master.reservations), \
            "the release names a port the master does not hold"
        for m in rel.members:
            q = self.by_instance[m.instance]
            assert q.status != "exited", (
                f"generation {g} released naming {m.instance} (rank {m.rank}), which had left "
                f"({q.error.__class__.__name__}) at t={q.died_at}")
            cname = claim_name(g, m.rank)
            if cname not in self.corrupted:
                claim = self.fs.current(cname)
                assert claim is not None and decode(claim, Claim).instance == m.instance, \
                    f"generation {g} released naming {m.instance} as rank {m.rank}, which it does not hold"

    def _check_released(self, q: Proc, rel: Release) -> None:
        assert rel.state == "released"
        truth = self.releases.get(rel.generation)
        assert truth == rel, f"{q.instance} released by a release that is not its generation's decision"
        assert rel.members[q.p.rank].instance == q.instance

    def _check_exception(self, q: Proc, e: BaseException, prev_step: float | None) -> None:
        p = q.p
        if isinstance(e, RendezvousTimeoutError):
            assert q.host.clock.monotonic() >= p.deadline, f"timeout before the deadline: {e}"
            # leaving must not be contradicted by a release naming us
            rel = self.releases.get(p.gen) if p.gen is not None else None
            assert rel is None or all(m.instance != q.instance for m in rel.members), (
                f"{q.instance} raised {e.__class__.__name__} although generation {p.gen} was released "
                f"with it as rank {[m.rank for m in rel.members if m.instance == q.instance]}: "
                "the others run without it")
            return
        if isinstance(e, RankConflictError):
            r = p.want_rank
            assert r is not None, "RankConflictError for a first-come participant"
            rel = self.releases.get(p.gen)
            if rel is not None and rel.members[r].instance != q.instance:
                return  # the rank was released to another process
            holder_inst = p.contest_holder  # the instance it judged (claims are read once, then cached)
            if holder_inst is None:
                holder_data = self.fs.current(claim_name(p.gen, r))
                assert holder_data is not None, f"rank {r} conflict without a claim: {e}"
                holder_inst = decode(holder_data, Claim).instance
            holder = self.by_instance.get(holder_inst)
            assert holder is not None, f"RankConflictError naming a forged holder {holder_inst}: {e}"
            assert holder is not q
            # "alive" means its heartbeat changed between our previous observation and now, so it
            # was alive after (previous step - staleness); or the local check said so just now.
            lower = (prev_step if prev_step is not None else self.fs.now) - self.fs.max_staleness
            assert holder.alive or holder.died_at > lower - 1e-9, (
                f"RankConflictError although the holder {holder.instance} of rank {r} "
                f"{holder.status} at t={holder.died_at}: {e}")
            return
        if isinstance(e, CorruptStateError) and p.gen is not None and release_name(p.gen) in self.corrupted:
            return
        if isinstance(e, ConfigError) and "already in use" in str(e) and (self.intruders or (
                None in self.ranks and 0 in self.ranks)):
            return  # an explicit --port rank 0 next to first-come processes of the same host
        raise AssertionError(f"unexpected {e.__class__.__name__} from {q.instance}: {e}") from e

    def check(self) -> None:
        done = [q for q in self.procs if q.result is not None]
        worlds = {(q.result.master_addr, q.result.master_port, q.result.generation) for q in done}
        assert len(worlds) <= 1, f"participants released into different worlds: {sorted(worlds)}"
        held = {}
        for q in done:
            if q.alive:
                key = (q.result.generation, q.p.rank)
                assert key not in held, f"two live participants released with rank {key[1]} of generation {key[0]}"
                held[key] = q

    # ------------------------------------------------------------------ liveness
    def released_any(self) -> bool:
        return bool(self.releases)

    def liveness_applies(self) -> str | None:
        """Why the liveness property is not checked for this run (None: it is)."""
        if self.corrupted and any(not fakefs.basename(n).startswith("beacon-") for n in self.corrupted):
            return "a claim or release was corrupted"
        if self.intruders:
            return "a duplicate explicit rank"
        explicit = [r for r in self.ranks if r is not None]
        if explicit and len(explicit) != self.size:
            return "explicit and first-come ranks mixed"
        if self.timeout < LONG:
            return "short timeouts"
        return None

    def bound(self) -> float:
        t = self.timing
        # detect the dead (stale_after + a heartbeat + visibility) in each generation that holds dead
        # claims, then join, claim and release (visibility twice, polls, a scan).
        per_gen = t.stale_after + 2 * t.heartbeat_period + 4 * self.fs.max_staleness + 4 * t.poll_max + 2
        dead = sum(1 for q in self.procs if not q.alive)
        return (1 + dead) * per_gen + 10

    def run_to_completion(self) -> float | None:
        """Stop crashing, start a process in every slot without a live one, let time pass; check liveness.

        Returns the fake seconds it took (None when the property does not apply)."""
        why = self.liveness_applies()
        if not self.released_any():
            for s in range(self.size):
                cur = self.current(s)
                if cur is None or not cur.alive:
                    self.start(s)
        if why is not None:
            self.say(f"liveness not checked: {why}")
            # Safety still: whoever is named in a release and alive must get it.
            self.tick(self.bound(), stop=lambda: not self.running())
            assert not self.waiting_named() or why == "a claim or release was corrupted", \
                f"named in a release but never released: {[q.instance for q in self.waiting_named()]}"
            return None
        start, bound = self.fs.now, self.bound()
        self.tick(bound, stop=lambda: self.released_any() and not self.waiting_named())
        assert self.released_any(), (
            f"not released within {bound:.0f} fake seconds with all {self.size} slots alive: "
            + ", ".join(f"{q.instance[:4]}(slot {q.slot}, {q.p.state}, gen {q.p.gen}, rank {q.p.rank})"
                        for q in self.running()))
        stuck = self.waiting_named()
        assert not stuck, f"named in a release but not released after {bound:.0f} s: {[q.instance for q in stuck]}"
        # A live participant left out of the release is legitimate only if the release named a
        # process that was already dead when it was written (undetectable before stale_after: the
        # world is released into a dead member, torch fails, the scheduler restarts the job).
        (g, rel), = self.releases.items()
        written = self.release_time[g]
        left_out = [q for q in self.running() if q.slot is not None]
        if left_out:
            dead = [m.instance for m in rel.members
                    if self.by_instance[m.instance].died_at is not None
                    and self.by_instance[m.instance].died_at <= written]
            assert dead, f"generation {g} was released without live {[q.instance for q in left_out]}"
            self.say(f"released into dead member(s) {dead}; {[q.instance for q in left_out]} left out")
        return self.fs.now - start

    def waiting_named(self) -> list[Proc]:
        named = {m.instance for rel in self.releases.values() for m in rel.members}
        return [q for q in self.running() if q.instance in named]


# ---------------------------------------------------------------------------------------------
# The state machine.

GARBAGE = [
    b"",
    b"\x00\xff\xfe garbage",
    b"{}",
    b"null",
    b'{"schema": 2, "kind": "claim", "rank": 0, "instance": "deadbeefdeadbeef"}',
    b'{"schema": 1, "kind": "beacon"',  # torn JSON
    encode(Claim(0, "deadbeefdeadbeef")),  # a valid record of the wrong kind (in a beacon/release)
]


class RendezvousMachine(RuleBasedStateMachine):
    """Interleavings of joins, steps, crashes, restarts, time, staleness and corruption."""

    def __init__(self):
        super().__init__()
        self.w: World | None = None

    @initialize(
        size=st.integers(2, 5),
        mode=st.sampled_from(["node", "rank"]),
        rank_policy=st.sampled_from(["explicit", "first", "first", "mixed"]),
        staleness=st.sampled_from([0.0, 1.0, 2.5]),
        pidns=st.sampled_from(["host", "pod"]),
        link=st.booleans(),
        cleaner=st.booleans(),
        unreachable=st.sets(st.integers(0, 4), max_size=2),
        fixed_port=st.booleans(),
        short_timeout=st.integers(0, 9),
        mixed_seed=st.integers(0, 31),
        joined=st.integers(0, 5),
        initial_lag=st.sampled_from([0.0, 0.5, 1.0]),
    )
    def setup(self, size, mode, rank_policy, staleness, pidns, link, cleaner, unreachable, fixed_port,
              short_timeout, mixed_seed, joined, initial_lag):
        if rank_policy == "explicit":
            ranks = list(range(size))
        elif rank_policy == "first":
            ranks = [None] * size
        else:
            ranks = [s if mixed_seed >> s & 1 else None for s in range(size)]
        if not KNOWN_BUGS:
            link = True  # bug 4 (torn O_EXCL release after a crash); remove when fixed
        self.w = World(size, mode=mode, ranks=ranks, staleness=staleness, pidns=pidns, link=link, cleaner=cleaner,
                       unreachable=unreachable, master_port=29500 if fixed_port else None,
                       timeout=40.0 if short_timeout == 0 else LONG, initial_lag=initial_lag)
        note(f"World(size={size}, mode={mode!r}, ranks={ranks}, staleness={staleness}, pidns={pidns!r}, "
             f"link={link}, cleaner={cleaner}, unreachable={unreachable}, fixed_port={fixed_port}, "
             f"timeout={self.w.timeout}, joined={joined})")
        for slot in range(min(joined, size)):
            self.w.start(slot)

    def teardown(self):
        if self.w is not None:
            try:
                self.w.run_to_completion()
                w = self.w
                event(f"generations decided: {min(len(w.decided), 4)}")
                event(f"released at all: {bool(w.releases)}")
                event(f"liveness: {w.liveness_applies() or 'checked'}")
                for q in w.procs:
                    if q.error is not None:
                        event(f"exit: {q.error.__class__.__name__}")
                event(f"rules: {getattr(self, 'n_rules', 0) // 10 * 10}+")
                event(f"processes: {len(w.procs)}")
                if any(q.status == 'crashed' for q in w.procs):
                    event("some crashed")
            finally:
                note("\n".join(self.w.log[-80:]))

    def _count(self):
        self.n_rules = getattr(self, "n_rules", 0) + 1

    def _slot(self, i: int) -> int:
        return i % self.w.size

    def _running_proc(self, i: int) -> Proc | None:
        run = self.w.running()
        return run[i % len(run)] if run else None

    def _first_step(self, q: Proc, crash_at: int | None) -> None:
        if crash_at is not None:
            self.w.step(q, crash_at=crash_at)
            if q.status == "running":
                self.w.crash(q)

    CRASH_AT = st.one_of(st.none(), st.none(), st.integers(0, 9))

    @rule(i=st.integers(0, 4), crash_at=CRASH_AT)
    def join(self, i, crash_at):
        """Start the first process of a slot (perhaps dying at its crash_at-th operation)."""
        s = self._slot(i)
        if self.w.current(s) is None:
            self._first_step(self.w.start(s), crash_at)

    @rule(i=st.integers(0, 4), new_host=st.booleans(), crash_at=CRASH_AT)
    def restart(self, i, new_host, crash_at):
        """Start a replacement (same requested rank) for a slot whose process died, before any release."""
        s = self._slot(i)
        cur = self.w.current(s)
        if cur is not None and not cur.alive and not self.w.released_any():
            self._first_step(self.w.start(s, new_host=new_host), crash_at)

    @rule(r=st.integers(0, 4))
    def intrude(self, r):
        """A process asks for an explicit rank some slot asks for too (a user error)."""
        if self.w.intruders < 1 and r % self.w.size in self.w.ranks:
            self.w.start(None, rank=r % self.w.size)

    @rule(i=st.integers(0, 15), n=st.integers(1, 4))
    def step(self, i, n):
        """Step one process now, out of its schedule (as a slow or early scheduler might)."""
        for _ in range(n):
            q = self._running_proc(i)
            if q is None:
                return
            self.w.step(q)

    @rule(dt=st.sampled_from([0.1, 0.5, 1.0, 3.0, 7.0]))
    def tick(self, dt):
        """Everyone runs on their own schedule for a while."""
        self.w.tick(dt)

    @rule(dt=st.sampled_from([0.05, 0.5, 2.0, 5.0, 11.0]))
    def advance(self, dt):
        """Time passes without anyone stepping (everyone stalled: GC, swapping, a stopped VM)."""
        self.w.fs.advance(dt)

    @rule(i=st.integers(0, 15))
    def crash(self, i):
        q = self._running_proc(i)
        if q is not None:
            self.w.crash(q)

    @rule(i=st.integers(0, 15), k=st.integers(0, 8), after_effect=st.booleans())
    def crash_in_step(self, i, k, after_effect):
        """The process dies at its k-th store operation of this step (before or after it takes effect)."""
        q = self._running_proc(i)
        if q is not None:
            self.w.step(q, crash_at=k, after_effect=after_effect)
            if q.status == "running":
                self.w.crash(q)  # it survived the step's operations; it dies right after

    @rule(i=st.integers(0, 15), j=st.integers(0, 15), k=st.integers(0, 8))
    def preempt(self, i, j, k):
        """Two processes truly concurrent: another one runs a step at the k-th store operation of this one."""
        q, other = self._running_proc(i), self._running_proc(j)
        if q is not None and other is not None and q is not other:
            self.w.step(q, preempt=(k, other))

    @rule(h=st.integers(0, 7), lag=st.sampled_from([0.0, 0.3, 1.0, 2.5]))
    def set_lag(self, h, lag):
        """A node's caches start answering late (up to the staleness bound)."""
        keys = sorted(self.w.hosts)
        if keys:
            self.w.hosts[keys[h % len(keys)]].store.lag = lag

    @rule(i=st.integers(0, 63), g=st.integers(0, len(GARBAGE) - 1), kinds=st.sampled_from(["beacon", "beacon", "any"]))
    def corrupt(self, i, g, kinds):
        """A hostile or broken writer replaces a record with garbage."""
        names = [n for n in self.w.fs.present_files()
                 if not fakefs.basename(n).startswith(".")
                 and (fakefs.basename(n).startswith("beacon-") or kinds == "any")]
        if names:
            n = names[i % len(names)]
            self.w.corrupted.add(n)
            self.w.say(f"corrupt {n}")
            self.w.fs.corrupt(n, GARBAGE[g])

    @invariant()
    def safe(self):
        self._count()
        if self.w is not None:
            self.w.check()


# Set FSMINGLE_MODEL_KNOWN_BUGS=1 to let the machine generate the situations of the known bugs below.
KNOWN_BUGS = bool(os.environ.get("FSMINGLE_MODEL_KNOWN_BUGS"))
MODEL_EXAMPLES = int(os.environ.get("FSMINGLE_MODEL_EXAMPLES", "1000"))

RendezvousMachine.TestCase.settings = settings(
    max_examples=MODEL_EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
TestRendezvousModel = RendezvousMachine.TestCase


# ---------------------------------------------------------------------------------------------
# Deterministic scenarios on the same fake filesystem.


def _released_same_world(w: World) -> Release:
    done = [q for q in w.procs if q.result is not None]
    assert done
    rels = {q.result for q in done}
    assert len(rels) == 1
    return rels.pop()


@pytest.mark.parametrize("mode", ["node", "rank"])
def test_four_nodes_under_staleness_release_one_world(mode):
    w = World(4, mode=mode, staleness=2.0)
    for s in range(4):
        w.start(s)
    for h in w.hosts.values():
        h.store.lag = 2.0
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert sorted(q.p.rank for q in w.procs) == [0, 1, 2, 3]
    assert rel.generation == 1 and took < 10


def test_explicit_ranks_with_staggered_arrivals():
    w = World(3, ranks=[2, 0, 1], staleness=1.0)
    for s in range(3):
        w.start(s)
        w.tick(5.0)
    w.run_to_completion()
    rel = _released_same_world(w)
    assert [m.instance for m in rel.members] == [w.current(s).instance for s in (1, 2, 0)]


def test_dead_master_is_voided_and_replaced():
    # rank 0 claims, then dies; the others find it dead (heartbeat stops) and regroup with its replacement
    w = World(3, ranks=[0, 1, 2], staleness=1.0, pidns="pod")
    w.start(0)
    w.tick(0.5)
    w.crash(w.current(0))
    w.start(1)
    w.start(2)
    w.tick(2.0)
    w.start(0, new_host=True)
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert rel.generation >= 2 and rel.members[0].instance == w.current(0).instance
    assert took < w.bound()


def test_duplicate_explicit_rank_fails_while_holder_alive():
    w = World(2, ranks=[0, 1], staleness=1.0, pidns="pod")
    a = w.start(0)
    w.tick(3.0)
    b = w.start(None, rank=0)
    w.tick(TIMING.stale_after)
    assert b.status == "exited" and isinstance(b.error, RankConflictError)
    assert a.status == "running" and a.p.rank == 0


def test_crash_in_every_operation_of_the_last_joiner():
    # the last participant dies at each of its store operations in turn; the world always recovers
    for k in range(12):
        for after in (False, True):
            w = World(3, ranks=[None] * 3, staleness=1.0, pidns="pod")
            w.start(0)
            w.start(1)
            w.tick(2.0)
            q = w.start(2)
            w.step(q, crash_at=k, after_effect=after)
            if q.status == "running":
                w.crash(q)
            w.tick(1.0)
            w.run_to_completion()


# ---------------------------------------------------------------------------------------------
# Known protocol bugs found by the model (strict xfail: they start passing when fixed; then also
# drop the matching KNOWN_BUGS guard in the machine).


def test_bug_first_come_port_race_on_one_host():
    # Per-rank mode, two first-come processes on one node, --port 29500.  A reserves the port and
    # is about to create rank-00000.claim; B lists the directory in between, sees rank 0 free and
    # tries to reserve the same port: ConfigError("--port 29500 is already in use on this host")
    # kills B, although rank 1 was free for it.
    w = World(2, mode="rank", master_port=29500)
    a, b = w.start(0), w.start(1)
    assert a.host is b.host
    w.step(a, preempt=(5, b))  # A: listdir root, mkdir, read release, publish beacon, listdir gen, reserve, [B], create
    assert b.error is None, f"B died: {b.error!r}"
    w.run_to_completion()


def test_bug_timeout_withdraw_misses_stale_release():
    # A (rank 0) waits alone; its node's lookup cache holds "release.json: absent".  B arrives,
    # completes the world, probes A (alive) and writes the release naming A as master.  A's
    # deadline passes before its cache expires: withdraw() tries to void, the exclusive create
    # fails (a decision exists!), the re-read still answers "absent" from the negative cache, and A
    # raises RendezvousTimeoutError ("all 2 node ranks were claimed but no release was written") --
    # while B is released into a world whose master has just exited.
    w = World(2, ranks=[0, 1], staleness=2.0, timeout=30.0)
    a = w.start(0)
    w.hosts[0].store.lag = 2.0
    w.tick(29.0)  # A polls release.json: absent (negatively cached from now on)
    b = w.start(1)
    w.step(b)  # B completes the world and writes the release
    assert 1 in w.releases
    w.fs.advance(1.5)  # A's deadline passes; the release is 1.5 s old, younger than A's cache
    for _ in range(40):  # fixed: A keeps reading the decision it cannot see yet, instead of leaving
        w.step(a)
        if a.status == "done":
            break
        w.fs.advance(0.1)
    assert a.status == "done"


def test_torn_claim_is_judged_and_voided():
    # Found by the model as bug 3 (fixed in 18abacf): on a filesystem without hard links
    # PosixStore.create falls back to O_EXCL + write.  B dies between the exclusive open and the
    # write of its first-come claim: rank-00001.claim stays empty.  Nobody could read who holds
    # rank 1, so nobody judged the holder and the generation hung until everyone's timeout.  Now
    # a claim unreadable for stale_after counts as a dead holder and the generation is voided.
    w = World(3, ranks=[None] * 3, link=False, pidns="pod")
    a = w.start(0)
    w.step(a)
    b = w.start(1)
    w.step(b, crash_at=5)  # listdir, mkdir, read release, publish beacon, listdir gen, [create claim]
    assert w.fs.current(claim_name(1, 1)) == b""
    w.run_to_completion()
    assert _released_same_world(w).generation == 2


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="bug 4: a torn release is fatal for everyone")
def test_bug_torn_release_is_fatal():
    # Same fallback; B completes the world and dies between the exclusive open and the write of
    # release.json.  The release stays empty: after stale_after every waiting participant raises
    # CorruptStateError ("remove it or run fsmingle clean"), although nobody was released in that
    # generation and regrouping in the next one (as joiners already do: they skip it) is safe.
    w = World(2, ranks=[0, 1], link=False, pidns="pod")
    a = w.start(0)
    w.step(a)
    b = w.start(1)
    w.step(b, crash_at=10)  # ... claim, beacon, check master (read claim 0, read beacon), list, [create release]
    assert w.fs.current(release_name(1)) == b""
    w.run_to_completion()  # fails: unexpected CorruptStateError from A


# ---------------------------------------------------------------------------------------------
# The Store contract, on the real and the fake implementation.


@pytest.fixture(params=["posix", "fake"])
def store(request, tmp_path):
    if request.param == "posix":
        return PosixStore(str(tmp_path))
    return FakeFS(max_staleness=0.0).view("n0")


def test_store_contract(store: Store):
    assert isinstance(store, Store)
    assert store.listdir("") == []
    assert store.listdir("nope") == []
    assert store.read("nope.json") is None
    assert store.mkdir("gen-00000001") is True
    assert store.mkdir("gen-00000001") is False
    assert store.listdir("") == ["gen-00000001"]
    assert store.listdir("gen-00000001") == []
    # publish: create or atomically replace
    store.publish("gen-00000001/beacon-a.json", b"one")
    assert store.read("gen-00000001/beacon-a.json") == b"one"
    store.publish("gen-00000001/beacon-a.json", b"two")
    assert store.read("gen-00000001/beacon-a.json") == b"two"
    # create: exclusive, the first content stays
    assert store.create("gen-00000001/rank-00000.claim", b"first") is True
    assert store.create("gen-00000001/rank-00000.claim", b"second") is False
    assert store.read("gen-00000001/rank-00000.claim") == b"first"
    # listdir: sorted, temporaries and other hidden names never shown
    assert store.listdir("gen-00000001") == ["beacon-a.json", "rank-00000.claim"]
    # a missing directory: writes raise FileNotFoundError (the protocol rejoins)
    with pytest.raises(FileNotFoundError):
        store.publish("gen-00000009/beacon-a.json", b"x")
    with pytest.raises(FileNotFoundError):
        store.create("gen-00000009/rank-00000.claim", b"x")
    # remove: absent is fine
    store.remove("gen-00000001/beacon-a.json")
    store.remove("gen-00000001/beacon-a.json")
    assert store.read("gen-00000001/beacon-a.json") is None
    assert store.listdir("gen-00000001") == ["rank-00000.claim"]
    # retire: the whole directory goes at once; a second retire finds nothing
    assert store.retire("gen-00000001") is True
    assert store.retire("gen-00000001") is False
    assert store.listdir("") == []
    assert store.read("gen-00000001/rank-00000.claim") is None
    assert store.listdir("gen-00000001") == []


def test_store_contract_hides_dot_names(tmp_path):
    posix = PosixStore(str(tmp_path))
    posix.mkdir("gen-00000001")
    (tmp_path / "gen-00000001" / ".tmp-x").write_bytes(b"partial")
    (tmp_path / "gen-00000001" / ".nfs0001").write_bytes(b"silly")
    assert posix.listdir("gen-00000001") == []
    fs = FakeFS()
    v = fs.view("n0")
    v.mkdir("gen-00000001")
    v.arm_crash(0)  # dies inside publish: only a hidden temporary is left
    with pytest.raises(Crash):
        v.publish("gen-00000001/beacon-a.json", b"x")
    assert v.listdir("gen-00000001") == [] and v.read("gen-00000001/beacon-a.json") is None
    assert [fakefs.basename(n) for n in fs.present_files("gen-00000001")] == [".tmp-n0-1"]


# ---------------------------------------------------------------------------------------------
# The fake filesystem's own staleness rules.


def test_fake_stale_reads_are_bounded_and_monotonic():
    fs = FakeFS(max_staleness=2.0)
    a, b = fs.view("a"), fs.view("b")
    b.lag = 2.0
    assert b.read("f") is None  # b caches "absent"
    a.publish("f", b"1")
    assert a.read("f") == b"1"  # read-your-writes
    assert b.read("f") is None  # negative dentry, younger than the lag
    assert fs.view("c").read("f") == b"1"  # a view that never looked sees it
    fs.advance(1.0)
    a.publish("f", b"2")
    assert b.read("f") is None
    fs.advance(1.0)
    assert b.read("f") == b"1"  # the version current 2 s ago
    fs.advance(1.0)
    assert b.read("f") == b"2"
    b.lag = 0.0
    assert b.read("f") == b"2"
    b.lag = 2.0
    assert b.read("f") == b"2"  # caches never go back
    b.lag = 99
    assert b.lag == 2.0  # clamped to the bound


def test_fake_listdir_lags_and_exclusive_create_is_linearisable():
    fs = FakeFS(max_staleness=1.0)
    a, b = fs.view("a"), fs.view("b")
    b.lag = 1.0
    a.mkdir("d")
    assert b.listdir("") == [] and b.mkdir("d") is False  # stale listing, but mkdir asks the truth
    assert b.listdir("") == ["d"]  # its own mkdir refreshed its listing
    assert b.create("d/x", b"b") is True and a.create("d/x", b"a") is False
    fs.advance(1.0)
    assert a.listdir("d") == ["x"]


def test_fake_clock_skew_and_sleep():
    fs = FakeFS()
    c1, c2 = FakeClock(fs, 5.0, 120.0), FakeClock(fs, -3.0, -120.0)
    m1, m2 = c1.monotonic(), c2.monotonic()
    c1.sleep(10)
    assert c1.monotonic() == m1  # sleeping advances nothing
    fs.advance(1.5)
    assert c1.monotonic() - m1 == c2.monotonic() - m2 == 1.5
    assert c1.time() - c2.time() == 240.0


def test_fake_o_excl_crash_leaves_empty_target():
    fs = FakeFS(link=False)
    v = fs.view("n")
    v.mkdir("g")
    v.arm_crash(0)
    with pytest.raises(Crash):
        v.create("g/rank-00000.claim", b"data")
    assert fs.current("g/rank-00000.claim") == b""
    assert fs.view("m").create("g/rank-00000.claim", b"other") is False
