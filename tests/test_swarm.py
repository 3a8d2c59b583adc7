"""The swarm benchmark (``python -m benchmarks.swarm``, issue 31): many real participants per
process, one scheduler, the real directory and real sockets -- a smoke run, and what it found
in rank 0's channel (a scan of every connection at every poll)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fsmingle.net.channel import Hub, TcpTransport

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _swarm(tmp_path, out, *args: str) -> dict:
    """``python -m benchmarks.swarm`` with ``args`` on ``tmp_path``, results in ``out``: its one run."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-m", "benchmarks.swarm", *args, "--settle", "2", "--timeout", "60"]
    argv += ["--root", str(tmp_path), "--out", str(out)]
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((out / "results.json").read_text())["runs"][0]


def test_swarm_smoke_last_arrival_and_a_killed_member(tmp_path):
    """256 participants in 4 processes released as one world; 64 with a member killed after its
    claim regroup in a later generation with it restarted."""
    out = tmp_path / "out"
    run = _swarm(tmp_path, out, "--n", "256")
    assert run["valid"] and run["n"] == 256 and run["generations"] == [1]
    assert run["procs"] == 4 and run["sources"] == "own"
    assert 0 < run["last_all_s"] < 60 and run["rank0_cpu_us_per_member"] > 0
    assert 20 < run["ops"]["fs_ops_mean"] < 60  # the real PosixStore, counted as the thread harness counts
    assert "| 256 | last |" in (out / "results.md").read_text()
    run = _swarm(tmp_path, out, "--n", "64", "--scenario", "storm")
    assert run["valid"] and run["killed"]["gen"] == 1 and run["generations"][0] >= 2
    assert run["kill_to_all_s"] > 0


def test_hub_scans_for_quiet_connections_a_few_times_a_ping_interval_not_at_every_poll():
    """Rank 0 polls at every step, and steps at every message while members join: a scan of every
    connection at each poll made gathering N members O(N^2) (the swarm at N = 2,048: the largest
    part of rank 0's CPU)."""
    now = [100.0]
    hub = Hub("127.0.0.1", 0, clock=lambda: now[0], ping_interval=1.0)
    links = [
        TcpTransport(clock=lambda: now[0], ping_interval=1.0).connect("127.0.0.1", hub.port, 2.0)[1] for _ in range(3)
    ]
    scans = []
    real = hub._ping_quiet
    hub._ping_quiet = lambda conns: (scans.append(now[0]), real(conns))
    try:
        for _ in range(200):
            hub.poll(0.001)
        assert hub.open_connections() == 3
        assert len(scans) == 1  # the clock stood still: one scan
        for _ in range(40):
            now[0] += 0.1
            hub.poll(0)
        assert 12 <= len(scans) <= 17  # 4 s: about four scans a second
        assert all(link.poll(0.05) == [] and not link.lost for link in links)  # pings arrive, consumed
        assert max(link.silent_for() for link in links) < 1.3
    finally:
        for link in links:
            link.close()
        hub.close()
