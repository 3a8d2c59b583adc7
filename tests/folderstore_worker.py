"""One process hammering a FolderStore (driven by tests/test_folderstore.py and benchmarks/bench_folderstore.py).

Usage: ``python folderstore_worker.py STORE_DIR WORKER_ID MODE=COUNT[,MODE=COUNT...]``; prints one JSON line
per completed operation (flushed, so that a SIGKILLed worker's completed operations are known).

Modes:
  add    ``add("ctr", 1)`` COUNT times; prints ``{"add": value}``.
  chain  COUNT times: read ``chain`` ("<n>:<writer>"), ``compare_set`` it to "<n+1>:<me>"; prints
         ``{"cas": n + 1, "won": bool}``.
  race   COUNT rounds: ``compare_set("race-<r>", "", "<me>")``; prints ``{"round": r, "got": value}``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fsmingle.fs.folderstore_torch import folder_store_class


def main() -> None:
    path, me, plan = sys.argv[1], sys.argv[2], sys.argv[3]
    s = folder_store_class()(path)
    for step in plan.split(","):
        mode, count = step.split("=")
        run(s, me, mode, int(count))


def run(s, me: str, mode: str, count: int) -> None:
    out = sys.stdout
    for r in range(count):
        if mode == "add":
            print(json.dumps({"add": s.add("ctr", 1)}), file=out, flush=True)
        elif mode == "chain":
            cur = s.get("chain").decode()
            n = int(cur.split(":")[0])
            want = f"{n + 1}:{me}"
            got = s.compare_set("chain", cur, want).decode()
            print(json.dumps({"cas": n + 1, "won": got == want}), file=out, flush=True)
        elif mode == "race":
            got = s.compare_set(f"race-{r}", "", me).decode()
            print(json.dumps({"round": r, "got": got}), file=out, flush=True)
        else:
            raise SystemExit(f"unknown mode {mode}")


def check(outs: list[list[dict]], store, workers: int, n_add: int, n_race: int) -> None:
    """The oracle of a hammering: every add distinct and none lost, one compare_set winner per chain step and per
    race round (seen by all).  ``outs``: each worker's printed lines; ``store``: a FolderStore on the same directory."""
    adds = [x["add"] for o in outs for x in o if "add" in x]
    want = list(range(1, workers * n_add + 1))
    assert sorted(adds) == want, (
        f"every add distinct, none lost: {sorted(adds)} (repeated: {sorted(set(a for a in adds if adds.count(a) > 1))}, missing: {sorted(set(want) - set(adds))})"
    )
    assert store.add("ctr", 0) == workers * n_add
    wins = [x["cas"] for o in outs for x in o if x.get("won")]
    assert len(wins) == len(set(wins)), "two compare_sets won the same step"
    assert int(store.get("chain").decode().split(":")[0]) == len(wins) == max(wins)
    races: dict = {}
    for o in outs:
        for x in o:
            if "round" in x:
                races.setdefault(x["round"], set()).add(x["got"])
    assert len(races) == n_race and all(len(v) == 1 for v in races.values()), "one winner per round, seen by all"


if __name__ == "__main__":
    main()
