"""Smoke test of the rendezvous benchmark harness (``python -m benchmarks.rdzv``,
also ``benchmarks/bench_rendezvous.py``).

Runs the real harness at N=2, one repetition, on a local directory, for
fsmingle and torch's c10d-on-FileStore rendezvous, and checks that it prints
a table and writes its results, with fsmingle's operations counted in process.
Also checks the strace accounting on a synthetic log and the participant layout.
Needs torch (the CI installs it) and strace for the strace columns (the CI
installs it too).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "bench_rendezvous.py")


def _load_bench():
    sys.path.insert(0, ROOT)
    from benchmarks.rdzv import common, fsops

    class B:
        classify_strace = staticmethod(fsops.classify_strace)
        layout = staticmethod(common.layout)

    return B


def test_classify_strace_counts_file_ops_by_directory():
    b = _load_bench()
    log = "\n".join(
        [
            "101 read(0<pipe:[1]>,  <unfinished ...>",
            '102 openat(AT_FDCWD</w>, "/rdzv/job/gen-1/release.json", O_RDONLY|O_CLOEXEC) = -1 ENOENT (No such file)',
            '102 openat(AT_FDCWD</w>, "/rdzv/job/gen-1", O_RDONLY|O_CLOEXEC|O_DIRECTORY) = 5</rdzv/job/gen-1>',
            "102 getdents64(5</rdzv/job/gen-1>, 0x1 /* 3 entries */, 32768) = 80",
            "102 close(5</rdzv/job/gen-1>) = 0",
            '102 newfstatat(AT_FDCWD</w>, "/rdzv/job/gen-1/beacon-a.json", {st_mode=S_IFREG}, 0) = 0',
            "102 flock(3</rdzv/store>, LOCK_SH) = 0",
            '102 read(3</rdzv/store>, "x", 10) = 1',
            '102 write(1<pipe:[2]>, "@@ {}", 5) = 5',
            '102 newfstatat(AT_FDCWD</w>, "/usr/lib/python3/x.py", {st_mode=S_IFREG}, 0) = 0',
            '103 sendto(7<socket:[9]>, "abc", 3, 0, NULL, 0) = 3',
            '102 <... read resumed>"", 10) = 0',
            "+++ exited with 0 +++",
        ]
    )
    c = b.classify_strace(log, ("/rdzv",))
    assert c["opens"] == 1
    assert c["listdirs"] == 1
    assert c["getdents"] == 1
    assert c["closes"] == 1
    assert c["stats"] == 1
    assert c["locks"] == 1
    assert c["reads"] == 1
    assert c["writes"] == 0  # the pipe write is the harness's own channel
    assert c["net"] == 1
    assert c["outside"] == 1  # the stat of a python source file
    assert c["fs_ops"] == 1 + 1 + 1 + 1 + 1 + 1  # opens, listdirs, getdents, stats, locks, reads


def test_layout_keeps_last_participant_alone():
    b = _load_bench()
    groups = b.layout(10, 4)
    assert groups[-1] == [9]
    assert sorted(p for g in groups[:-1] for p in g) == list(range(9))
    assert len(groups) == 4
    assert b.layout(2, 16) == [[0], [1]]


@pytest.mark.torch
def test_benchmark_smoke_runs_and_prints_table(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    out = tmp_path / "results"
    cmd = [
        sys.executable,
        BENCH,
        "--n",
        "2",
        "--reps",
        "1",
        "--fs",
        "local",
        "--backends",
        "fsmingle,torch-file",
        "--settle",
        "2",
        "--strace-secs",
        "1",
        "--timeout",
        "40",
        "--ready-timeout",
        "40",
        "--out",
        str(out),
        "--workdir",
        str(tmp_path / "work"),
    ]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert elapsed < 60, f"smoke benchmark took {elapsed:.0f}s"
    table = p.stdout
    assert "| backend | fs | N |" in table
    for backend in ("fsmingle", "torch-file"):
        rows = [ln for ln in table.splitlines() if ln.startswith(f"| {backend} | local | 2 |")]
        assert rows, table
        assert rows[0].rstrip().endswith("| ok |"), rows[0]
    assert "### fsmingle: counted operations per participant per generation" in table

    res = json.loads((out / "results.json").read_text())
    assert res["command"].startswith("python ")
    by = {(r["backend"], r["fs"], r["n"]): r for r in res["rows"]}
    for backend in ("fsmingle", "torch-file"):
        row = by[(backend, "local", 2)]
        assert row["status"] == "ok"
        (run,) = row["runs"]
        assert run["valid"], run["problems"]
        assert 0 <= run["last_own_s"] <= run["last_all_s"] < 30
        if shutil.which("strace"):
            assert run["fsops"], "strace sample missing"
            assert run["fsops"][0]["counts"]["fs_ops"] > 0
    fm = by[("fsmingle", "local", 2)]["runs"][0]
    assert fm["torch_imported_in_fsmingle"] is False
    # Counted in process: every participant created, linked (its claim) and listed something.
    assert fm["ops"]["per_kind_mean"]["link"] >= 1 and fm["ops"]["per_kind_mean"]["readdir"] >= 1
    # N=2: the only early participant is rank 0, so the waiting window measures rank 0.
    assert fm["ops"]["fs_ops_mean"] > 0 and fm["ops"]["window_s"] > 0
    assert fm["ops"]["rank0_fs_ops_per_s"] is not None
    assert (out / "rendezvous.png").stat().st_size > 1000
    # once in the main table, once in the by-kind table of counted operations
    assert (out / "results.md").read_text().count("| fsmingle | local | 2 |") == 2
    assert (out / "command.txt").read_text().strip() == res["command"]


def test_ops_trace_names_the_callers_of_each_operation():
    # `python -m benchmarks.ops_trace`: a real rendezvous of 3 threads, each counted operation of
    # issue 13's list shown with the fsmingle call that made it.
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.ops_trace", "--n", "3", "--stagger", "0.05", "--timeout", "60"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    head, *rest = p.stdout.splitlines()
    assert head.startswith("N = 3, stagger 0.05 s: mean per participant create ")
    total = float(head.rsplit("= ", 1)[1])
    assert 5 <= total <= 40, head  # a joiner's 8, rank 0's share; never zero (the wrapper counted)
    assert "--- rank 0:" in p.stdout and "--- rank 2:" in p.stdout
    assert any("link" in line and "joining.py:try_claim" in line for line in rest), p.stdout


def test_benchmark_one_address_smoke(tmp_path):
    # Issue 29: a world from one address (--one-addr: every participant on 127.0.0.1, as one big
    # host in rank mode or a NAT) is no flood to rank 0's caps on unanswered connections.  The
    # full-size runs (4,096 and 8,192) are in benchmarks/README.md; this is the harness path.
    pytest.importorskip("matplotlib")
    out = tmp_path / "results"
    cmd = [sys.executable, BENCH, "--n", "160", "--reps", "1", "--fs", "local", "--backends", "fsmingle"]
    cmd += ["--max-procs", "3", "--settle", "1", "--strace-secs", "0.5", "--strace-procs", "0", "--one-addr"]
    cmd += ["--timeout", "60", "--ready-timeout", "60", "--out", str(out), "--workdir", str(tmp_path / "work")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    res = json.loads((out / "results.json").read_text())
    (row,) = res["rows"]
    assert row["status"] == "ok", row
    (run,) = row["runs"]
    assert run["valid"], run["problems"]
    assert run["generations"] == [1], run["generations"]  # no void on the way
    assert "--one-addr" in res["command"]


def test_profile_of_a_contended_add_counts_its_calls(tmp_path):
    # `bench_folderstore --profile DIR` then `profile_adds DIR`: each rank's barrier add(b, 1) profiled, summed per
    # add (where a contended add's metadata calls go: session 14's table in docs/folderstore.md).
    pytest.importorskip("torch")
    prof = tmp_path / "prof"
    cmd = [sys.executable, "-m", "benchmarks.bench_folderstore", "--n", "3", "--fs", "local", "--stores", "folder"]
    cmd += ["--k", "1", "--k-add", "1", "--no-strace", "--profile", str(prof), "--out", str(tmp_path / "out")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert sorted(f.name for f in prof.iterdir()) == ["rank-0.prof", "rank-1.prof", "rank-2.prof"]
    s = subprocess.run(
        [sys.executable, "-m", "benchmarks.profile_adds", str(prof)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert s.returncode == 0, s.stderr
    assert s.stdout.startswith("3 ranks, one add(b, 1) each; per add:"), s.stdout
    rows = {line.split("|")[1].strip(): line for line in s.stdout.splitlines() if line.startswith("| ")}
    # every add links its version (a delta's or a read-modify-write's) and lists its epoch at least once
    assert float(rows["link"].split("|")[2]) >= 1 and float(rows["listdir"].split("|")[2]) >= 1, s.stdout
    assert "folderstore.py" in s.stdout and "(_update)" in s.stdout, s.stdout
