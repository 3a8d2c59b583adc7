"""Model-checking protocol v2 (fsmingle.rendezvous.participant.Participant) on a stale in-memory filesystem and a fake network.

The real policy code -- :mod:`fsmingle.rendezvous.participant`, :mod:`fsmingle.rendezvous.rank0.coordinator`,
:mod:`fsmingle.rendezvous.member`, :mod:`fsmingle.rendezvous.decision` -- runs unchanged against
:mod:`fakefs` (bounded stale reads, negative caches of any length, spurious
``ENOENT``, lagging listings, linearisable exclusive create with lost replies,
crashes in the middle of store operations, corrupt files), :mod:`fakenet`
(connections, pings, refused and unanswered connects, silent partitions,
resets, dead processes' sockets closing) and a fake clock.  A
``RuleBasedStateMachine`` interleaves joins, steps, crashes, restarts, time,
staleness, caches, partitions, resets and corruption, and checks (issue 11):

* never two released instances of one rank;
* every member of a released world was alive, connected to its master and had
  acknowledged the release when ``release.json`` was created (or its death or
  loss was not observable by rank 0 yet: a partition held its FIN, or it
  happened after rank 0's last look at its connections);
* no release of a world containing a participant that had left the generation
  (rejoined another, or exited);
* everyone released agrees on (master address, port, generation), and each
  placement is what :func:`fsmingle.rendezvous.decision.placements` gives for that
  generation's authentic decision;
* exceptions are the documented ones, in their documented situations:
  RankConflictError only when the other holder is (recently) alive or was
  released; RendezvousTimeoutError only after the deadline; CorruptStateError
  only over a release the test corrupted; WorldSizeMismatchError only where the
  test gave participants different sizes; ConfigError ("port in use") only for
  an explicit --port shared by first-come processes of one host;

and, at the end of every run (liveness), that once faults stop (crashes,
partitions, lost replies; negative cache entries expire), every slot has a
live participant and time passes, everyone is released within a bound.

Environment: ``FSMINGLE_MODEL_EXAMPLES`` (default 400 runs of up to 60 actions,
about a minute on this 2-core machine); ``FSMINGLE_MODEL_KNOWN_BUGS=1`` lets the
machine generate the situations of the known bugs (see the ``test_bug_*`` tests)
that it otherwise avoids.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import random
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fsmingle.errors import (
    ConfigError,
    CorruptStateError,
    PeerJobEndedError,
    RankConflictError,
    RendezvousTimeoutError,
    StorageError,
    WorldSizeMismatchError,
)
from fsmingle.fs.layout import (
    GEN_RE,
    RELEASE,
    claim_name,
    gen_name,
    master_dir,
    release_name,
)
from fsmingle.fs.records import Claim, HostId, Release, decode, encode
from fsmingle.fs.store import PosixStore, Store
from fsmingle.rendezvous.cleanup import retire_decided_below
from fsmingle.rendezvous.decision import Placement, placements
from fsmingle.rendezvous.joining import RETIRED_NUMBER
from fsmingle.rendezvous.participant import Participant, State, Timing
from fsmingle.rendezvous.queue import ENDED, JobState, QueueWatch

try:
    import fakefs
    import fakenet
except ImportError:  # tests/ imported as a package
    from tests import fakefs, fakenet

Crash, FakeClock, FakeFS, FakeStore = fakefs.Crash, fakefs.FakeClock, fakefs.FakeFS, fakefs.FakeStore
FakeNet = fakenet.FakeNet

# Fast fake-time settings: liveness judged after 10 s, views lag at most a few seconds.
TIMING = Timing(
    poll_min=0.05,
    poll_max=1.0,
    backoff=1.6,
    jitter=0.1,
    stale_after=10.0,
    scan_interval=1.0,
    status_interval=30.0,
    probe_timeout=2.0,
)
LONG = 1e6  # a timeout that never fires
JOB = "job-model"
GLUSTER_NEG = 61.0  # seconds a looked-up-too-early name stays ENOENT on a GlusterFS nl-cache client (measured)


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


class World:
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

    def _on_send(self, pipe, direction: int, msg: dict) -> None:
        # Issue 21: once release.json of g says "released", nobody says "void" for g on the wire.
        if msg.get("t") != "void" or direction != fakenet.TO_LINK:
            return
        q = self.by_instance.get(pipe.hub.owner)
        g = q.p.gen if q is not None and q.p is not None else None
        rel = self.releases.get(g)
        assert rel is None or release_name(g) in self.corrupted, (
            f"{pipe.hub.owner} sent 'void' ({msg.get('why')!r}) to {pipe.link.owner} for generation {g}, "
            f"whose release.json says released (writer {rel.writer})"
        )

    # ------------------------------------------------------------------ oracles
    def _local_alive(self, me: HostId, other: HostId) -> bool | None:
        if not me.same_pid_space(other):
            return None
        q = self.by_pid.get(other.pid)
        return q is not None and q.alive and q.hid.pid_start == other.pid_start

    def _cleaner_for(self, store: Store):
        # fsmingle.rendezvous.cleanup.locked_cleaner without the lease (one process acts at a time here)
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

    def _note_left(self, q: Proc, gen_before: int | None) -> None:
        p = q.p
        if gen_before is not None and (p.gen != gen_before or q.status == "exited"):
            self.left.setdefault(q.instance, set()).add(gen_before)
            rel = self.releases.get(gen_before)
            assert (
                rel is None
                or release_name(gen_before) in self.corrupted
                or all(m.instance != q.instance for m in rel.members)
            ), (
                f"{q.instance} left generation {gen_before} although its release names it as rank "
                f"{[m.rank for m in rel.members if m.instance == q.instance]}: the others start without it"
            )
            if p.gen != gen_before:
                self.say(f"{q.instance[:4]} left generation {gen_before} for {p.gen}")
        if p.left:
            self.left.setdefault(q.instance, set()).update(range(1, p.left + 1))
            for g, rel in self.releases.items():
                assert (
                    g > p.left
                    or q.result is not None
                    or release_name(g) in self.corrupted
                    or all(m.instance != q.instance for m in rel.members)
                ), (
                    f"{q.instance} left generation {g} (rejoined, state {p.state.value}) although its release "
                    f"names it as rank {[m.rank for m in rel.members if m.instance == q.instance]}"
                )

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
        if delay == 0 and p._enoent_since is not None:
            # bug 7 (fixed): a member retrying after ENOENT asked for no delay at all (a busy loop of
            # failing heartbeats for as long as the cache lies).  Counted; the run fails on it.
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

    # ------------------------------------------------------------------ invariants
    def _on_event(self, ev) -> None:
        try:
            self._check_event(ev)
        except AssertionError:
            raise
        except Exception as e:  # a bug of the oracle itself must not pass for the protocol's
            raise AssertionError(f"oracle failed on {ev}: {e!r}") from e

    def _check_event(self, ev) -> None:
        if ev.ok and ev.op == "retire" and GEN_RE.match(ev.name):
            self.retired[int(GEN_RE.match(ev.name).group(1))] = ev.t
        if not ev.ok or fakefs.basename(ev.name) != RELEASE or ev.op not in ("create", "publish"):
            return
        assert ev.op == "create", f"a release was replaced: {ev}"
        rel = decode(ev.data, Release)  # only the protocol writes through create, and always a whole record
        g = rel.generation
        assert ev.name == release_name(g), f"{ev.name} holds generation {g}"
        if g in self.decided and self.retired.get(g, -1) >= self.release_time_any.get(g, 0):
            # The number of a retired generation, re-created from a stale listing: only ever marked
            # decided again as a restart (generation names are never reused for a release).
            assert rel.state == "restart", f"generation {g} was retired, re-created and released: {rel.reason}"
            self.say(f"re-created generation {g} marked: {rel.reason}")
            self.release_time_any[g] = ev.t
            return
        assert g not in self.decided, f"generation {g} decided twice"
        self.release_time_any[g] = ev.t
        self.decided[g] = rel
        self.say(f"decision gen {g}: {rel.state} by {rel.writer[:4]} {rel.reason}")
        if rel.state != "released":
            return
        self.releases[g] = rel
        self.release_time[g] = ev.t
        assert len(rel.members) == rel.size and [m.rank for m in rel.members] == list(range(rel.size))
        master = self.by_instance[rel.members[0].instance]
        writer = self.by_instance[rel.writer]  # the coordinator: claim rank 0 (with --rank-order, maybe not the master)
        for q, what in ((master, "master"), (writer, "coordinator")):
            assert q.alive, (
                f"generation {g} released naming {what} {q.instance} ({q.host.node}), "
                f"which {q.status} at t={q.died_at} before the release was written (t={ev.t})"
            )
        assert writer.p.rank == 0 and writer.p.gen == g, "a release written by a participant not rank 0 of it"
        assert rel.master_addr == master.p.addr
        port_hub = self.net.hubs.get((master.host.key, rel.master_port))
        assert port_hub is not None and port_hub.owner == master.instance and not port_hub.closed, (
            "the release names a port the master does not hold"
        )
        hub = writer.p.hub
        held = set()
        for m in rel.members:
            q = self.by_instance[m.instance]
            assert q.status != "exited", (
                f"generation {g} released naming {m.instance} (rank {m.rank}), which had left "
                f"({q.error.__class__.__name__}) at t={q.died_at}"
            )
            assert g not in self.left.get(m.instance, ()), (
                f"generation {g} released naming {m.instance} (rank {m.rank}), which had left the generation"
            )
            claims = [n for n in self.fs.present_files(gen_name(g)) if n.endswith(".claim")]
            mine = [
                n
                for n in claims
                if n not in self.corrupted and decode(self.fs.current(n), Claim).instance == m.instance
            ]
            assert mine or any(n in self.corrupted for n in claims), (
                f"generation {g} released naming {m.instance} as rank {m.rank}, which holds no claim in it"
            )
            assert len(mine) <= 1, f"{m.instance} holds {len(mine)} claims in generation {g}"
            held.update(mine)
            if q is writer:
                continue
            # Alive, connected to rank 0 and acknowledged -- or its loss not observable by rank 0 yet.
            pipes = [pp for pp in self.net.pipes if pp.hub is hub and pp.link.owner == m.instance and g in pp.acked]
            assert pipes, (
                f"generation {g} released naming rank {m.rank} ({m.instance}), which never acknowledged "
                "the release on a connection to rank 0"
            )
            pp = pipes[-1]
            unseen = hub.last_poll_seq
            assert not pp.hub_lost or (pp.lost_seq or -1) > unseen, (
                f"generation {g} released although rank 0 had seen rank {m.rank}'s connection lost"
            )
            assert q.alive or q.died_seq > unseen or self.net.blocked(pp), (
                f"generation {g} released naming rank {m.rank} ({m.instance}), which {q.status} at t={q.died_at} "
                "where rank 0 could see it"
            )

    def _check_released(self, q: Proc, pl: Placement) -> None:
        truth = self.releases.get(pl.generation)
        assert truth is not None, f"{q.instance} released into generation {pl.generation}, which has no release"
        at = [m.rank for m in truth.members if m.instance == q.instance]
        assert at == [pl.rank], f"{q.instance} released as rank {pl.rank} of generation {pl.generation}; it names {at}"
        want = placements(list(truth.members), truth.mode, truth.master_port, truth.generation)[pl.rank]
        assert pl == want, f"{q.instance} got {pl}, the decision says {want}"
        assert (pl.master_addr, pl.master_port) == (truth.master_addr, truth.master_port)

    def _check_exception(self, q: Proc, e: BaseException, prev_step: float | None) -> None:
        p = q.p
        if self.is_injected(e):
            return  # raised by the test inside the process (a signal, an I/O error)
        if isinstance(e, RendezvousTimeoutError):
            # A spare's --timeout is held (its deadline moves on); only --spare-timeout ends its wait,
            # and only --queue-timeout a wait held by pending peer jobs.
            # By how the message starts: a timeout message may quote a void reason naming the other.
            hold = p.spare_hold if str(e).startswith(f"rendezvous for job {JOB}: waited ") else None
            if str(e).startswith(f"rendezvous for job {JOB}: peer jobs still pending after --queue-timeout"):
                hold = p.queue.held_time
            assert (
                q.host.clock.monotonic() >= p.deadline
                if hold is None
                else hold.bound is not None and hold.held_for >= hold.bound
            ), f"timeout before the deadline: {e}"
            # leaving must not be contradicted by a release naming us
            rel = self.releases.get(p.gen) if p.gen is not None else None
            assert rel is None or all(m.instance != q.instance for m in rel.members), (
                f"{q.instance} raised {e.__class__.__name__} although generation {p.gen} was released "
                f"with it as rank {[m.rank for m in rel.members if m.instance == q.instance]}: "
                "the others run without it"
            )
            return
        if isinstance(e, WorldSizeMismatchError):
            assert len(set(self.sizes)) > 1, f"WorldSizeMismatchError although every size is {self.size}: {e}"
            assert all(str(n) in str(e) for n in (p.size,)), f"the message does not name the sizes: {e}"
            return
        if isinstance(e, RankConflictError):
            r = p.want_rank
            assert r is not None, "RankConflictError for a first-come participant"
            rel = self.releases.get(p.gen)
            if rel is not None and rel.members[r].instance != q.instance:
                return  # the rank was released to another process
            if "connected to rank 0" in str(e):
                # Judged by rank 0's vouch (GenerationReader.judge_rank): the holder is the member
                # rank 0 verified for rank r, whatever a hostile writer left in the claim file since.
                held = [x for x in self.procs if x is not q and x.p is not None and x.p.gen == p.gen and x.p.rank == r]
                assert held, f"RankConflictError by rank 0's vouch, but nobody held rank {r} in {p.gen}: {e}"
                holder = held[-1]
            else:
                holder_inst = p.contest_holder  # the instance it judged (claims are read once, then cached)
                if holder_inst is None:
                    holder_data = self.fs.current(claim_name(p.gen, r))
                    assert holder_data is not None, f"rank {r} conflict without a claim: {e}"
                    holder_inst = decode(holder_data, Claim).instance
                holder = self.by_instance.get(holder_inst)
                assert holder is not None, f"RankConflictError naming a forged holder {holder_inst}: {e}"
            assert holder is not q
            # "alive" means its heartbeat changed between our previous observation and now, so it
            # was alive after (previous observing step - staleness); or the local check said so just
            # now -- within stale_after of that previous observation (bug 9, fixed in liveness.Judge).
            lower = (prev_step if prev_step is not None else self.fs.now) - self.fs.max_staleness
            assert holder.alive or holder.died_at > lower - 1e-9, (
                f"RankConflictError although the holder {holder.instance} of rank {r} "
                f"{holder.status} at t={holder.died_at}: {e}"
            )
            return
        if isinstance(e, CorruptStateError) and p.gen is not None and release_name(p.gen) in self.corrupted:
            return
        if isinstance(e, PeerJobEndedError):
            ended = self.scheduler.ever_ended if self.scheduler is not None else set()
            assert any(f"peer job {j} " in str(e) for j in ended), f"PeerJobEndedError but none ended: {e}"
            return
        if (
            isinstance(e, ConfigError)
            and "already in use" in str(e)
            and (self.intruders or (None in self.ranks and 0 in self.ranks))
        ):
            return  # an explicit --port rank 0 next to first-come processes of the same host
        if isinstance(e, ConfigError) and "no other node took rank 0" in str(e):
            # A first-come joiner met --port busy on its host and saw no rank 0 for stale_after
            # (docs/protocol.md, "A busy --port"): the port is held by another process of its host.
            assert p.want_rank is None and self.master_port is not None, f"busy-port failure without --port: {e}"
            hub = self.net.hubs.get((q.host.key, self.master_port))
            assert hub is not None and not hub.closed and hub.owner != q.instance, f"the port is not busy: {e}"
            assert f"--port {self.master_port}" in str(e) and f"held by fake process {hub.owner[:4]}" in str(e), e
            waited = q.host.clock.monotonic() - p._busy_since
            assert p.rank is None and waited >= p.timing.stale_after, f"failed after {waited:.1f} s holding {p.rank}"
            return
        raise AssertionError(f"unexpected {e.__class__.__name__} from {q.instance}: {e}") from e

    def check(self) -> None:
        done = [q for q in self.procs if q.result is not None]
        worlds = {(q.result.master_addr, q.result.master_port, q.result.generation) for q in done}
        assert len(worlds) <= 1, f"participants released into different worlds: {sorted(worlds)}"
        held = {}
        for q in done:
            key = (q.result.generation, q.result.rank)
            assert key not in held, f"two participants released with rank {key[1]} of generation {key[0]}"
            held[key] = q

    # ------------------------------------------------------------------ faults stop
    def stop_faults(self) -> None:
        """Partitions heal, lost replies stop, negative caches stop growing (existing entries expire)."""
        self.partitioned_slots.clear()
        self.net.heal()
        if self.scheduler is not None:
            self.scheduler.states.clear()  # every job running
        for h in self.hosts.values():
            h.store.neg_ttl = 0.0
            h.store._lost_reply_at = None
            h.store._io_at = None

    # ------------------------------------------------------------------ liveness
    def released_any(self) -> bool:
        return bool(self.releases)

    def liveness_applies(self) -> str | None:
        """Why the liveness property is not checked for this run (None: it is)."""
        if any(not fakefs.basename(n).startswith("beacon-") for n in self.corrupted):
            return "a claim or release was corrupted"
        if any("/master/" in n for n in self.corrupted):
            # rank 0 writes its endpoint once; members cannot find a master whose record is garbage
            return "rank 0's endpoint record was corrupted"
        if self.intruders:
            return "a duplicate explicit rank"
        if self.scheduler is not None and self.scheduler.ever_ended:
            return "a peer job ended (everyone may fail, exit 13)"
        explicit = [r for r in self.ranks if r is not None]
        if explicit and len(explicit) != self.size:
            return "explicit and first-come ranks mixed"
        if self.timeout < LONG:
            return "short timeouts"
        if len(set(self.sizes)) > 1:
            return "sizes disagree"
        if self.addrs:
            return "an announced address no host owns"
        return None

    def bound(self) -> float:
        t = self.timing
        # detect the dead (stale_after + a heartbeat + visibility) in each generation that holds dead
        # claims, then join, claim and release (visibility twice, polls, a scan, connect timeouts).
        per_gen = (
            t.stale_after
            + 2 * t.heartbeat_period
            + 4 * self.fs.max_staleness
            + 4 * t.poll_max
            + 2 * t.probe_timeout
            + 2
        )
        dead = sum(1 for q in self.procs if not q.alive)
        neg = max([0.0, *(h.store.neg_remaining() for h in self.hosts.values())])
        return (2 + dead) * per_gen + neg + 10

    def run_to_completion(self) -> float | None:
        """Stop faults, start a process in every slot without a live one, let time pass; check liveness.

        Returns the fake seconds it took (None when the property does not apply)."""
        self.stop_faults()
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
            assert not self.waiting_named() or "corrupted" in why, (
                f"named in a release but never released: {[q.instance for q in self.waiting_named()]}"
            )
            return None
        start, bound = self.fs.now, self.bound()
        self.tick(bound, stop=lambda: self.released_any() and not self.waiting_named())
        assert self.released_any(), (
            f"not released within {bound:.0f} fake seconds with all {self.size} slots alive: "
            + ", ".join(
                f"{q.instance[:4]}(slot {q.slot}, {q.p.state.value}, gen {q.p.gen}, rank {q.p.rank})"
                for q in self.running()
            )
        )
        stuck = self.waiting_named()
        assert not stuck, f"named in a release but not released after {bound:.0f} s: {[q.instance for q in stuck]}"
        # v2 releases only members that acknowledged over a live connection, so a live slot left
        # out is legitimate only if a member died after acknowledging (undetectable in time: torch
        # fails, the scheduler restarts the job).
        ((g, rel),) = self.releases.items()
        left_out = [q for q in self.running() if q.slot is not None]
        if left_out:
            dead = [m.instance for m in rel.members if not self.by_instance[m.instance].alive]
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


def _is_claim(name: str) -> bool:
    return name.endswith(".claim")


class RendezvousMachine(RuleBasedStateMachine):
    """Interleavings of joins, steps, crashes, restarts, time, caches, partitions, resets and corruption."""

    def __init__(self):
        super().__init__()
        self.w: World | None = None
        # Thousands of runs log tens of thousands of warnings; pytest would capture every one.
        self._log_level = logging.getLogger("fsmingle").level
        logging.getLogger("fsmingle").setLevel(logging.CRITICAL)

    @initialize(
        size=st.integers(2, 5),
        mode=st.sampled_from(["node", "rank"]),
        rank_policy=st.sampled_from(["explicit", "first", "first", "mixed"]),
        staleness=st.sampled_from([0.0, 1.0, 2.5]),
        pidns=st.sampled_from(["host", "pod"]),
        cleaner=st.booleans(),
        partitioned=st.sets(st.integers(0, 4), max_size=2),
        fixed_port=st.booleans(),
        short_timeout=st.integers(0, 9),
        mixed_seed=st.integers(0, 31),
        joined=st.integers(0, 5),
        initial_lag=st.sampled_from([0.0, 0.5, 1.0]),
        rank_order=st.sampled_from(["arrival", "arrival", "host"]),
        peers=st.sampled_from([False, False, True]),
    )
    def setup(
        self,
        size,
        mode,
        rank_policy,
        staleness,
        pidns,
        cleaner,
        partitioned,
        fixed_port,
        short_timeout,
        mixed_seed,
        joined,
        initial_lag,
        rank_order,
        peers=False,
    ):
        if rank_policy == "explicit":
            ranks = list(range(size))
        elif rank_policy == "first":
            ranks = [None] * size
        else:
            ranks = [s if mixed_seed >> s & 1 else None for s in range(size)]
        self.w = World(
            size,
            mode=mode,
            ranks=ranks,
            staleness=staleness,
            pidns=pidns,
            cleaner=cleaner,
            partitioned=partitioned,
            master_port=29500 if fixed_port else None,
            timeout=40.0 if short_timeout == 0 else LONG,
            initial_lag=initial_lag,
            rank_order=rank_order,
        )
        if peers:  # issue 24: every slot an array task (scheduler_says); an intruder or spare a job outside
            self.w.scheduler = FakeScheduler(lambda: self.w.fs.now)
        note(
            f"World(size={size}, mode={mode!r}, ranks={ranks}, rank_order={rank_order!r}, staleness={staleness}, pidns={pidns!r}, "
            f"cleaner={cleaner}, partitioned={partitioned}, fixed_port={fixed_port}, "
            f"timeout={self.w.timeout}, joined={joined}, peers={self.w.scheduler is not None})"
        )
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
                if any(q.status == "crashed" for q in w.procs):
                    event("some crashed")
                if any(h.store.lost_replies for h in w.hosts.values()):
                    event("a create reply was lost")
                if w.spins:
                    event("bug 7: zero-delay ENOENT retries")
                if w.net.connect_timeouts:
                    event("a connect got no answer")
                if any(q.interrupted is not None for q in w.procs):
                    event("interrupted after its release stood")
                if w.released_with_error:
                    event("released, then exited with an injected error")
                if any(h.store.io_errors for h in w.hosts.values()):
                    event(
                        "an I/O error took effect"
                        if any(t for h in w.hosts.values() for *_, t in h.store.io_errors)
                        else "an I/O error"
                    )
            finally:
                logging.getLogger("fsmingle").setLevel(self._log_level)
                note("\n".join(self.w.log[-100:]))

    def _count(self):
        self.n_rules = getattr(self, "n_rules", 0) + 1

    def _slot(self, i: int) -> int:
        return i % self.w.size

    def _running_proc(self, i: int) -> Proc | None:
        run = self.w.running()
        return run[i % len(run)] if run else None

    def _host(self, h: int) -> Host | None:
        keys = sorted(self.w.hosts)
        return self.w.hosts[keys[h % len(keys)]] if keys else None

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

    @rule(i=st.integers(0, 4), state=st.sampled_from(["PENDING", "PENDING", "RUNNING", "CANCELLED"]))
    def scheduler_says(self, i, state):
        """What squeue says of a slot's job from now on (whether or not its process runs)."""
        if self.w.scheduler is not None:
            self.w.scheduler.say(f"j_{self._slot(i)}", state)

    @rule(r=st.integers(0, 4))
    def intrude(self, r):
        """A process asks for an explicit rank some slot asks for too (a user error)."""
        if self.w.intruders < 1 and r % self.w.size in self.w.ranks:
            self.w.start(None, rank=r % self.w.size)

    @rule(bounded=st.booleans())
    def spare(self, bounded):
        """A first-come process beyond the world's size: a spare once the world is full or released
        without it (its --timeout held; ``bounded``: a short --timeout and a --spare-timeout)."""
        if self.w.intruders < 1 and None in self.w.ranks:
            self.w.start(None, timeout=5.0 if bounded else None, spare_timeout=20.0 if bounded else math.inf)

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

    @rule(i=st.integers(0, 15), dt=st.sampled_from([2.0, 6.0, 12.0]))
    def stall(self, i, dt):
        """One process is busy (not stepping) while the others run."""
        q = self._running_proc(i)
        if q is not None:
            self.w.stall(q, dt)
            self.w.tick(dt)

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

    @rule(
        i=st.integers(0, 15),
        k=st.integers(0, 10),
        where=st.sampled_from(["store", "net", "net"]),
        kind=st.sampled_from(["interrupt", "interrupt", "storage", "oserror"]),
        after_effect=st.booleans(),
    )
    def fault_in_step(self, i, k, where, kind, after_effect):
        """An exception lands inside the process (issue 21): a SIGTERM (KeyboardInterrupt) or an I/O
        error at its k-th store operation or k-th send/poll of this step, before or after it takes
        effect; the process then does what ``Participant.run`` does (withdraw; an interrupt after
        its release stood returns the release)."""
        q = self._running_proc(i)
        if q is not None:
            self.w.say(f"arm {kind} at {where} op {k} of {q.instance[:4]} (after effect: {after_effect})")
            self.w.step(q, fault=(where, k, kind), after_effect=after_effect)

    @rule(
        h=st.integers(0, 7),
        k=st.integers(0, 2),
        which=st.sampled_from(["release", "release", "claim", "any"]),
        ops=st.sampled_from([("create",), ("publish",), ("create", "publish")]),
        after_effect=st.booleans(),
        blind=st.sampled_from([0.0, 0.0, 5.0, GLUSTER_NEG]),
    )
    def io_error(self, h, k, which, ops, after_effect, blind):
        """A node's k-th next link() (create) or rename() (publish) fails with EIO -- after taking effect on
        the server, or before -- and the name may then read as absent there for a while (issue 21)."""
        host = self._host(h)
        if host is not None:
            match = {"release": lambda n: n.endswith(RELEASE), "claim": _is_claim, "any": None}[which]
            self.w.say(f"{host.node}: EIO on its {k}-th next {'/'.join(ops)} of {which} (took effect: {after_effect})")
            host.store.arm_io_error(k, match, ops=ops, after_effect=after_effect, blind_for=blind)

    @rule(i=st.integers(0, 15), j=st.integers(0, 15), k=st.integers(0, 8))
    def preempt(self, i, j, k):
        """Two processes truly concurrent: another one runs a step at the k-th store operation of this one."""
        q, other = self._running_proc(i), self._running_proc(j)
        if q is not None and other is not None and q is not other:
            self.w.step(q, preempt=(k, other))

    @rule(h=st.integers(0, 7), lag=st.sampled_from([0.0, 0.3, 1.0, 2.5]))
    def set_lag(self, h, lag):
        """A node's caches start answering late (up to the staleness bound)."""
        host = self._host(h)
        if host is not None:
            host.store.lag = lag

    @rule(h=st.integers(0, 7), ttl=st.sampled_from([0.0, 3.0, 15.0, GLUSTER_NEG]))
    def negative_cache(self, h, ttl):
        """A node's failed lookups stay "absent" for ttl seconds (GlusterFS nl-cache, NFS lookupcache)."""
        host = self._host(h)
        if host is not None:
            host.store.neg_ttl = ttl

    @rule(h=st.integers(0, 7), i=st.integers(0, 63), secs=st.sampled_from([0.5, 5.0, 20.0, GLUSTER_NEG]))
    def spurious_enoent(self, h, i, secs):
        """A node's lookups of a name that exists (a generation, master/, a claim, a release) fail for a while."""
        host = self._host(h)
        names = sorted(
            [d for d in self.w.fs.dirs if d and self.w.fs.dir_exists(d)]
            + [n for n in self.w.fs.present_files() if not fakefs.basename(n).startswith(".")]
        )
        if host is not None and names:
            n = names[i % len(names)]
            self.w.say(f"{host.node} blind to {n} for {secs:g} s")
            host.store.blind(n, secs)

    @rule(h=st.integers(0, 7), k=st.integers(0, 2), claims_only=st.booleans())
    def lose_create_reply(self, h, k, claims_only):
        """The k-th next exclusive create on a node takes effect, but its reply is lost (EEXIST on retry)."""
        host = self._host(h)
        if host is not None:
            only_claims = claims_only
            host.store.arm_lost_reply(k, _is_claim if only_claims else None)

    @rule(h=st.integers(0, 7))
    def partition(self, h):
        """A node's network link goes down silently (no RST, no answer); its filesystem stays reachable."""
        host = self._host(h)
        if host is not None:
            self.w.say(f"partition {host.node}")
            self.w.net.partition(host.key)

    @rule(h=st.one_of(st.none(), st.integers(0, 7)))
    def heal(self, h):
        host = self._host(h) if h is not None else None
        self.w.say(f"heal {host.node if host else 'all'}")
        self.w.net.heal(host.key if host else None)

    @rule(i=st.integers(0, 31), lose_unread=st.booleans())
    def reset_connection(self, i, lose_unread):
        """A connection is reset (RST) at any moment."""
        pipes = self.w.net.open_pipes()
        if pipes:
            pp = pipes[i % len(pipes)]
            self.w.say(f"reset connection {pp.link.owner[:4]} -> {pp.hub.owner[:4]} (lose unread: {lose_unread})")
            self.w.net.reset(pp, lose_unread)

    @rule(i=st.integers(0, 63), g=st.integers(0, len(GARBAGE) - 1), kinds=st.sampled_from(["beacon", "beacon", "any"]))
    def corrupt(self, i, g, kinds):
        """A hostile or broken writer replaces a record with garbage."""
        names = [
            n
            for n in self.w.fs.present_files()
            if not fakefs.basename(n).startswith(".") and (fakefs.basename(n).startswith("beacon-") or kinds == "any")
        ]
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
MODEL_EXAMPLES = int(os.environ.get("FSMINGLE_MODEL_EXAMPLES", "400"))

