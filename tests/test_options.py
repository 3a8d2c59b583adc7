"""One declaration of every option (fsmingle/options/table.py): the CLI, the Python API, the torchrun
backend's ``--rdzv-conf`` keys and the scheduler fallbacks all come from ``OPTIONS``."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from helpers import clean_env

import fsmingle
from fsmingle import options
from fsmingle.config import resolve
from fsmingle.errors import ConfigError


def _click_params(command: str) -> dict:
    import typer.main

    from fsmingle.cli import app

    root = typer.main.get_command(app)
    return {p.name: p for p in root.commands[command].params}


@pytest.mark.parametrize("command", ["run", "env"])
def test_every_option_is_a_cli_option_with_its_flags_and_default(command):
    params = _click_params(command)
    for o in options.OPTIONS:
        p = params[o.name]
        assert tuple(p.opts + p.secondary_opts) == o.flags, o.name
        assert p.default == o.default, o.name
        assert o.help.split(";")[0] in " ".join(p.help.split()), o.name
    assert {n for n, p in params.items() if p.param_type_name == "option"} - {o.name for o in options.OPTIONS} == (
        {"format", "slots"} if command == "env" else set()
    )


def test_the_python_api_takes_every_non_cli_option_as_a_keyword():
    sig = inspect.signature(fsmingle.rendezvous)
    names = [o.name for o in options.OPTIONS if not o.cli_only]
    assert [n for n in sig.parameters if n in names] == names
    assert list(sig.parameters)[:2] == ["dir", "job_id"]
    assert {"timing", "on_progress", "env", "values"} <= set(sig.parameters)
    for o in options.OPTIONS:
        if not o.cli_only:
            assert f"        {o.name} (" in fsmingle.rendezvous.__doc__, o.name
    with pytest.raises(TypeError, match="quiet"):
        fsmingle.rendezvous("/nonexistent", "j", nnodes=1, quiet=True)


def test_python_api_rendezvous_with_keywords(tmp_path):
    r = fsmingle.rendezvous(str(tmp_path), "api", nnodes=1, addr="127.0.0.1", timeout=30, stale_after=4, env={})
    assert (r.nnodes, r.node_rank, r.master_addr, r.job_id) == (1, 0, "127.0.0.1", "api")


def test_python_api_errors_name_the_flag(tmp_path):
    with pytest.raises(ConfigError, match=r"^--poll-max 2 is too long for --stale-after 4"):
        fsmingle.rendezvous(str(tmp_path), "api", nnodes=1, poll_max=2, stale_after=4, env={})
    with pytest.raises(ConfigError, match=r"^--timeout must be a positive number of seconds, got 0"):
        fsmingle.rendezvous(str(tmp_path), "api", nnodes=1, timeout=0, env={})


def test_validate_fills_poll_max_and_refuses_combinations_that_cannot_work():
    v = options.validate(options.Values(stale_after=1.0))
    assert v.poll_max == 0.25 and v.timeout == 600.0 and v.addr_not_local is False
    assert options.validate(options.Values()).poll_max == options.POLL_MAX_DEFAULT
    assert options.validate(options.Values(stale_after=4.0, poll_max=1.0)).poll_max == 1.0
    with pytest.raises(
        ConfigError,
        match=r"--poll-max 1\.5 is too long for --stale-after 4.*lower --poll-max or "
        r"raise --stale-after",
    ):
        options.validate(options.Values(stale_after=4.0, poll_max=1.5))


def test_addr_must_be_this_hosts_unless_addr_not_local():
    local = options.local_addresses()
    assert "127.0.0.1" in local
    assert options.validate(options.Values(addr="127.0.0.1")).addr == "127.0.0.1"
    assert options.validate(options.Values(addr="127.0.0.2")).addr == "127.0.0.2"  # all of 127/8 is lo's
    with pytest.raises(ConfigError) as e:
        options.validate(options.Values(addr="10.9.9.9"))
    msg = str(e.value)
    assert msg.startswith("--addr 10.9.9.9 is not an address of this host (this host has: ") and "127.0.0.1" in msg
    assert "--addr-not-local" in msg
    assert options.validate(options.Values(addr="10.9.9.9", addr_not_local=True)).addr == "10.9.9.9"


def test_torchrun_rdzv_conf_keys_are_parsed_by_the_same_rows():
    assert options.from_rdzv_conf({"addr": "127.0.0.1", "iface": "lo", "join_timeout": "5"}) == {
        "addr": "127.0.0.1",
        "iface": "lo",
    }
    assert options.from_rdzv_conf({"addr": "10.9.9.9", "addr_not_local": "true"})["addr_not_local"] is True
    with pytest.raises(ConfigError, match=r"^--rdzv-conf addr= 'host.example' is not an IP address"):
        options.from_rdzv_conf({"addr": "host.example"})
    with pytest.raises(ConfigError, match=r"^--rdzv-conf addr=10\.9\.9\.9 is not an address of this host"):
        options.from_rdzv_conf({"addr": "10.9.9.9"})


def test_scheduler_fallbacks_are_the_env_column():
    for name, var, _value in (("nnodes", "PET_NNODES", "3"), ("node_rank", "JOB_COMPLETION_INDEX", "1")):
        assert var in options.get(name).env
    s = resolve(dir="/x", job_id="j", env={"PET_NNODES": "3", "JOB_COMPLETION_INDEX": "1"})
    assert (s.size, s.rank) == (3, 1)
    s = resolve(dir="/x", env={"LSB_JOBID": "77", "SLURM_NNODES": "2"})
    assert (s.job_id, s.size) == ("77", 2)


def test_values_not_accepted_by_an_option_are_one_line_exit_3(tmp_path):
    for argv, line in (
        (["--nnodes", "two"], "fsmingle: error: --nnodes 'two' is not a whole number; give e.g. --nnodes 2"),
        (["--stale-after", "x"], "fsmingle: error: --stale-after 'x' is not a number; give e.g. --stale-after 30"),
        (["--port", "0"], "fsmingle: error: --port 0 is outside 1..65535; choose a free port in 1..65535"),
        (
            ["--addr", "a.b"],
            ("fsmingle: error: --addr 'a.b' is not an IP address; give the IP other nodes reach this one at"),
        ),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "fsmingle", "env", "--dir", str(tmp_path), "--job-id", "j", *argv],
            env=clean_env(),
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (p.returncode, p.stderr, p.stdout) == (3, line + "\n", ""), (argv, p.stderr)
