"""``fsmingle demo``: two simulated nodes on one machine, each running torchrun, rendezvous through a temp dir."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading


def find_script(script: str | None) -> str:
    """Locate the example training script (``--script``, ``./examples/train_ddp.py`` or the source checkout's)."""
    cands = (
        [script]
        if script
        else [
            os.path.join(os.getcwd(), "examples", "train_ddp.py"),
            os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "train_ddp.py"),
        ]
    )
    for c in cands:
        if c and os.path.isfile(c):
            return os.path.abspath(c)
    raise FileNotFoundError("examples/train_ddp.py not found: run from the fsmingle checkout or pass --script")


def run_demo(script: str | None, nproc_per_node: int, steps: int, timeout: float) -> int:
    """Run the demo; return 0 on success, else the first failing node's exit code."""
    try:
        path = find_script(script)
    except FileNotFoundError as e:
        print(f"fsmingle: error: {e}", file=sys.stderr)
        return 3
    if shutil.which("torchrun") is None:
        print("fsmingle: error: torchrun not found: pip install 'fsmingle[torch]'", file=sys.stderr)
        return 127
    tmp = tempfile.mkdtemp(prefix="fsmingle-demo-")  # mode 0700 (tempfile), whatever the umask
    os.mkdir(os.path.join(tmp, "rdzv"), 0o700)  # fsmingle run never creates --dir itself
    job = f"demo-{secrets.token_hex(3)}"
    print(f"demo: 2 nodes x {nproc_per_node} processes, rendezvous directory {tmp}/rdzv, job id {job}")
    procs = []
    for _node in range(2):
        env = dict(os.environ, TMPDIR=tmp)
        cmd = [
            sys.executable,
            "-m",
            "fsmingle",
            "run",
            "--dir",
            os.path.join(tmp, "rdzv"),
            "--job-id",
            job,
            "--nnodes",
            "2",
            "--addr",
            "127.0.0.1",
            "--timeout",
            str(timeout),
            "--",
            "torchrun",
            "--nproc-per-node",
            str(nproc_per_node),
            path,
            "--steps",
            str(steps),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    def pump(i, p):
        for line in p.stdout:
            print(f"[node {i}] {line}", end="", flush=True)

    threads = [threading.Thread(target=pump, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout + 60))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            codes.append(124)
    for t in threads:
        t.join(timeout=5)
    shutil.rmtree(tmp, ignore_errors=True)
    bad = [c for c in codes if c]
    print(
        "demo: success, both nodes trained to identical parameters" if not bad else f"demo: failed, exit codes {codes}"
    )
    return bad[0] if bad else 0
