"""A partition that lasts, then a second failure: ``python -m benchmarks.recovery.partition``.

Two nodes train (``inproc`` or ``fsmingle-run``), a spare waits, each on a network-namespace host
of ``tests/cluster/`` (:mod:`benchmarks.recovery.netcut`).  Node 1's link goes down and stays
down; the survivor and the spare form the next world.  The cut node's own collective times out,
it leaves its world and claims a rank in the generation after, through the shared directory it
still reaches.  A second spare starts; then the spare of the first recovery (now a member) is
killed (SIGKILL).  Printed (JSON): whether a third world formed while node 1 was still cut
(``third_world_while_cut``), when (seconds after the kill), its members (node indices), and, if
none did within ``--wait`` seconds, how long after node 1's link came up one formed; the job's
last generations; and how many times the nodes logged that they could not reach the master
(``master_unreachable``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil

from .harness import Run, _tree, _wait
from .netcut import _gens


def _members(run: Run, before: set) -> dict[int, int] | None:
    w = run._next_world(before)
    return run.world_ranks()[w] if w else None


def _unreachable(work: Path) -> int:
    n = 0
    for out in work.glob("node*.out"):
        n += out.read_text(errors="replace").count("cannot reach the master")
    return n


def scenario(path: str, stale_after: float, wait_s: float, keep: str | None = None) -> dict:
    """One run of the scenario above; returns its result (seconds, node indices).

    Raises TimeoutError if the first or the second world does not form within 300 / 120 s."""
    work = Path(tempfile.mkdtemp(prefix=f"partition-{path}-"))
    run = Run(path, 2, "cut", work, stale_after, stale_after, spares=2)
    res: dict = dict(path=path, stale_after=stale_after, wait_s=wait_s)
    try:
        run.start_node(0)
        run.start_node(1)
        _wait(lambda: any(len(r) == 2 for r in run.world_ranks().values()), 300, "the first world")
        run.start_node(2, spare=True)
        run._wait_spare()
        before = set(run.world_ranks())
        t_cut = time.time()
        run.cluster.hosts[1].link_down()  # stays down until the end (or --wait seconds after the kill)
        _wait(lambda: run._next_world(before) is not None, 120, "the second world")
        res["second_world_s"] = round(time.time() - t_cut, 2)
        res["second_world"] = _members(run, before)
        run.start_node(3, spare=True)
        # The cut node's collective times out at stale_after; then it claims in the next generation.
        _wait(lambda: any(i == 1 and e.get("ev") == "lost" for i, e in run.events()), 120, "the cut node's loss")
        time.sleep(stale_after)  # let both the cut node and the new spare settle in the next generation
        res["gens_before_kill"] = _gens(run.dir / run.job)
        before = set(run.world_ranks())
        t_kill = time.time()
        for p in _tree(run.procs[2].pid):
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        try:
            _wait(lambda: run._next_world(before) is not None, wait_s, "a third world")
            res.update(third_world_while_cut=True, third_world_s=round(time.time() - t_kill, 2))
        except TimeoutError:
            res["third_world_while_cut"] = False
            res["gens_while_cut"] = _gens(run.dir / run.job)
            t_up = time.time()
            run.cluster.hosts[1].link_up()
            try:
                _wait(lambda: run._next_world(before) is not None, 60, "a third world")
                res["third_world_after_link_up_s"] = round(time.time() - t_up, 2)
            except TimeoutError:
                res["third_world_after_link_up_s"] = None
        res["third_world"] = _members(run, before)
        res["gens_end"] = _gens(run.dir / run.job)
        res["master_unreachable"] = _unreachable(work)
        return res
    finally:
        run.close()
        if keep:
            shutil.copytree(work, Path(keep) / work.name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("rdzv"))
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.recovery.partition", description=__doc__)
    ap.add_argument("--path", default="inproc", choices=("inproc", "fsmingle-run"))
    ap.add_argument("--stale-after", type=float, default=5.0, help="--stale-after and the process-group timeout (s)")
    ap.add_argument("--wait", type=float, default=60.0, help="seconds after the kill to wait for a third world")
    ap.add_argument("--keep-logs", default=None, help="copy the nodes' logs here")
    a = ap.parse_args(argv)
    print(json.dumps(scenario(a.path, a.stale_after, a.wait, a.keep_logs)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
