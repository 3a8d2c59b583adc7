"""First contact (issue 16): what a new user sees is what the code does.

Each test drives the real ``fsmingle`` command as a user would and checks the exact
message, exit code and number of lines: SIGTERM, ``--verbose``, ``status`` on
exited / remote / voided participants, ``clean`` output and other users' job
directories, and the sbatch scripts' ``TRAIN`` and ``FSMINGLE_DIR`` handling.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import (
    REPO,
    assert_one_world,
    clean_env,
    have,
    other_pidns_prefix,
    results,
    wait_claimed,
    wait_for,
)

JOB = "fc"
NOBODY = 65534


def _status(procs, d, *args) -> tuple[int, str, str]:
    return procs.cli("status", "--dir", d, *args, timeout=60)


# ---------------------------------------------------------------- SIGTERM


def test_sigterm_while_waiting_says_terminated_and_exits_130(procs, d):
    p = procs.env(d, JOB, "--nnodes", 2, "--node-rank", 0, timeout=60, name="waiter")
    wait_claimed(d, JOB, 1, [0], procs=[p])
    p.signal(signal.SIGTERM)
    rc = p.wait(30)
    err = p.stderr()
    assert rc == 130, err
    assert "fsmingle: terminated (SIGTERM) while waiting; this participant withdrew from the rendezvous" in err, err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err
    assert p.stdout() == ""


def test_sigint_while_waiting_says_interrupted(procs, d):
    p = procs.env(d, JOB, "--nnodes", 2, "--node-rank", 0, timeout=60, name="waiter")
    wait_claimed(d, JOB, 1, [0], procs=[p])
    p.signal(signal.SIGINT)
    assert p.wait(30) == 130
    assert "fsmingle: interrupted (SIGINT); this participant withdrew" in p.stderr(), p.stderr()


# ---------------------------------------------------------------- --verbose


def test_verbose_prints_protocol_details_the_default_does_not(procs, d):
    quiet = results([procs.env(d, "plain", "--nnodes", 2, name=f"plain{i}") for i in range(2)])
    assert_one_world(quiet, 2)
    loud = [procs.env(d, "loud", "--nnodes", 2, "--verbose", name=f"loud{i}") for i in range(2)]
    assert_one_world(results(loud), 2)
    plain_err = "".join(p.stderr() for p in procs.all[:2])
    loud_err = "".join(p.stderr() for p in loud)
    assert "DEBUG" not in plain_err, plain_err
    for what in (
        "DEBUG: options: --dir",
        "DEBUG: resolved: dir",
        "DEBUG: timing: poll",
        "DEBUG: job directory",
        "DEBUG: state: generation 1",
    ):
        assert what in loud_err, (what, loud_err)
    # timestamps and logger names on every verbose line
    assert all(
        re.match(r"fsmingle \d\d:\d\d:\d\d\.\d{3} fsmingle[\w.]* [A-Z]+: ", ln)
        for ln in loud_err.splitlines()
        if ln.strip()
    ), loud_err


# ---------------------------------------------------------------- status


def test_status_calls_exited_participants_exited_not_stale(procs, d):
    assert_one_world(results([procs.env(d, JOB, "--nnodes", 2, name=f"p{i}") for i in range(2)]), 2)
    rc, out, err = _status(procs, d, JOB, "--json")
    assert rc == 0, err
    s = json.loads(out)
    assert [p["liveness"] for p in s["participants"]] == ["exited", "exited"], s
    rc, out, err = _status(procs, d, JOB)
    assert rc == 0, err
    assert out.count("exited") == 2 and "stale" not in out, out


@pytest.mark.skipif(os.geteuid() != 0 or bool(have("unshare")), reason="a remote participant needs unshare (root)")
def test_status_judges_a_remote_participant_by_heartbeat_age_against_stale_after(procs, d):
    """Another pid namespace = another host for liveness: alive until its heartbeat is --stale-after old."""
    remote = procs.env(
        d, JOB, "--nnodes", 2, "--node-rank", 1, timeout=120, stale_after=3, prefix=other_pidns_prefix(), name="remote"
    )
    wait_claimed(d, JOB, 1, [1], procs=[remote])
    _rc, out, _err = _status(procs, d, JOB, "--json", "--stale-after", "6")
    part = json.loads(out)["participants"][0]
    assert (part["liveness"], part["same_host"]) == ("alive", False), part
    _rc, out, _err = _status(procs, d, JOB, "--stale-after", "6")
    assert "alive (remote)" in out, out
    remote.kill()  # its heartbeat stops here

    def stale():
        _rc, out, _err = _status(procs, d, JOB, "--json", "--stale-after", "6")
        p = json.loads(out)["participants"][0]
        return p if p["liveness"] == "stale" else None

    p = wait_for(stale, 30, "status to call the killed remote participant stale")
    # never before its heartbeat was --stale-after old
    assert p["heartbeat_age_s"] >= 6, p


@pytest.mark.skipif(os.geteuid() != 0 or bool(have("unshare")), reason="a remote participant needs unshare (root)")
def test_status_calls_a_connected_member_alive_by_rank0s_vouch(procs, d):
    """A verified member rewrites its own beacon only every 2 x --stale-after; status takes rank 0's
    fresh beacon, which vouches for it, instead of calling it stale by its own beacon's age."""
    nodes = [
        procs.env(
            d,
            JOB,
            "--nnodes",
            3,
            "--node-rank",
            r,
            timeout=120,
            stale_after=3,
            prefix=other_pidns_prefix(),
            name=f"n{r}",
        )
        for r in (0, 1)
    ]
    wait_claimed(d, JOB, 1, [0, 1], procs=nodes)

    def old_own_beacon():
        _rc, out, _err = _status(procs, d, JOB, "--json", "--stale-after", "3")
        p = {x["rank"]: x for x in json.loads(out)["participants"]}.get(1)
        return p if p is not None and p["heartbeat_age_s"] >= 3.2 else None

    p = wait_for(old_own_beacon, 30, "member 1's own beacon to be older than --stale-after", interval=0.3)
    assert (p["liveness"], p["vouched_by_rank0"], p["same_host"]) == ("alive", True, False), p
    for n in nodes:
        n.kill()


