"""The recovery benchmark's outputs from its rows: the rows a run printed, ``results.json``/``results.md``, the
cells, the markdown tables and the plot.

``python -m benchmarks.recovery`` (one run) and ``python -m benchmarks.recovery.final`` (the runs that count) both
write them; ``benchmarks.recovery.join`` reads and writes its rows, and makes its table's numbers, with the same
functions.  A row is one run's JSON (``harness.one``), a cell every row of one (fault, N, path).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .harness import PATHS


def printed_rows(log: Path) -> list[dict]:
    """The JSON rows a run printed (its stdout, saved in ``log``), one a line; every other line is left out."""
    return [json.loads(line) for line in Path(log).read_text().splitlines() if line.startswith("{")]


def write_results(out: Path, results: object, table: str) -> Path:
    """``out/results.json`` (``results``, indented) and ``out/results.md`` (``table``); ``out`` made if missing."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(table)
    return out


def cells(rows: list[dict]) -> dict[tuple[str, int, str], list[dict]]:
    """The rows by cell, ``(fault, n, path)`` -> its rows in their order; cells sorted by fault, then N, then
    the path's place in ``PATHS``."""
    out: dict[tuple[str, int, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["fault"], r["n"], r["path"]), []).append(r)
    return {k: out[k] for k in sorted(out, key=lambda k: (k[0], k[1], PATHS.index(k[2])))}


def median(xs) -> float | None:
    """The median of the values that are not None; None if there are none."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def two_places(x: float | None) -> str:
    """A table's number: two decimals, "—" for none."""
    return "—" if x is None else f"{x:.2f}"


def _med(xs) -> str:
    return two_places(median(xs))


def markdown(rows: list[dict]) -> str:
    """One line per cell: runs ok / runs, then the medians (seconds after the fault) of the runs ok."""
    lines = [
        "| fault | N | path | runs ok | detect (s) | release (s) | ready, every rank (s) | first step, every rank (s) | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k, rs in cells(rows).items():
        ok = [r for r in rs if r["ok"]]
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {len(ok)}/{len(rs)} | {_med(r['detect'] for r in ok)} | "
            f"{_med(r['release'] for r in ok)} | {_med(r.get('ready') for r in ok)} | {_med(r['first_step'] for r in ok)} | "
            f"{_med(r['load'] for r in rs)} |"
        )
    return "\n".join(lines) + "\n"


def cut_markdown(rows: list[dict]) -> str:
    """What the cut node and the new world did once the link came up again (runs that recovered)."""
    lines = [
        "| N | path | runs | cut node, while cut (first run) | cut node, link up again (first run) | "
        "cut node in a new world | new world stepped after the link came up | another world after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    # Only "cut" runs carry r["cut"], so every cell here is of that one fault.
    for (_fault, n, path), rs in cells([r for r in rows if r.get("cut")]).items():
        cs = [r["cut"] for r in rs]
        lines.append(
            f"| {n} | {path} | {len(cs)} | {' '.join(cs[0]['victim_cut']) or '—'} | "
            f"{' '.join(cs[0]['victim_up']) or '—'} | {sum(c['victim_in_new_world'] for c in cs)}/{len(cs)} | "
            f"{sum(c['new_world_steps_up'] > 0 for c in cs)}/{len(cs)} | {sum(c['worlds_after_up'] > 0 for c in cs)}/{len(cs)} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], png: Path) -> None:
    """Per fault, every path's median first step against N (log 2); nothing without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    faults = sorted({r["fault"] for r in rows})
    fig, axes = plt.subplots(1, len(faults), figsize=(6 * len(faults), 4), squeeze=False)
    for ax, fault in zip(axes[0], faults):
        for path in PATHS:
            pts = {}
            for r in rows:
                if r["fault"] == fault and r["path"] == path and r["ok"]:
                    pts.setdefault(r["n"], []).append(r["first_step"])
            if pts:
                ns = sorted(pts)
                ax.plot(ns, [statistics.median(pts[n]) for n in ns], marker="o", label=path)
        ax.set_title(f"{fault}: fault -> every rank's first step (median)")
        ax.set_xlabel("nodes (N)")
        ax.set_ylabel("seconds")
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=90)
