"""Would *combining* adds meet issue 30's 256-rank target?  A prototype measured before the protocol is built.

FolderStore's contended ``add`` links a delta version in the next free slot of its key's epoch; N adders of one
counter race for one name at a time, ~60 metadata calls per add at 256 ranks on four cached mounts
(``benchmarks/bench_folderstore.py``).  *Combining* (docs/folderstore.md, "Combining adds"): an adder that
loses its first race leaves a **request** (``q-<token>-<amount>``, a name of its own: no race) and whoever next wins
a slot carries every request it lists in one **batch**.  This module runs that protocol's fault-free path -- the
part that decides the speed -- on real mounts, beside the real ``FolderKV.add`` in the same run:

* a version ``v-<m>`` holds ``d <amount>`` (a delta) or ``b <batch token>`` (a batch's slot, won *before* its
  content is fixed); ``v-1`` holds the start value;
* a slot's winner claims requests by ``rename(q-T-a, r-T-a-<m>-<B>)`` (one rename of a name succeeds; the first
  draft's claim -- the design claims by an exclusive ``link()`` to a name never freed, since a rename frees the
  request's name for a retransmitted create: ``results/combine-proto/attack.md``; one call either way), then makes
  the batch's content ``c-<B>`` (the claimed tokens in order; exclusive ``link()`` of a complete file) and its hint
  ``a-<m>-<B>-<sum>`` (a name: the batch's amount, read from listings);
* a requester finds its claim by listing, then its batch's content by listing, reads it once, and answers the value
  below the batch's slot plus its prefix in the batch.

Left out because no fault happens in a timed run (the design covers them): epochs and seals (one directory, slots
without a bound), timeouts and the closing of a batch whose winner died (``c-<B>`` made empty by a waiter), lost
replies.  Every run checks that the N answers are exactly 1..N (each add counted once, answers unique).
:class:`Mailbox` is the variant whose requests are directories of their own (polled alone); ``--race K`` lets about K
unclaimed requesters race for a slot at each look; each row's ``phases`` say where the adds' time went.

``python -m benchmarks.combine_proto --n 256 --rounds 3`` (four 2 s-cached bindfs mounts; alternates the prototype
and ``FolderKV.add``): time from the last arrival to the last add's answer, metadata calls per add, CPU seconds of
the ranks and the bindfs daemons.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial

from fsmingle.fs.lookup import dir_signature

from .bench_folderstore import bindfs_stats, daemon_cpu
from .opkinds import METADATA
from .rdzv.filesystems import FS_OPTS, MountSet
from .rdzv.fsops import OpCounter, _CountingOs, install_counting_os

V_RE = re.compile(r"^v-(\d{12})$")
HINT_RE = re.compile(r"^a-(\d{12})-([0-9a-f]{16})-(-?\d+)$")
CLAIM_RE = re.compile(r"^r-([0-9a-f]{16})-(-?\d+)-(\d{12})-([0-9a-f]{16})$")
REQ_RE = re.compile(r"^q-([0-9a-f]{16})-(-?\d+)$")
POLL = 0.010  # a waiting requester's pause at most 16 ranks (FolderKV's poll_min); more: fast_pause's crowd rule
MAX_BATCH = 32  # requests one winner claims: a short sweep makes its content visible sooner (session 10's trace)
STOP_AFTER = 3  # claims in a row found taken after which a winner stops claiming

counter = OpCounter()
cos = _CountingOs(os, counter)


def vname(m: int) -> str:
    return f"v-{m:012d}"


class Proto:
    """One rank's view of the counter directory ``d``: hints and values it learnt (immutable: cached)."""

    def __init__(self, d: str, rng: random.Random, crowd: int = 1, poll: float | None = None, race: float = 0) -> None:
        self.d, self.rng, self.race = d, rng, race
        self.poll = poll or min(0.25, POLL * max(1.0, crowd / 16))  # folderstore_wait.fast_pause
        self.amount: dict[int, int] = {}  # slot -> amount of its delta or batch (from hints or reads)
        self.names: list[str] = []
        self.trace: list[tuple[str, float]] = []  # (event, monotonic seconds): where an add's time goes

    def mark(self, event: str) -> None:
        self.trace.append((event, time.monotonic()))

    def listing(self) -> list[str]:
        self.names = cos.listdir(self.d)
        for n in self.names:
            h = HINT_RE.match(n)
            if h:
                self.amount[int(h.group(1))] = int(h.group(3))
        return self.names

    def top(self) -> int:
        return max((int(m.group(1)) for n in self.names if (m := V_RE.match(n))), default=0)

    def read(self, name: str) -> bytes:
        fd = cos.open(os.path.join(self.d, name), os.O_RDONLY)
        try:
            cos.fstat(fd)  # as PosixStore.read: owner and type checked
            out = b""
            while b := cos.read(fd, 1 << 16):
                out += b
            return out
        finally:
            cos.close(fd)

    def make(self, name: str, data: bytes) -> bool:
        """Exclusive create of a complete file (a temporary, link(), unlink): False on EEXIST."""
        tmp = os.path.join(self.d, f".tmp-{secrets.token_hex(6)}")
        fd = cos.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        cos.write(fd, data)
        cos.close(fd)
        try:
            cos.link(tmp, os.path.join(self.d, name))
            return True
        except FileExistsError:
            return False
        finally:
            cos.unlink(tmp)

    def batch(self, token: str) -> list[tuple[str, int]]:
        """A batch's content, once a listing shows it (never looked up before: a negative dentry would stay)."""
        while f"c-{token}" not in self.names:
            time.sleep(self.poll * (0.5 + self.rng.random()))
            self.listing()
        return _pairs(self.read(f"c-{token}"))

    def value_below(self, m: int) -> int:
        """The value at slot ``m`` - 1: the start value plus every amount below, hints first, else read."""
        total = 0
        if any(k not in self.amount for k in range(2, m)):
            self.listing()  # one listing tells every hinted slot's amount (as FolderKV's harvest), no reads
        for k in range(m - 1, 1, -1):
            if k not in self.amount:
                kind, arg = self.read(vname(k)).decode().split()
                self.amount[k] = int(arg) if kind == "d" else sum(a for _, a in self.batch(arg))
            total += self.amount[k]
        return total + int(self.read(vname(1)).decode().split()[1])

    def add(self, amount: int) -> int:
        token = secrets.token_hex(8)
        self.listing()
        m = self.top() + 1
        if self.make(vname(m), f"d {amount}".encode()):  # uncontended: one delta, as FolderKV's
            cos.link(os.path.join(self.d, vname(m)), os.path.join(self.d, f"a-{m:012d}-{token}-{amount}"))
            self.mark("delta won")
            return self.value_below(m) + amount
        self.mark("first race lost")
        return self.combined(amount, token)

    def _win_slot(self) -> tuple[int, str, list[str]] | None:
        """Race for the next slot for a batch: (slot, batch token, a listing made after the win), or None when lost
        (the loser looks again after a pause: carried meanwhile?)."""
        m, btok = self.top() + 1, secrets.token_hex(8)
        if not self.make(vname(m), f"b {btok}".encode()):
            self.mark("slot lost")
            return None
        self.mark("slot won")
        return m, btok, self.listing()  # after our win: the requests made since, fewer already claimed

    def _sweep(self, names: list[str], own: str, claim: Callable[[str, int], bool]) -> list[str]:
        """Claim our own request, then others' from a random place on (concurrent winners sweep different parts),
        at most MAX_BATCH, stopping after STOP_AFTER claims in a row found taken: another winner is sweeping here.
        ``claim(q, k)`` (``k``: claimed so far) is False when ``q`` was taken; the requests claimed, in order."""
        others = [n for n in names if REQ_RE.match(n) and n != own]
        at = self.rng.randrange(len(others)) if others else 0
        got, taken = [], 0
        for q in [own, *others[at:], *others[:at]][:MAX_BATCH]:
            if claim(q, len(got)):
                got.append(q)
                taken = 0
            else:
                taken += 1
                if taken >= STOP_AFTER:
                    break
        return got

    def _rename_claim(self, m: int, btok: str, q: str, _held: int) -> bool:
        """Claim request ``q`` for slot ``m``'s batch ``btok`` (one rename of a name succeeds)."""
        t, a = REQ_RE.match(q).groups()
        try:
            cos.rename(os.path.join(self.d, q), os.path.join(self.d, f"r-{t}-{a}-{m:012d}-{btok}"))
            return True
        except FileNotFoundError:
            return False  # another winner's claim (or its requester's withdrawal in the full protocol)

    def _publish(self, m: int, btok: str, got: list[str]) -> None:
        """Slot ``m``'s batch: its content ``c-<B>`` (the claimed requests' tokens and amounts, in order) and its hint."""
        pairs = [(t, int(a)) for t, a in (REQ_RE.match(q).groups() for q in got)]
        self.make(f"c-{btok}", "".join(f"{t} {a}\n" for t, a in pairs).encode())
        total = sum(a for _, a in pairs)
        cos.link(os.path.join(self.d, f"c-{btok}"), os.path.join(self.d, f"a-{m:012d}-{btok}-{total}"))
        self.amount[m] = total

    def combined(self, amount: int, token: str) -> int:
        """After a lost first race: a request (a file), carried by whichever batch claims it (ours, if we win a slot)."""
        req = f"q-{token}-{amount}"
        fd = cos.open(os.path.join(self.d, req), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        cos.close(fd)
        self.mark("requested")
        while True:
            time.sleep(self.poll * (0.5 + self.rng.random()))  # a winner may carry us meanwhile
            names = self.listing()
            mine = next((c for n in names if (c := CLAIM_RE.match(n)) and c.group(1) == token), None)
            if mine is not None:
                slot, btok = int(mine.group(3)), mine.group(4)
                self.mark("claim seen")
                prefix = _prefix(self.batch(btok), token)
                self.mark("content read")
                cos.unlink(os.path.join(self.d, mine.group(0)))  # keeps the others' listings short
                return self.value_below(slot) + prefix
            if req not in names:  # claimed after our listing was made, or a listing that lags: look again
                continue
            unclaimed = sum(1 for n in names if REQ_RE.match(n))
            if self.race and self.rng.random() >= self.race / unclaimed:
                continue  # about ``race`` of the unclaimed requesters race for the next slot; the rest wait
            if (won := self._win_slot()) is None:
                continue
            m, btok, names = won
            got = self._sweep(names, req, partial(self._rename_claim, m, btok))
            self.mark(f"swept {len(got)}")
            self._publish(m, btok, got)
            base = self.value_below(m)
            if got and got[0] == req:
                return base + amount
            # Our own request was claimed by another winner (our listing lagged): its claim tells our answer.


class Mailbox(Proto):
    """The *mailbox* variant (session 10's trace: requesters polling the busy epoch directory's listing held the FUSE
    daemons): each request is a directory ``q-<T>-<amount>/`` of its own; a winner claims it by an exclusive hard
    link of one temporary holding ``<m> <B>`` as ``q-…/claim``, and after making ``c-<B>`` links it as
    ``q-…/content``.  A requester polls only its own directory (``statx`` past the attribute cache; a listing of it
    only when it changed), and lists the epoch directory only to race for a slot while unclaimed."""

    def _link_claim(self, tmp: str, q: str, held: int) -> bool:
        """Claim box ``q`` by an exclusive link of ``tmp`` (our ``<m> <B>``, 1 + ``held`` links so far) as its claim."""
        try:
            cos.link(tmp, os.path.join(self.d, q, "claim"))
        except FileExistsError:
            if cos.stat(tmp).st_nlink <= 1 + held:  # not a retransmitted LINK of ours: claimed by another
                return False
        return True

    def combined(self, amount: int, token: str) -> int:
        box = f"q-{token}-{amount}"
        boxp = os.path.join(self.d, box)
        cos.mkdir(boxp)
        self.mark("requested")
        sig, claim = None, None
        while True:
            time.sleep(self.poll * (0.5 + self.rng.random()))  # a winner may carry us meanwhile
            counter.add("stat")  # statx through ctypes: not seen by the counting os
            now = dir_signature(boxp)
            if now != sig:
                sig, inside = now, cos.listdir(boxp)
                if claim is None and "claim" in inside:
                    slot, btok = self.read(f"{box}/claim").decode().split()
                    claim = (int(slot), btok)
                    self.mark("claim seen")
                if "content" in inside:
                    prefix = _prefix(_pairs(self.read(f"{box}/content")), token)
                    self.mark("content read")
                    return self.value_below(claim[0]) + prefix
            if claim is not None:
                continue
            self.listing()  # unclaimed: which slot is next
            if (won := self._win_slot()) is None:
                continue
            m, btok, names = won
            tmp = os.path.join(self.d, f".tmp-{secrets.token_hex(6)}")
            fd = cos.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            cos.write(fd, f"{m} {btok}".encode())
            cos.close(fd)
            got = self._sweep(names, box, partial(self._link_claim, tmp))
            cos.unlink(tmp)
            self.mark(f"swept {len(got)}")
            self._publish(m, btok, got)
            for q in got:
                if q != box:
                    cos.link(os.path.join(self.d, f"c-{btok}"), os.path.join(self.d, q, "content"))
            if got and got[0] == box:
                return self.value_below(m) + int(amount)
            # Our own box was claimed by another winner (our listing lagged): its content tells our answer.


def _pairs(content: bytes) -> list[tuple[str, int]]:
    """A batch's content: its requests' (token, amount), in order."""
    return [(t, int(a)) for t, a in (line.split() for line in content.decode().splitlines())]


def _prefix(pairs: list[tuple[str, int]], token: str) -> int:
    """Request ``token``'s share of a batch: the amounts up to and including its own."""
    prefix = 0
    for t, a in pairs:
        prefix += a
        if t == token:
            return prefix
    raise AssertionError("claimed but not in the batch: the prototype has no closers")


def _rank(kind: str, where: str, n: int, r: int, bar, q, poll: float | None, race: float) -> None:
    try:
        counter.bind(r)
        trace: list = []
        rng = random.Random(secrets.randbits(64))
        if kind in ("proto", "mailbox"):
            p = (Proto if kind == "proto" else Mailbox)(os.path.join(where, "proto"), rng, n, poll, race)
            do = lambda: p.add(1)
            trace = p.trace
        else:
            from fsmingle.fs.folderstore import FolderKV
            from fsmingle.fs.folderstore_torch import open_store_dir

            kv = FolderKV(open_store_dir(os.path.join(where, "fstore")), timeout=120, crowd=n)
            do = lambda: kv.add("b", 1)
        bar.wait()
        c0 = dict(counter.counts[r])
        t0, cpu0 = time.monotonic(), time.process_time()
        got = do()
        t1, cpu1 = time.monotonic(), time.process_time()
        c1 = counter.counts[r]
        kinds = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1}
        meta = sum(kinds[k] for k in METADATA)
        q.put(
            {"r": r, "got": got, "t0": t0, "t1": t1, "cpu": cpu1 - cpu0, "meta": meta, "kinds": kinds, "trace": trace}
        )
    except BaseException as e:  # report, never hang the parent
        q.put({"r": r, "error": f"{type(e).__name__}: {e}"[:300]})
    finally:
        q.close()
        q.join_thread()
        os._exit(0)


