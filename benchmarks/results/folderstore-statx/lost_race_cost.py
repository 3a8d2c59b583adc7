"""What one lost race's link-count read costs, plain ``stat`` against ``lookup.link_count`` (forced ``statx``), in
one run, alternating: a ``link()`` that answers EEXIST, then the read, ``--n`` times each, on a local directory and on
a 2 s-cached bindfs mount of it (as the A/B's mounts).  Prints microseconds per read (median, p90) and the bindfs
daemon's CPU per read.  Usage: python benchmarks/results/folderstore-statx/lost_race_cost.py [--n 4000]"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks.bench_folderstore import daemon_cpu  # noqa: E402
from fsmingle.fs.lookup import link_count  # noqa: E402


def plain(path: str) -> int:
    return os.stat(path).st_nlink


def measure(d: str, read, n: int) -> tuple[list[float], float]:
    tmp, taken = os.path.join(d, f".tmp-{os.getpid()}"), os.path.join(d, "v-taken")
    Path(tmp).write_bytes(b"x")
    if not os.path.exists(taken):
        Path(taken).write_bytes(b"y")
    times, cpu0 = [], daemon_cpu()
    for _ in range(n):
        try:
            os.link(tmp, taken)
        except FileExistsError:
            t0 = time.perf_counter()
            assert read(tmp) == 1
            times.append(time.perf_counter() - t0)
    os.unlink(tmp)
    return times, daemon_cpu() - cpu0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4000)
    n = ap.parse_args().n
    with tempfile.TemporaryDirectory() as top:
        backing, mnt = os.path.join(top, "backing"), os.path.join(top, "mnt")
        os.mkdir(backing), os.mkdir(mnt)
        opts = "attr_timeout=2,entry_timeout=2,negative_timeout=2"
        subprocess.run(["bindfs", "-o", opts, backing, mnt], check=True)
        try:
            print("| where | read | us per read: median | p90 | bindfs CPU us per read |\n|---|---|--:|--:|--:|")
            for where, d in (("local", backing), ("bindfs 2 s", mnt)):
                for rnd in range(3):
                    for name, read in (("plain stat", plain), ("link_count (forced statx)", link_count)):
                        t, cpu = measure(d, read, n)
                        q = statistics.quantiles(t, n=10)
                        row = f"| {where} (round {rnd + 1}) | {name} | {statistics.median(t) * 1e6:.1f} | {q[8] * 1e6:.1f}"
                        print(f"{row} | {cpu / len(t) * 1e6:.1f} |")
        finally:
            subprocess.run(["fusermount", "-u", mnt], check=False)


if __name__ == "__main__":
    main()
