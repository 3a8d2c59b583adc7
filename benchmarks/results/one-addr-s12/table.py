"""Session 12's one-address A/B: one row per run (``python benchmarks/results/one-addr-s12/table.py DIR``), read from
each run's results.json: release after the last arrival (own, everyone), counted fs ops per participant (stat and
link among them: the claim path session 11 changed), generations, status."""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/oneaddr-s12")
print("| run | N | last→own s | last→all s | fs ops / participant | stat | link | generations | load at start | status |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
for f in sorted(out.glob("*/results.json"), key=lambda p: (p.parent.name.split("-")[1], p.parent.name)):
    d = json.loads(f.read_text())
    row = d["rows"][0]
    for r in row["runs"]:
        ops = (r.get("ops") or {}).get("per_kind_mean", {})
        print(
            f"| {f.parent.name} | {r['n']} | {r.get('last_own_s', float('nan')):.2f} | {r.get('last_all_s', float('nan')):.2f} "
            f"| {(r.get('ops') or {}).get('fs_ops_mean', float('nan')):.1f} | {ops.get('stat', float('nan')):.2f} "
            f"| {ops.get('link', float('nan')):.3f} | {len(r.get('generations', []))} "
            f"| {d['environment'].get('loadavg_start', ['?'])[0]:.2f} | {row['status']} |"
        )
