"""A swarm process: ``python -m benchmarks.swarm.driver CONFIG.json GROUP``.

Many real :class:`fsmingle.protocol.participant.Participant` state machines in one process,
stepped by one scheduler -- the idea of the model harness (``tests/test_model.py``: step the
participant with the earliest wake-up) on the real filesystem (a ``PosixStore`` from
``open_job_dir``, as :func:`fsmingle.rendezvous` opens it) and the real network
(:class:`fsmingle.net.channel.TcpTransport` on loopback).  Nothing of the protocol is replaced:
each participant is built as :func:`fsmingle.api.rendezvous` builds it and driven as
:meth:`Participant.run` drives it -- :meth:`~Participant.step`, then wait
:meth:`~Participant.next_delay` seconds or until a message arrives on its channel -- except that
the wait is one ``epoll`` for the whole process instead of one blocking call per thread.

How a wait becomes the scheduler's:

* Timers: a heap of (wake-up time, participant).
* Messages: each participant's endpoint (a member's :class:`~fsmingle.net.channel.Link`, rank 0's
  :class:`~fsmingle.net.channel.Hub`) has its own ``selectors`` epoll, which is itself a pollable
  descriptor; the scheduler registers that descriptor, edge-triggered, in its own epoll, so any
  new arrival on any of the participant's sockets wakes it (as ``role.wait`` returns early).

What differs from separate hosts, on purpose and named in the report: every participant has
its own loopback address (``127.a.b.c``) and, with ``sources: own``, its connections to rank 0 come
from that address (``socket.create_connection(source_address=…)``, patched into the channel
module's view of ``socket`` only, as the counting ``os`` is); participants of one process share
its CPU and GIL, and their host identities are made up (no direct pid liveness check: each
looks like a process on a host of its own).

stdin commands (one per line): ``go [P...]`` (start these participants now; no argument: this
group's), ``kill P`` (SIGKILL as the peers see it: its sockets close, its files stay; it is
never stepped again), ``snap TAG``, ``stats``, ``exit``.  stdout: ``@@ {json}`` events as
:mod:`benchmarks.rdzv.worker`'s, plus ``rank0`` (participant holds rank 0), ``stats``.
"""

from __future__ import annotations

import collections
import heapq
import json
import os
import random
import select
import socket
import sys
import time
import traceback
from typing import Any

from ..rdzv.common import emit_ready, load_config, pct
from ..rdzv.fsops import OpCounter, install_counting_os


def emit(**ev: Any) -> None:
    sys.stdout.write("@@ " + json.dumps(ev) + "\n")
    sys.stdout.flush()


class _SourceSocket:
    """The ``socket`` module as :mod:`fsmingle.net.channel` sees it: ``create_connection`` binds
    the stepping participant's own address, so rank 0 sees one source per participant (one host
    each), not thousands from 127.0.0.1 (its per-source cap of unauthenticated connections)."""

    def __init__(self):
        self.src: str | None = None

    def __getattr__(self, name):
        return getattr(socket, name)

    def create_connection(self, address, timeout=None, source_address=None, **kw):
        if source_address is None and self.src is not None:
            source_address = (self.src, 0)
        return socket.create_connection(address, timeout, source_address, **kw)


