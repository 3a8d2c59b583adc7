"""Prints run.log's rows as the Markdown table in README.md (python table.py < run.log)."""

import json
import sys

print("| N | round | kind | requester pause s | racers per look | last arrival to last answer s | add p50 s | metadata calls per add | ranks CPU s | bindfs CPU s | load before |")
print("|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|")
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    kind = "FolderKV.add (main)" if r["kind"] == "folder" else f"prototype, {r['kind']}"
    print(
        f"| {r['n']} | {r['round']} | {kind} | {r['poll'] or ''} | {(r.get('race') or 'all') if r['kind'] != 'folder' else ''} | {r['last_arrival_to_last_answer_s']} | {r['add_p50_s']} |"
        f" {r['meta_per_add']} | {r['ranks_cpu_s']} | {r['daemons_cpu_s']} | {r['load_before']} |"
    )