RendezvousMachine.TestCase.settings = settings(
    max_examples=MODEL_EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
TestRendezvousModel = RendezvousMachine.TestCase


# ---------------------------------------------------------------------------------------------
# Deterministic scenarios on the same fake filesystem and network.


def _released_same_world(w: World) -> Release:
    done = [q for q in w.procs if q.result is not None]
    assert done
    gens = {q.result.generation for q in done}
    assert len(gens) == 1
    return w.releases[gens.pop()]


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
    assert all(q.status == "done" for q in w.procs)


def test_explicit_ranks_with_staggered_arrivals():
    w = World(3, ranks=[2, 0, 1], staleness=1.0)
    for s in range(3):
        w.start(s)
        w.tick(5.0)
    w.run_to_completion()
    rel = _released_same_world(w)
    assert [m.instance for m in rel.members] == [w.current(s).instance for s in (1, 2, 0)]


def test_dead_master_is_voided_and_replaced():
    # rank 0 claims, publishes its endpoint, then dies: its port closes with it, so the members'
    # connects are refused (the master is gone) and they void; its replacement regroups them.
    w = World(3, ranks=[0, 1, 2], staleness=1.0, pidns="pod")
    w.start(0)
    w.tick(0.5)
    w.crash(w.current(0))
    w.start(1)
    w.start(2)
    w.tick(2.0)
    assert w.decided.get(1) is not None and w.decided[1].state == "restart"
    assert "refused" in w.decided[1].reason
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


def test_first_come_port_race_on_one_host():
    # Formerly a known bug (fixed in 5eb175e, still holds in v2).  Per-rank mode, two first-come
    # processes on one node, --port 29500.  A holds the port and is about to create
    # rank-00000.claim; B lists the directory in between, sees rank 0 free and tries to listen on
    # the same port: it must take another rank instead of dying with "port already in use".
    w = World(2, mode="rank", master_port=29500)
    a, b = w.start(0), w.start(1)
    assert a.host is b.host
    w.step(a, preempt=(6, b))  # A: listdir, mkdir gen, mkdir master, read release, beacon, listdir gen, [B] create
    assert b.error is None, f"B died: {b.error!r}"
    w.run_to_completion()
    assert {q.p.rank for q in (a, b)} == {0, 1}


def test_acked_member_reads_the_decision_through_its_negative_cache():
    # Formerly "timeout withdraw misses a stale release" (v1).  B acknowledged the release; its
    # connection is reset (unread data lost) before the go arrives.  B voids, loses the race to
    # rank 0's release, and must read the decision -- which its negative cache hides for 15 s,
    # past B's deadline -- instead of leaving a world that starts with it.
    w = World(2, ranks=[0, 1], timeout=30.0)
    a, b = w.start(0), w.start(1)
    w.hosts[1].store.neg_ttl = 15.0
    w.step(b)  # joins gen 1: mkdir, read release.json (absent: cached so for 15 s), claim
    w.tick(20.0, stop=lambda: a.p.role is not None and a.p.role.preparing_since is not None)
    assert a.p.role.preparing_since is not None, "rank 0 never prepared"
    w.fs.advance(9.0)  # B's deadline is near: the release will show to B only after it
    w.step(b)  # B acknowledges
    (pipe,) = [pp for pp in w.net.open_pipes() if pp.link.owner == b.instance]
    w.step(a)  # rank 0 commits: release.json, go
    assert 1 in w.releases
    w.net.reset(pipe, lose_unread=True)  # the go never reaches B
    w.tick(40.0, stop=lambda: b.status != "running")
    assert b.status == "done" and b.result.generation == 1


def test_gluster_negative_cache_hides_a_generation_looked_up_too_early():
    # Issue 11, row 1: on a GlusterFS client with nl-cache, a name looked up before it existed
    # stays ENOENT for 61 s while listing its parent shows it.  Host 1 (e.g. `fsmingle status`
    # run there) looked gen-00000001 up before anyone made it.  Its participant must neither walk
    # away from generation 1 holding a claim nor let the others be released without it.
    w = World(3, ranks=[None] * 3)
    w.hosts.clear()
    h1 = w.host(1)
    h1.store.neg_ttl = GLUSTER_NEG
    assert h1.store.read(release_name(1)) is None  # the too-early lookup
    h1.store.neg_ttl = 0.0
    w.start(0)
    w.tick(1.0)
    w.start(1)
    w.start(2)
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert {m.instance for m in rel.members} == {q.instance for q in w.procs}
    assert took <= GLUSTER_NEG + w.bound()


def _connected_member_keeps_its_place(disturb, for_s: float) -> None:
    """Ranks 0 and 1 of 3 start and connect; ``disturb(world, rank0)``, then ``for_s`` seconds pass:
    generation 1 must stay undecided (no void), and once rank 2 arrives it is released to all."""
    w = World(3, ranks=[0, 1, 2])
    a, _b = w.start(0), w.start(1)
    w.tick(3.0)
    assert a.p.role.rank_conn.keys() == {1}
    disturb(w, a)
    w.tick(for_s)
    assert 1 not in w.decided, f"generation 1 decided: {w.decided.get(1)}"
    w.start(2)
    w.run_to_completion()
    assert _released_same_world(w).generation == 1


def test_generation_dir_enoent_on_a_waiting_member_is_confirmed_not_acted_on():
    # An ENOENT on a directory that exists (a spurious one, for 20 s) while a member waits
    # connected: it must keep its place (no void, no rejoin) and be released with the others.
    _connected_member_keeps_its_place(lambda w, a: w.hosts[1].store.blind(gen_name(1), 20.0), 25.0)


def test_silent_partition_of_rank1_at_release_time_voids():
    # Issue 11, row 2: node rank 1's link goes down (no RST, no answer) right after rank 0 asked
    # everyone to acknowledge; its filesystem stays reachable.  Rank 1's ack never arrives:
    # rank 0 must void, never release.  After the link comes back, everyone regroups.
    w = World(3, ranks=[0, 1, 2])
    a, b, _c = w.start(0), w.start(1), w.start(2)
    w.tick(10.0, stop=lambda: a.p.role is not None and a.p.role.preparing_since is not None)
    assert a.p.role.preparing_since is not None
    w.net.partition(b.host.key)
    w.tick(TIMING.probe_timeout + 1.0)
    assert not w.releases and w.decided[1].state == "restart"
    assert "did not acknowledge" in w.decided[1].reason
    w.tick(30.0)
    assert not w.releases  # still cut off: nobody is released into a world with rank 1 unreachable
    w.net.heal()
    took = w.run_to_completion()
    assert _released_same_world(w).generation >= 2 and took < w.bound()


def test_silent_partition_before_connecting_never_releases():
    w = World(2, ranks=[0, 1], partitioned={1})
    _a, b = w.start(0), w.start(1)
    w.tick(60.0)
    assert not w.releases and w.net.connect_timeouts > 0
    assert "cannot reach the master" in b.p.note
    w.run_to_completion()


def test_master_address_that_does_not_answer_never_releases():
    # Issue 11, row 4: `--addr 10.9.9.9` (no host has it) for rank 0.  v1 released both nodes
    # with MASTER_ADDR=10.9.9.9 when rank 0 completed the world; v2 needs the member's connection.
    w = World(2, ranks=[0, 1], addrs={0: "10.9.9.9"}, timeout=30.0)
    a, b = w.start(0), w.start(1)
    w.tick(40.0)
    assert not w.releases
    assert a.status == b.status == "exited"
    assert isinstance(a.error, RendezvousTimeoutError) and isinstance(b.error, RendezvousTimeoutError)
    assert "10.9.9.9" in str(b.error)


@pytest.mark.parametrize("ranks", [[None] * 3, [0, 1, 2]], ids=["first-come", "explicit"])
def test_lost_link_reply_on_a_claim_is_recognised(ranks):
    # Issue 11, row 6: link() took effect but its reply was lost (NFS retransmit -> EEXIST).  The
    # claimer must read the claim back and recognise its own: one rank, not two, and released.
    w = World(3, ranks=ranks)
    w.start(0)
    w.tick(1.0)
    b = w.start(1)
    b.host.store.arm_lost_reply(0, _is_claim)
    # first-come: b asks rank 0 and claims the rank it is offered, a round trip later
    w.tick(2.0, stop=lambda: bool(b.host.store.lost_replies))
    assert b.host.store.lost_replies, "the lost reply was not injected"
    w.start(2)
    w.run_to_completion()
    rel = _released_same_world(w)
    assert [m.instance for m in rel.members].count(b.instance) == 1
    claims = [n for n in w.fs.present_files(gen_name(1)) if n.endswith(".claim")]
    holders = [decode(w.fs.current(n), Claim).instance for n in claims]
    assert holders.count(b.instance) == 1, f"{b.instance} holds {holders.count(b.instance)} ranks"


def test_rank0_busy_with_members_connected_is_not_voided():
    # Issue 11, row 7: rank 0 does not step (a long scan, GC, swapping) for most of stale_after
    # while members wait connected: nobody may void it; the world is released when complete.
    _connected_member_keeps_its_place(lambda w, a: w.stall(a, 0.8 * TIMING.stale_after), 0.8 * TIMING.stale_after)


def test_rank0_stopped_longer_than_stale_after_is_voided_then_regrouped():
    w = World(3, ranks=[0, 1, 2])
    a, _b, _c = w.start(0), w.start(1), w.start(2)
    w.tick(0.2)
    w.stall(a, 3 * TIMING.stale_after)  # stopped before it could release (SIGSTOP, a frozen VM)
    if not w.releases:
        w.tick(3 * TIMING.stale_after)
        assert 1 in w.decided
    w.run_to_completion()


@pytest.mark.parametrize("first", [0, 1])
def test_participants_disagreeing_on_size_get_a_clear_error(first):
    # Issue 11, row 9: v1 crashed with an IndexError traceback.
    w = World(2, ranks=[0, 1], sizes=[2, 3])
    q0, q1 = w.start(0), w.start(1)
    w.step([q0, q1][first])
    w.tick(30.0)
    assert not w.releases
    errs = [q.error for q in w.procs if q.error is not None]
    assert errs and all(isinstance(e, WorldSizeMismatchError) for e in errs), errs
    assert all("2" in str(e) and "3" in str(e) for e in errs)


# ---------------------------------------------------------------------------------------------
# Protocol bugs the model found in v2 (5-7), fixed: each scenario now passes as a regression test,
# and the machine generates their situations (no KNOWN_BUGS guard left for them).  Bug 4 of v1 (a
# torn O_EXCL release) and the link=False scenarios are gone: PosixStore no longer falls back to
# O_EXCL (1f6f377).


def test_bug_lost_reply_on_release_record():
    # coordinator.py, Coordinator._commit: store.create(release.json) took effect but returned
    # False (lost link() reply).  Rank 0 reads the record back, finds its *own* "released"
    # decision, calls it "voided by another participant" and rejoins generation 2 -- while
    # release.json of generation 1 names everyone.  A member that had acknowledged and lost its
    # connection reads that release and starts alone (another world than everyone else's);
    # `status` and late arrivals read generation 1 as released.  Fix: in _commit, after the
    # create returns False, treat `got.state == "released" and got.writer == p.instance` as
    # success (the same read-back the claims do).
    w = World(2, ranks=[0, 1])
    a, b = w.start(0), w.start(1)
    a.host.store.arm_lost_reply(0, lambda n: n.endswith(RELEASE))
    w.tick(30.0)  # fails: "0002 left generation 1 although its release names it"
    assert all(q.status == "done" for q in (a, b))


def test_bug_master_dir_enoent_leaves_rank0_without_a_role():
    # protocol.py, Participant._hold sets state WAIT, then Coordinator.__init__ publishes the
    # endpoint in master/; an ENOENT there (a lookup of gen-N/master cached as absent, or a
    # spurious one) propagates to step()'s handler, which keeps state WAIT with self.role None:
    # the next step raises AttributeError ('NoneType' object has no attribute 'step').  Fix:
    # publish the endpoint from Coordinator.step() until it succeeds (a `published` flag), so
    # ENOENT is retried like any other.
    w = World(2, ranks=[0, 1])
    a = w.start(0)
    # a's first step: listdir, mkdir gen, mkdir master, read release, beacon, claim, beacon, [master/ endpoint]
    a.host.store.arm_hook(7, lambda: a.host.store.blind(master_dir(1), 5.0))
    w.step(a)
    w.start(1)
    w.tick(10.0)
    assert a.error is None, f"rank 0 died: {a.error!r}"
    w.run_to_completion()


def test_bug_enoent_retry_does_not_spin():
    # protocol.py, Participant.heartbeat_if_due bumps next_hb only after publish_beacon()
    # succeeded, and next_delay() takes the role's delay in WAIT, ignoring the backoff that
    # _on_enoent set.  A member not yet connected whose generation directory is cached as absent
    # (61 s on GlusterFS) retries its heartbeat at every step with a zero delay: a busy loop of
    # failing writes against the metadata server for the whole cache lifetime; once connected,
    # every step fails before reading the channel, so it stops answering pings and rank 0 voids.
    # Fix: set next_hb before publishing, and in next_delay() use max(role.delay(), self.delay)
    # while _enoent_since is set.
    w = World(2, ranks=[0, 1])
    b = w.start(1)
    w.step(b)
    b.host.store.blind(gen_name(1), 5.0)
    w.fs.advance(TIMING.heartbeat_period)
    w.tick(1.0)
    assert w.spins == 0, f"{w.spins} zero-delay retries in 1 s"


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


def test_bug_old_heartbeat_change_is_not_proof_of_life():
    # liveness.py, Judge.judge: a changed counter returns ALIVE however long ago the previous
    # observation was.  B asks for rank 0, held by A; B observes A's beacon, then does not look
    # for 20 s (stalled, or its lookups failed with ENOENT -- found by the model that way).
    # Meanwhile A heartbeats once and dies.  B's next look sees the counter changed and raises
    # RankConflictError ("held by a live process") about a holder dead for 15 s, instead of
    # judging it dead after stale_after and taking its place.  Fix: keep the time of the
    # previous observation in _Seen and count a change as ALIVE only if that observation is
    # less than stale_after old (otherwise start a new observation window: UNKNOWN).
    w = World(2, ranks=[0, 1], pidns="pod")
    a = w.start(0)
    w.tick(1.0)
    b = w.start(None, rank=0)
    w.step(b)
    w.step(b)
    assert b.p.state is State.CONTEST
    w.stall(b, 20.0)
    w.tick(5.0)  # A heartbeats (every stale_after / 3)
    w.crash(a)
    w.tick(15.0)  # B's next step
    assert b.status == "running" or b.died_at >= a.died_at + 14.0  # it stepped again 15 s after A died
    assert not isinstance(b.error, RankConflictError), f"{b.error}; A died {w.fs.now - a.died_at:.0f} s ago"


# ---------------------------------------------------------------------------------------------
# The paths only big worlds take: first-come joiners whose blind guesses collide ask rank 0 for
# a free rank (fsmingle.rendezvous.member, "asking"), and connected members heartbeat their own beacons
# rarely, so judges rely on rank 0's vouch (GenerationReader.judge_rank).  Small worlds never
# take them, so the machine above is run again with both forced: every first-come joiner makes
# one guess and then asks, and a connected member never heartbeats again.


def test_model_with_the_paths_of_big_worlds(monkeypatch):
    from hypothesis.stateful import run_state_machine_as_test

    from fsmingle.rendezvous import joining, member

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
    from fsmingle.rendezvous import joining, member

    monkeypatch.setattr(joining, "SPREAD_ABOVE", 1)
    monkeypatch.setattr(joining, "BLIND_GUESSES", 1)
    monkeypatch.setattr(member, "MEMBER_BEACONS_PER_S", 1e-6)
    monkeypatch.setitem(globals(), "note", lambda *a: None)
    monkeypatch.setitem(globals(), "event", lambda *a: None)
    m = RendezvousMachine()
    m.setup(
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
    monkeypatch.setitem(globals(), "note", lambda *a: None)
    monkeypatch.setitem(globals(), "event", lambda *a: None)
    m = RendezvousMachine()
    m.setup(
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
    monkeypatch.setitem(globals(), "note", lambda *a: None)
    monkeypatch.setitem(globals(), "event", lambda *a: None)
    m = RendezvousMachine()
    m.setup(
        size=2, mode="node", rank_policy="first", staleness=0.0, pidns="host", cleaner=False,
        partitioned=set(), fixed_port=False, short_timeout=0, mixed_seed=0, joined=2, initial_lag=0.0,
        rank_order="arrival",
    )  # fmt: skip
    m.preempt(i=1, j=0, k=0)
    m.spurious_enoent(h=1, i=0, secs=0.5)
    m.crash(i=0)
    m.tick(dt=0.5)
    m.teardown()


def _count_calls(monkeypatch, cls, name: str) -> list:
    calls: list = []
    orig = getattr(cls, name)

    def spy(self, *a, **k):
        calls.append(a)
        return orig(self, *a, **k)

    monkeypatch.setattr(cls, name, spy)
    return calls


@pytest.mark.parametrize("arrivals", ["staggered", "together"])
def test_big_first_come_world_asks_rank0_instead_of_listing(monkeypatch, arrivals):
    """48 first-come nodes (above SPREAD_ABOVE): joiners whose 3 guesses collide ask rank 0 and
    claim what it offers; the generation directory is listed by rank 0's scans, not by joiners."""
    from fsmingle.rendezvous import joining
    from fsmingle.rendezvous.rank0 import coordinator

    asks = _count_calls(monkeypatch, coordinator.Coordinator, "_on_ask")
    listings = _count_calls(monkeypatch, joining.Joining, "claim_by_listing")
    n = 48
    assert n > joining.SPREAD_ABOVE
    w = World(n, staleness=1.0)
    for s in range(n):
        w.start(s)
        if arrivals == "staggered":
            w.tick(0.2)
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert sorted(m.rank for m in rel.members) == list(range(n))
    assert rel.generation == 1 and took < w.bound()
    assert asks, "no joiner asked rank 0: the test no longer drives the asking path"
    # Listing fallbacks: only before rank 0 published its endpoint or when it offered nothing.
    assert len(listings) <= 3, f"{len(listings)} joiners listed the generation"


def test_connected_members_with_rare_heartbeats_live_by_rank0s_vouch(monkeypatch):
    """In a big world a connected member heartbeats its beacon rarely (member.MEMBER_BEACONS_PER_S);
    rank 0's beacon vouches for it.  A contester for its rank must not judge it dead and void the
    generation -- long after the member's own beacon went stale -- and learns of the conflict when
    the world is released."""
    from fsmingle.rendezvous import member

    monkeypatch.setattr(member, "MEMBER_BEACONS_PER_S", 1e-6)  # a member's own beacon: never again
    w = World(4, ranks=[0, 1, 2, 3], staleness=1.0, pidns="pod")
    for s in range(3):  # rank 3 comes last: the world waits
        w.start(s)
    w.tick(5.0)
    w.tick(2 * TIMING.stale_after)  # the members' own beacons are stale by now
    intruder = w.start(None, rank=1, new_host=True)
    w.tick(2 * TIMING.stale_after)
    assert w.decided.get(1) is None, f"generation 1 voided: {w.decided.get(1)}"
    assert intruder.status == "running" and intruder.p.state is State.CONTEST
    w.start(3)
    w.tick(10.0)
    assert w.releases.get(1) is not None
    assert intruder.status == "exited" and isinstance(intruder.error, RankConflictError), intruder.error
    assert "released" in str(intruder.error)


# ---------------------------------------------------------------------------------------------
# Issue 21: generation numbers are never reused, voided generations are cleaned, a busy --port.

ADMIN_INSTANCE = "feedfacefeedface"


def _restart(g: int) -> bytes:
    return encode(
        Release(
            job_id=JOB,
            generation=g,
            state="restart",
            mode="node",
            size=2,
            master_addr=None,
            master_port=None,
            members=(),
            writer=ADMIN_INSTANCE,
            reason="test history",
            wall_time=0.0,
        )
    )


def _history_with_retired_generations(w: World) -> None:
    """Generations 1-3 made (3 the newest, undecided); 10 s later 3 and 4 voided (5 made ahead); 2 s
    later 1-3 retired (``fsmingle clean``, or a cleaner keeping the newest decided one, 4)."""
    admin = w.fs.view("admin")
    for g in (1, 2, 3):
        admin.mkdir(gen_name(g))
        admin.mkdir(master_dir(g))
        if g < 3:
            admin.create(release_name(g), _restart(g))
    w.fs.advance(10.0)
    for g in (3, 4):
        admin.mkdir(gen_name(g + 1))
        admin.mkdir(master_dir(g + 1))
        admin.create(release_name(g), _restart(g))
    w.fs.advance(2.0)
    for g in (1, 2, 3):
        admin.retire(gen_name(g))
    w.fs.advance(1.0)


def _gens_on_disk(w: World) -> list[int]:
    return sorted(int(GEN_RE.match(d).group(1)) for d in w.fs.dirs if GEN_RE.fullmatch(d) and w.fs.dir_exists(d))


@pytest.mark.parametrize("relist_fresh", [True, False], ids=["joiner-relists", "rank0-relists"])
def test_a_stale_listing_never_resurrects_a_retired_generation(relist_fresh):
    # Issue 21 row 3: a joiner whose listing is 12 s stale sees generation 3 as the newest, but 3
    # was retired; its mkdir re-creates it.  Before: it became rank 0 of an empty old generation
    # while the world waited in 5 (a hang; with timeouts, "generation 3 decided twice").  Now the
    # joiner re-lists after creating it, marks it retired and joins 5; if that re-listing is
    # still stale (relist_fresh=False), rank 0 of 3 re-lists every stale_after and leaves it.
    w = World(2, staleness=15.0)
    _history_with_retired_generations(w)
    stale = w.start(0)
    stale.host.store.lag = 12.0  # its listing shows the job directory as it was at t0 + 1
    stale.host.store.mkdir_refreshes_listing = relist_fresh
    w.start(1)
    took = w.run_to_completion()
    rel = _released_same_world(w)
    assert rel.generation == 5 and sorted(m.instance for m in rel.members) == sorted(q.instance for q in w.procs)
    # (rank 0 of generation 5 has retired the marked generation 3 again since: read its event)
    made = [e for e in w.fs.events if e.op == "create" and e.ok and e.name == release_name(3)]
    marked = decode(made[-1].data, Release)
    assert marked.state == "restart" and marked.writer == stale.instance
    if relist_fresh:
        assert marked.reason.startswith(RETIRED_NUMBER) and took < 5, (marked.reason, took)
    else:
        assert "re-created from a stale listing" in marked.reason and took < 2 * TIMING.stale_after + 5


def test_voided_generations_are_cleaned_while_the_job_runs():
    # Issue 21 row 8: a member killed 8 times after connecting; each kill voids a generation.
    # Before: prepare_next() made every next generation ahead, no joiner's mkdir created one, so
    # the cleaner never ran and all 9+ generations stayed.  Now each generation's rank 0 cleans.
    w = World(4)  # slot 3 comes last: the world cannot complete during the crash loop
    w.start(0)
    w.start(1)
    for _ in range(8):
        q = w.start(2)
        w.tick(3.0)
        assert q.p.state is State.WAIT and q.p.role is not None and q.p.role.link is not None
        w.crash(q)
        w.tick(3.0)
    assert len(w.decided) >= 8
    on_disk = _gens_on_disk(w)
    assert len(on_disk) <= 3, on_disk
    w.start(2)
    w.start(3)
    w.run_to_completion()
    rel = _released_same_world(w)
    on_disk = _gens_on_disk(w)
    assert on_disk == [rel.generation - 1, rel.generation, rel.generation + 1], on_disk


def _occupy_port(w: World, host: Host, port: int) -> str:
    owner = "0bad0bad0bad0bad"
    w.net.transport(host.key, owner, 1.0).listen(host.addr, port, 1)
    return owner


def test_busy_port_on_every_host_fails_first_come_within_stale_after():
    # Issue 21 row 6: --port busy on every host (a previous run's master holds it).  Before:
    # nobody took rank 0 and everyone timed out blaming a master that "never published its
    # endpoint".  Now: a warning at once, and exit 3 (ConfigError) naming the port and its
    # holder once no rank 0 appeared for stale_after.
    w = World(2, master_port=29500, timeout=300.0)
    for s in range(2):
        _occupy_port(w, w.host(w.slot_host[s]), 29500)
    qs = [w.start(s) for s in range(2)]
    w.tick(TIMING.stale_after + 5.0)
    for q in qs:
        assert q.status == "exited" and isinstance(q.error, ConfigError), (q.status, q.error)
        msg = str(q.error)
        assert "--port 29500 is already in use" in msg and "held by fake process 0bad" in msg, msg
        assert "no other node took rank 0" in msg, msg
        assert q.died_at - w.procs[0].hid.pid_start <= TIMING.stale_after + 3.0


def test_busy_port_on_one_host_lets_another_take_rank0():
    w = World(3, master_port=29500)
    _occupy_port(w, w.host(w.slot_host[0]), 29500)
    first = w.start(0)
    w.tick(0.5)
    assert "already in use" in first.p.note and "held by fake process 0bad" in first.p.note
    w.start(1)
    w.start(2)
    w.run_to_completion()
    rel = _released_same_world(w)
    assert rel.members[0].instance != first.instance and first.status == "done"


# ---------------------------------------------------------------------------------------------
# Issue 24: peer jobs in the scheduler's queue while the one missing is rank 0's (explicit ranks,
# as array tasks started with --node-rank from the task index).


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


def _rank0_held(**kw) -> tuple[World, FakeScheduler]:
    """Ranks 1 and 2 of 3 waiting (timeout 30 s) while rank 0's job is PENDING."""
    w = World(3, ranks=[0, 1, 2], staleness=1.0, pidns="pod", timeout=30.0, **kw)
    w.scheduler = FakeScheduler(lambda: w.fs.now, {"j_0": "PENDING"})
    w.start(1)
    w.start(2)
    return w, w.scheduler


def test_missing_rank0_the_lowest_present_rank_asks_and_everyone_holds():
    w, sched = _rank0_held()
    w.tick(120.0)  # four times --timeout
    one, two = w.current(1), w.current(2)
    assert one.status == two.status == "running", (one.error, two.error)
    assert sched.askers() == {"j_1"}, sched.calls  # one asker, never every node
    assert len(sched.calls) <= 120 / sched.interval + 2
    for q in (one, two):
        assert q.p.queue.hold and "missing rank 0: job j_0 PENDING (JobHeldUser)" in q.p.note, q.p.note
    # rank 0 starts: it asks from now on, the asker stops (its beacon drops the word), the world completes
    sched.states["j_0"] = "RUNNING"
    w.start(0)
    w.tick(5.0)
    t = w.fs.now
    w.run_to_completion()
    assert _released_same_world(w).generation == 1
    assert "j_1" not in sched.askers(since=t), sched.calls


def test_missing_rank0_the_asker_dies_and_the_next_lowest_takes_over():
    w, sched = _rank0_held()
    w.tick(20.0)
    w.crash(w.current(1))
    t = w.fs.now
    w.tick(90.0)
    two = w.current(2)
    assert two.status == "running", two.error  # held all along: rank 1's word, then its own
    assert sched.askers(since=t + TIMING.stale_after + 2 * TIMING.heartbeat_period) == {"j_2"}, sched.calls
    assert two.p.queue.hold
    sched.states["j_0"] = "RUNNING"
    w.start(0)
    w.run_to_completion()  # restarts slot 1; rank 0 voids its dead claim, the next generation releases


def test_missing_rank0_cancelled_fails_the_asker_and_the_others_at_once():
    w, sched = _rank0_held()
    w.tick(40.0)
    sched.say("j_0", "CANCELLED")
    t = w.fs.now
    w.tick(TIMING.heartbeat_period + 2 * sched.interval + 2 * w.fs.max_staleness + 1)
    for s in (1, 2):
        q = w.current(s)
        assert q.status == "exited" and isinstance(q.error, PeerJobEndedError), (s, q.status, q.error)
        assert "peer job j_0 CANCELLED (JobHeldUser) without joining" in str(q.error)
        assert q.died_at - t < TIMING.heartbeat_period + 2 * sched.interval + 2 * w.fs.max_staleness + 1
    assert w.decided[1].reason.startswith("the scheduler says: peer job j_0 CANCELLED")
    assert sched.askers() == {"j_1"}


def test_an_old_members_beacon_without_a_word_is_not_followed_for_ever(monkeypatch):
    """Rank 1 runs a version without the asker (its beacon never carries a word): rank 2 lists
    the generation again at most every stale_after / 2, and waits with --timeout (no hold, no
    scheduler call: rank 1 is present and not dead, so rank 2 is not the lowest)."""
    from fsmingle.rendezvous import queue_relay

    finds = _count_calls(monkeypatch, queue_relay.Relay, "_find")
    w, sched = _rank0_held()
    w.current(1).p.queue = None  # an older fsmingle: no QueueWatch, no queue_word
    w.tick(25.0)
    two = w.current(2)
    assert two.status == "running" and not two.p.queue.hold and sched.calls == []
    assert two.p.queue.relay.asker[0] == 1 and not two.p.queue.relay.asking
    assert 1 <= len(finds) <= 25.0 / (TIMING.stale_after / 2) + 2, len(finds)
    w.tick(10.0)
    assert two.status == "exited" and isinstance(two.error, RendezvousTimeoutError), two.error


def _asker_due_afresh(w: World) -> Proc:
    """Rank 1, the asker, about to take up asking as if new: its next step lists the generation,
    reads rank 2's beacon (its scheduler job), asks the scheduler, and writes its word."""
    from fsmingle.rendezvous.queue_relay import Relay

    one = w.current(1)
    assert one.p.queue.relay.asking
    relay = one.p.queue.relay = Relay()
    relay.gen = one.p.gen
    one.p.queue.next_query = 0.0
    one.wake = w.fs.now
    return one


@pytest.mark.parametrize("kind", ["interrupt", "storage", "oserror"])
def test_a_fault_at_every_call_of_the_asker(kind):
    """An exception or interrupt at each store operation of the asker's step, and in its
    scheduler call: it withdraws (voiding the generation), the others regroup, the next lowest
    asks (the asker's job requeued: pending), nobody times out, and once every slot runs the
    world is released.  A scheduler call that fails (not an interrupt) degrades to --timeout only."""
    for k in range(8):
        w, sched = _rank0_held()
        w.tick(12.0)
        one = _asker_due_afresh(w)
        if k == 7:
            sched.raise_in = ("j_1", w.exc_factory(kind))
            w.step(one)
        else:
            w.step(one, fault=("store", k, kind), after_effect=bool(k % 2))
        if one.status != "running":
            sched.say("j_1", "PENDING")  # requeued (a job that ended would fail everyone: exit 13)
        w.tick(45.0)  # past --timeout 30 s: only a hold keeps the others waiting
        two = w.current(2)
        if k == 7 and kind != "interrupt":
            # A scheduler call that fails degrades, as on rank 0: one warning, then --timeout only
            # (the asker's word says no hold; nobody holds on a scheduler nobody can ask).
            assert one.p.queue.broken and not two.p.queue.hold
            assert all(isinstance(q.error, RendezvousTimeoutError) for q in (one, two)), (one.error, two.error)
            continue
        assert two.status == "running", (k, two.error, w.log[-20:])
        if one.status == "exited":
            assert two.p.queue.hold and "j_2" in sched.askers(since=w.fs.now - 20.0), (k, sched.calls[-5:])
        sched.say("j_0", "RUNNING")
        w.start(0)
        w.run_to_completion()


@pytest.mark.parametrize("kind", ["interrupt", "storage"])
def test_a_fault_at_every_call_of_the_asker_that_finds_rank0s_job_ended(kind):
    """Rank 0's job is cancelled and the asker fails at each store operation of the steps that
    find it (its listing, beacon read and word; then, taking the answer, the void's mkdirs and
    create): whichever way it leaves, rank 2 fails with exit 13 naming the job -- on the asker's
    restart record, or by asking itself in the next generation -- and never waits out --timeout."""
    for step, k in [(0, k) for k in range(4)] + [(1, k) for k in range(7)]:
        w, sched = _rank0_held()
        w.tick(12.0)
        one = _asker_due_afresh(w)
        sched.say("j_0", "CANCELLED")
        if step == 1:
            w.step(one)  # asks; the answer is taken at its next step (the query runs in a thread)
            assert one.status == "running" and w.fs.current(release_name(1)) is None
            one.wake = w.fs.now
        w.step(one, fault=("store", k, kind), after_effect=bool(k % 2))
        w.tick(25.0)  # under --timeout 30 s from here
        for q in (one, w.current(2)):
            assert q.status == "exited", (k, q.slot, q.status, w.log[-20:])
        two = w.current(2)
        assert isinstance(two.error, PeerJobEndedError) and "peer job j_0 CANCELLED" in str(two.error), two.error
