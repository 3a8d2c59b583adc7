"""The model's simulated cluster: hosts, processes and the :class:`World` that runs the real
:class:`fsmingle.protocol.participant.Participant` on :mod:`fakefs` and :mod:`fakenet` under a fake
clock, step by step, checking the oracles of :mod:`model_oracles` at every action.  Used by the
hypothesis machine (``test_model.py``), the deterministic scenarios (``test_model_*.py``) and the
exhaustive fault enumeration (``test_exhaustive.py``).
"""

from __future__ import annotations

import errno
import os
import random
from dataclasses import dataclass

from fsmingle.errors import (
    RendezvousTimeoutError,
    StorageError,
)
from fsmingle.fs.records import HostId, Release
from fsmingle.fs.store import Store
from fsmingle.protocol.cleanup import retire_decided_below
from fsmingle.protocol.decision import Placement
from fsmingle.protocol.participant import Participant, State, Timing

try:
    import fakefs
    import fakenet
except ImportError:  # tests/ imported as a package
    from tests import fakefs, fakenet

try:
    from model_oracles import JOB, LONG, TIMING, WorldOracles
except ImportError:  # tests/ imported as a package
    from tests.model_oracles import JOB, LONG, TIMING, WorldOracles

Crash, FakeClock, FakeFS, FakeStore = fakefs.Crash, fakefs.FakeClock, fakefs.FakeFS, fakefs.FakeStore
FakeNet = fakenet.FakeNet
# Set FSMINGLE_MODEL_KNOWN_BUGS=1 to let the machine generate the situations of the known bugs.
KNOWN_BUGS = bool(os.environ.get("FSMINGLE_MODEL_KNOWN_BUGS"))

# ---------------------------------------------------------------------------------------------
# The simulated cluster: hosts, processes, oracles and invariants (used by the machine and the
# deterministic tests alike).


@dataclass
class Host:
    key: int
    node: str
    addr: str
    boot_id: str
    clock: FakeClock
    store: FakeStore


@dataclass
class Proc:
    """One simulated fsmingle process."""

    slot: int | None  # None: an intruder (a process with a duplicate explicit rank)
    host: Host
    hid: HostId
    instance: str
    p: Participant | None = None
    status: str = "running"  # running | done | crashed | exited
    died_at: float | None = None  # fake time it crashed or exited
    died_seq: int | None = None  # the network's sequence number then
    wake: float = 0.0  # when its next step is due (its own next_delay(), or a message)
    last_step: float | None = None  # start of its last step that read the filesystem (not cut short by ENOENT)
    result: Placement | None = None
    error: BaseException | None = None
    interrupted: BaseException | None = None  # released although interrupted (its release stood)

    @property
    def alive(self) -> bool:
        return self.status in ("running", "done")


