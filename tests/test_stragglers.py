"""Who was slow: ``fsmingle status JOB`` shows each member's arrival; ``--timeline`` and ``--plot`` draw them.

A real job: three ``fsmingle env`` processes started a second and a half apart
(first-come ranks, so rank order is arrival order), then ``fsmingle status``
as a user would run it afterwards.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers import REPO, Procs, clean_env, run_cli

STAGGER = 1.5  # seconds between starts


def _fsmingle(*args, env=None):
    return run_cli(*args, env=env, timeout=120)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A job released to three members that arrived STAGGER seconds apart: (rdzv dir, env)."""
    rdzv = tmp_path_factory.mktemp("slow") / "rdzv"
    rdzv.mkdir(mode=0o700)
    procs = Procs(tmp_path_factory.mktemp("logs"))
    try:
        ps = []
        for _ in range(3):
            ps.append(procs.env(rdzv, "slow", "--nnodes", 3, timeout=60, stale_after=None, addr=None, fmt=None))
            time.sleep(STAGGER)
        for p in ps:
            assert p.wait(90) == 0, p.stderr()
    finally:
        procs.cleanup()
    return rdzv, clean_env()


def test_status_lists_each_members_arrival_host_and_address(released):
    rdzv, env = released
    cp = _fsmingle("status", "--dir", str(rdzv), "slow", "--json", env=env)
    assert cp.returncode == 0, cp.stderr
    world = json.loads(cp.stdout)["release"]["world"]
    assert [m["rank"] for m in world] == [0, 1, 2]
    arrivals = [m["arrival"] for m in world]
    assert arrivals[0] == 0.0 and arrivals[0] < arrivals[1] < arrivals[2], arrivals  # rank order = arrival order
    assert all(m["host"] and m["addr"] for m in world)
    table = _fsmingle("status", "--dir", str(rdzv), "slow", env=env)
    assert table.returncode == 0, table.stderr
    assert "arrivals (seconds after the first" in table.stdout
    for m in world:
        assert f"+{m['arrival']:.2f} s" in table.stdout


def test_timeline_draws_the_slowest_last(released):
    rdzv, env = released
    cp = _fsmingle("status", "--dir", str(rdzv), "slow", "--timeline", env={**env, "COLUMNS": "120"})
    assert cp.returncode == 0, cp.stderr
    rows = [line for line in cp.stdout.splitlines() if "●" in line]
    assert len(rows) == 3, cp.stdout
    # first arrival at the axis start, later ones further right, the last at the end
    positions = [line.index("●") for line in rows]
    assert positions[0] < positions[1] < positions[2], cp.stdout
    assert "─" not in rows[0].split("●")[0] and "─" in rows[2]


def test_plot_writes_a_png(released, tmp_path):
    rdzv, env = released
    png = tmp_path / "arrivals.png"
    cp = _fsmingle("status", "--dir", str(rdzv), "slow", "--plot", str(png), env=env)
    assert cp.returncode == 0, cp.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in cp.stderr


def test_plot_errors_are_one_clear_line(released, tmp_path):
    rdzv, env = released
    cp = _fsmingle("status", "--dir", str(rdzv), "slow", "--plot", str(tmp_path / "a.svg"), env=env)
    assert cp.returncode == 3 and "ending in .png" in cp.stderr, cp.stderr
    cp = _fsmingle("status", "--dir", str(rdzv), "--plot", str(tmp_path / "a.png"), env=env)
    assert cp.returncode == 3 and "give its JOB_ID" in cp.stderr, cp.stderr
    # matplotlib missing: a stub that fails to import stands first on the path
    stub = tmp_path / "nompl" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('not installed here')\n")
    cp = _fsmingle(
        "status",
        "--dir",
        str(rdzv),
        "slow",
        "--plot",
        str(tmp_path / "a.png"),
        env={**env, "PYTHONPATH": f"{stub.parent}{os.pathsep}{REPO}"},
    )
    assert cp.returncode == 3, cp.stderr
    assert cp.stderr.strip().splitlines()[-1] == (
        "fsmingle: error: --plot needs matplotlib, which is not installed: pip install 'fsmingle[plot]'"
    )
    assert not (tmp_path / "a.png").exists()


def test_a_big_world_is_read_from_its_member_chunks(tmp_path):
    """Over MEMBERS_PER_CHUNK members, release.json names chunk files; status reads the members from them."""
    from fsmingle.fs.chunks import encode_release
    from fsmingle.fs.layout import gen_name, member_chunk_name, release_name
    from fsmingle.fs.records import MEMBERS_PER_CHUNK, HostId, Member, Release

    n = MEMBERS_PER_CHUNK + 5
    writer = "ab" * 8
    members = tuple(
        Member(
            k,
            f"{k:016x}",
            f"10.1.{k // 250}.{k % 250 + 1}",
            HostId(f"node{k}", "boot", "pid:[1]", 1000 + k, 1.0),
            arrival=k / 100,
        )
        for k in range(n)
    )
    rel = Release("big", 1, "released", "node", n, "10.1.0.1", 29500, members, writer, wall_time=time.time())
    header, chunks = encode_release(rel)
    assert len(chunks) == 2
    job = tmp_path / "rdzv" / "big"
    (job / gen_name(1)).mkdir(parents=True)
    os.chmod(tmp_path / "rdzv", 0o700)
    os.chmod(job, 0o700)
    for k, c in enumerate(chunks):
        (job / member_chunk_name(1, writer, k)).write_bytes(c)
    (job / release_name(1)).write_bytes(header)
    cp = _fsmingle("status", "--dir", str(tmp_path / "rdzv"), "big", "--json")
    assert cp.returncode == 0, cp.stderr
    world = json.loads(cp.stdout)["release"]["world"]
    assert len(world) == n and world[-1] == {
        "rank": n - 1,
        "host": f"node{n - 1}",
        "addr": members[-1].addr,
        "arrival": round((n - 1) / 100, 3),
    }