def test_status_of_a_voided_generation_says_voided_not_an_empty_claim_table(procs, d):
    p = procs.env(d, JOB, "--nnodes", 2, timeout=2, name="alone")
    assert p.wait(30) == 7, p.stderr()
    rc, out, err = _status(procs, d, JOB)
    assert rc == 1, err
    text = " ".join(out.split())
    assert f"job {JOB} generation 1: voided (rank 0 timed out after 2 s; it left)" in text, out
    assert "the next attempt starts generation 2" in text and "no participant is left" in text, out
    assert "claimed" not in text and "restart" not in text and "┏" not in out, out


# ---------------------------------------------------------------- clean


def test_clean_prints_each_removal_once_on_stdout(procs, d):
    for run in range(3):
        assert_one_world(results([procs.env(d, JOB, "--nnodes", 2, name=f"r{run}{i}") for i in range(2)]), 2)
    # released generations (the newest generation is the next one, made ahead and still empty)
    gens = sorted(p.name for p in (d / JOB).iterdir() if p.name.startswith("gen-") and (p / "release.json").exists())
    assert len(gens) >= 2, gens  # (participants retire older decided generations themselves)
    rc, out, err = procs.cli("clean", "--dir", d, JOB)
    assert rc == 0, err
    assert out.splitlines() == [f"removed {JOB}/{g}: released generation" for g in reversed(gens[:-1])], out
    assert "removed" not in err and "generation" not in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's job directory needs chown (root)")
def test_clean_without_job_id_skips_another_users_job_directory(procs, d):
    for run in range(2):
        assert_one_world(results([procs.env(d, JOB, "--nnodes", 2, name=f"r{run}{i}") for i in range(2)]), 2)
    other = d / "theirs"
    other.mkdir(mode=0o700)
    os.chown(other, NOBODY, NOBODY)
    rc, out, err = procs.cli("clean", "--dir", d)
    assert rc == 0, err
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        (
            f"fsmingle: skipping job directory {other} is owned by uid {NOBODY}, not by you (uid 0); another user "
            "may have created it to redirect your job: choose another --job-id or --dir"
        )
    ], err
    assert out.splitlines() == [f"removed {JOB}/gen-00000001: released generation"], out
    assert other.is_dir()
    # naming it is still an error: exit 4, one line
    rc, out, err = procs.cli("clean", "--dir", d, "theirs")
    assert rc == 4 and err.startswith("fsmingle: error: job directory") and len(err.splitlines()) == 1, err


# ---------------------------------------------------------------- sbatch scripts

SCRIPTS = sorted((Path(REPO) / "slurm").glob("*.sbatch"))


def _lines(script: Path, pattern: str) -> str:
    return "\n".join(ln for ln in script.read_text().splitlines() if re.match(pattern, ln))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_sbatch_creates_fsmingle_dir_owner_only_whatever_the_umask(tmp_path, script):
    """The script's own mkdir line, under umask 000: the directory is 0700 and fsmingle accepts it."""
    mkdir = _lines(script, r"^\(umask 077 && mkdir -p \"\$FSMINGLE_DIR\"\)$")
    assert mkdir, f"{script.name} creates FSMINGLE_DIR without umask 077"
    target = tmp_path / "home" / ".fsmingle" / "rdzv"
    subprocess.run(
        ["bash", "-c", f"umask 000; {mkdir}"], env={**os.environ, "FSMINGLE_DIR": str(target)}, check=True, timeout=30
    )
    assert target.stat().st_mode & 0o777 == 0o700
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsmingle",
            "env",
            "--dir",
            str(target),
            "--job-id",
            "j",
            "--nnodes",
            "1",
            "--addr",
            "127.0.0.1",
            "--format",
            "json",
            "-q",
        ],
        env=clean_env(),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_sbatch_train_default_is_relative_to_the_submit_dir(tmp_path, script):
    lines = _lines(script, r"^(TRAIN=|case \"\$TRAIN\")")
    assert "SLURM_SUBMIT_DIR" in lines and "submit from" in script.read_text(), script.name
    run = subprocess.run(
        ["bash", "-c", f'{lines}\necho "$TRAIN"'],
        cwd=tmp_path,
        check=False,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "SLURM_SUBMIT_DIR": "/submit/here"},
        timeout=30,
    )
    assert run.stdout.strip() == "/submit/here/examples/train_ddp.py", run
    run = subprocess.run(
        ["bash", "-c", f'{lines}\necho "$TRAIN"'],
        check=False,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "SLURM_SUBMIT_DIR": "/s", "TRAIN": "/abs/t.py"},
        timeout=30,
    )
    assert run.stdout.strip() == "/abs/t.py", run


