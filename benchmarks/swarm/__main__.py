"""``python -m benchmarks.swarm``: rank 0's real code at large N without a thread per participant.

Examples::

    python -m benchmarks.swarm --n 512,2048,8192 --out benchmarks/results/swarm
    python -m benchmarks.swarm --n 4096 --scenario cold,storm      # issue 31, item 4
    python -m benchmarks.swarm --n 2048 --sources one --unauth-cap 100000   # as the thread harness

Writes ``results.json`` (every run's measurements) and ``results.md`` (the tables) under ``--out``.
See :mod:`benchmarks.swarm.run` for the scenarios and :mod:`benchmarks.swarm.driver` for how
the participants are stepped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..rdzv.common import RunError
from ..rdzv.report import environment
from .run import run_once


def _table(rows: list[dict]) -> str:
    out = [
        "| N | scenario | sources / cap | procs | release after the last arrival (everyone) | go/kill → all "
        "| generations | rank 0 CPU / member (join + release) | rank 0 CPU waiting "
        "| rank 0's messages / member (status, ping) | fs ops / participant "
        "(rank 0) | entries / participant | member-process lag p99 | status |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['n']} | {r['scenario']} | | | | | | | | | | | | failed: {r['error'][:120]} |")
            continue
        o = r["ops"]
        lag = max((s.get("lag_p99") or 0) for k, s in r["swarm"].items() if 0 < int(k) < r["procs"] - 1)
        other = r.get("kill_to_all_s", r.get("go_to_all_s"))
        cpu = None if r["scenario"] == "storm" else r.get("rank0_cpu_us_per_member")  # storm: rank 0 moves
        wait = r.get("rank0_cpu_waiting_per_s")
        sent = r["swarm"]["0"].get("sent", {})
        rel = r.get("rank0_cpu_release_s")
        rel = "" if rel is None or cpu is None else f" ({1e6 * rel / r['n']:.0f} µs release)"
        out.append(
            f"| {r['n']:,} | {r['scenario']} | {r['sources']} / {r['unauth_cap'] or r['unauth_cap_shipped']} "
            f"| {r['procs']} | {r['last_all_s']:.2f} s | {'—' if other is None else f'{other:.2f} s'} "
            f"| {r['generations']} | {'—' if cpu is None else f'{cpu:.0f} µs'}{rel} "
            f"| {'—' if wait is None else f'{wait * 1000:.0f} ms/s'} "
            f"| {sum(sent.values()) / r['n']:.1f} ({sent.get('status', 0) / r['n']:.1f}, {sent.get('ping', 0) / r['n']:.1f}) "
            f"| {o['fs_ops_mean']:.1f} ({o['fs_ops_rank0']}) | {o['entries_mean']:.0f} | {lag:.2f} s "
            f"| {'ok' if r['valid'] else 'INVALID ' + '; '.join(r['problems'])} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.swarm", description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="512,2048", help="sizes, comma-separated (>= 3)")
    ap.add_argument("--scenario", default="last", help="last, cold, storm (comma-separated)")
    ap.add_argument("--procs", type=int, default=0, help="member processes (0: one per 8,000 members, at least 2)")
    ap.add_argument(
        "--sources",
        choices=("own", "one"),
        default="own",
        help="own: each participant connects from its own 127.a.b.c; one: all from 127.0.0.1",
    )
    ap.add_argument(
        "--unauth-cap",
        type=int,
        default=None,
        help="rank 0's per-source cap of unauthenticated connections (default: as shipped)",
    )
    ap.add_argument("--settle", type=float, default=4.0, help="seconds between N - 1 present and the last arrival")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per phase and --timeout of every participant")
    ap.add_argument("--nice", type=int, default=0, help="nice value of the member processes (rank 0's stays 0)")
    ap.add_argument("--root", default=None, help="where the job directory goes (default: the temp dir)")
    ap.add_argument("--profile-rank0", default=None, help="cProfile rank 0's process into this file (pstats)")
    ap.add_argument(
        "--sample-rank0",
        default=None,
        help="sample rank 0's stacks by CPU time into this file (JSON; python -m benchmarks.swarm.sampler FILE)",
    )
    ap.add_argument("--out", default=None, help="directory for results.json and results.md")
    a = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    rows = []
    for n in (int(x) for x in a.n.split(",")):
        for sc in a.scenario.split(","):
            procs = a.procs or max(2, -(-n // 8000))
            try:
                rows.append(
                    run_once(
                        n,
                        sc,
                        procs=procs,
                        sources=a.sources,
                        unauth_cap=a.unauth_cap,
                        settle=a.settle,
                        timeout=a.timeout,
                        nice=a.nice,
                        root=a.root,
                        profile=a.profile_rank0,
                        sample=a.sample_rank0,
                        log=log,
                    )
                )
            except RunError as e:
                log(f"  swarm N={n} {sc}: FAILED: {str(e).strip().splitlines()[0]}")
                rows.append({"n": n, "scenario": sc, "error": str(e)})
    md = _table(rows)
    print(md)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "results.json"), "w") as fh:
            json.dump({"argv": sys.argv, "time": time.time(), "env": environment(), "runs": rows}, fh, indent=1)
        with open(os.path.join(a.out, "results.md"), "w") as fh:
            fh.write(f"Command: `python -m benchmarks.swarm {' '.join(sys.argv[1:] if argv is None else argv)}`\n\n")
            fh.write(md)
    return 0 if all(r.get("valid") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
