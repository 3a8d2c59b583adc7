"""Small shared pieces of the rendezvous benchmark: names, layout of participants, addresses, statistics."""

from __future__ import annotations

import json
import math
import os
import resource
import socket
import sys
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BACKENDS = ("fsmingle", "fsmingle-v1", "torch-file", "torch-tcp")
MSG = "@@"  # prefix of worker protocol lines on stdout


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (not an error in the harness)."""


class RunError(RuntimeError):
    """One repetition failed (timeout, a participant's error, a worker that died)."""


def pct(xs: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no data."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def participant_addr(p: int) -> str:
    """A distinct loopback address per participant (all of 127/8 is loopback on Linux)."""
    return f"127.{1 + p // 62500}.{(p // 250) % 250}.{p % 250 + 1}"


def layout(n: int, max_procs: int) -> list[list[int]]:
    """Participants per process: the last participant always gets its own process; the N-1
    early ones are spread round-robin over at most ``max_procs - 1`` processes (as threads).

    Raises:
        ValueError: ``n < 2``.
    """
    if n < 2:
        raise ValueError("N must be >= 2")
    procs = max(1, min(n - 1, max_procs - 1))
    groups: list[list[int]] = [[] for _ in range(procs)]
    for p in range(n - 1):
        groups[p % procs].append(p)
    groups.append([n - 1])
    return groups


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (rank 0 holds one socket per member,
    every member one socket and one epoll descriptor); returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard_eff = 1 << 20
    else:
        hard_eff = hard
    if soft != resource.RLIM_INFINITY and soft < hard_eff:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard_eff, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def load_config(cfg_path: str) -> tuple[dict, float, tuple[int, int]]:
    """A worker process's start: its configuration file (never argv: thousands of participants'
    settings overflow the kernel's argument limit), the monotonic time it started at, and the
    open-file limit raised before anything opens a socket (:func:`raise_nofile`)."""
    t0 = time.monotonic()
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    return cfg, t0, raise_nofile()


def emit_ready(emit: Callable[..., None], t0: float, nofile: tuple[int, int], **extra) -> None:
    """Say ``ready`` once the worker's backend is built: what it imported, in how long, whether
    torch came with it, its open-file limit, and ``extra`` fields."""
    emit(
        ev="ready",
        pid=os.getpid(),
        import_s=time.monotonic() - t0,
        torch_imported="torch" in sys.modules,
        nofile=list(nofile),
        **extra,
    )


def mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
