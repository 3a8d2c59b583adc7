"""--gpus-per-node: a node short of GPUs never joins, and says what it saw.

CI has no GPU, so the GPUs are what a user's node would show the probe:
nothing at all (no NVML library, no ``nvidia-smi``), a fake ``nvidia-smi``
on PATH printing what the real one prints, or a fake ``pynvml`` module
answering like NVML.  A stub ``pynvml`` that fails to import is first on
PYTHONPATH wherever NVML must be absent, so the tests mean the same on a
machine where ``nvidia-ml-py`` and a driver are installed.
"""

from __future__ import annotations

import os
import shlex
import time

import pytest
from helpers import REPO, clean_env, run_cli

SMI_2 = (
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a1b2c3d-0000-1111-2222-333344445555)\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-9f8e7d6c-0000-1111-2222-333344445555)\n"
)
NO_NVML = "raise ImportError('no NVML in this test')\n"
FAKE_NVML = """
class NVMLError(Exception):
    pass
_GPUS = [("NVIDIA A100-SXM4-40GB", "GPU-aaaa", True), ("NVIDIA A100-SXM4-40GB", "GPU-bbbb", False)]
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return len(_GPUS)
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return _GPUS[h][0]
def nvmlDeviceGetUUID(h): return _GPUS[h][1]
def nvmlDeviceGetMemoryInfo(h):
    if not _GPUS[h][2]:
        raise NVMLError("GPU is lost")
    return (1, 2, 3)
"""


@pytest.fixture
def node(tmp_path):
    """A node's environment: an empty PATH dir for fake tools, a pynvml stub dir, an rdzv dir."""
    bin_dir, py_dir, rdzv = tmp_path / "bin", tmp_path / "py", tmp_path / "rdzv"
    for d in (bin_dir, py_dir):
        d.mkdir()
    rdzv.mkdir(mode=0o700)
    (py_dir / "pynvml.py").write_text(NO_NVML)

    def run(
        *args,
        smi: str | None = None,
        smi_rc: int = 0,
        nvml: str | None = None,
        env: dict | None = None,
        module: str = "fsmingle",
    ):
        if smi is not None:
            # shell builtins only: PATH holds nothing but this script
            lines = " ".join(shlex.quote(x) for x in smi.splitlines())
            (bin_dir / "nvidia-smi").write_text(
                f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\nprintf '%s\\n' {lines}\nexit {smi_rc}\n"
            )
            (bin_dir / "nvidia-smi").chmod(0o755)
        if nvml is not None:
            (py_dir / "pynvml.py").write_text(nvml)
        # PATH: only the fake tools (no real nvidia-smi can answer); python runs by absolute path
        e = clean_env({"PATH": str(bin_dir), "PYTHONPATH": f"{py_dir}{os.pathsep}{REPO}", **(env or {})})
        t0 = time.monotonic()
        cp = run_cli(*args, env=e, module=module)
        return cp, time.monotonic() - t0

    run.rdzv = rdzv
    return run


def _env_args(node, job="g", *more):
    return ["env", "--dir", str(node.rdzv), "--job-id", job, "--nnodes", "1", "--timeout", "120", *more]


def test_no_gpu_at_all_exit_12_and_nothing_written(node):
    cp, took = node(*_env_args(node, "g", "--gpus-per-node", "1"))
    assert cp.returncode == 12, cp.stderr
    err = cp.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fsmingle: error: --gpus-per-node 1: this node has 0 usable GPUs"), err
    assert "no nvidia-smi on PATH" in err[0] and "does not join" in err[0]
    assert os.listdir(node.rdzv) == [], "a node that fails the GPU check must not write to the shared dir"
    assert took < 60, "the check must fail at once, not wait for the rendezvous timeout (120 s)"
    assert cp.stdout == ""


def test_env_variable_asks_for_the_check_too(node):
    cp, _ = node(*_env_args(node), env={"FSMINGLE_GPUS_PER_NODE": "2"})
    assert cp.returncode == 12 and "--gpus-per-node 2" in cp.stderr, cp.stderr
    assert os.listdir(node.rdzv) == []