def _gap(tr: list, a: str, b: str) -> float | None:
    ta = next((t for e, t in tr if e.startswith(a)), None)
    tb = next((t for e, t in tr if e.startswith(b) and ta is not None and t >= ta), None)
    return None if ta is None or tb is None else tb - ta


def phases(outs: list[dict], t_last: float) -> dict:
    """Where the prototype's time went: quantiles (min / p50 / p90 / max, seconds) of each phase over the ranks
    that had it, the batches (slots won) and their sizes, and the moments (after the last arrival) requests met."""

    def q(xs):
        xs = sorted(x for x in xs if x is not None)
        return [round(xs[int(f * (len(xs) - 1))], 3) for f in (0.0, 0.5, 0.9, 1.0)] if xs else []

    trs = [o["trace"] for o in outs]
    swept = [(int(e.split()[1]), t) for tr in trs for e, t in tr if e.startswith("swept")]
    won = [t for tr in trs for e, t in tr if e == "slot won"]
    return {
        "deltas_won": sum(1 for tr in trs for e, _ in tr if e == "delta won"),
        "batches": len(swept),
        "batch_sizes": sorted((k for k, _ in swept), reverse=True)[:12],
        "slot_races_lost": sum(1 for tr in trs for e, _ in tr if e == "slot lost"),
        "requested_after_last_arrival": q([t - t_last for tr in trs for e, t in tr if e == "requested"]),
        "slots_won_after_last_arrival": q([t - t_last for t in won]),
        "sweep_s": q([_gap(tr, "slot won", "swept") for tr in trs]),
        "request_to_claim_seen_s": q([_gap(tr, "requested", "claim seen") for tr in trs]),
        "claim_seen_to_content_read_s": q([_gap(tr, "claim seen", "content read") for tr in trs]),
        "content_read_to_answer_s": q([o["t1"] - t for o in outs for e, t in o["trace"] if e == "content read"]),
    }


