"""``python -m benchmarks.recovery``: the matrix of paths x faults x sizes, medians, table, plot."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

from .harness import FAULTS, PATHS, ROOT, one
from .table import cut_markdown, markdown, plot, printed_rows, write_results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.recovery", description=__doc__)
    ap.add_argument("--n", default="4", help="node counts, comma-separated (default 4)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {','.join(PATHS)}")
    ap.add_argument(
        "--faults",
        default="kill,stop",
        help="kill (SIGKILL of a node's tree), stop (SIGSTOP), cut (the node's network link down: "
        "every node on a network-namespace host of tests/cluster/, needs root)",
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--stale-after", type=float, default=10.0, help="fsmingle --stale-after (seconds)")
    ap.add_argument("--pg-timeout", type=float, default=10.0, help="the training's process-group timeout (s)")
    ap.add_argument(
        "--train-s", type=float, default=3.0, help="seconds of training with the spare waiting, then the fault"
    )
    ap.add_argument("--recover-s", type=float, default=60.0, help="give up on a run after this many seconds")
    ap.add_argument(
        "--plan",
        default=None,
        help="instead of --n/--paths/--faults/--reps: 'N,N:PATHS|all:FAULTS:REPS;...' "
        "(e.g. '4:all:kill:5;8,16:inproc,fsmingle-run:kill:5')",
    )
    ap.add_argument(
        "--from-log", default=None, help="no runs: rebuild the outputs from the JSON rows a run printed (its stdout)"
    )
    ap.add_argument(
        "--cut-watch",
        type=float,
        default=10.0,
        help="cut: seconds to watch after the cut node's link comes up again (once the next world stepped)",
    )
    ap.add_argument("--out", default=None, help="directory for results.json and results.md")
    ap.add_argument("--keep-logs", default=None, help="copy each run's logs here")
    a = ap.parse_args(argv)
    rows = []
    if a.from_log:
        rows = printed_rows(a.from_log)
        plan = []
    elif a.plan:
        plan = []
        for part in a.plan.split(";"):
            ns, paths, faults, reps = part.split(":")
            plan.append((ns, ",".join(PATHS) if paths == "all" else paths, faults, int(reps)))
    else:
        plan = [(a.n, a.paths, a.faults, a.reps)]
    for _ns, paths, faults, _reps in plan:
        bad = [x for x in faults.split(",") if x not in FAULTS] + [x for x in paths.split(",") if x not in PATHS]
        if bad:
            ap.error(f"unknown fault or path: {', '.join(bad)}")
    for ns, paths, faults, reps in plan:
        for n in [int(x) for x in ns.split(",")]:
            for fault in faults.split(","):
                for path in paths.split(","):
                    for rep in range(reps):
                        load = os.getloadavg()[0]
                        r = one(
                            path,
                            n,
                            fault,
                            a.stale_after,
                            a.pg_timeout,
                            a.keep_logs,
                            a.train_s,
                            a.recover_s,
                            a.cut_watch,
                        )
                        r.update(rep=rep, load=round(load, 2))
                        rows.append(r)
                        print(json.dumps(r), flush=True)
                        fails = [x["ok"] for x in rows if (x["path"], x["n"], x["fault"]) == (path, n, fault)]
                        if fails[-2:] == [False, False] or (fails == [False] and path.startswith("torchrun-")):
                            break  # a path that does not recover is not tried again at this size
    meta = dict(
        when=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        host=platform.node(),
        cpus=os.cpu_count(),
        git=subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        args=vars(a),
    )
    table = markdown([r for r in rows if not r.get("before_fix")])
    if any(r.get("cut") for r in rows):
        table += "\n" + cut_markdown(rows)
    print(table)
    if a.out:
        out = write_results(a.out, dict(meta=meta, rows=rows), table)
        plot([r for r in rows if not r.get("before_fix")], out / "recovery.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
