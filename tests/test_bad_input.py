"""Bad input to the real CLI: documented exit code, a message saying what is wrong and what to do, and
nothing left behind that breaks the next, correct attempt in the same directory and job.

Permission cases run the CLI as root *without* CAP_DAC_OVERRIDE & co.
(``setpriv --bounding-set=-dac_override,...``): root ignores mode bits, and
``nobody`` cannot run the interpreter (it lives under ``/root``, mode 0700).
Mounts (read-only bind, tiny tmpfs) are undone in finalizers.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import (
    Procs,
    assert_one_world,
    clean_env,
    gen_dir,
    have,
    make_gen_dir,
    release_of,
    results,
    umount,
    unprivileged_prefix,
    wait_claimed,
    wait_for,
)

JOB = "job1"
NOBODY = 65534


class Ctx:
    """Per-case state: the rendezvous dir, the job id, things to undo."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.d = tmp / "rdv"
        self.job = JOB
        self.mounts: list[Path] = []
        self.sockets: list[socket.socket] = []
        self.extra_env: dict = {}

    def mount(self, *argv) -> None:
        subprocess.run(list(argv), check=True, capture_output=True, timeout=20)
        self.mounts.append(Path(argv[-1]))

    def undo(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets.clear()
        for m in reversed(self.mounts):
            umount(m)
        self.mounts.clear()


def args(
    ctx: Ctx, *extra, nnodes=2, rank=0, addr="127.0.0.1", job=None, dir=None, fmt="json", timeout=5, stale=2, cmd="env"
) -> list:
    """``fsmingle env`` argv with sane defaults; pass a keyword as None to leave its option out."""
    a = [cmd]
    for opt, v in (
        ("--dir", dir if dir is not None else ctx.d),
        ("--job-id", job if job is not None else ctx.job),
        ("--nnodes", nnodes),
        ("--node-rank", rank),
        ("--addr", addr),
        ("--timeout", timeout),
        ("--stale-after", stale),
    ):
        if v is not None:
            a += [opt, v]
    if fmt is not None and cmd == "env":
        a += ["--format", fmt]
    return [str(x) for x in a + list(extra)]


@dataclass
class Case:
    id: str
    argv: Callable[[Ctx], list]
    rc: int
    words: tuple[str, ...]  # all must appear in stderr (what is wrong AND what to do)
    setup: Callable[[Ctx], None] = lambda ctx: None
    fix: Callable[[Ctx], None] = lambda ctx: None  # what the user does after reading the message
    unprivileged: bool = False
    env: dict = field(default_factory=dict)
    followup_job: str | None = None  # job id of the correct attempt (default: the same job)
    needs: tuple[str, ...] = ()  # tools
    dir_exists: bool = True  # --dir is created (0700) before setup: it must exist, see "dir-missing"
    at_start: bool = True  # refused before waiting: stderr is exactly one line, the error


# ---------------------------------------------------------------- setups and fixes


def _mkdir(p: Path, mode=0o700) -> None:
    p.mkdir(parents=True, exist_ok=True)
    os.chmod(p, mode)


def _file(p: Path, data="x") -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data)


def _readonly(ctx: Ctx) -> None:
    backing = ctx.tmp / "backing"
    _mkdir(backing)
    _mkdir(ctx.d)
    ctx.mount("mount", "--bind", str(backing), str(ctx.d))
    ctx.mount("mount", "-o", "remount,bind,ro", str(ctx.d))


