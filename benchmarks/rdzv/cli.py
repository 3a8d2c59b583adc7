"""Command line: ``python -m benchmarks.rdzv --help`` (``python benchmarks/bench_rendezvous.py`` is the same).

Exit status: 0 when every requested configuration ran and was valid; 1 when one failed, was
invalid or its backend was unavailable; 2 for bad arguments; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

from .common import (
    BACKENDS,
    REPO,
    BackendUnavailable,
    layout,
    mem_available_bytes,
    raise_nofile,
)
from .filesystems import FS_MODES, FS_OPTS, MountSet, bindfs_unavailable_reason
from .harness import Scenario, run_once
from .report import environment, plot, render_tables, summarize

PER_PROC_BYTES = {"fsmingle": 60 << 20, "fsmingle-v1": 60 << 20, "torch-file": 300 << 20, "torch-tcp": 300 << 20}


def check_backend(backend: str, v1_root: str) -> str | None:
    """Why ``backend`` cannot run here, or None."""
    if backend == "fsmingle-v1":
        if not os.path.isfile(os.path.join(v1_root, "fsmingle", "api.py")):
            return (
                f"fsmingle-v1 not available: no fsmingle package in {v1_root}; make one with "
                f"`git worktree add --detach {v1_root} 3be66ce` or pass --v1-root"
            )
        return None
    if backend == "fsmingle":
        return None if importlib.util.find_spec("fsmingle") else "fsmingle not available: not importable"
    return None if importlib.util.find_spec("torch") else f"{backend} not available: torch is not installed"


def write_outputs(out: str, command: str, env_info: dict, rows: list[dict], notes: list[str], extra: dict) -> str:
    table = render_tables(rows, notes)
    results = {
        "command": command,
        "environment": env_info,
        "loadavg_end": os.getloadavg(),
        "rows": rows,
        "notes": notes,
        **extra,
    }
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write(f"Command: `{command}`\n\nEnvironment: {json.dumps(env_info, default=str)}\n\n{table}")
    with open(os.path.join(out, "command.txt"), "w") as fh:
        fh.write(command + "\n")
    plot(rows, os.path.join(out, "rendezvous.png"), title=command)
    return table


# The options that are Scenario settings: (flag, type, help).  Their defaults are Scenario's own
# (benchmarks/rdzv/harness.py), typed once; each value goes to the field of the flag's name.
_SCENARIO_FLAGS = [
    ("--settle", float, "seconds between 'all early participants joined' and the last arrival"),
    ("--strace-secs", float, "strace/counting window inside the settle period"),
    ("--strace-procs", int, "waiting processes sampled with strace (0: none)"),
    ("--max-procs", int, "participant processes at most; beyond, participants are threads"),
    ("--timeout", float, "per-phase timeout (s) and fsmingle's --timeout"),
    ("--ready-timeout", float, "time allowed for spawning and imports"),
    ("--v1-root", str, "checkout holding the previous release (fsmingle-v1)"),
]


def _field(flag: str) -> str:
    """``--strace-secs`` -> ``strace_secs`` (argparse's dest and the Scenario field)."""
    return flag[2:].replace("-", "_")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.rdzv",
        description="Rendezvous benchmark: fsmingle vs torch c10d (last-arrival scenario).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--n", default="2,4,16,64", help="comma-separated participant counts")
    ap.add_argument("--backends", default="fsmingle,torch-file,torch-tcp", help=f"any of {', '.join(BACKENDS)}")
    ap.add_argument(
        "--fs", default="local,bindfs", help=f"any of {', '.join(FS_MODES)}; torch-tcp ignores it (fs 'net')"
    )
    ap.add_argument("--reps", type=int, default=3, help="repetitions per configuration")
    for flag, kind, text in _SCENARIO_FLAGS:
        ap.add_argument(flag, type=kind, default=getattr(Scenario, _field(flag)), help=text)
    ap.add_argument(
        "--max-mounts", type=int, default=64, help="bindfs mounts at most (participant p uses mount p %% M)"
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=900.0,
        help="stop escalating N for a backend/fs once one configuration takes longer (s)",
    )
    ap.add_argument(
        "--fsmingle-root",
        default=None,
        help="checkout whose fsmingle package the fsmingle backend runs (default: the installed one, "
        "i.e. this working tree); e.g. a `git worktree add --detach /tmp/v2 HEAD` to measure a commit",
    )
    ap.add_argument(
        "--no-progress",
        action="store_true",
        help="call fsmingle.rendezvous without on_progress (the join is then detected by N-1 beacons, "
        "and --settle must cover the connections); the callback costs O(N) per update in v2",
    )
    ap.add_argument(
        "--one-addr",
        action="store_true",
        help="every participant on 127.0.0.1 (one host in rank mode, or a NAT: rank 0's per-source caps "
        "see one address); default: one loopback address per participant",
    )
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a new temp dir)")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument(
        "--replot",
        metavar="RESULTS_JSON",
        default=None,
        help="only re-render the table and plot of an earlier results.json into --out",
    )
    args = ap.parse_args(argv)
    raw = list(argv) if argv is not None else sys.argv[1:]

    if args.replot:
        with open(args.replot) as fh:
            old = json.load(fh)
        os.makedirs(args.out, exist_ok=True)
        for r in old["rows"]:
            r["summary"] = summarize(r["runs"])
        print(write_outputs(args.out, old["command"], old["environment"], old["rows"], old["notes"], {}))
        return 0

    ns = sorted({int(x) for x in args.n.split(",") if x.strip()})
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    fss = [f.strip() for f in args.fs.split(",") if f.strip()]
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r}; choose from {', '.join(BACKENDS)}")
    for f in fss:
        if f not in FS_MODES:
            ap.error(f"unknown fs {f!r}; choose from {', '.join(FS_MODES)}")
    if any(n < 2 for n in ns):
        ap.error("--n: every N must be >= 2")
    os.makedirs(args.out, exist_ok=True)
    command = " ".join(shlex.quote(x) for x in ["python", "-m", "benchmarks.rdzv"] + raw)
    sc = Scenario(
        **{_field(flag): getattr(args, _field(flag)) for flag, _, _ in _SCENARIO_FLAGS},
        keep_logs=args.keep_logs,
        fsmingle_root=args.fsmingle_root,
        progress=not args.no_progress,
        one_addr=args.one_addr,
    )

    def log(msg: str) -> None:
        print(msg, flush=True)

    raise_nofile()
    notes: list[str] = []
    workdir = args.workdir or tempfile.mkdtemp(prefix="fsmingle-bench-")
    os.makedirs(workdir, exist_ok=True)
    env_info = environment()
    log(
        f"# workdir {workdir}; torch {env_info.get('torch')}; {env_info['cpus']} CPUs; load {env_info['loadavg_start']}"
    )
    unavailable = {b: check_backend(b, args.v1_root) for b in backends}
    for b, why in unavailable.items():
        if why:
            log(f"! {b}: {why}")
    bindfs_reason = bindfs_unavailable_reason() if any(f in FS_OPTS for f in fss) else None
    if bindfs_reason:
        log(f"! skipping bindfs modes: {bindfs_reason}")
        notes.append(f"bindfs modes skipped: {bindfs_reason}")
    combos: list[tuple[str, str]] = []
    for b in backends:
        if b == "torch-tcp":
            combos.append((b, "net"))
            continue
        combos += [(b, f) for f in fss if not (f in FS_OPTS and bindfs_reason)]

    rows: list[dict] = []
    mountsets: dict[str, MountSet] = {}
    exit_code = 0
    started = time.monotonic()
    try:
        for b, f in combos:
            stopped: str | None = None
            for n in ns:
                row: dict[str, Any] = {"backend": b, "fs": f, "n": n, "runs": []}
                rows.append(row)
                if unavailable.get(b):
                    row["status"] = unavailable[b]
                    exit_code = 1
                    continue
                if stopped:
                    row["status"] = f"not run: {stopped}"
                    continue
                groups = layout(n, args.max_procs)
                need = len(groups) * PER_PROC_BYTES[b]
                avail = mem_available_bytes()
                if avail is not None and need > 0.7 * avail:
                    stopped = (
                        f"stopped before N={n}: {len(groups)} processes need ~{need / 2**30:.1f} GiB, "
                        f"only {avail / 2**30:.1f} GiB available"
                    )
                    row["status"] = f"not run: {stopped}"
                    notes.append(f"{b}/{f}: {stopped}")
                    continue
                if f in FS_OPTS:
                    m = min(max(ns), args.max_mounts)
                    if f not in mountsets:
                        root = os.path.join(workdir, f)
                        log(f"# mounting {m} bindfs mounts (-o {FS_OPTS[f]}) under {root}")
                        mountsets[f] = MountSet(root, m, FS_OPTS[f])
                    ms = mountsets[f]
                    dirs_for = ms.mounts[: min(n, len(ms.mounts))]
                    backing = ms.backing
                    row["mounts"], row["mount_opts"] = len(dirs_for), ms.opts
                else:
                    backing = os.path.join(workdir, "local")
                    os.makedirs(backing, mode=0o700, exist_ok=True)
                    dirs_for = [backing]
                log(
                    f"## {b} fs={f} N={n}: {len(groups)} processes (≤{max(len(g) for g in groups)} participants "
                    f"each){'' if f not in FS_OPTS else f', {len(dirs_for)} mounts'}"
                )
                t_cfg = time.monotonic()
                for rep in range(args.reps):
                    try:
                        row["runs"].append(run_once(sc, b, f, n, rep, dirs_for, backing, workdir, log))
                    except BackendUnavailable as exc:
                        row["status"] = str(exc)
                        exit_code = 1
                        break
                    except Exception as exc:
                        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                        row["status"] = f"failed: {msg}"
                        row.setdefault("errors", []).append(traceback.format_exc())
                        log(f"    rep {rep} FAILED: {exc}")
                        stopped = f"stopped after N={n} failed ({msg[:120]})"
                        notes.append(f"{b}/{f}: {stopped}")
                        exit_code = 1
                        break
                row["summary"] = summarize(row["runs"])
                if "status" not in row:
                    bad = [r for r in row["runs"] if not r["valid"]]
                    row["status"] = "ok" if not bad else f"INVALID: {bad[0]['problems']}"
                    exit_code = exit_code or (1 if bad else 0)
                dt = time.monotonic() - t_cfg
                if not stopped and dt > args.budget and n != ns[-1]:
                    stopped = f"stopped after N={n}: it took {dt:.0f}s > budget {args.budget:.0f}s"
                    notes.append(f"{b}/{f}: {stopped}")
    except KeyboardInterrupt:
        if rows and not rows[-1]["runs"] and "status" not in rows[-1]:
            rows[-1]["status"] = "not run: interrupted (SIGINT)"
        notes.append("interrupted")
        exit_code = 130
    finally:
        for ms in mountsets.values():
            ms.close()

    if any(max(len(g) for g in layout(n, args.max_procs)) > 1 for n in ns):
        notes.append(
            f"At most {args.max_procs} processes per configuration; beyond that participants are threads "
            "(own identity each); the last participant always has a process of its own."
        )
    notes.append(
        f"Settle {args.settle:g}s after the early participants joined; waiting-load window "
        f"{args.strace_secs:g}s (counting wrapper on every fsmingle participant; strace on "
        f"≤{args.strace_procs} processes, detached before the last arrival)."
    )
    for f in fss:
        if f in FS_OPTS and not bindfs_reason:
            notes.append(
                f"{f}: bindfs mounts (one per participant up to {args.max_mounts}, then shared round-robin) "
                f"of one backing directory, -o {FS_OPTS[f]}."
            )
    if "fsmingle-v1" in backends:
        notes.append(f"fsmingle-v1: the previous release's package from {args.v1_root} (git worktree of 3be66ce).")
    for b, root in (
        ("fsmingle", args.fsmingle_root),
        ("fsmingle-v1", args.v1_root if "fsmingle-v1" in backends else None),
    ):
        if root:
            rev = subprocess.run(["git", "-C", root, "log", "-1", "--format=%h %s"], capture_output=True, text=True)
            notes.append(f"{b} ran the package of {root} at commit {rev.stdout.strip()[:100]}")
    notes.append(f"harness time {time.monotonic() - started:.0f}s.")
    try:
        table = write_outputs(args.out, command, env_info, rows, notes, {"args": vars(args)})
    except Exception as exc:  # a missing plot must not hide the numbers
        log(f"! writing outputs failed: {exc!r}")
        table, exit_code = render_tables(rows, notes), exit_code or 1
    print()
    print(table)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    log(f"# wrote {args.out}/results.json, results.md, rendezvous.png, command.txt")
    return exit_code
