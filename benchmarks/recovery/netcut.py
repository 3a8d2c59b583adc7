"""The network-cut fault of the recovery benchmark: every node on a host of its own.

With ``--faults cut`` each node (the spare too) runs on a host of ``tests/cluster/``'s
:class:`Cluster`: a network namespace with its own IP on a private bridge, its own hostname, and
the root's mounts (the run's directory under ``/tmp`` is not under ``cluster.shared``, so every
host sees the same plain directory: a cut takes the node off the network, never off the shared
filesystem -- the partition fsmingle's keep-alive-through-the-filesystem cannot see, the hard
case).  etcd (``torchrun-etcd``) runs on an extra host of its own, c10d's TCPStore on node 0's.
The fault is :meth:`Host.link_down` of the victim's host: its processes keep running, their
packets go nowhere (no RST, no FIN: a peer sees silence, as with SIGSTOP).

The cut node stays cut until the next world has stepped on every rank (the measured times), then
:func:`watch` brings its link up again and records what the victim and the new world did.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

import cluster as cl  # noqa: E402  (tests/cluster/: the cluster harness)


def start_cluster(n_hosts: int, etcd: bool, pid_ns: bool | None = None) -> cl.Cluster:
    """``n_hosts`` hosts ``node0``.. (and ``etcd`` if asked) on a private bridge; needs root.

    ``pid_ns``: each host's processes in a pid namespace of its own, as on separate machines
    (fsmingle then judges a peer it cannot reach by its heartbeat file, never by asking the
    kernel); None: ``$BENCH_PID_NS`` = 1.  Raises RuntimeError (from the cluster harness) when
    namespaces cannot be made here."""
    if pid_ns is None:
        pid_ns = os.environ.get("BENCH_PID_NS") == "1"
    # bindfs views are made by the harness for every host; uncached (0) since nothing here uses them.
    return cl.Cluster(n_hosts, cache_timeout=0, extra_hosts=["etcd"] if etcd else (), pid_ns=pid_ns).start()


def _kinds(evs: list[dict]) -> list[str]:
    """The event kinds in order, repeats folded (``step`` x 40 -> ``step*40``)."""
    out: list[list] = []
    for e in evs:
        k = e.get("ev", "?")
        if out and out[-1][0] == k:
            out[-1][1] += 1
        else:
            out.append([k, 1])
    return [k if c == 1 else f"{k}*{c}" for k, c in out]


def watch(run, victim: int, wid: str, before: set, t_fault: float, watch_s: float) -> dict:
    """Bring the victim's link up again, watch ``watch_s`` seconds, and say what happened.

    Returns ``victim_cut`` (the victim's log events between the cut and the link coming up),
    ``victim_up`` (after it), ``victim_in_new_world`` (True if the victim stepped in any world
    formed after the fault), ``new_world_steps_up`` (steps of the measured world after the link
    came up: it went on training if > 0), ``new_world_last_step_s`` (its last step, seconds
    after the link came up), ``worlds_after_up`` (worlds that stepped first after the link came
    up: another recovery, the partitioned node being noticed late), ``procs_alive`` (the
    victim's processes still running at the end), ``gens`` (fsmingle's paths: the job's last
    three generations, ``claims``/``released``: where the cut node waits)."""
    host = run.cluster.hosts[victim]
    t_up = time.time()
    host.link_up()
    time.sleep(watch_s)  # an observation window, not a wait for a condition: what happens in it is the result
    evs = run.events()
    mine = [e for i, e in evs if i == victim and e["t"] >= t_fault]
    steps = [e["t"] for _i, e in evs if e.get("ev") == "step" and e["wid"] == wid and e["t"] >= t_up]
    first: dict[str, float] = {}
    for _i, e in evs:
        if e.get("ev") == "step":
            first.setdefault(e["wid"], e["t"])
    new = [w for w, r in run.world_ranks().items() if w not in before]
    return dict(
        link_up_s=round(t_up - t_fault, 2),
        victim_cut=_kinds([e for e in mine if e["t"] < t_up]),
        victim_up=_kinds([e for e in mine if e["t"] >= t_up]),
        victim_in_new_world=any(victim in run.world_ranks()[w].values() for w in new),
        new_world_steps_up=len(steps),
        new_world_last_step_s=round(max(steps) - t_up, 2) if steps else None,
        worlds_after_up=sum(1 for w in new if first[w] >= t_up),
        procs_alive=len(host.pids()),
        gens=_gens(run.dir / run.job),
    )


def _decision(rel: Path) -> str:
    """``released``, ``voided`` (a ``release.json`` is also how a generation is voided) or ``open``."""
    try:
        return str(json.loads(rel.read_text()).get("state", "decided"))
    except FileNotFoundError:
        return "open"
    except (OSError, ValueError):
        return "decided (unreadable)"


def _gens(job: Path) -> dict[str, str]:
    """``{gen-N: "CLAIMS claims, released|voided|open"}`` of the last three generations (fsmingle's directory)."""
    out = {}

    def num(g: Path) -> int:
        digits = "".join(c for c in g.name if c.isdigit())
        return int(digits) if digits else -1

    for g in sorted(job.glob("gen-*"), key=num)[-3:]:
        claims = len(list(g.glob("rank-*.claim")))
        out[g.name] = f"{claims} claims, {_decision(g / 'release.json')}"
    return out