class Swarm:
    """One process's participants and their scheduler."""

    def __init__(self, cfg: dict, group: int):
        # Everything the participants run is imported before the counting ``os`` goes in (it
        # patches the modules loaded at that moment), as the thread harness's worker does.
        import fsmingle
        import fsmingle.net.channel as channel
        import fsmingle.protocol.member
        import fsmingle.protocol.rank0.coordinator  # noqa: F401
        from fsmingle.protocol.rank0 import door
        from fsmingle.protocol.rank0.coordinator import Coordinator

        self.cfg, self.group = cfg, group
        self.coordinator_cls = Coordinator
        self.n = cfg["nnodes"]
        self.counter = OpCounter()
        self.patched = install_counting_os(self.counter)
        self.source = _SourceSocket()
        if cfg.get("sources", "own") == "own":
            channel.socket = self.source
        cap = cfg.get("unauth_cap")
        self.cap_shipped = getattr(door, "UNAUTH_PER_SOURCE", None)
        self.sent: dict[str, int] = {}  # messages this process queued, by type (rank 0's: what it pays for)
        real_queue = channel._Endpoint._queue

        def counting_queue(end, c, msg, _real=real_queue, _sent=self.sent):
            t = "ping" if msg is channel._PING else msg.get("t", "?")  # a ping goes pre-encoded
            _sent[t] = _sent.get(t, 0) + 1
            return _real(end, c, msg)

        channel._Endpoint._queue = counting_queue
        if cap:
            door.UNAUTH_PER_SOURCE = int(cap)  # the measurement's "raised" setting (report says so)
        self.parts: dict[int, Any] = {}
        self.unborn: set[int] = set()  # started, not built yet (start)
        self.ready: collections.deque[int] = collections.deque()  # a message arrived for them (loop)
        self.in_ready: set[int] = set()
        self.t_arr: dict[int, float] = {}
        self.heap: list[tuple[float, int, int]] = []
        self.due: dict[int, float] = {}
        self.seq = 0
        self.ep = select.epoll()
        self.watch: dict[int, tuple[Any, int]] = {}  # p -> (selector object, its fd) registered
        self.owner: dict[int, int] = {}  # fd -> p
        self.stdin_buf = b""
        self.quit = False
        self.steps = 0
        self.cpu = 0.0
        self.lags: list[float] = []
        self.rank0_seen = False
        self.world_ready = False
        self.cpu0 = time.process_time()
        self.go_cpu: float | None = None
        self.sys0, self.go_sys = os.times().system, None

    # ---------------------------------------------------------------- participants
    def make(self, p: int):
        from fsmingle._version import __version__
        from fsmingle.fs.jobdir import open_job_dir
        from fsmingle.fs.records import HostId
        from fsmingle.net.channel import TcpTransport
        from fsmingle.protocol.cleanup import locked_cleaner
        from fsmingle.protocol.participant import Participant, SystemClock, Timing

        cfg = self.cfg
        timing = Timing(**cfg.get("timing", {}))
        self.counter.bind(p)
        store = open_job_dir(cfg["dir"], cfg["job_id"], create_base=False)
        return Participant(
            store,
            job_id=cfg["job_id"],
            mode="node",
            size=self.n,
            rank=None,
            addr=cfg["addrs"][p],
            instance=f"{random.getrandbits(64):016x}",
            me=HostId(hostname=f"swarm{p}", boot_id=f"boot-{p}", pidns="swarm", pid=100 + p, pid_start=1.0),
            timeout=float(cfg["rdzv_timeout"]),
            timing=timing,
            clock=SystemClock(),
            transport=TcpTransport(ping_interval=timing.ping_interval),
            on_progress=self._progress(p),
            cleaner=locked_cleaner(store, timing.stale_after),
            version=__version__,
        )

    def _progress(self, p: int):
        def on_progress(pr) -> None:
            present = getattr(pr, "present", None)
            if pr.rank == 0 and present is not None and len(present) >= self.n - 1 and not self.world_ready:
                self.world_ready = True
                emit(ev="world_ready", p=p, t=time.monotonic(), present=len(present), cpu=self._cpu(), sys=self._sys())

        return on_progress

    def _cpu(self) -> float:
        return time.process_time() - (self.go_cpu if self.go_cpu is not None else self.cpu0)

    def _sys(self) -> float:
        """The kernel's part of :meth:`_cpu` (system calls: sockets, files, epoll) since the same start."""
        return os.times().system - (self.go_sys if self.go_sys is not None else self.sys0)

    def start(self, p: int) -> None:
        """Let ``p`` arrive now: it is built at its first turn of the scheduler (thousands started
        by one ``go`` must not be built in one burst while nobody is stepped), and its arrival is
        stamped then, as the thread harness stamps it in the participant's own thread."""
        if self.go_cpu is None:
            self.go_cpu, self.go_sys = time.process_time(), os.times().system
        self.unborn.add(p)
        self.wake(p, time.monotonic())

    def _arrive(self, p: int) -> None:
        self.unborn.discard(p)
        now = time.monotonic()
        self.t_arr[p] = now
        emit(ev="entered", p=p, t=now, tid=p)
        self.parts[p] = self.make(p)

    def kill(self, p: int) -> None:
        """What the peers see of a SIGKILL: every socket of the participant closes, nothing more."""
        part = self.parts.pop(p, None)
        self.due.pop(p, None)
        self.unborn.discard(p)
        self._unwatch(p)
        if part is None:
            return
        role = part.role
        for end in (getattr(role, "link", None), part.hub):
            if end is None:
                continue
            socks = [getattr(end, "_lsock", None)] + [c.sock for c in getattr(end, "_conns", {}).values()]
            if getattr(end, "_c", None) is not None:
                socks.append(end._c.sock)
            for s in socks:
                if s is not None:
                    s.close()
            end.sel.close()
        emit(ev="killed", p=p, t=time.monotonic(), gen=part.gen, rank=part.rank, state=part.state.value)

    def wake(self, p: int, t: float) -> None:
        if t < self.due.get(p, float("inf")):
            self.due[p] = t
            self.seq += 1
            heapq.heappush(self.heap, (t, self.seq, p))

    def _endpoint_sel(self, part):
        from fsmingle.protocol.states import State

        if part.state is not State.WAIT or part.role is None:
            return None
        end = getattr(part.role, "hub", None) or getattr(part.role, "link", None)
        return None if end is None else end.sel

    def _unwatch(self, p: int) -> None:
        old = self.watch.pop(p, None)
        if old is not None:
            try:
                self.ep.unregister(old[1])
            except (OSError, ValueError):
                pass  # closed with its selector (epoll forgets a closed file by itself)
            if self.owner.get(old[1]) == p:
                del self.owner[old[1]]

    def _sync_watch(self, p: int, part) -> None:
        sel = self._endpoint_sel(part)
        old = self.watch.get(p)
        if old is not None and old[0] is sel:
            return
        self._unwatch(p)
        if sel is None:
            return
        try:
            fd = sel.fileno()
        except (OSError, ValueError):
            return
        self.ep.register(fd, select.EPOLLIN | select.EPOLLET)
        self.watch[p] = (sel, fd)
        self.owner[fd] = p

    def _pings_only(self, p: int) -> bool:
        """True if rank 0's connections brought it nothing but pings (read now, as its own
        ``Coordinator.wait`` reads them: ``Hub.poll`` waits on past pings); its timer stays."""
        role = getattr(self.parts.get(p), "role", None)
        if not isinstance(role, self.coordinator_cls):
            return False
        role.wait(0)
        return not role.inbox

    def step(self, p: int) -> None:
        if p in self.unborn:
            self._arrive(p)
        part = self.parts.get(p)
        if part is None:
            return
        self.counter.bind(p)
        self.source.src = self.cfg["addrs"][p]
        c0 = time.thread_time()
        try:
            placement = part.step()
        except Exception:
            self.cpu += time.thread_time() - c0
            self.parts.pop(p, None)
            self._unwatch(p)
            emit(ev="error", p=p, t=time.monotonic(), error=traceback.format_exc())
            return
        self.cpu += time.thread_time() - c0
        self.steps += 1
        if part.rank == 0 and not self.rank0_seen and part.role is not None:
            self.rank0_seen = True
            emit(ev="rank0", p=p, t=time.monotonic(), gen=part.gen)
        if placement is not None:
            t_rel = time.monotonic()
            self._unwatch(p)
            del self.parts[p]
            emit(
                ev="released",
                p=p,
                t_arr=self.t_arr[p],
                t_rel=t_rel,
                rank=placement.rank,
                world=placement.size,
                master_addr=placement.master_addr,
                master_port=placement.master_port,
                generation=placement.generation,
                ops=dict(self.counter.counts.get(p, {})),
                cpu=self._cpu(),
                sys=self._sys(),
            )
            return
        self._sync_watch(p, part)
        self.wake(p, time.monotonic() + part.next_delay())

    # ---------------------------------------------------------------- control
    def command(self, line: str) -> None:
        cmd = line.split()
        if not cmd:
            return
        if cmd[0] == "go":
            for p in [int(x) for x in cmd[1:]] or self.cfg["groups"][self.group]:
                self.start(p)
        elif cmd[0] == "kill":
            self.kill(int(cmd[1]))
        elif cmd[0] == "snap":
            emit(
                ev="counts",
                tag=cmd[1],
                t=time.monotonic(),
                cpu=self._cpu(),
                sys=self._sys(),
                counts={str(p): c for p, c in self.counter.snapshot().items()},
            )
        elif cmd[0] == "stats":
            self.report()
        elif cmd[0] == "exit":
            self.quit = True

    def report(self) -> None:
        emit(
            ev="stats",
            group=self.group,
            steps=self.steps,
            step_cpu_s=self.cpu,
            process_cpu_s=self._cpu(),
            lag_p50=pct(self.lags, 50),
            lag_p99=pct(self.lags, 99),
            lag_max=max(self.lags) if self.lags else None,
            live=len(self.parts) + len(self.unborn),
            cap_shipped=self.cap_shipped,
            sent=self.sent,
        )

    def _read_stdin(self) -> None:
        data = os.read(0, 1 << 16)
        if not data:
            self.quit = True
            return
        self.stdin_buf += data
        while b"\n" in self.stdin_buf:
            line, self.stdin_buf = self.stdin_buf.split(b"\n", 1)
            self.command(line.decode())

    def loop(self) -> None:
        """Step whoever a message arrived for, then whoever is due, then wait in one epoll.

        A message's participant goes first (FIFO): a real host answers within microseconds, and
        the protocol's short timeouts (a challenge's answer within ``probe_timeout``, the ack) are
        on that path; timers (a connected member's ping tick every second, join polls) tolerate a
        late turn, and their lateness is sampled (``lag``)."""
        os.set_blocking(0, False)
        self.ep.register(0, select.EPOLLIN)
        rng = random.Random(self.group)
        while not self.quit:
            ran = 0
            while self.ready and ran < 1024:
                p = self.ready.popleft()
                self.in_ready.discard(p)
                if self._pings_only(p):
                    continue  # as Participant.run: rank 0's wait() ends on an event, not on a ping
                self.step(p)
                ran += 1
            now = time.monotonic()
            while self.heap and self.heap[0][0] <= now and ran < 512:
                t, _, p = heapq.heappop(self.heap)
                if self.due.get(p) != t:
                    continue
                del self.due[p]
                if rng.random() < 0.05:
                    self.lags.append(now - t)  # a sample: how late the scheduler steps a due participant
                self.step(p)
                ran += 1
                now = time.monotonic()
            if self.ready or (self.heap and self.heap[0][0] <= now):
                timeout = 0.0  # more to do: only look at the sockets, then go on
            else:
                timeout = min(1.0, self.heap[0][0] - now) if self.heap else 1.0
            for fd, _ in self.ep.poll(max(0.0, timeout), 4096):
                if fd == 0:
                    self._read_stdin()
                    continue
                p = self.owner.get(fd)
                if p is not None and p not in self.in_ready:
                    self.in_ready.add(p)
                    self.ready.append(p)


def main(cfg_path: str, group: int) -> None:
    cfg, t0, nofile = load_config(cfg_path)
    try:
        sw = Swarm(cfg, group)
    except Exception:
        emit(ev="fatal", error=traceback.format_exc())
        os._exit(4)
    emit_ready(emit, t0, nofile, patched=sw.patched, impl=os.path.dirname(sys.modules["fsmingle"].__file__))
    prof = None
    if cfg.get("profile") and group in (0, 1):  # rank 0's and one member process under cProfile
        import cProfile

        prof = cProfile.Profile(time.process_time)  # CPU, not the waits in epoll
        prof.enable()
    sampler = None
    if cfg.get("sample") and group == 0:  # rank 0's process, by CPU time at its own speed
        from .sampler import Sampler

        sampler = Sampler()
        sampler.start()
    try:
        sw.loop()
    except Exception:
        emit(ev="fatal", error=traceback.format_exc())
    if prof is not None:
        prof.disable()
        prof.dump_stats(cfg["profile"] + ("" if group == 0 else f".{group}"))
    if sampler is not None:
        sampler.dump(cfg["sample"])
    sw.report()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
