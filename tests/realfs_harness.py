"""The participants of the real-filesystem tests (``test_realfs.py``, ``test_realfs_juicefs.py``): :func:`start`
runs ``fsmingle env`` (or ``run -- cmd``) on a cluster host as a :class:`Part`, :func:`wait` waits for them,
:func:`oracle` checks every run's invariants (``test_realfs.py`` lists them), :func:`dump` says what each did and
:func:`wait_claimed` waits until ``fsmingle status`` counts the live ones.

A cluster ``c`` here is a ``cluster.Cluster`` with ``c.rdzv`` (the rendezvous directory on its filesystem) and
``c.logs`` (a directory for the participants' logs) set by the test module's fixture.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers import host_env

try:
    import cluster as cl
except ImportError:  # tests/ imported as a package
    from tests import cluster as cl

REPO = Path(__file__).resolve().parents[1]
FSM = [sys.executable, "-m", "fsmingle"]
STALE = "8"  # --stale-after: small, so that dead nodes are noticed within a test's time
SLACK = 15.0  # seconds a failing participant may take beyond its --timeout (interpreter start, loaded CI)

ENV = host_env()  # helpers' one scrub: no launcher/scheduler variable of the test process reaches a host
RELEASED = re.compile(r"released: master (\S+):(\d+), node rank (\d+)/(\d+), generation (\d+)")


@dataclass
class Part:
    """One participant (:func:`start`): its host, process, log file, ``--timeout`` and start (monotonic) and wall
    limit in seconds; :meth:`wait` fills in its exit code, output and seconds taken."""

    host: cl.Host
    proc: subprocess.Popen
    log: Path
    timeout: float
    t0: float
    wall: float = 0.0
    rc: int | None = None
    out: str = ""
    elapsed: float = 0.0

    def wait(self, limit: float) -> Part:
        """Wait up to ``limit`` seconds (at least 1), then SIGKILL its process group; read its output."""
        try:
            self.proc.wait(timeout=max(1.0, limit))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.rc = self.proc.returncode
        self.elapsed = time.monotonic() - self.t0
        self.out = self.log.read_text(errors="replace")
        return self

    @property
    def released(self) -> dict | None:
        """``{"master", "port", "rank", "nnodes", "generation"}`` from the release line or env JSON."""
        m = RELEASED.search(self.out)
        if m:
            return {"master": m[1], "port": int(m[2]), "rank": int(m[3]), "nnodes": int(m[4]), "generation": int(m[5])}
        for line in self.out.splitlines():
            if line.startswith("{") and '"master_addr"' in line:
                d = json.loads(line)
                return {
                    "master": d["master_addr"],
                    "port": d["master_port"],
                    "rank": d["node_rank"],
                    "nnodes": d["nnodes"],
                    "generation": d["generation"],
                }
        return None


def start(
    c, k: int, job: str, nnodes: int, timeout: float = 60, tag: str = "", cmd=None, wall: float | None = None
) -> Part:
    """Start ``fsmingle env`` (or ``run -- cmd``) on host ``k``; ``wall``: seconds before the
    whole command is killed (default ``timeout + 60``; longer for training)."""
    h = c[k]
    argv = [
        "fsmingle",
        "run" if cmd else "env",
        "--dir",
        c.rdzv,
        "--job-id",
        job,
        "--nnodes",
        str(nnodes),
        "--timeout",
        f"{timeout:g}",
        "--stale-after",
        STALE,
    ]
    argv += ["--", *cmd] if cmd else ["--format", "json"]
    log = c.logs / f"{job}{tag}-{h.name}.log"
    with open(log, "w") as f:
        p = h.popen(
            ["timeout", "-k", "5", f"{wall or timeout + 60:g}", *argv],
            env=ENV,
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    return Part(h, p, log, timeout, time.monotonic(), wall=wall or timeout + 60)


def wait(parts: list[Part]) -> list[Part]:
    """Wait for each participant until its wall limit (plus 10 s) has passed."""
    for p in parts:
        p.wait(p.t0 + p.wall + 10 - time.monotonic())
    return parts


def dump(parts: list[Part]) -> str:
    """Every participant's exit and output tail, then the filesystem's own logs (a client that
    failed under a node says why only there)."""
    out = [
        f"===== {p.host.name} rc={p.rc} after {p.elapsed:.1f}s (timeout {p.timeout:g})\n{p.out[-2500:]}" for p in parts
    ]
    return "\n".join(out) + (parts[0].host.cluster.fs_backend.diagnostics() if parts else "")


def oracle(c, parts: list[Part], nnodes: int, expect_released: list[Part] | None = None, what: str = "") -> dict:
    """The invariants of every run (``test_realfs.py``'s docstring).  Returns the agreed release."""
    rel = [p for p in parts if p.rc == 0]
    info = (f"[{c.fs}] {what}\n" if what else f"[{c.fs}]\n") + dump(parts)
    if expect_released is not None:
        assert sorted(p.host.name for p in rel) == sorted(p.host.name for p in expect_released), info
    views = [p.released for p in rel]
    assert all(views), "a participant exited 0 without a release line\n" + info
    agreed = {(v["master"], v["port"], v["generation"]) for v in views}
    assert len(agreed) == 1, f"released participants disagree: {agreed}\n{info}"
    ranks = sorted(v["rank"] for v in views)
    assert ranks == list(range(nnodes)), (
        f"node ranks {ranks} are not a permutation of 0..{nnodes - 1} (a dead "
        f"or missing member in the released world)\n{info}"
    )
    assert {v["nnodes"] for v in views} == {nnodes}, info
    rank0 = next(p for p, v in zip(rel, views) if v["rank"] == 0)
    assert views[0]["master"] == rank0.host.ip, (
        f"master {views[0]['master']} is not rank 0's host {rank0.host.ip}\n{info}"
    )
    for p in parts:
        if p.rc not in (0, None):
            assert p.elapsed < p.timeout + SLACK, f"{p.host.name} failed only after {p.elapsed:.1f}s\n{info}"
    return views[0]


def assert_named_failure(p: Part) -> None:
    assert p.rc not in (0, None)
    assert p.elapsed < p.timeout + SLACK, dump([p])
    assert "missing" in p.out.lower(), "the failure does not name what is missing:\n" + dump([p])


def wait_claimed(c, job: str, n: int, limit: float = 30.0) -> None:
    """Until ``fsmingle status`` (test process, its own client) counts ``n`` live participants."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        p = subprocess.run(
            [*FSM, "status", job, "--dir", c.rdzv, "--json", "--stale-after", STALE],
            capture_output=True,
            text=True,
            timeout=30,
        )
        try:
            d = json.loads(p.stdout)
            d = d[0] if isinstance(d, list) else d
            present = d.get("present", d.get("participants"))
            count = len(present) if isinstance(present, (list, dict)) else present
            if isinstance(count, int) and count >= n:
                return
        except (ValueError, KeyError, IndexError, AttributeError, TypeError):
            pass
        time.sleep(0.5)
    # Not fatal: the scenario stays valid (a node killed before it claimed is a no-show); the
    # test's oracle decides.  Give the participants a moment more, as a user would.
    time.sleep(2)