def test_fake_nvidia_smi_two_gpus_pass_and_names_logged(node):
    cp, _ = node(*_env_args(node, "two", "--gpus-per-node", "2"), smi=SMI_2)
    assert cp.returncode == 0, cp.stderr
    assert (
        "GPU preflight: 2 usable GPUs (nvidia-smi -L, asked for 2): GPU 0 NVIDIA H100 80GB HBM3; "
        "GPU 1 NVIDIA H100 80GB HBM3"
    ) in cp.stderr
    assert "export NNODES=1" in cp.stdout


def test_fake_nvidia_smi_two_gpus_four_asked_fails_naming_them(node):
    cp, _ = node(*_env_args(node, "four", "--gpus-per-node", "4"), smi=SMI_2)
    assert cp.returncode == 12, cp.stderr
    assert (
        "this node has 2 usable GPUs (nvidia-smi -L; saw: GPU 0 NVIDIA H100 80GB HBM3; GPU 1 NVIDIA H100" in cp.stderr
    )
    assert os.listdir(node.rdzv) == []


def test_cuda_visible_devices_is_respected(node):
    cp, _ = node(*_env_args(node, "cvd", "--gpus-per-node", "2"), smi=SMI_2, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert cp.returncode == 12, cp.stderr
    assert "1 usable GPU (nvidia-smi -L; saw: GPU 1 NVIDIA H100" in cp.stderr
    assert "CUDA_VISIBLE_DEVICES='1' hides 1" in cp.stderr
    # by UUID prefix, as CUDA accepts it; "" hides everything
    cp, _ = node(*_env_args(node, "uuid", "--gpus-per-node", "1"), smi=SMI_2, env={"CUDA_VISIBLE_DEVICES": "GPU-9f8e"})
    assert cp.returncode == 0 and "GPU 1 NVIDIA H100" in cp.stderr, cp.stderr
    cp, _ = node(*_env_args(node, "none", "--gpus-per-node", "1"), smi=SMI_2, env={"CUDA_VISIBLE_DEVICES": ""})
    assert cp.returncode == 12 and "hides 2" in cp.stderr, cp.stderr


def test_a_gpu_nvidia_smi_cannot_open_is_not_usable(node):
    smi = SMI_2 + "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n"
    cp, _ = node(*_env_args(node, "broken", "--gpus-per-node", "3"), smi=smi, smi_rc=255)
    assert cp.returncode == 12, cp.stderr
    assert "2 usable GPUs" in cp.stderr and "Unable to determine the device handle for GPU0000:3B:00.0" in cp.stderr


def test_nvml_is_preferred_and_a_lost_gpu_is_not_usable(node):
    cp, _ = node(*_env_args(node, "nvml", "--gpus-per-node", "2"), nvml=FAKE_NVML, smi=SMI_2)
    assert cp.returncode == 12, cp.stderr
    assert (
        "1 usable GPU (NVML; saw: GPU 0 NVIDIA A100-SXM4-40GB; GPU 1 NVIDIA A100-SXM4-40GB "
        "(NVML cannot read its memory: GPU is lost))" in cp.stderr
    )
    cp, _ = node(*_env_args(node, "nvml1", "--gpus-per-node", "1"), nvml=FAKE_NVML)
    assert cp.returncode == 0 and "GPU preflight: 1 usable GPU (NVML" in cp.stderr, cp.stderr


def test_module_entry_point_for_a_real_node(node):
    cp, _ = node("2", smi=SMI_2, module="fsmingle.preflight.gpu")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines()[0].split("\t") == [
        "0",
        "GPU-0a1b2c3d-0000-1111-2222-333344445555",
        "NVIDIA H100 80GB HBM3",
        "ok",
    ]
    cp, _ = node("3", smi=SMI_2, module="fsmingle.preflight.gpu")
    assert cp.returncode == 12 and "2 usable GPUs" in cp.stderr


def test_bad_value_is_exit_3(node):
    cp, _ = node(*_env_args(node, "bad", "--gpus-per-node", "-1"))
    assert cp.returncode == 3 and "--gpus-per-node" in cp.stderr, cp.stderr
