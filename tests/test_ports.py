"""Issue 24: master ports outside the kernel's ephemeral range, fresh for every listener, and
(torchrun backend) the held socket handed to torch's TCPStore, so nothing can take the port in
between."""

from __future__ import annotations

import random
import socket
import sys
import threading
import time

import pytest
from helpers import results

from fsmingle.net import ports
from fsmingle.net.channel import Hub


def _outside(port: int) -> bool:
    lo, hi = ports.ephemeral_range()
    return not lo <= port <= hi


def test_candidates_are_outside_the_ephemeral_range():
    rng = random.Random(1)
    assert ports.outside_ranges((32768, 60999)) == [(20000, 32767), (61000, 65535)]
    assert ports.outside_ranges((1024, 65535)) == []
    assert ports.candidates(eph=(1024, 65535)) == []
    c = ports.candidates(500, eph=(32768, 60999), rng=rng)
    assert len(set(c)) == 500 and all(20000 <= p < 32768 or 61000 <= p <= 65535 for p in c)
    assert ports.ephemeral_range("/nonexistent") == (32768, 60999)


def test_hub_holds_a_fresh_port_outside_the_range_each_time():
    hubs = [Hub("127.0.0.1", 0) for _ in range(5)]
    try:
        got = [h.port for h in hubs]
        assert all(_outside(p) for p in got), got
        assert len(set(got)) == 5
    finally:
        for h in hubs:
            h.close()


def test_torch_takes_the_held_socket():
    torch_dist = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    s = ports.listener(socket.AF_INET)
    port = s.getsockname()[1]
    assert _outside(port)
    store = torch_dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=s.detach(), timeout=timedelta(5)
    )
    client = torch_dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
    client.set("k", "v")
    assert store.port == port and store.get("k") == b"v"


BIND_LATE = (
    "import os, socket, time, json; time.sleep(0.3); s = socket.socket(); "
    "s.bind(('', int(os.environ['MASTER_PORT']))); s.listen(); "  # as torch's TCPStore binds it
    "print(json.dumps({'port': int(os.environ['MASTER_PORT'])}))"
)


def test_two_jobs_rank0_on_one_host_in_a_tight_loop(procs, d):
    """Two jobs' rank 0s on one host, started together, ten times in a row, while another process
    takes ephemeral ports as fast as it can (bind(0)): each exec'd command binds MASTER_PORT
    0.3 s after fsmingle let it go, as torch would; none may find it taken."""
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            held = []
            for _ in range(200):
                s = socket.socket()
                s.bind(("", 0))
                held.append(s)
            time.sleep(0.01)
            for s in held:
                s.close()

    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    seen = []
    try:
        for i in range(10):
            ps = [
                procs.env(d, f"tight{i}{j}", "--nnodes", 1, "--", sys.executable, "-c", BIND_LATE, cmd="run")
                for j in "ab"
            ]
            res = results(ps, timeout=60)
            seen += [r["port"] for r in res]
    finally:
        stop.set()
        t.join()
    assert len(seen) == 20 and all(_outside(p) for p in seen), seen
    assert len(set(seen)) == 20, seen  # a fresh port every time
