"""The tables of README.md from this directory's runs: ``python table.py`` (run.log for the floor, the rest from each
run's results.json)."""

import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).parent


def runs(prefix: str) -> list[dict]:
    out = []
    for p in sorted(HERE.glob(f"{prefix}-256-*/results.json"), key=lambda p: int(p.parent.name.rsplit("-", 1)[1])):
        d = json.loads(p.read_text())["runs"]["bindfs2"]["256"]["folder"]
        t = d["timeline"]
        out.append(
            {
                "round": int(p.parent.name.rsplit("-", 1)[1]),
                "barrier": d["barrier"],
                "add1_last": t["add1"][-1],
                "wake_p50": t["wake_after_set"][1],
                "meta": d["add_meta"],
                "link": d["add_kinds"]["link"],
                "cpu": t["ranks_cpu_s"],
                "daemons": t["daemons_cpu_s"],
                "load": d["load"][0],
            }
        )
    return out


def floors() -> list[float]:
    text = (HERE / "run.log").read_text()
    return [float(x) for x in re.findall(r"^floor N=256 bindfs2: barrier ([0-9.]+) s", text, re.M)]


def local16() -> list[tuple[float, float]]:
    out = []
    for p in sorted(HERE.glob("local-16-*/results.json")):
        d = json.loads(p.read_text())["runs"]["local"]["16"]
        out.append((d["folder"]["barrier"], d["file"]["barrier"]))
    return out


def summary(name: str, rs: list[dict]) -> str:
    def med(k, nd=2):
        xs = [r[k] for r in rs]
        return f"{statistics.median(xs):.{nd}f} ({min(xs):.{nd}f}-{max(xs):.{nd}f})"

    return (
        f"| {name} | {len(rs)} | {med('barrier')} | {med('add1_last')} | {med('wake_p50')} | {med('meta', 1)} | "
        f"{med('link', 1)} | {med('cpu')} | {med('daemons')} |"
    )


if __name__ == "__main__":
    print("| tree | runs | barrier s | last add(b, 1) s | wake after the set, p50 s | metadata calls per add | "
          "link() per add | ranks' CPU s | daemons' CPU s |")
    print("|---|--:|---|---|---|---|---|---|---|")
    for name, prefix in [("main (a157fda), run.log", "folder"), ("base (79ea8cc), run.log", "base"),
                         ("main (a157fda), trees.log", "tmain"), ("pause (d91f05d), trees.log", "pause"),
                         ("parse (pause + listing parse), trees.log", "parse")]:
        rs = runs(prefix)
        if rs:
            print(summary(name, rs))
    fl = floors()
    print(f"\nfloor (256 ranks, no contention): {len(fl)} runs, median {statistics.median(fl):.2f} s "
          f"({min(fl):.2f}-{max(fl):.2f})")
    loc = local16()
    ratios = [a / b for a, b in loc]
    print(f"16 ranks, local disk, FolderStore's barrier over FileStore's: {len(loc)} runs, median "
          f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x); "
          + ", ".join(f"{1e3 * a:.1f}/{1e3 * b:.1f} ms" for a, b in loc))
