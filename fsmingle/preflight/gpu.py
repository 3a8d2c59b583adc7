"""GPU preflight (``--gpus-per-node N``): prove this node sees N usable GPUs before it joins.

A node short of GPUs must not join: the job would start, and torchrun would
fail on that node minutes later, after every other node waited for it.  So
:func:`require_gpus` runs before anything is written to the shared directory
and raises :class:`~fsmingle.errors.GpuPreflightError` (exit 12) with what it
saw.

How GPUs are found, never importing torch (it takes seconds to import and
initialises CUDA, which the training processes must do themselves):

1. NVML through ``pynvml`` (the ``nvidia-ml-py`` package, the ``gpu`` extra:
   ``pip install fsmingle[gpu]``), imported lazily.  A GPU is *usable* when
   NVML returns its handle, name and memory info (a GPU that fell off the bus
   fails there with ``NVML_ERROR_GPU_IS_LOST``).
2. Else ``nvidia-smi -L``, whose lines read
   ``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)``; a line without that shape
   (``Unable to determine the device handle for GPU0000:...: Unknown Error``)
   is a GPU that is there but unusable.
3. Neither: no GPU is visible.

``CUDA_VISIBLE_DEVICES`` is respected as the CUDA runtime reads it (CUDA C
Programming Guide, "CUDA Environment Variables"): a comma list of indices or
UUIDs (``GPU-`` prefixes), visible in that order, cut at the first entry that
names no device; unset means all, the empty string none.  NVML and
``nvidia-smi`` ignore the variable, so the filter is applied here.

Run by hand on a node: ``python -m fsmingle.preflight.gpu 8`` (exit 0 and the names, or
exit 12 and why).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ..errors import GpuPreflightError

log = logging.getLogger("fsmingle")

__all__ = ["Gpu", "Probe", "probe", "require_gpus", "visible"]

NVIDIA_SMI_TIMEOUT = 20.0  # seconds: nvidia-smi can take several seconds on a busy 8-GPU node
_SMI_LINE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the probe saw it.

    Attributes:
        index (int): NVML / ``nvidia-smi`` index (the host's numbering, not CUDA's); negative for
            a GPU ``nvidia-smi`` could not open (it prints no index for it).
        name (str): product name, e.g. ``NVIDIA H100 80GB HBM3``.
        uuid (str): ``GPU-...`` ("" if unknown).
        problem (str): why it is not usable ("" when it is).
    """

    index: int
    name: str
    uuid: str = ""
    problem: str = ""

    @property
    def usable(self) -> bool:
        return not self.problem

    def describe(self) -> str:
        what = f"GPU {self.index} {self.name}" if self.index >= 0 else "a GPU"
        return what + (f" ({self.problem})" if self.problem else "")


@dataclass(frozen=True)
class Probe:
    """What one look at the node found.

    Attributes:
        gpus (tuple[Gpu, ...]): the GPUs, after ``CUDA_VISIBLE_DEVICES``, in CUDA's order.
        method (str): ``"NVML"``, ``"nvidia-smi -L"`` or ``"none"``.
        note (str): what the probe saw besides GPUs (why NVML or nvidia-smi gave nothing).
        hidden (int): GPUs present but hidden by ``CUDA_VISIBLE_DEVICES``.
    """

    gpus: tuple[Gpu, ...]
    method: str
    note: str = ""
    hidden: int = 0

    @property
    def usable(self) -> tuple[Gpu, ...]:
        return tuple(g for g in self.gpus if g.usable)


def _nvml() -> tuple[list[Gpu] | None, str]:
    """All GPUs through NVML; (None, why) when NVML cannot be used here."""
    try:
        import pynvml  # the nvidia-ml-py package; optional (extra "gpu")
    except ImportError:
        return None, "pynvml (nvidia-ml-py) not installed"
    nvml_errors = (pynvml.NVMLError, OSError)  # every NVML failure is an NVMLError; OSError: a broken library
    try:
        pynvml.nvmlInit()
    except nvml_errors as e:  # NVMLError_LibraryNotFound / DriverNotLoaded: no driver on this node
        return None, f"NVML: {e}"
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                name = name.decode() if isinstance(name, bytes) else name
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            except nvml_errors as e:
                out.append(Gpu(i, "?", "", f"NVML cannot open it: {e}"))
                continue
            try:
                pynvml.nvmlDeviceGetMemoryInfo(h)  # fails on a GPU that is lost or in a bad state
            except nvml_errors as e:
                out.append(Gpu(i, name, uuid, f"NVML cannot read its memory: {e}"))
                continue
            out.append(Gpu(i, name, uuid))
        return out, ""
    except nvml_errors as e:
        return None, f"NVML: {e}"
    finally:
        with contextlib.suppress(*nvml_errors):
            pynvml.nvmlShutdown()


