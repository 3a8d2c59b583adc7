"""JuiceFS's own failures under a running rendezvous (issue 32, item 3), and its harness's teardown.

A JuiceFS volume has two parts a node depends on besides the network: the host's client (one
``juicefs mount`` process per host: its death is the host's mount dying while the node's
processes live on) and the metadata engine (one redis-server for the whole cluster).  The
scenarios of tests/test_realfs.py run on JuiceFS too; these are the ones only JuiceFS has:

* a host's client killed (SIGKILL, no supervisor to restart it): that host's calls fail at once
  with ENOTCONN; its participant must fail at once, naming the directory, and the others must
  carry on without it (a replacement from another host is let in);
* Redis restarted (SIGKILL, then started again from its append-only file) under waiting
  participants: every metadata call blocks until Redis is back, then goes on; the rendezvous
  completes with every participant, none judged dead;
* the cluster's teardown leaves nothing: no client, no Redis, no mount, no /var/jfsCache.

Run only these: ``python -m pytest tests/test_realfs_juicefs.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from realfs_harness import dump, oracle, start, wait, wait_claimed

from fsmingle.errors import StorageError

try:
    import cluster as cl
except ImportError:  # tests/ imported as a package
    from tests import cluster as cl

pytestmark = [pytest.mark.root, pytest.mark.realfs]


@pytest.fixture(scope="module")
def jc():
    """A 4-host JuiceFS cluster (the client's default caches) shared by this module's tests."""
    cl.require_capabilities(fs="juicefs")
    with cl.Cluster(4, fs="juicefs") as c:
        c.rdzv = os.path.join(c.shared, "rdzv")
        os.chmod(c.rdzv, 0o700)
        c.logs = c.workdir / "logs"
        c.logs.mkdir()
        yield c


@pytest.fixture
def fresh(jc):
    yield jc
    for h in jc:
        h.ensure_mount()  # a killed client's mount fails the probe at once (ENOTCONN): replaced
        h.kill_all()


# What a call on a host whose client was killed can get (os.strerror): ENOTCONN after the kill,
# ECONNABORTED for a call in flight (fuse_abort_conn), ETIMEDOUT answered by the client before it
# died, to a call that waited on Redis; EIO answered by the client to a call whose Redis requests
# failed (CI, stop 41: node1's client could not dial Redis for ~25 s before the kill -- the test
# bridge's MAC had changed under it, tests/cluster/core.py -- and its open of --dir got
# "Input/output error").
DEAD_CLIENT = (
    "Transport endpoint is not connected",
    "Software caused connection abort",
    "Connection timed out",
    "Input/output error",
)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_killed_client_fails_its_node_at_once_and_the_others_go_on(fresh):
    c = fresh
    # node1 first: it is rank 0, the coordinator, whose loss the others must also get over
    b = start(c, 1, "kcl", 3, timeout=90)
    wait_claimed(c, "kcl", 1, limit=60)
    a = start(c, 0, "kcl", 3, timeout=90)
    wait_claimed(c, "kcl", 2, limit=60)
    (pid,) = c[1].fuse_pids
    os.kill(pid, signal.SIGKILL)  # JFS_SUPERVISOR=1: nothing restarts it, as after a crash
    t0 = time.monotonic()
    r = c[1].sh(f"stat {c.shared}", timeout=20)
    assert r.returncode != 0 and "Transport endpoint is not connected" in r.stderr, r
    b.wait(30)
    took = time.monotonic() - t0
    # its node: fails at once (not after --timeout) with fsmingle's one line -- the storage exit
    # code, the errno, the directory and what to do -- not a traceback
    assert b.rc == StorageError.exit_code and b.released is None, dump([b])
    assert took < 20, f"node1 took {took:.1f}s to notice its mount died\n" + dump([b])
    assert "Traceback" not in b.out, dump([b])
    line = next((x for x in b.out.splitlines() if x.startswith("fsmingle: error: ")), b.out[-3000:])
    # The directory is the job's, or --dir itself when node1 had not opened the job directory yet
    # (wait_claimed gives up after 30 s, not fatally); the errno is the dead client's: ENOTCONN
    # for a call made after the kill, ECONNABORTED for one the kernel aborted in flight, or
    # ETIMEDOUT that the client itself answered a call waiting on a slow Redis (CI, stop 36: a
    # node1 still opening --dir under load printed "cannot open the rendezvous directory .../rdzv:
    # Connection timed out").  Each is the one line a user must get; a traceback or a wait is not.
    why = line + dump([b])
    assert f"{c.rdzv}: " in line or f"{c.rdzv}/kcl" in line, why
    assert any(e in line for e in DEAD_CLIENT), why
    assert line.endswith("check the shared mount on this node"), why
    # a node started on that host now fails on its first call, the stat of --dir, the same way
    # (a raw traceback and exit 1 before: CI, stop 35, met it as ETIMEDOUT)
    n = start(c, 1, "kcl-late", 2, timeout=30).wait(60)
    assert n.rc == StorageError.exit_code and "Traceback" not in n.out, dump([n])
    assert f"cannot open the rendezvous directory {c.rdzv}: " in n.out, dump([n])
    assert any(e in n.out for e in DEAD_CLIENT), dump([n])
    # the others: node1's beacon stops, it is judged dead; two late nodes complete the world
    late = [start(c, 2, "kcl", 3, timeout=90), start(c, 3, "kcl", 3, timeout=90)]
    parts = wait([a, *late])
    oracle(c, [*parts, b], 3, expect_released=parts)
    # and the host works again with a new client
    c[1].fuse_abort()
    c[1].remount()
    assert c[1].sh(f"ls {c.rdzv}/kcl", timeout=20, check=True).stdout.strip()


def test_a_client_that_does_not_answer_is_replaced_between_tests(fresh):
    """The harness's own promise (``fresh``): every test starts on hosts whose clients answer.
    CI (stop 35) handed a test two hosts whose fresh clients answered their first lookup with
    ETIMEDOUT after 150 s.  A stopped client hangs every call the same way; ``ensure_mount``
    must notice within its probe time and leave a new client that creates files."""
    c = fresh
    h = c[1]
    (old,) = h.fuse_pids
    os.kill(old, signal.SIGSTOP)  # every call on the mount now waits, as on a client that lost Redis
    t0 = time.monotonic()
    h.ensure_mount(probe_s=3)
    took = time.monotonic() - t0
    assert h.fuse_pids and h.fuse_pids != [old] and not _alive(old), h.fuse_pids
    assert c.fs_backend.answers(h.mountpoint, 20), "the new client does not answer"
    assert took < 60, f"replacing a stopped client took {took:.1f} s"


def test_redis_restart_under_waiting_participants(fresh):
    c = fresh
    first = [start(c, k, "redis", 4, timeout=120) for k in range(3)]
    wait_claimed(c, "redis", 3)
    t0 = time.monotonic()
    c.fs_backend.restart_meta(down=3.0)  # SIGKILL; its append-only file brings the volume back
    # every host's mount answers again, through its own client
    for h in c:
        h.sh(f"ls {c.rdzv}/redis", timeout=60, check=True)
    back = time.monotonic() - t0
    parts = wait([*first, start(c, 3, "redis", 4, timeout=120)])
    oracle(c, parts, 4, expect_released=parts, what=f"Redis down 3 s; mounts answered {back:.1f} s after the kill")


def test_teardown_leaves_no_client_redis_mount_or_cache(tmp_path):
    cl.require_capabilities(fs="juicefs")
    before = {p: os.path.exists(p) for p in ("/var/jfsCache", "/var/log/juicefs.log")}
    c = cl.Cluster(2, fs="juicefs-cached").start()
    try:
        clients = [p.pid for p in c.fs_backend.clients.values()]
        redis = c.fs_backend._redis.pid
        assert len(clients) == 3 and all(map(_alive, clients)) and _alive(redis)
        c[0].sh(f"echo x > {c.shared}/f", check=True, timeout=20)
        # A mount namespace made while the mounts exist keeps copies of them (/ is private here):
        # the clients would go on serving those after a plain umount.
        holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
        time.sleep(0.3)
    finally:
        c.close()
    try:
        assert not [p for p in clients if _alive(p)], "a juicefs client outlived the cluster"
        assert not _alive(redis)
        assert not cl._mounts_under(str(c.workdir)) and not c.workdir.exists()
        for p, was in before.items():
            assert os.path.exists(p) == was, f"{p} left behind"
    finally:
        holder.kill()
        holder.wait()
