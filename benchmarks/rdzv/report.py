"""Statistics, markdown tables and the plot -- all from the rows of one results.json."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

from ..opkinds import ISSUE13_KINDS
from .common import HERE, mem_available_bytes, pct


def summarize(runs: list[dict]) -> dict:
    """Percentiles over the valid repetitions of one configuration."""
    ok = [r for r in runs if r.get("valid")]
    s: dict[str, Any] = {"reps_ok": len(ok), "reps": len(runs)}
    if not ok:
        return s
    own = [r["last_own_s"] for r in ok]
    allr = [r["last_all_s"] for r in ok]
    waiters = [x for r in ok for x in r["waiters_after_last_s"]]
    for name, xs in (("last_own", own), ("last_all", allr), ("waiter", waiters)):
        s[f"{name}_p50"] = pct(xs, 50)
        s[f"{name}_p95"] = pct(xs, 95)
        s[f"{name}_max"] = max(xs)
    s["wall_p50"] = pct([r["wall_s"] for r in ok], 50)
    s["join_p50"] = pct([r["go_to_joined_s"] for r in ok], 50)
    s["procs"] = ok[0]["procs"]
    s["max_threads_per_proc"] = ok[0]["max_threads_per_proc"]
    ops = [r["ops"] for r in ok if r.get("ops")]
    if ops:
        for k in (
            "fs_ops_mean",
            "fs_ops_max",
            "fs_ops_rank0",
            "fs_ops_last",
            "entries_mean",
            "entries_rank0",
            "entries_last",
            "waiter_fs_ops_per_s_p50",
            "waiter_fs_ops_per_s_max",
            "rank0_fs_ops_per_s",
        ):
            vals = [o.get(k) for o in ops if o.get(k) is not None]
            s[f"ops_{k}"] = pct(vals, 50) if vals else None
        kinds = ops[0]["per_kind_mean"].keys()
        s["ops_per_kind_mean"] = {k: pct([o["per_kind_mean"][k] for o in ops], 50) for k in kinds}
    samples = [x for r in ok for x in (r["fsops"] or [])]
    if samples:
        cats = samples[0]["per_participant_per_s"].keys()
        s["ops_per_s"] = {c: sum(x["per_participant_per_s"][c] for x in samples) / len(samples) for c in cats}
        s["ops_samples"] = len(samples)
        own = [(x["ranks"].get(str(p)), v) for x in samples for p, v in x["own_thread_per_s"].items() if "ranks" in x]
        if own:
            non0 = [v for r, v in own if r != 0]
            r0 = [v for r, v in own if r == 0]
            s["own_non_rank0_p50"] = {c: pct([v[c] for v in non0], 50) for c in cats} if non0 else None
            s["own_rank0_p50"] = {c: pct([v[c] for v in r0], 50) for c in cats} if r0 else None
    return s


def _f(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def render_tables(rows: list[dict], notes: list[str]) -> str:
    """The markdown report: one main table, the counted-operations table, ratios, notes."""
    out = [
        "### Last arrival → release (seconds), waiting load, operations per participant\n",
        (
            "| backend | fs | N | procs × threads | reps | last→own p50 / max | last→all p50 / max | any waiter p50 "
            "| wall p50 | waiter fs ops/s (strace, own thread) | waiter fs ops/s (counted) | rank 0 fs ops/s (counted) "
            "| fs ops / participant / generation (counted) | entries read / participant | status |"
        ),
        "|" + "---|" * 15,
    ]
    for r in rows:
        s = r.get("summary", {})
        lay = f"{s.get('procs', '—')} × ≤{s.get('max_threads_per_proc', '—')}" if s.get("procs") else "—"
        status = (r.get("status", "ok") or "").replace("|", "/").replace("\n", " ")
        status = status if len(status) <= 90 else status[:87] + "..."
        tw = (s.get("own_non_rank0_p50") or {}).get("fs_ops")
        out.append(
            f"| {r['backend']} | {r['fs']} | {r['n']} | {lay} | {s.get('reps_ok', 0)}/{s.get('reps', 0)} "
            f"| {_f(s.get('last_own_p50'))} / {_f(s.get('last_own_max'))} "
            f"| {_f(s.get('last_all_p50'))} / {_f(s.get('last_all_max'))} | {_f(s.get('waiter_p50'))} "
            f"| {_f(s.get('wall_p50'), 1)} | {_f(tw)} | {_f(s.get('ops_waiter_fs_ops_per_s_p50'), 3)} "
            f"| {_f(s.get('ops_rank0_fs_ops_per_s'))} | {_f(s.get('ops_fs_ops_mean'), 1)} "
            f"(max {_f(s.get('ops_fs_ops_max'), 0)}, rank 0 {_f(s.get('ops_fs_ops_rank0'), 0)}) "
            f"| {_f(s.get('ops_entries_mean'), 0)} (rank 0 {_f(s.get('ops_entries_rank0'), 0)}) | {status} |"
        )
    kinds_rows = [r for r in rows if r.get("summary", {}).get("ops_per_kind_mean")]
    if kinds_rows:
        kinds = list(kinds_rows[0]["summary"]["ops_per_kind_mean"])
        out.append("\n### fsmingle: counted operations per participant per generation, by kind (mean)\n")
        out.append("| backend | fs | N | " + " | ".join(kinds) + " |")
        out.append("|" + "---|" * (3 + len(kinds)))
        for r in kinds_rows:
            k = r["summary"]["ops_per_kind_mean"]
            out.append(f"| {r['backend']} | {r['fs']} | {r['n']} | " + " | ".join(_f(k[x], 1) for x in kinds) + " |")
    if notes:
        out.append("\n### Notes\n")
        out.extend(f"- {x}" for x in notes)
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: str, title: str = "") -> None:
    """Three panels vs N: release latency after the last arrival; waiting fs ops/s per participant;
    fs operations per participant per generation (fsmingle, counted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.8))
    series: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for r in rows:
        s = r.get("summary", {})
        if s.get("last_all_p50") is not None:
            series.setdefault((r["backend"], r["fs"]), []).append((r["n"], s))
    for (b, fs), pts in sorted(series.items()):
        pts.sort(key=lambda t: t[0])
        xs = [p[0] for p in pts]
        (line,) = ax1.plot(xs, [p[1]["last_all_p50"] for p in pts], marker="o", label=f"{b} / {fs}")
        ax1.plot(xs, [p[1]["last_own_p50"] for p in pts], ls="--", marker="x", color=line.get_color(), alpha=0.6)
        c = line.get_color()
        cnt = [
            (p[0], p[1]["ops_waiter_fs_ops_per_s_p50"])
            for p in pts
            if p[1].get("ops_waiter_fs_ops_per_s_p50") is not None
        ]
        stc = [
            (p[0], (p[1].get("own_non_rank0_p50") or {}).get("fs_ops"))
            for p in pts
            if (p[1].get("own_non_rank0_p50") or {}).get("fs_ops") is not None
        ]
        if cnt:
            ax2.plot(
                [x for x, _ in cnt], [max(v, 1e-3) for _, v in cnt], marker="o", color=c, label=f"{b} / {fs} (counted)"
            )
        if stc:
            ax2.plot(
                [x for x, _ in stc],
                [max(v, 1e-3) for _, v in stc],
                marker="s",
                ls=":",
                color=c,
                label=f"{b} / {fs} (strace)",
            )
        ops_series = (
            ("mean", {"marker": "o"}, lambda s: s.get("ops_fs_ops_mean")),
            (
                f"mean, {' + '.join(ISSUE13_KINDS)}",
                {"marker": "s", "ls": "--"},
                lambda s: (
                    sum(s["ops_per_kind_mean"].get(k, 0) for k in ISSUE13_KINDS) if s.get("ops_per_kind_mean") else None
                ),
            ),
            ("rank 0", {"marker": "^", "ls": ":", "alpha": 0.7}, lambda s: s.get("ops_fs_ops_rank0")),
        )
        for name, style, value in ops_series:
            got = [(x, value(s)) for x, s in pts if value(s) is not None]
            if got:
                ax3.plot([x for x, _ in got], [v for _, v in got], color=c, label=f"{b} / {fs}: {name}", **style)
    ax2.axhline(0.2, color="grey", ls="--", lw=0.8)
    ax3.axhline(10, color="grey", ls="--", lw=0.8)
    ax1.axhline(0.3, color="grey", ls="--", lw=0.8)
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("participants N")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6)
    ax1.set_ylabel("seconds")
    ax1.set_title("Release after the last arrival\n(solid: everyone, dashed: the last one)", fontsize=9)
    ax2.set_ylabel("fs ops / s")
    ax2.set_title("Waiting participant's fs ops/s (typical non-rank-0)\n(grey: goal 0.2/s)", fontsize=9)
    ax3.set_ylabel("fs ops")
    ax3.set_title(
        "fs ops per participant per generation (fsmingle, counted)\n(grey: target 10, for issue 13's kinds)", fontsize=9
    )
    if title:
        fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment() -> dict:
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "mem_available_gib": (mem_available_bytes() or 0) / 2**30,
    }
    from importlib.metadata import version

    for dist in ("torch", "fsmingle", "matplotlib"):
        try:
            env[dist] = version(dist)
        except Exception:
            env[dist] = None
    try:
        r = subprocess.run(
            ["git", "-C", os.path.dirname(os.path.dirname(HERE)), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        env["git_commit"] = r.stdout.strip() or None
    except Exception:
        env["git_commit"] = None
    return env