def _nvidia_smi(env: dict) -> tuple[list[Gpu] | None, str]:
    """All GPUs from ``nvidia-smi -L`` (PATH of ``env``); (None, why) when it cannot be run."""
    exe = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if exe is None:
        return None, "no nvidia-smi on PATH"
    try:
        cp = subprocess.run(
            [exe, "-L"],
            check=False,
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT,
            env={k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi -L failed: {e}"
    out: list[Gpu] = []
    odd = []
    for line in cp.stdout.splitlines():
        if not line.strip() or line.startswith((" ", "\t")):  # blank, or a MIG device under its GPU
            continue
        m = _SMI_LINE.match(line)
        if m:
            out.append(Gpu(int(m.group(1)), m.group(2), m.group(3)))
        else:
            odd.append(line.strip())
    # A GPU nvidia-smi cannot open is a line of its own ("Unable to determine the device handle for
    # GPU0000:3B:00.0: Unknown Error"): it is there, and not usable.
    for k, line in enumerate(odd):
        out.append(Gpu(-1 - k, "?", "", f"nvidia-smi: {line}"))
    if cp.returncode != 0 and not out:
        why = (cp.stderr.strip() or cp.stdout.strip()).splitlines()
        return None, f"nvidia-smi -L exited {cp.returncode}" + (f": {why[-1]}" if why else "")
    return out, "" if cp.returncode == 0 else f"nvidia-smi -L exited {cp.returncode}"


def _apply_visible(gpus: list[Gpu], spec: str | None) -> list[Gpu]:
    """Filter and order ``gpus`` as the CUDA runtime reads ``CUDA_VISIBLE_DEVICES`` (see the module doc)."""
    if spec is None:
        return list(gpus)
    out: list[Gpu] = []
    for tok in (t.strip() for t in spec.split(",")):
        if tok.isdigit():
            found = [g for g in gpus if g.index == int(tok)]
        elif tok.startswith(("GPU-", "MIG-")):
            found = [g for g in gpus if g.uuid and g.uuid.startswith(tok)]
        else:
            found = []
        if len(found) != 1 or found[0] in out:
            break  # CUDA stops at the first entry that names no (single, new) device
        out.append(found[0])
    return out


def probe(env: dict | None = None) -> Probe:
    """Look at this node's GPUs: NVML, else ``nvidia-smi -L``; then ``CUDA_VISIBLE_DEVICES``.

    Args:
        env (dict | None): environment for ``PATH`` and ``CUDA_VISIBLE_DEVICES`` (default ``os.environ``).

    Returns:
        Probe: never raises; a node without GPUs gives ``Probe((), "none", why)``.
    """
    env = dict(os.environ if env is None else env)
    gpus, note = _nvml()
    method = "NVML"
    if gpus is None:
        gpus, note2 = _nvidia_smi(env)
        method = "nvidia-smi -L"
        note = f"{note}; {note2}" if note2 else note
        if gpus is None:
            return Probe((), "none", note)
    visible_gpus = _apply_visible(gpus, env.get("CUDA_VISIBLE_DEVICES"))
    return Probe(tuple(visible_gpus), method, note, hidden=len(gpus) - len(visible_gpus))


def visible(env: dict | None = None) -> int:
    """Number of usable GPUs this node's processes would see (0 without any); for ``--slots`` defaults."""
    return len(probe(env).usable)


def require_gpus(n: int, env: dict | None = None) -> Probe:
    """Check that at least ``n`` usable GPUs are visible; log their names at INFO.

    Args:
        n (int): GPUs this node must have (``--gpus-per-node``); 0 checks nothing.
        env (dict | None): environment (default ``os.environ``).

    Returns:
        Probe: what was found.

    Raises:
        GpuPreflightError: fewer than ``n`` usable GPUs; the message says how many are
            visible, which ones, what the probe saw and ``CUDA_VISIBLE_DEVICES``.
    """
    if n <= 0:
        return Probe((), "none", "no check asked")
    env = dict(os.environ if env is None else env)
    p = probe(env)
    usable = p.usable
    if len(usable) >= n:
        log.info(
            "GPU preflight: %d usable GPU%s (%s, asked for %d): %s",
            len(usable),
            "s" * (len(usable) != 1),
            p.method,
            n,
            "; ".join(g.describe() for g in usable),
        )
        return p
    saw = "; ".join(g.describe() for g in p.gpus) or "none"
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    parts = [
        (
            f"--gpus-per-node {n}: this node has {len(usable)} usable GPU{'s' * (len(usable) != 1)} "
            f"({p.method}; saw: {saw})"
        )
    ]
    if cvd is not None:
        parts.append(f"CUDA_VISIBLE_DEVICES={cvd!r} hides {p.hidden}" if p.hidden else f"CUDA_VISIBLE_DEVICES={cvd!r}")
    if p.note:
        parts.append(p.note)
    raise GpuPreflightError(
        "; ".join(parts) + "; this node does not join: fix the node or lower --gpus-per-node",
        found=len(usable),
        wanted=n,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m fsmingle.preflight.gpu [N]``: print what the probe sees; exit 12 if fewer than N are usable."""
    args = sys.argv[1:] if argv is None else argv
    try:
        n = int(args[0]) if args else 1
    except ValueError:
        print(
            f"usage: python -m fsmingle.preflight.gpu [N]  (N: GPUs this node must have; got {args[0]!r})",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="fsmingle: %(message)s")
    try:
        p = require_gpus(n) if n > 0 else probe()
    except GpuPreflightError as e:
        print(f"fsmingle: error: {e}", file=sys.stderr)
        return e.exit_code
    for g in p.gpus:
        print(f"{g.index}\t{g.uuid}\t{g.name}\t{'ok' if g.usable else g.problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
