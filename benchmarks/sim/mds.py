"""In-memory shared filesystem with a metadata-server (MDS) cost model, as a :class:`fsmingle.fs.store.Store`."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsmingle.fs.store import Store

from ..opkinds import SERVER_KINDS


@dataclass
class CostModel:
    """Metadata-server costs, all in seconds.

    Attributes:
        op_latency (float): client<->server round trip added to every operation.
        ops_per_s (float): the server's ceiling: each operation occupies it ``1/ops_per_s`` s.
        entry_cost (float): server time per directory entry a listing returns.
    """

    op_latency: float = 0.0005
    ops_per_s: float = 5000.0
    entry_cost: float = 2e-6


@dataclass
class MDS:
    """The server: a capacity of one second of service per second, booked in time slots.

    Each operation needs ``1/ops_per_s`` s of service (plus ``entry_cost`` per entry listed) and
    takes it from the first slots at or after its arrival that have room.  Booking by slot, not
    in the order the simulator happens to run participants' steps, keeps the ceiling exact
    without a participant whose step ran ahead in virtual time (a long step is processed at
    once) pushing everybody's later-run but earlier-issued operations behind its own.
    """

    cost: CostModel
    slot: float = 0.001  # seconds per booking slot
    ops: int = 0
    busy: float = 0.0
    per_second: dict = field(default_factory=dict)  # whole virtual second -> ops started in it
    used: dict = field(default_factory=dict)  # slot -> service seconds booked in it
    full: dict = field(default_factory=dict)  # full slot -> a later slot to look at (path-compressed)

    def _first_open(self, b: int) -> int:
        path = []
        while b in self.full:
            path.append(b)
            b = self.full[b]
        for x in path:
            self.full[x] = b
        return b

    def serve(self, t: float, kind: str, entries: int = 0) -> float:
        """An operation issued at ``t``; returns when its reply is back at the client."""
        service = 1.0 / self.cost.ops_per_s + entries * self.cost.entry_cost
        arrive = t + self.cost.op_latency / 2
        need, b, start, end = service, int(arrive / self.slot), None, arrive
        while need > 1e-15:
            b = self._first_open(b)
            used = self.used.get(b, 0.0)
            take = min(self.slot - used, need)
            at = max(b * self.slot + used, arrive) if start is None else b * self.slot + used
            start = at if start is None else start
            self.used[b] = used + take
            need -= take
            end = max(end, at + take)
            if self.used[b] >= self.slot - 1e-15:
                self.full[b] = b + 1
            b += 1
        self.ops += 1
        self.busy += service
        sec = int(start)
        self.per_second[sec] = self.per_second.get(sec, 0) + 1
        return end + self.cost.op_latency / 2


class SimFS:
    """The truth: directories (name -> set of entries) and files (name -> bytes)."""

    def __init__(self, mds: MDS):
        self.mds = mds
        self.dirs: dict[str, set[str]] = {"": set()}
        self.files: dict[str, bytes] = {}
        self._sorted: dict[str, list[str]] = {}

    @staticmethod
    def split(name: str) -> tuple[str, str]:
        d, _, b = name.rpartition("/")
        return d, b

    def listing(self, d: str) -> list[str]:
        got = self._sorted.get(d)
        if got is None:
            got = self._sorted[d] = sorted(self.dirs[d])
        return got

    def add(self, name: str) -> None:
        d, b = self.split(name)
        self.dirs[d].add(b)
        self._sorted.pop(d, None)


class SimStore(Store):
    """One participant's view of :class:`SimFS` (coherent: no client caches), charging the MDS.

    Each call counts the system calls :class:`fsmingle.fs.store.PosixStore` would make for it
    (``open``+``fstat``+2 ``read``+``close`` for a read, temp-file ``create``+``write``+``fsync``+
    ``close`` then ``rename`` for a publish or ``link``+``unlink`` for an exclusive create...).
    """

    def __init__(self, fs: SimFS, clock, counts: dict[str, int]):
        self.fs, self.clock, self.counts = fs, clock, counts

    def _op(self, kind: str, k: int = 1, entries: int = 0) -> None:
        self.counts[kind] += k
        if kind in SERVER_KINDS:
            for _ in range(k):
                self.clock.t = self.fs.mds.serve(self.clock.t, kind, entries)

    def path(self, name: str) -> str:
        return "sim:/" + name

    def listdir(self, name: str = "") -> list[str]:
        self.counts["entries"] += len(self.fs.dirs.get(name, ()))
        self._op("readdir", entries=len(self.fs.dirs.get(name, ())))
        if name not in self.fs.dirs:
            return []
        return self.fs.listing(name)

    def read(self, name: str) -> bytes | None:
        self._op("open")
        data = self.fs.files.get(name)
        if data is None:
            return None
        self._op("stat")
        self._op("read", 2)
        self.counts["close"] += 1
        return data

    def _tmp(self, name: str, fsync: bool = True) -> None:
        d, _ = self.fs.split(name)
        self._op("create")
        if d not in self.fs.dirs:
            raise FileNotFoundError(name)
        self._op("write")
        if fsync:
            self._op("fsync")
        self.counts["close"] += 1

    def publish(self, name: str, data: bytes) -> None:
        self._tmp(name)
        self._op("rename")
        if name not in self.fs.files:
            self.fs.add(name)
        self.fs.files[name] = bytes(data)

    def create(self, name: str, data: bytes, fsync: bool = True) -> bool:
        self._tmp(name, fsync)
        self._op("link")
        ok = name not in self.fs.files
        if ok:
            self.fs.add(name)
            self.fs.files[name] = bytes(data)
        else:
            self._op("stat")  # link count of our temp file: did a lost reply hide our success?
        self._op("unlink")
        return ok

    def mkdir(self, name: str) -> bool:
        self._op("mkdir")
        if name in self.fs.dirs:
            self._op("stat")
            return False
        d, _ = self.fs.split(name)
        if d not in self.fs.dirs:
            raise FileNotFoundError(name)
        self.fs.dirs[name] = set()
        self.fs.add(name)
        return True

    def remove(self, name: str) -> None:
        self._op("unlink")
        if self.fs.files.pop(name, None) is not None:
            d, b = self.fs.split(name)
            self.fs.dirs[d].discard(b)
            self.fs._sorted.pop(d, None)

    def retire(self, name: str, keep_for: float = 0.0) -> bool:  # keep_for: nothing to keep in a model
        self._op("rename")
        if name not in self.fs.dirs:
            return False
        for k in [k for k in self.fs.files if k.startswith(name + "/")]:
            del self.fs.files[k]
        for k in [k for k in self.fs.dirs if k == name or k.startswith(name + "/")]:
            del self.fs.dirs[k]
        d, b = self.fs.split(name)
        self.fs.dirs[d].discard(b)
        self.fs._sorted.pop(d, None)
        return True

    def read_retired(self, name: str) -> bytes | None:  # retire keeps nothing in the model (above)
        return None
