"""``python -m benchmarks.recovery.final``: issue 31's recovery table, every cell, from the runs that count.

The matrix (5 paths x 3 faults x N = 4, 8, 16, >= 5 runs a cell where a path recovers) took eleven sessions' runs
on a shared 2-core machine; no single run holds it.  This module gathers the rows of the runs made with today's
settings -- ``SOURCES`` says which run directory counts for which paths, and why the others do not -- and writes
the same ``results.md``, ``results.json`` and ``recovery.png`` as one run would (``table.markdown``/``plot``),
plus ``sources.md``: for each cell, its runs and the directories they came from.

A run directory's rows are its ``results.json``, else the JSON lines of its ``run*.out`` (a run stopped by a
timeout wrote no ``results.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from .table import cells, cut_markdown, markdown, plot, printed_rows, write_results

RESULTS = Path(__file__).resolve().parent.parent / "results"
FSM = ("inproc", "fsmingle-run")
TORCHRUN = ("torchrun-fsmingle", "torchrun-c10d", "torchrun-etcd")
# (run directory, the paths whose rows count).  Left out: "recovery" and "recovery-2" (the harness before the
# network cut and before the abort-first teardown); the torchrun rows of "recovery-3" (torch's default keep-alive,
# 15 s, and read_timeout 60 s: every torchrun run since uses keep-alive 5 s x 2 = --stale-after and read_timeout
# 10 s, "Fifth run"; its torchrun-fsmingle cut also predates the cut fix).
SOURCES = (
    ("recovery-3", FSM),
    ("recovery-4", FSM),
    ("recovery-5", TORCHRUN),
    ("recovery-6", FSM + TORCHRUN),
    ("recovery-7", TORCHRUN),
    ("recovery-8", TORCHRUN),
    ("recovery-9", TORCHRUN),
    ("recovery-10", TORCHRUN),
    ("recovery-11", TORCHRUN),
    ("recovery-12", FSM + TORCHRUN),
    ("recovery-13", TORCHRUN),
)


def rows_of(d: Path) -> list[dict]:
    """The rows of one run directory (see the module's docstring); [] if it holds none."""
    if (d / "results.json").exists():
        return json.loads((d / "results.json").read_text())["rows"]
    return [r for f in sorted(d.glob("run*.out")) for r in printed_rows(f)]


def gather(results: Path = RESULTS) -> list[dict]:
    """Every counted row, each with ``source`` (its run directory's name)."""
    out = []
    for name, paths in SOURCES:
        for r in rows_of(results / name):
            if r["path"] in paths and not r.get("before_fix"):
                out.append(dict(r, source=name))
    return out


def sources_markdown(rows: list[dict]) -> str:
    """One line per cell: runs ok / runs, every run's first step (s) with its run directory, the loads."""
    lines = [
        "| fault | N | path | runs ok | first step, every rank (s), each run [its directory] | loads |",
        "|---|---|---|---|---|---|",
    ]
    for k, rs in cells(rows).items():
        runs = " ".join(f"{r['first_step']:.1f}" if r["ok"] else "failed" for r in rs)
        where = ", ".join(dict.fromkeys(r["source"] for r in rs))
        loads = [r["load"] for r in rs]
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {sum(r['ok'] for r in rs)}/{len(rs)} | {runs} [{where}] | "
            f"{min(loads):.1f}–{max(loads):.1f} (median {statistics.median(loads):.1f}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.recovery.final", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS / "recovery-final"), help="directory for the outputs")
    a = ap.parse_args(argv)
    rows = gather()
    table = markdown(rows) + "\n" + cut_markdown(rows)
    out = write_results(a.out, dict(sources=SOURCES, rows=rows), table)
    (out / "sources.md").write_text(sources_markdown(rows))
    plot(rows, out / "recovery.png")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