def _full(ctx: Ctx) -> None:
    _mkdir(ctx.d)
    ctx.mount("mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(ctx.d))
    fd = os.open(ctx.d / ".filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    assert os.statvfs(ctx.d).f_bavail == 0


def _unfill(ctx: Ctx) -> None:
    os.unlink(ctx.d / ".filler")


def _busy_port(ctx: Ctx) -> None:
    s = socket.socket()
    s.bind(("", 0))
    s.listen(1)
    ctx.sockets.append(s)
    ctx.port = s.getsockname()[1]


def _not_executable(ctx: Ctx) -> None:
    p = ctx.tmp / "script.sh"
    p.write_text("#!/bin/sh\necho hi\n")
    os.chmod(p, 0o644)


CASES = [
    # ---- the directory
    Case(
        "dir-parent-missing",
        lambda c: args(c, dir=c.tmp / "nomount" / "rdv"),
        5,
        ("parent", "does not exist", "mounted"),
        fix=lambda c: _mkdir(c.tmp / "nomount"),
    ),
    Case("dir-missing", lambda c: args(c), 5, ("does not exist", "mkdir -m 700", "typo"), dir_exists=False),
    Case(
        "dir-is-a-file",
        lambda c: args(c),
        5,
        ("is not a directory", "point --dir at a directory"),
        setup=lambda c: _file(c.d),
        fix=lambda c: c.d.unlink(),
        dir_exists=False,
    ),
    Case(
        "dir-unwritable",
        lambda c: args(c),
        5,
        ("permission denied", "use a directory you can write"),
        setup=lambda c: _mkdir(c.d, 0o500),
        fix=lambda c: os.chmod(c.d, 0o700),
        unprivileged=True,
        needs=("setpriv",),
    ),
    Case(
        "job-dir-unwritable",
        lambda c: args(c),
        5,
        ("permission denied", "use a directory you can write"),
        setup=lambda c: (_mkdir(c.d), _mkdir(c.d / JOB, 0o500)),
        fix=lambda c: os.chmod(c.d / JOB, 0o700),
        unprivileged=True,
        needs=("setpriv",),
    ),
    Case(
        "read-only-fs",
        lambda c: args(c),
        5,
        ("read-only", "writable"),
        setup=_readonly,
        fix=lambda c: c.undo(),
        needs=("mount",),
    ),
    Case("full-fs", lambda c: args(c), 5, ("full", "free space"), setup=_full, fix=_unfill, needs=("mount",)),
    Case(
        "dir-world-writable-no-sticky",
        lambda c: args(c),
        4,
        ("world-writable", "sticky", "chmod +t"),
        setup=lambda c: _mkdir(c.d, 0o777),
        fix=lambda c: os.chmod(c.d, 0o1777),
    ),
    Case(
        "dir-group-writable-no-sticky",
        lambda c: args(c),
        4,
        ("group-writable without the sticky bit", "chmod g-w", "chmod +t"),
        setup=lambda c: _mkdir(c.d, 0o770),
        fix=lambda c: os.chmod(c.d, 0o700),
    ),
    Case(
        "job-dir-group-writable",
        lambda c: args(c),
        4,
        ("group- or world-writable", "chmod go-w"),
        setup=lambda c: (_mkdir(c.d), _mkdir(c.d / JOB, 0o770)),
        fix=lambda c: os.chmod(c.d / JOB, 0o700),
    ),
    Case(
        "job-dir-foreign-owner",
        lambda c: args(c),
        4,
        ("owned by uid 65534", "choose another --job-id"),
        setup=lambda c: (_mkdir(c.d), _mkdir(c.d / JOB), os.chown(c.d / JOB, NOBODY, NOBODY)),
        fix=lambda c: os.chown(c.d / JOB, 0, 0),
    ),
    Case(
        "job-dir-symlink",
        lambda c: args(c),
        4,
        ("symlink", "Remove it"),
        setup=lambda c: (_mkdir(c.d), _mkdir(c.tmp / "elsewhere"), os.symlink(c.tmp / "elsewhere", c.d / JOB)),
        fix=lambda c: os.unlink(c.d / JOB),
    ),
    Case(
        "job-dir-is-a-file",
        lambda c: args(c),
        4,
        ("not a directory", "remove it"),
        setup=lambda c: (_mkdir(c.d), _file(c.d / JOB)),
        fix=lambda c: os.unlink(c.d / JOB),
    ),
    Case("no-dir", lambda c: args(c, dir=""), 3, ("no rendezvous directory", "--dir", "FSMINGLE_DIR")),
    # ---- job ids
    Case(
        "job-id-dotdot-slash",
        lambda c: args(c, job="../x"),
        3,
        ("job id", "not allowed", "letters, digits"),
        followup_job="ok",
    ),
    Case("job-id-slash", lambda c: args(c, job="a/b"), 3, ("job id", "not allowed", "no '/'"), followup_job="ok"),
    Case("job-id-dotdot", lambda c: args(c, job=".."), 3, ("job id", "not allowed"), followup_job="ok"),
    Case(
        "job-id-control-char", lambda c: args(c, job="a\x01b"), 3, ("job id", "control characters"), followup_job="ok"
    ),
    Case("job-id-too-long", lambda c: args(c, job="j" * 200), 3, ("200 characters", "at most 128"), followup_job="ok"),
    Case("job-id-empty", lambda c: args(c, job=""), 3, ("no job id", "--job-id", "FSMINGLE_JOB_ID"), followup_job="ok"),
    # ---- sizes and ranks
    Case("nnodes-0", lambda c: args(c, nnodes=0, rank=None), 3, ("--nnodes is 0", "at least 1")),
    Case("nnodes-missing", lambda c: args(c, nnodes=None, rank=None), 3, ("how many participants", "--nnodes")),
    Case("rank-ge-nnodes", lambda c: args(c, rank=2), 3, ("--node-rank is 2", "0..1")),
    Case("rank-negative", lambda c: args(c, rank=-1), 3, ("--node-rank is -1", "0..1")),
    Case(
        "per-rank-rank-ge-world",
        lambda c: args(c, "--world-size", 2, "--rank", 5, nnodes=None, rank=None),
        3,
        ("--rank is 5", "0..1"),
    ),
    Case("nnodes-and-world-size", lambda c: args(c, "--world-size", 2, rank=None), 3, ("either", "not both")),
    Case(
        "slurm-nnodes-not-int",
        lambda c: args(c, nnodes=None, rank=None),
        3,
        ("SLURM_NNODES", "not an integer"),
        env={"SLURM_NNODES": "two"},
    ),
    Case(
        "pet-nnodes-elastic",
        lambda c: args(c, nnodes=None, rank=None),
        3,
        ("elastic", "--nnodes"),
        env={"PET_NNODES": "1:4"},
    ),
    # ---- network
    Case("port-0", lambda c: args(c, "--port", 0), 3, ("--port", "1..65535")),
    Case("port-70000", lambda c: args(c, "--port", 70000), 3, ("--port", "1..65535")),
    Case(
        "port-not-a-number",
        lambda c: args(c, "--port", "abc"),
        3,
        ("--port 'abc' is not a whole number", "give e.g. --port 29500"),
    ),
    Case(
        "nnodes-not-a-number",
        lambda c: args(c, nnodes="two", rank=None),
        3,
        ("--nnodes 'two' is not a whole number", "give e.g. --nnodes 2"),
    ),
    Case("timeout-not-a-number", lambda c: args(c, timeout="10m"), 3, ("--timeout '10m' is not a number",)),
    Case(
        "addr-not-local",
        lambda c: args(c, addr="10.9.9.9"),
        3,
        ("--addr 10.9.9.9 is not an address of this host", "127.0.0.1", "--addr-not-local"),
    ),
    Case(
        "port-busy",
        lambda c: args(c, "--port", c.port),
        3,
        ("already in use", "choose another --port"),
        setup=_busy_port,
        fix=lambda c: c.undo(),
        at_start=False,
    ),  # found when rank 0 is claimed
    Case(
        "iface-unknown",
        lambda c: args(c, "--iface", "nosuch0", addr=None),
        3,
        ("nosuch0", "no such interface", "--iface or --addr"),
    ),
    Case("addr-not-ip", lambda c: args(c, addr="node1.example.org"), 3, ("not an IP address", "give the IP")),
    # ---- timing and output
    Case("timeout-0", lambda c: args(c, timeout=0), 3, ("--timeout", "positive")),
    Case("timeout-negative", lambda c: args(c, timeout=-5), 3, ("--timeout", "positive")),
    Case("stale-after-0", lambda c: args(c, stale=0), 3, ("stale", "positive")),
    Case(
        "poll-max-not-below-stale-after",
        lambda c: args(c, "--poll-max", 2, stale=4),
        3,
        ("--poll-max 2", "--stale-after 4", "at most --stale-after/4 = 1 s"),
    ),
    Case("format-bad", lambda c: args(c, fmt="xml"), 3, ("--format", "choose sh, json, dotenv or hostfile")),
    # ---- the command line itself
    Case("misspelt-option", lambda c: args(c, "--nnode", 2, nnodes=None), 2, ("No such option", "--nnodes")),
    Case("run-without-command", lambda c: args(c, cmd="run"), 2, ("Missing argument", "COMMAND")),
    Case(
        "run-command-not-found",
        lambda c: args(c, "--", "no-such-command-xyz", cmd="run", nnodes=1, rank=None),
        127,
        ("command not found", "no-such-command-xyz"),
    ),
    Case(
        "run-command-not-executable",
        lambda c: args(c, "--", str(c.tmp / "script.sh"), cmd="run", nnodes=1, rank=None),
        126,
        ("not executable", "script.sh"),
        setup=_not_executable,
    ),
]


def _missing_tools(case: Case) -> list[str]:
    return have(*case.needs)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(procs, tmp_path, case):
    if os.geteuid() != 0 and (case.unprivileged or "mount" in case.needs or "owner" in case.id):
        pytest.skip(f"{case.id} needs root (mounts, chown, dropping capabilities)")
    if _missing_tools(case):
        pytest.skip(f"{case.id} needs {', '.join(_missing_tools(case))}")
    ctx = Ctx(tmp_path)
    try:
        if case.dir_exists and not case.id.startswith("job-id"):
            _mkdir(ctx.d)
        case.setup(ctx)
        argv = case.argv(ctx)
        env = clean_env(case.env)
        rc, out, err = procs.cli(
            *argv, env=env, prefix=unprivileged_prefix() if case.unprivileged else (), timeout=30, name="bad"
        )
        assert rc == case.rc, f"exit {rc}, expected {case.rc}; stderr:\n{err}"
        for w in case.words:
            assert w.lower() in err.lower(), f"{w!r} missing from the message:\n{err}"
        assert "Traceback" not in err, err
        if case.at_start and rc in (2, 3, 4, 5):
            assert [ln for ln in err.splitlines() if ln.strip()] == [err.strip()] and err.startswith(
                "fsmingle: error: "
            ), err
        if rc != 127 and rc != 126:
            assert out.strip() == "", f"nothing may be printed on stdout on failure: {out!r}"
        if case.id.startswith("job-id") or case.id == "dir-missing":
            # nothing was created anywhere for an invalid job id or a missing --dir
            assert not (tmp_path / "x").exists() and not ctx.d.exists(), os.listdir(tmp_path)
        # the user fixes what the message said; nothing left behind breaks the next, correct attempt
        case.fix(ctx)
        if not ctx.d.exists():
            _mkdir(ctx.d)  # --dir must exist (exit 5 otherwise, "dir-missing")
        job = case.followup_job or ctx.job
        ps = [procs.env(ctx.d, job, "--nnodes", 2, timeout=40, stale_after=2, name=f"next{i}") for i in range(2)]
        res = results(ps, timeout=40)
        w = assert_one_world(res, 2)
        assert w["master_addr"] == "127.0.0.1" and w["job_id"] == job
    finally:
        ctx.undo()


def test_table_is_big_enough():
    assert len(CASES) >= 20


# ---------------------------------------------------------------- messages that name the wrong option


def test_poll_max_zero_names_the_option(procs, tmp_path):
    ctx = Ctx(tmp_path)
    rc, _out, err = procs.cli(*args(ctx, "--poll-max", 0), timeout=30)
    assert rc == 3 and "--poll-max" in err, err


# ---------------------------------------------------------------- untrusted files planted in the job dir


def _valid_records(tmp_path):
    """A real released generation to take valid-looking records from (then tampered with)."""
    src = tmp_path / "src"
    src.mkdir(mode=0o700)
    p = Procs(tmp_path / "srclogs")
    try:
        results([p.env(src, "s", "--nnodes", 2, "--node-rank", r, timeout=30, stale_after=2) for r in (0, 1)], 30)
    finally:
        p.cleanup()
    g = gen_dir(src, "s", 1)
    claim = json.loads((g / "rank-00000.claim").read_text())
    beacon = json.loads((g / f"beacon-{claim['instance']}.json").read_text())
    release = json.loads((g / "release.json").read_text())
    return claim, beacon, release


def _evil(records, job):
    claim, beacon, release = (json.loads(json.dumps(r)) for r in records)
    for rec in (beacon, release):
        rec["job_id"] = job
    beacon["addr"] = release["master_addr"] = release["members"][0]["addr"] = "10.66.66.66"
    beacon["master_port"] = release["master_port"] = 6666
    return claim, beacon, release


def _write(path: Path, rec, owner=None) -> None:
    path.write_text(json.dumps(rec) if not isinstance(rec, str) else rec)
    os.chmod(path, 0o600)
    if owner is not None:
        os.chown(path, owner, owner)


@pytest.mark.parametrize("how", ["foreign-owned", "symlink"])
def test_untrusted_claim_and_beacon_are_never_used(procs, tmp_path, how):
    """A rank-0 claim + beacon naming 10.66.66.66 that are foreign-owned or symlinks: ignored, warned about."""
    if how == "foreign-owned" and os.geteuid() != 0:
        pytest.skip("chown needs root")
    d = tmp_path / "rdv"
    claim, beacon, _ = _evil(_valid_records(tmp_path), JOB)
    gd = make_gen_dir(d, JOB)
    if how == "foreign-owned":
        _write(gd / "rank-00000.claim", claim, owner=NOBODY)
        _write(gd / f"beacon-{claim['instance']}.json", beacon, owner=NOBODY)
        warn = "never trusted"
    else:
        _write(gd / "rank-00000.claim", claim)
        real = tmp_path / "planted-beacon.json"
        _write(real, beacon)
        os.symlink(real, gd / f"beacon-{claim['instance']}.json")
        warn = "symlink"
    ps = [procs.env(d, JOB, "--nnodes", 2, "--node-rank", r, timeout=40, stale_after=2, name=f"r{r}") for r in (0, 1)]
    res = results(ps, timeout=40)
    w = assert_one_world(res, 2)
    assert w["master_addr"] == "127.0.0.1" and w["master_port"] != 6666
    err = "".join(p.stderr() for p in ps)
    assert warn in err, err
    assert "10.66.66.66" not in json.dumps(release_of(d, JOB, w["generation"]))


@pytest.mark.parametrize("how", ["foreign-owned", "symlink"])
def test_untrusted_release_is_never_used_and_does_not_block(procs, tmp_path, how):
    if how == "foreign-owned" and os.geteuid() != 0:
        pytest.skip("chown needs root")
    d = tmp_path / "rdv"
    _, _, release = _evil(_valid_records(tmp_path), JOB)
    gd = make_gen_dir(d, JOB)
    if how == "foreign-owned":
        _write(gd / "release.json", release, owner=NOBODY)
    else:
        real = tmp_path / "planted-release.json"
        _write(real, release)
        os.symlink(real, gd / "release.json")
    ps = [procs.env(d, JOB, "--nnodes", 2, timeout=4, stale_after=1, name=f"p{i}") for i in range(2)]
    rcs = [p.wait(30) for p in ps]
    for p, rc in zip(ps, rcs):
        assert rc in (0, 8), f"{p.name} exited {rc}:\n{p.stderr()}"
        if rc == 0:
            assert json.loads(p.stdout())["master_addr"] == "127.0.0.1"
        else:
            assert "release.json" in p.stderr()


# ---------------------------------------------------------------- a release that goes bad while waiting


@pytest.mark.parametrize(
    "content",
    [
        '{"schema": 2, "kind": "release", "state": "relea',  # truncated JSON
        '{"schema": 99, "kind": "release", "state": "released"}',  # unknown schema version
        '{"schema": 2, "kind": "release", "state": "released", "job_id": "other"}',  # invalid fields
    ],
    ids=["truncated", "schema-99", "invalid-fields"],
)
def test_release_unusable_while_waiting_is_named_once_and_skipped(procs, tmp_path, content):
    """A decision record spoiled in the pending generation: named once, that generation skipped, the world completes.

    Protocol v2: an unusable decision still means "decided"; rank 0 lists it,
    warns once naming the file and why, tells its members, and everyone
    regroups in the next generation (no exit 8, no peer left alone).
    """
    d = tmp_path / "rdv"
    d.mkdir(mode=0o700)
    p = procs.env(d, JOB, "--nnodes", 2, "--node-rank", 0, timeout=40, stale_after=2, name="waiter")
    wait_claimed(d, JOB, 1, [0], procs=[p])
    rel = gen_dir(d, JOB, 1) / "release.json"
    tmp = rel.with_name(".planted")
    _write(tmp, content)
    os.replace(tmp, rel)
    wait_for(lambda: "release.json" in p.stderr(), 10, "rank 0 to name the unusable decision record")
    time.sleep(2)  # polling goes on: the warning must not repeat
    q = procs.env(d, JOB, "--nnodes", 2, "--node-rank", 1, timeout=40, stale_after=2, name="next")
    w = assert_one_world(results([p, q], timeout=40), 2)
    assert w["generation"] >= 2
    err = p.stderr()
    assert err.count("gen-00000001/release.json") == 1, err
    if '"schema": 99' in content:
        assert "unknown schema version 99" in err, err


# ---------------------------------------------------------------- participants that disagree


def test_mismatched_nnodes_fails_clearly_and_others_recover(procs, tmp_path):
    d = tmp_path / "rdv"
    d.mkdir(mode=0o700)
    r0 = procs.env(d, JOB, "--nnodes", 3, "--node-rank", 0, timeout=40, stale_after=2, name="r0")
    wait_claimed(d, JOB, 1, [0], procs=[r0])
    wrong = procs.env(d, JOB, "--nnodes", 2, "--node-rank", 1, timeout=40, stale_after=2, name="wrong")
    rc = wrong.wait(30)
    err = wrong.stderr()
    assert rc == 11, err  # WorldSizeMismatchError
    assert "expects a world of 3" in err and "expects 2" in err and "same --nnodes" in err, err
    ps = [procs.env(d, JOB, "--nnodes", 3, "--node-rank", r, timeout=40, stale_after=2, name=f"r{r}") for r in (1, 2)]
    w = assert_one_world(results([r0] + ps, timeout=40), 3)
    assert w["generation"] >= 2