# ---------------------------------------------------------------- the README's newcomer blocks


def test_readme_marks_the_newcomer_commands_that_ci_runs():
    """.ci/newcomer.sh extracts these blocks; the first makes a venv and installs from the checkout."""
    text = (Path(REPO) / "README.md").read_text()
    script = (Path(REPO) / ".ci" / "newcomer.sh").read_text()
    run = (Path(REPO) / ".ci" / "run").read_text()
    for marker in ("<!-- newcomer: first command", "<!-- newcomer: test command"):
        assert text.count(marker) == 1 and marker in script, marker
    first = text.split("<!-- newcomer: first command", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert "python3 -m venv .venv && . .venv/bin/activate" in first
    assert "pip install torch==2.13.0 -e '.[torch,test]' && fsmingle demo" in first
    assert "pip install fsmingle" not in text  # not on PyPI
    assert "bash .ci/newcomer.sh" in run and "bash .ci/newcomer.sh --tests" in run
    assert "sudo bash .ci/run" in text and "\nbash .ci/run" in text


def test_kubernetes_example_makes_the_rendezvous_dir_owner_only_before_fsmingle_runs():
    import yaml

    job = yaml.safe_load((Path(REPO) / "examples" / "kubernetes" / "job.yaml").read_text())
    spec = job["spec"]["template"]["spec"]
    cmd = spec["containers"][0]["command"]
    rdzv = cmd[cmd.index("--dir") + 1]
    (init,) = spec["initContainers"]
    assert init["command"] == ["mkdir", "-p", "-m", "700", rdzv]
    assert init["image"] == spec["containers"][0]["image"]
    assert init["volumeMounts"] == [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "shared"]


def test_status_warns_once_about_an_unreadable_beacon_then_counts(procs, d):
    """`status --watch` rereads every interval: one warning about the file, then one line with the count."""
    p = procs.env(d, JOB, "--nnodes", 2, "--node-rank", 0, timeout=60, name="waiter")
    wait_claimed(d, JOB, 1, [0], procs=[p])
    bad = d / JOB / "gen-00000001" / "beacon-0123456789abcdef.json"
    bad.write_text('{"schema": 2, "kind": "beacon", "trunc')
    os.chmod(bad, 0o600)
    w = procs.spawn(
        [sys.executable, "-m", "fsmingle", "status", "--dir", str(d), JOB, "--watch", "--interval", "0.2"],
        name="watch",
        env=clean_env(),
    )
    wait_for(lambda: "ignoring" in w.stderr(), 30, "the first warning")
    time.sleep(2.0)  # about ten more rounds of --watch
    w.signal(signal.SIGINT)
    w.wait(30)
    err = w.stderr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    name = f"gen-00000001/{bad.name}"
    assert [ln for ln in lines if "ignoring" in ln] == [f"fsmingle: ignoring {name}: " + lines[0].split(": ", 2)[2]], (
        err
    )
    (count,) = [ln for ln in lines if "repeated" in ln]
    assert re.fullmatch(rf"fsmingle: \(the warning about {re.escape(name)} repeated \d+ more times\)", count), err
    assert int(re.search(r"repeated (\d+)", count).group(1)) >= 3, err
    assert len(lines) == 2, err


def test_sigterm_after_the_release_says_too_late_and_exits_143():
    """The handler `fsmingle run`/`env` installs once released (the window before exec is too short to hit)."""
    code = (
        "import os, signal, time; from types import SimpleNamespace as R; from fsmingle.cli.commands import _after_release; "
        "signal.signal(signal.SIGTERM, _after_release(R(job_id='j', generation=3))); "
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env=clean_env(), check=False, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 143, p
    assert p.stderr == (
        "fsmingle: terminated (SIGTERM) after job j generation 3 was released with this participant "
        "in it, before its command started; the others will not find it\n"
    ), p.stderr


@pytest.mark.parametrize("cmd", ["status", "clean"])
def test_status_and_clean_on_a_missing_dir_are_exit_5_in_one_line(procs, tmp_path, cmd):
    rc, out, err = procs.cli(cmd, "--dir", tmp_path / "typo")
    assert rc == 5 and out == "", err
    assert len(err.splitlines()) == 1 and err.startswith("fsmingle: error: ") and str(tmp_path / "typo") in err, err
    assert "check --dir" in err, err