def run_one(kind: str, mounts: list[str], n: int, poll: float | None = None, race: float = 0.0) -> dict:
    os.makedirs(os.path.join(mounts[0], "proto"), exist_ok=True)
    if kind in ("proto", "mailbox"):
        with open(os.path.join(mounts[0], "proto", vname(1)), "w") as f:
            f.write("f 0")
    ctx = mp.get_context("fork")
    bar, q = ctx.Barrier(n), ctx.Queue()
    d0 = daemon_cpu()
    ps = [ctx.Process(target=_rank, args=(kind, mounts[r % len(mounts)], n, r, bar, q, poll, race)) for r in range(n)]
    for p in ps:
        p.start()
    outs = [q.get(timeout=300) for _ in range(n)]
    for p in ps:
        p.join()
    errs = [o["error"] for o in outs if "error" in o]
    if errs:
        return {"kind": kind, "error": errs[0]}
    answers = sorted(o["got"] for o in outs)
    t_last = max(o["t0"] for o in outs)
    res = {
        "kind": kind,
        "n": n,
        "answers_exact": answers == list(range(1, n + 1)),
        "last_arrival_to_last_answer_s": round(max(o["t1"] for o in outs) - t_last, 3),
        "add_p50_s": round(statistics.median(o["t1"] - o["t0"] for o in outs), 3),
        "meta_per_add": round(statistics.mean(o["meta"] for o in outs), 1),
        "kinds_per_add": {k: round(statistics.mean(o["kinds"][k] for o in outs), 1) for k in outs[0]["kinds"]},
        "ranks_cpu_s": round(sum(o["cpu"] for o in outs), 2),
        "daemons_cpu_s": round(daemon_cpu() - d0, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }
    if kind in ("proto", "mailbox"):
        res["files"] = len(os.listdir(os.path.join(mounts[0], "proto")))
        res["phases"] = phases(outs, t_last)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mounts", type=int, default=4)
    ap.add_argument("--fs", default="bindfs2", choices=sorted(FS_OPTS))
    ap.add_argument("--out", default=None, help="a JSON file for the rows")
    ap.add_argument("--poll", type=float, action="append", help="a requester's pause (s); several: one row each")
    ap.add_argument("--design", nargs="+", default=["proto"], choices=["proto", "mailbox"], help="prototype variants")
    ap.add_argument("--quiet-load", type=float, default=2.0, help="wait (up to 120 s) for the 1-minute load under this")
    ap.add_argument(
        "--race", type=float, action="append", help="about how many unclaimed requesters race per look (0: all)"
    )
    a = ap.parse_args()
    install_counting_os(counter)  # FolderKV's calls, counted as the prototype's are
    rows = []
    for rnd in range(a.rounds):
        kinds = [("folder", None, 0.0)] + [
            (d, p, x) for d in a.design for p in a.poll or [None] for x in a.race or [0.0]
        ]
        for kind, poll, race in kinds if rnd % 2 == 0 else kinds[::-1]:
            for _ in range(120):
                if os.getloadavg()[0] < a.quiet_load:
                    break
                time.sleep(1)
            root = tempfile.mkdtemp(prefix="combine-")
            ms = MountSet(root, a.mounts, FS_OPTS[a.fs])
            try:
                load = round(os.getloadavg()[0], 2)
                row = {
                    "round": rnd + 1,
                    "load_before": load,
                    "poll": poll,
                    "race": race,
                    **run_one(kind, ms.mounts, a.n, poll, race),
                }
            finally:
                ms.close()
                shutil.rmtree(root, ignore_errors=True)
                for _ in range(100):  # the next row's daemon CPU counts only its own bindfs daemons
                    if next(bindfs_stats(), None) is None:
                        break
                    time.sleep(0.1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