class World(WorldOracles):
    """A job of ``size`` slots on a :class:`FakeFS` and a :class:`FakeNet`; every action re-checks the invariants.

    Args:
        size (int): world size (nnodes in node mode).
        mode (str): ``node`` (a host per slot) or ``rank`` (two slots per host).
        ranks (list[int | None]): each slot's requested rank (None: first-come).
        sizes (list[int] | None): each slot's world size, where a test makes them disagree.
        staleness (float): the most a view may lag.
        pidns (str): ``host``: processes of a host share a pid namespace (the
            local liveness check works); ``pod``: each has its own (liveness
            only from heartbeats).
        cleaner (bool): participants retire old decided generations.
        partitioned (set[int]): slots whose hosts start behind a silent partition.
        master_port (int | None): ``--port`` for everyone (None: any free port).
        timeout (float): participants' rendezvous timeout.
        addrs (dict[int, str]): slots announcing an address other than their host's (``--addr``).
        rank_order (str): ``--rank-order`` (``host``: rank 0 may hand the master's place to a member).
        initial_lag (float): fraction of the staleness bound new hosts' views lag by.
        scheduler (FakeScheduler | None): every slot is a job of it (issue 24: peer jobs pending in
            its queue hold the timeout; one that ended fails everyone, PeerJobEndedError).
    """

    def __init__(
        self,
        size: int,
        *,
        mode: str = "node",
        ranks=None,
        sizes=None,
        staleness: float = 0.0,
        pidns: str = "host",
        cleaner: bool = True,
        partitioned=(),
        master_port: int | None = None,
        timeout: float = LONG,
        timing: Timing = TIMING,
        initial_lag: float = 0.0,
        addrs=None,
        rank_order: str = "arrival",
        scheduler=None,
    ):
        self.size, self.mode, self.pidns, self.timing = size, mode, pidns, timing
        self.scheduler = scheduler
        self.ranks = list(ranks) if ranks is not None else [None] * size
        self.sizes = list(sizes) if sizes is not None else [size] * size
        self.fs = FakeFS(staleness)
        self.net = FakeNet(lambda: self.fs.now, self.fs.advance, on_wake=self._wake)
        self.use_cleaner = cleaner
        self.partitioned_slots = set(partitioned)
        self.master_port, self.timeout = master_port, timeout
        self.initial_lag = initial_lag
        self.addrs = dict(addrs or {})
        self.rank_order = rank_order
        self.hosts: dict[int, Host] = {}
        self.slot_host: dict[int, int] = {s: (s if mode == "node" else s // 2) for s in range(size)}
        self.procs: list[Proc] = []
        self.by_instance: dict[str, Proc] = {}
        self.by_pid: dict[int, Proc] = {}
        self.releases: dict[int, Release] = {}  # generation -> authentic "released" decision (from the events)
        self.release_time: dict[int, float] = {}
        self.decided: dict[int, Release] = {}  # generation -> any authentic decision
        self.retired: dict[int, float] = {}  # generation -> when its directory was last retired
        self.release_time_any: dict[int, float] = {}  # generation -> when its last decision was created
        self.left: dict[str, set[int]] = {}  # instance -> generations it left (rejoined elsewhere, or exited)
        self.corrupted: set[str] = set()  # names a hostile writer replaced
        self.intruders = 0
        self.spins = 0  # zero-delay retries after ENOENT (bug 7)
        self.log: list[str] = []
        self._counter = 0
        self.injected: list[BaseException] = []  # exceptions the test raised inside processes
        self.released_with_error: list[str] = []  # released (its release stood), then exited with an error
        self.fs.listeners.append(self._on_event)
        self.net.on_send = self._on_send

    # ------------------------------------------------------------------ helpers
    def say(self, msg: str) -> None:
        self.log.append(f"t={self.fs.now:9.3f} {msg}")

    def host(self, key: int) -> Host:
        if key not in self.hosts:
            node = f"h{key}"
            self.hosts[key] = Host(
                key=key,
                node=node,
                addr=f"10.0.{key // 250}.{key % 250 + 1}",
                boot_id=f"boot-{key}",
                # monotonic clocks share no origin; wall clocks are minutes apart
                clock=FakeClock(self.fs, mono_offset=1000.0 * key + 17.25, skew=(-1) ** key * 150.0 * key),
                store=self.fs.view(node),
            )
            self.hosts[key].store.lag = self.initial_lag * self.fs.max_staleness
            self.net.add_host(key, self.hosts[key].addr)
        return self.hosts[key]

    def new_host_key(self) -> int:
        return max([*self.hosts, *self.slot_host.values()]) + 1

    def running(self) -> list[Proc]:
        return [q for q in self.procs if q.status == "running"]

    def current(self, slot: int) -> Proc | None:
        mine = [q for q in self.procs if q.slot == slot]
        return mine[-1] if mine else None

    def rank0(self) -> Proc | None:
        holders = [q for q in self.running() if q.p.rank == 0 and q.p.state is State.WAIT]
        return holders[-1] if holders else None

    def _wake(self, owner: str) -> None:
        # Participant.wait() returns early when a message arrives on the channel.
        q = self.by_instance.get(owner)
        if q is not None and q.status == "running":
            q.wake = min(q.wake, self.fs.now)

    # ------------------------------------------------------------------ injected exceptions
    def exc_factory(self, kind: str):
        """A factory of the exception ``kind`` (``interrupt``: SIGTERM in ``fsmingle run``;
        ``storage``: a StorageError with EIO, as PosixStore raises; ``oserror``: a bare OSError(EIO)),
        each instance remembered so the oracles know the test raised it."""

        def make(what: str) -> BaseException:
            if kind == "interrupt":
                e: BaseException = KeyboardInterrupt(f"SIGTERM in {what}")
            elif kind == "storage":
                e = StorageError(f"injected EIO in {what}")
                e.errno = errno.EIO
            else:
                e = OSError(errno.EIO, f"injected EIO in {what}")
            self.injected.append(e)
            return e

        return make

    def is_injected(self, e: BaseException | None) -> bool:
        seen = set()
        while e is not None and id(e) not in seen:
            if any(e is x for x in self.injected) or any(
                e is x for h in self.hosts.values() for x in h.store.io_raised
            ):
                return True
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return False

    # ------------------------------------------------------------------ oracles
    def _local_alive(self, me: HostId, other: HostId) -> bool | None:
        if not me.same_pid_space(other):
            return None
        q = self.by_pid.get(other.pid)
        return q is not None and q.alive and q.hid.pid_start == other.pid_start

    def _cleaner_for(self, store: Store):
        # fsmingle.protocol.cleanup.locked_cleaner without the lease (one process acts at a time here)
        def cleaner(g: int) -> None:
            retire_decided_below(store, g)

        return cleaner

    # ------------------------------------------------------------------ processes
    def start(
        self,
        slot: int | None,
        *,
        rank: int | None = None,
        new_host: bool = False,
        timeout: float | None = None,
        spare_timeout: float | None = None,
    ) -> Proc:
        """Start a process for ``slot`` (its requested rank), or an intruder with ``rank`` (a
        first-come one, ``rank`` None: a spare when the world is full or released)."""
        size = self.size
        if slot is not None:
            if new_host:
                self.slot_host[slot] = self.new_host_key()
            host = self.host(self.slot_host[slot])
            rank = self.ranks[slot]
            size = self.sizes[slot]
            if slot in self.partitioned_slots:
                self.net.partition(host.key)
        else:
            host = self.host(self.new_host_key())
            self.intruders += 1
        self._counter += 1
        pid = 1000 + self._counter
        pidns = "pid:[1]" if self.pidns == "host" else f"pid:[{pid}]"
        hid = HostId(hostname=host.node, boot_id=host.boot_id, pidns=pidns, pid=pid, pid_start=self.fs.now)
        instance = f"{self._counter:04x}{'ab' * 6}"
        q = Proc(slot=slot, host=host, hid=hid, instance=instance, wake=self.fs.now)
        q.p = Participant(
            host.store,
            job_id=JOB,
            mode=self.mode,
            size=size,
            rank=rank,
            addr=self.addrs.get(slot, host.addr),
            instance=instance,
            me=hid,
            timeout=self.timeout if timeout is None else timeout,
            timing=self.timing,
            master_port=self.master_port,
            clock=host.clock,
            local_alive=self._local_alive,
            transport=self.net.transport(host.key, instance, self.timing.ping_interval),
            cleaner=self._cleaner_for(host.store) if self.use_cleaner else None,
            rng=random.Random(self._counter),
            rank_order=self.rank_order,
            spare_timeout=spare_timeout,
            queue=self.scheduler.watch(self.size, slot) if self.scheduler is not None else None,
            # Its scheduler job, as Slurm's variables give it (the asker counts the jobs present by it).
            scheduler=(("array_job", "j"), ("array_task", str(slot))) if self.scheduler is not None else (),
        )
        self.procs.append(q)
        self.by_instance[instance] = q
        self.by_pid[pid] = q
        self.say(f"start {instance[:4]} slot={slot} rank={rank} size={size} host={host.node}")
        return q

    def _die(self, q: Proc, status: str) -> None:
        q.status, q.died_at, q.died_seq = status, self.fs.now, self.net.tick_seq()
        self.net.kill(q.instance)  # the kernel closes a dead process's sockets

    def crash(self, q: Proc) -> None:
        assert q.status == "running"
        self.say(f"crash {q.instance[:4]} (state {q.p.state.value}, gen {q.p.gen}, rank {q.p.rank})")
        self._die(q, "crashed")

    def stall(self, q: Proc, seconds: float) -> None:
        """``q`` does not step for ``seconds`` (busy, swapping, stopped) while everyone else runs."""
        q.wake = self.fs.now + seconds
        self.say(f"stall {q.instance[:4]} for {seconds:g} s")

    def step(
        self,
        q: Proc,
        crash_at: int | None = None,
        after_effect: bool = False,
        preempt: tuple[int, Proc] | None = None,
        fault: tuple[str, int, str] | None = None,
    ) -> Placement | None:
        """One ``Participant.step`` (as ``Participant.run`` would do it), then the invariants.

        ``fault``: ``(where, k, kind)`` -- an exception of ``kind`` (:meth:`exc_factory`) raised inside
        the process at its k-th ``store`` operation or k-th ``net`` call (send or poll) of this step,
        before or after it takes effect (``after_effect``)."""
        assert q.status == "running"
        p, store = q.p, q.host.store
        prev_step = q.last_step
        started = self.fs.now
        gen_before = p.gen
        if fault is not None:
            where, k, kind = fault
            if where == "store":
                store.arm_crash(k, after_effect, exc=self.exc_factory(kind))
            else:
                self.net.arm_fault(q.instance, k, self.exc_factory(kind), after_effect)
        if crash_at is not None:
            store.arm_crash(crash_at, after_effect)
        if preempt is not None:
            k, other = preempt
            store.arm_hook(k, lambda: other.status == "running" and self.step(other))
        try:
            pl = p.step()
        except Crash as e:
            self.say(f"crash in step {q.instance[:4]}: {e}")
            self._die(q, "crashed")
            return None
        except AssertionError:
            raise  # an invariant checked inside a store operation
        except BaseException as e:
            # Participant.run's `except BaseException`: withdraw(); a placement it finds there is
            # returned whatever the exception (the release stands: the commit window).
            store.disarm()
            self.net.disarm(q.instance)
            pl = None
            if p.state not in (State.DONE, State.FAILED) and not isinstance(e, RendezvousTimeoutError):
                pl = p.withdraw(f"rank {p.rank} stopped ({e.__class__.__name__})")
            if pl is not None:
                q.interrupted = e
                self.say(f"{e.__class__.__name__} in {q.instance[:4]} ({e}), but its release stood")
                self._note_left(q, gen_before)
                q.status, q.result = "done", pl
                self.say(
                    f"released {q.instance[:4]} gen {pl.generation} rank {pl.rank} master "
                    f"{pl.master_addr}:{pl.master_port} (after {e.__class__.__name__})"
                )
                self._check_released(q, pl)
                self.check()
                return pl
            q.error = e
            self.say(f"exit {q.instance[:4]}: {e.__class__.__name__}: {e}")
            if p.in_doubt:
                # Could not read its decision after acknowledging (or attempting) the release: it
                # did not withdraw (exit 143, or the error) -- to the others, a death in the window.
                self.say(f"{q.instance[:4]} exits in doubt about generation {p.gen}")
                self._die(q, "crashed")
                self._check_exception(q, e, prev_step)
                return None
            self._die(q, "exited")
            self._note_left(q, gen_before)
            self._check_exception(q, e, prev_step)
            return None
        finally:
            store.disarm()
            self.net.disarm(q.instance)
        self._note_left(q, gen_before)
        if p._enoent_since is None:
            q.last_step = started
        delay = p.next_delay()
        if delay == 0 and p._enoent_since is not None and p.deadline > p.clock.monotonic():
            # bug 7 (fixed): a member retrying after ENOENT asked for no delay at all (a busy loop of
            # failing heartbeats for as long as the cache lies).  Counted; the run fails on it.
            # No delay at the deadline is no spin: the next step times out (next_delay caps the
            # wait at the deadline; found by the machine with a 40 s --timeout and a blind cache).
            self.spins += 1
            delay = self.timing.poll_min
        assert KNOWN_BUGS or not self.spins, f"{q.instance} retries after ENOENT with no delay (bug 7)"
        q.wake = self.fs.now + delay
        if pl is not None:
            q.status, q.result = "done", pl
            self.say(
                f"released {q.instance[:4]} gen {pl.generation} rank {pl.rank} master {pl.master_addr}:{pl.master_port}"
            )
            self._check_released(q, pl)
        self.check()
        return pl

    def tick(self, dt: float, stop=None) -> None:
        """Let every running process run on its own schedule for ``dt`` fake seconds."""
        end = self.fs.now + dt
        same, last_now = 0, None
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
            same = same + 1 if self.fs.now == last_now else 0
            last_now = self.fs.now
            if same > 1990:
                self.say(
                    f"livelock step {q.instance[:4]} {q.p.state.value} rank {q.p.rank} role "
                    f"{type(q.p.role).__name__} note {q.p.note[:80]!r}"
                )
            assert same < 2000, (
                "livelock: 2000 steps without time passing: "
                + ", ".join(
                    f"{x.instance[:4]}({x.p.state.value}, gen {x.p.gen}, rank {x.p.rank}, wake {x.wake})" for x in run
                )
                + "\n"
                + "\n".join(self.log[-30:])
            )
            self.step(q)
        self.fs.now = max(self.fs.now, end)


def _released_same_world(w: World) -> Release:
    """The one generation everyone released was released into (asserting there is one)."""
    done = [q for q in w.procs if q.result is not None]
    assert done
    gens = {q.result.generation for q in done}
    assert len(gens) == 1
    return w.releases[gens.pop()]


def _count_calls(monkeypatch, cls, name: str) -> list:
    """Spy on ``cls.name``: the list of each call's positional arguments (``monkeypatch`` undoes it)."""
    calls: list = []
    orig = getattr(cls, name)

    def spy(self, *a, **k):
        calls.append(a)
        return orig(self, *a, **k)

    monkeypatch.setattr(cls, name, spy)
    return calls
