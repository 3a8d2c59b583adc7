"""The A/B's table: python benchmarks/results/folderstore-statx/table.py (reads each run's results.json)."""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def row(t: str, n: int, r: int) -> dict | None:
    p = HERE / f"{t}-{n}-{r}" / "results.json"
    if not p.exists():
        return None
    d = json.loads(p.read_text())
    fs = "bindfs2" if n == 256 else "local"
    f = d["runs"][fs][str(n)]["folder"]
    tl = f.get("timeline", {})
    return {
        "barrier": f["barrier"] * 1e3,
        "add": f["add"] * 1e3,
        "meta": f["add_meta"],
        "stat": f["add_kinds"]["stat"],
        "link": f["add_kinds"]["link"],
        "cpu": tl.get("ranks_cpu_s", float("nan")),
        "daemons": f.get("daemons_cpu_s", float("nan")),
        "load": f["load"][0],
    }


COLS = ("barrier", "add", "meta", "stat", "link", "cpu", "daemons", "load")
HEAD = "barrier ms | add ms (median) | metadata calls per add | of them stat | link | ranks' CPU s | daemons' CPU s | load"
for n in (256, 16):
    for rounds, label in (((1, 2, 3, 4, 5), "rounds 1-5 (counter before)"), ((6, 7), "rounds 6-7 (statx counted)")):
        print(f"\n{n} ranks, {label}\n\n| tree | round | {HEAD} |\n|---|--:|" + "--:|" * len(COLS))
        for t in ("base", "statx"):
            got = {r: row(t, n, r) for r in rounds}
            for r, x in got.items():
                if x:
                    print(f"| {t} | {r} | " + " | ".join(f"{x[c]:.1f}" if c != "load" else f"{x[c]:.2f}" for c in COLS) + " |")
            vals = [x for x in got.values() if x]
            if len(vals) > 1:
                med = {c: statistics.median(x[c] for x in vals) for c in COLS}
                print(f"| {t} | median | " + " | ".join(f"**{med[c]:.1f}**" for c in COLS) + " |")
