"""``python -m benchmarks.sim --n 16,256,1024 [...]``: simulate, print a table, write JSON.

Exit status: 0 when every size completed with a valid release; 1 otherwise; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

# option (argparse dest) -> the engine.Config field it sets
_CONFIG_FIELDS = {
    "net_latency": "net_latency",
    "spread": "arrival_spread",
    **{k: k for k in ("settle", "cores", "cpu_scale", "syscall_cost", "horizon", "seed")},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.sim",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--n", default="16,256,1024", help="comma-separated participant counts")
    ap.add_argument("--op-latency", type=float, default=0.0005, help="MDS round trip per operation (s)")
    ap.add_argument("--ops-per-s", type=float, default=5000.0, help="MDS ceiling (operations/s)")
    ap.add_argument("--entry-cost", type=float, default=2e-6, help="MDS time per directory entry listed (s)")
    ap.add_argument("--net-latency", type=float, default=0.0001, help="one-way message latency (s)")
    ap.add_argument("--spread", type=float, default=2.0, help="early arrivals spread over this many seconds")
    ap.add_argument("--settle", type=float, default=32.0, help="steady state before the last arrival (s)")
    ap.add_argument("--cores", type=int, default=0, help="shared CPU cores (0: one machine per participant)")
    ap.add_argument("--cpu-scale", type=float, default=1.0, help="factor on the policy's measured CPU time")
    ap.add_argument("--syscall-cost", type=float, default=0.0, help="CPU s per fs operation or message")
    ap.add_argument("--horizon", type=float, default=3600.0, help="virtual seconds before giving up")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument(
        "--fsmingle-root",
        default=None,
        help="checkout whose fsmingle package runs (e.g. a `git worktree add --detach /tmp/v2 HEAD`)",
    )
    a = ap.parse_args(argv)
    if a.fsmingle_root:
        sys.path.insert(0, a.fsmingle_root)  # before fsmingle is first imported (by .engine)
    from .engine import Config, run
    from .mds import CostModel

    ns = [int(x) for x in a.n.split(",") if x.strip()]
    if any(x < 2 for x in ns):
        ap.error("--n: every N must be >= 2")
    cost = CostModel(op_latency=a.op_latency, ops_per_s=a.ops_per_s, entry_cost=a.entry_cost)
    out, ok = [], True
    print(
        "| N | completed | release after last arrival: own / everyone (s) | fs ops / participant (rank 0) "
        "| entries / participant (rank 0) | waiter fs ops/s | peak MDS op/s | MDS busy s | sim CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in ns:
        t0 = time.monotonic()
        r = run(Config(n=n, cost=cost, **{field: getattr(a, dest) for dest, field in _CONFIG_FIELDS.items()}))
        r["wall_s"] = time.monotonic() - t0
        out.append(r)
        ok = ok and r["completed"] and r.get("valid", False)
        f = lambda x, d=2: "—" if x is None else f"{x:.{d}f}"
        print(
            f"| {n} | {r['completed']} | {f(r.get('last_own_s'), 3)} / {f(r.get('last_all_s'), 3)} "
            f"| {f(r['fs_ops_per_participant_mean'], 1)} ({r['fs_ops_rank0']}) "
            f"| {f(r['entries_per_participant_mean'], 0)} ({r['entries_rank0']}) "
            f"| {f(r.get('waiter_fs_ops_per_s_mean'), 3)} | {r['mds_peak_ops_per_s']} | {f(r['mds_busy_s'])} "
            f"| {f(r['sim_cpu_s'], 1)} |",
            flush=True,
        )
        if a.json:  # after every size: a long run that is cut off keeps what it finished
            cmd = " ".join(
                shlex.quote(x)
                for x in ["python", "-m", "benchmarks.sim", *(argv if argv is not None else sys.argv[1:])]
            )
            with open(a.json, "w") as fh:
                json.dump({"command": cmd, "results": out}, fh, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
