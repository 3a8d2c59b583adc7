"""Keep-alives off the shared state: per-node heartbeat files, judged by counters.

torch's dynamic rendezvous keeps every node's keep-alive time inside the one
compare-and-set state (``_RendezvousState.last_heartbeats``, written by
``_RendezvousKeepAliveOp`` every ``keep_alive_interval``).  At 1,024 nodes
that is ~205 writes/s of a 70 KB state that all nodes contend for, more than
one shared file can take, and live nodes go stale.  Here:

* :class:`HeartbeatWriter`: each agent replaces its own ``hb/<key>.json``
  every ``keep_alive_interval`` with a counter one higher.  No times: node
  clocks differ, and file mtimes come from the file server's clock and are
  cached by NFS clients (``acregmax``), so neither is compared to a local clock.
* :class:`LivenessView`: an observer remembers, per node, the highest counter
  it has seen and *its own monotonic time* when that counter last grew.  A
  node whose counter has not grown for ``liveness_s`` on the observer's clock
  is dead.  A node's clock starts when this observer first needs a verdict on
  it, and again when it first reads the node's counter: growth can only be
  seen after a first counter, so a counter first read late (a node missing
  from the scan, read directly only when nearly dead) must not count the wait
  before it as time without growth (never judged dead before ``liveness_s``
  of watching its counter).
* Reading N files per observer would be O(N^2) per interval.  So one agent,
  the *scanner* (the smallest member; any observer takes over when the scan
  stalls), reads every member's file, its own included, and publishes the
  counters it saw as ``hb/scan.json``; observers read that one file.
  Counters are facts that transfer between observers (a counter that grew is
  a sign of life whoever read it); times would not.  Before an observer reports a node as (nearly)
  dead it reads that node's file itself, so a slow or dead scanner can only
  delay a verdict, never cause a false one.

The backend folds these verdicts into ``last_heartbeats`` of the state it
hands torch (``FsRendezvousBackend.get_state``), so torch's own rule
(``_BackendRendezvousStateHolder._sanitize``: dead = last heartbeat older
than ``keep_alive_interval * keep_alive_max_attempt``) drops dead nodes, and
the shared state is written only when membership changes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import RecordError, StorageError
from ..fs.store import Store
from . import codec
from ._torch_private import NodeDesc

log = logging.getLogger("fsmingle.torchrun")


class HeartbeatWriter:
    """This node's heartbeat file, replaced every ``interval_s`` seconds by a daemon thread.

    When this node is the scanner (:meth:`LivenessView.is_scanner`), a second
    daemon thread runs :meth:`LivenessView.scan_if_due` every half interval,
    so scans go on while the agent is busy elsewhere (waiting for a store,
    running workers) and never delay a beat.

    Args:
        store (Store): the run directory.
        run_id (str): written into the file.
        node (_NodeDesc): this agent's node.
        interval_s (float): seconds between beats (torch's ``keep_alive_interval``).
        view (LivenessView | None): scanned from the thread when this node is the scanner.
    """

    def __init__(self, store: Store, run_id: str, node: NodeDesc, interval_s: float, view: LivenessView | None = None):
        self._store = store
        self._run_id = run_id
        self._node = node
        self._interval = float(interval_s)
        self._view = view
        self._count = 0
        self._last_ok: float | None = None  # monotonic time of the last successful beat
        self.started: float | None = None  # monotonic time of the first start()
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._scanner: threading.Thread | None = None
        self.writes = 0  # successful beats (benchmarks read it)
        self.max_gap = 0.0  # longest time between two successful beats, seconds (benchmarks read it)

    @property
    def name(self) -> str:
        """The heartbeat file's name in the run directory."""
        return codec.heartbeat_name(self._node)

    @property
    def last_ok(self) -> float | None:
        """``time.monotonic()`` of the last beat that reached the directory; None before any."""
        return self._last_ok

    def age_as_seen(self, liveness_s: float, interval_s: float) -> float:
        """This node's heartbeat age as others will judge it, for the state torch reads, seconds.

        0 before :meth:`start` (nobody judges a node that has not joined) and
        while beats succeed ("just now": torch's ``_should_keep_alive`` then
        never asks for a keep-alive write of the state); once beats have
        failed for ``liveness_s - interval_s``, the real age, so torch drops
        this node as the others will.
        """
        if self.started is None:
            return 0.0
        age = time.monotonic() - (self._last_ok if self._last_ok is not None else self.started)
        return 0.0 if age < liveness_s - interval_s else age

    def beat(self) -> bool:
        """Write the next counter now.

        Returns:
            bool: True if written; False if the directory refused it (logged
            once per failing streak; the thread keeps trying).
        """
        self._count += 1
        try:
            # publish(): write a unique temporary, fsync, rename() onto the
            # name.  rename within one directory is atomic on NFS, Lustre and
            # GPFS, so readers see the old or the new counter, never a torn file;
            # they open() afresh each time (close-to-open consistency).
            self._store.publish(self.name, codec.encode_heartbeat(self._run_id, self._node, self._count))
        except FileNotFoundError:
            self._store.mkdir(codec.HB_DIR)  # first beat of the run, or the directory was cleaned
            return self.beat()
        except (OSError, StorageError) as e:
            if not self._failing:
                log.warning("node %s cannot write its heartbeat file %s: %s", self._node, self.name, e)
            self._failing = True
            return False
        self._failing = False
        now = time.monotonic()
        if self._last_ok is not None:
            self.max_gap = max(self.max_gap, now - self._last_ok)
        self._last_ok = now
        self.writes += 1
        return True

    def start(self) -> None:
        """Beat once now (so the file exists before this node joins the state), then every interval."""
        if self._thread is not None and self._thread.is_alive():
            return
        if self.started is None:
            self.started = time.monotonic()
        self.beat()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"fsmingle-heartbeat-{self._node}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Beats on a fixed schedule (like torch's _PeriodicTimer): a late beat
        # does not shift the next one.  Scans run in their own thread, started
        # once this node becomes the scanner: reading 1,000 files on a loaded
        # file server must never delay this node's own beat.
        next_beat = time.monotonic() + self._interval
        while not self._stop.wait(max(0.0, next_beat - time.monotonic())):
            self.beat()
            next_beat = max(next_beat + self._interval, time.monotonic() + self._interval / 2)
            view = self._view
            if view is not None and view.is_scanner() and self._scanner is None:
                self._scanner = threading.Thread(target=self._scan_loop, name="fsmingle-heartbeat-scan", daemon=True)
                self._scanner.start()

    def _scan_loop(self) -> None:
        assert self._view is not None
        while not self._stop.wait(self._interval / 2):
            try:
                self._view.scan_if_due()
            except Exception as e:  # a failing scan must never end the scanning
                log.warning("heartbeat scan failed: %s: %s", type(e).__name__, e)

    def stop(self, remove: bool = True) -> None:
        """Stop the thread; with ``remove``, delete the heartbeat file (this node leaves)."""
        self._stop.set()
        for t in (self._thread, self._scanner):
            if t is not None:
                t.join(timeout=5)
        self._scanner = None
        if remove:
            self._store.remove(self.name)  # a reader holding it open keeps the old counter (.nfsXXXX): harmless


@dataclass
class _Obs:
    count: int | None  # highest counter seen; None: no valid file read yet
    changed: float  # observer's monotonic time the counter last grew (or was first needed, or first read)
    read: float  # observer's monotonic time of the last direct read of the file
    asked: float  # observer's monotonic time someone last needed a verdict on it


class LivenessView:
    """One observer's judgement of other nodes' liveness from their heartbeat counters.

    Args:
        store (Store): the run directory.
        run_id (str): expected in every file.
        interval_s (float): heartbeat interval (torch's ``keep_alive_interval``).
        liveness_s (float): a counter unchanged this long is dead
            (``keep_alive_interval * keep_alive_max_attempt``).
        clock (Callable[[], float]): monotonic seconds (tests may pass a fake).
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        interval_s: float,
        liveness_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._run_id = run_id
        self.interval = float(interval_s)
        self.liveness = float(liveness_s)
        self._clock = clock
        self._obs: dict[NodeDesc, _Obs] = {}
        self._lock = threading.Lock()
        self.me: NodeDesc | None = None
        self._members: tuple[NodeDesc, ...] = ()
        self._scan_seq = -1  # seq of the last scan file read (or written)
        self._scan_seen = clock()  # when that seq last changed
        self._scan_read = float("-inf")  # when the scan file was last read
        self._scanned = float("-inf")  # when this observer last scanned
        self._takeover_s = 2 * self.interval + random.uniform(0, self.interval)
        self.reads = 0  # heartbeat/scan files read (benchmarks read it)
        self.scans = 0  # scans published

    # -- what the backend tells us ------------------------------------------------

    def set_members(self, members: Iterable[NodeDesc]) -> None:
        """The members of the newest state: whom the scanner scans; observations of others are dropped."""
        members = tuple(sorted(members))
        if members == self._members:
            return
        self._members = members
        keep = set(members)
        with self._lock:
            for n in [n for n in self._obs if n not in keep]:
                del self._obs[n]

    def is_scanner(self) -> bool:
        """True if this node is the smallest member of the newest state seen."""
        return bool(self._members) and self.me is not None and self._members[0] == self.me

    # -- judging ------------------------------------------------------------------

    def observe(self, nodes: Iterable[NodeDesc]) -> None:
        """Bring the view of ``nodes`` (other nodes only) up to date.

        Reads at most: the scan file (once per half interval), or, when the
        scan has stalled for 2-3 intervals, every node's file (once per half
        interval, published as a new scan); plus each node that looks dead
        or nearly dead, directly (once per second each).
        """
        now = self._clock()
        others = [n for n in nodes if n != self.me]
        if not others:
            return
        with self._lock:
            for n in others:
                o = self._obs.get(n)
                if o is None:
                    self._obs[n] = _Obs(None, now, float("-inf"), now)
                elif now - o.asked > 2 * self.interval and not self.is_scanner():
                    # Nobody here followed it for a while (an idle agent
                    # judges nobody): a counter we did not look at is not
                    # a frozen one; start its clock again.
                    o.changed = max(o.changed, now)
                if o is not None:
                    o.asked = now
            if not self.is_scanner() and now - self._scan_read >= self.interval / 2:
                following = now - self._scan_read <= 2 * self.interval
                self._read_scan(now)
                if not following:
                    # We had not been reading the scan: give its writer the
                    # full takeover time before judging it stalled.
                    self._scan_seen = max(self._scan_seen, now)
            if self.is_scanner() or now - self._scan_seen > self._takeover_s:
                self._scan_locked(others, now)
            suspect = self.liveness - self.interval / 2
            recheck = min(1.0, self.interval / 4)
            for n in others:
                o = self._obs[n]
                if now - o.changed >= suspect and now - o.read >= recheck:
                    self._read_direct(n, now)

    def age(self, node: NodeDesc) -> float:
        """Seconds on this observer's clock since ``node``'s counter last grew (0 if never needed)."""
        o = self._obs.get(node)
        return 0.0 if o is None else max(0.0, self._clock() - o.changed)

    def is_live(self, node: NodeDesc) -> bool:
        """``age(node) < liveness_s``."""
        return self.age(node) < self.liveness

    # -- reading --------------------------------------------------------------------

    def _seen(self, n: NodeDesc, count: int, now: float) -> None:
        o = self._obs.get(n)
        if o is None:
            return
        if o.count is None:
            # First valid counter: not a sign of life (a dead node's file
            # stays readable), but only from now on can growth be seen: a
            # live node's next beat may come a whole interval after this
            # read.  Counting from when we first needed the node would judge
            # a live node first read at liveness - interval/2 (a node the
            # scan lacks) dead before its next beat could show.
            o.count = count
            o.changed = max(o.changed, now)
        elif count > o.count:
            o.count, o.changed = count, now

    def _read_direct(self, n: NodeDesc, now: float) -> None:
        o = self._obs[n]
        o.read = now
        self.reads += 1
        try:
            # A fresh open() (close-to-open consistency): attributes and
            # listings may be cached for up to acdirmax/acregmax on NFS, file
            # contents after open() are not.  A missing file counts as "no
            # change", never as death by itself: a negative dentry may hide a
            # new file for a while.
            data = self._store.read(codec.heartbeat_name(n))
        except OSError:
            return
        if not data:
            return
        try:
            self._seen(n, codec.decode_heartbeat(data, self._run_id, n), now)
        except RecordError as e:
            log.debug("ignoring heartbeat file of %s: %s", n, e)

    def _read_scan(self, now: float) -> None:
        self._scan_read = now
        self.reads += 1
        try:
            data = self._store.read(codec.SCAN_NAME)
        except OSError:
            return
        if not data:
            return
        try:
            _writer, seq, counts = codec.decode_scan(data, self._run_id)
        except RecordError as e:
            log.debug("ignoring %s: %s", codec.SCAN_NAME, e)
            return
        if seq != self._scan_seq:
            self._scan_seq, self._scan_seen = seq, now
        for n, c in counts.items():
            self._seen(n, c, now)

    def scan_if_due(self) -> None:
        """Scan every member (this node included) if this node is the scanner and half an interval passed."""
        if not self.is_scanner():
            return
        now = self._clock()
        with self._lock:
            self._scan_locked([], now)

    def _scan_locked(self, others: list[NodeDesc], now: float) -> None:
        if now - self._scanned < self.interval * 0.4 or self.me is None:
            return
        self._scanned = now
        # Our own file too: observers get every member's counter from the
        # scan, the scanner's included (else a new observer would have no
        # counter for the scanner until it read its file directly).
        targets = set(self._members) | set(others) | {self.me}
        for n in targets:
            if n not in self._obs:
                self._obs[n] = _Obs(None, now, float("-inf"), now)
            self._read_direct(n, now)
        counts = {n: o.count for n, o in self._obs.items() if o.count is not None and n in targets}
        # Readers only compare seq for equality ("a new scan"): a random one
        # needs no agreement between successive scanners.
        self._scan_seq = random.getrandbits(62)
        self._scan_seen = now
        try:
            # Atomic replace (rename within hb/, atomic on NFS, Lustre, GPFS):
            # readers see a whole scan, old or new.  Two scanners at once only
            # replace each other's scans; every scan holds true counters.
            self._store.publish(codec.SCAN_NAME, codec.encode_scan(self._run_id, self.me, self._scan_seq, counts))
            self.scans += 1
        except FileNotFoundError:
            self._store.mkdir(codec.HB_DIR)
        except (OSError, StorageError) as e:
            log.warning("cannot publish the heartbeat scan %s: %s", codec.SCAN_NAME, e)
