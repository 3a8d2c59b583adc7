"""The hypothesis machine of the rendezvous model (:class:`RendezvousMachine`): joins, steps, crashes,
restarts, time, staleness, caches, partitions, resets and corruption interleaved over :class:`model_world.World`,
every oracle checked after every rule (``test_model.py`` says which).  Run by ``test_model.py``, forced onto big
worlds' paths and replayed step by step in ``test_model_replays.py``, subclassed by ``hunt_liveness29.py``.

``FSMINGLE_MODEL_EXAMPLES`` (:data:`MODEL_EXAMPLES`, default 400): how many runs the machine's tests draw.
"""

from __future__ import annotations

import logging
import math
import os

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fsmingle.fs.layout import RELEASE
from fsmingle.fs.records import Claim, encode

try:
    import fakefs
    from model_oracles import GLUSTER_NEG, LONG
    from model_queue import FakeScheduler
    from model_world import Host, Proc, World
except ImportError:  # tests/ imported as a package
    from tests import fakefs
    from tests.model_oracles import GLUSTER_NEG, LONG
    from tests.model_queue import FakeScheduler
    from tests.model_world import Host, Proc, World

MODEL_EXAMPLES = int(os.environ.get("FSMINGLE_MODEL_EXAMPLES", "400"))


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


def replay(monkeypatch, **setup) -> RendezvousMachine:
    """A machine set up as ``setup`` says (as hypothesis drew it), to replay a shrunk run's steps
    outside hypothesis (its ``note``/``event`` need a test context: silenced)."""
    monkeypatch.setitem(globals(), "note", lambda *a: None)
    monkeypatch.setitem(globals(), "event", lambda *a: None)
    m = RendezvousMachine()
    m.setup(**setup)
    return m
