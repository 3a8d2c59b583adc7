"""Issue 31's recovery table is whole: ``python -m benchmarks.recovery.final`` gathers, from the committed runs
made with today's settings, every cell of 5 paths x 3 faults x N = 4, 8, 16, and a path that recovers has >= 5
runs in each of its cells (a torchrun path that fails its first run is not tried again at that size:
``benchmarks/recovery/__main__.py``).  The table in ``benchmarks/README.md`` ("The table, every cell") is this
module's output."""

from __future__ import annotations

from benchmarks.recovery import final
from benchmarks.recovery.harness import PATHS
from benchmarks.recovery.table import cells

FAULTS = ("kill", "stop", "cut")


def test_every_cell_of_the_recovery_table_has_its_runs(tmp_path):
    by_cell = cells(final.gather())
    missing, short = [], []
    for fault in FAULTS:
        for n in (4, 8, 16):
            for path in PATHS:
                rs = by_cell.get((fault, n, path), [])
                if not rs:
                    missing.append((fault, n, path))
                elif any(r["ok"] for r in rs) and len(rs) < 5:
                    short.append((fault, n, path, len(rs)))
    assert not missing, f"cells with no run: {missing}"
    assert not short, f"cells of a path that recovers with fewer than 5 runs: {short}"


def test_the_final_table_names_every_runs_directory(tmp_path):
    assert final.main(["--out", str(tmp_path)]) == 0
    sources = (tmp_path / "sources.md").read_text()
    used = {name for name, _ in final.SOURCES if final.rows_of(final.RESULTS / name)}
    assert used == {name for name, _ in final.SOURCES}, "a source directory holds no rows"
    assert all(f"recovery-{k}" in sources for k in (3, 5, 13))
    assert (tmp_path / "results.md").read_text().count("| kill |") == 15
