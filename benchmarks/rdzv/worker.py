"""A participant process: ``python -m benchmarks.rdzv.worker CONFIG.json GROUP``.

The configuration (every participant's directory and address, the job id, ...) comes from a
file, never from argv: 4,096 participants' settings overflow the kernel's argument limit
(``E2BIG``, "Argument list too long").  ``GROUP`` is this process's index in ``cfg["groups"]``.

The orchestrator talks to the process over stdin/stdout, blocking reads only (a waiting worker
makes no system calls of its own that strace would count):

* stdin: ``go`` (start this group's participants, each on its own thread), ``snap TAG``
  (report every participant's operation counts), ``exit``;
* stdout: ``@@ {json}`` events: ready, entered, joined (torch), world_ready (fsmingle rank 0),
  released (with rank, master and the participant's operation counts), error, counts, fatal.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

_out_lock = threading.Lock()


def emit(**ev: Any) -> None:
    line = "@@ " + json.dumps(ev) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def main(cfg_path: str, group: int) -> None:
    from .common import load_config

    cfg, t0, nofile = load_config(cfg_path)
    impl = cfg.get("impl_root")
    if impl:
        # fsmingle from another checkout (v1 comparison) shadows the installed one.
        sys.path.insert(0, impl)
    from .backends import make
    from .common import BackendUnavailable, emit_ready

    threading.stack_size(512 * 1024)  # thousands of participant threads on a small machine
    mine = cfg["groups"][group]
    try:
        backend = make(cfg, emit)
    except BackendUnavailable as exc:
        emit(ev="unavailable", reason=str(exc))
        os._exit(3)
    except Exception:
        emit(ev="fatal", error=traceback.format_exc())
        os._exit(4)
    emit_ready(emit, t0, nofile, impl=getattr(backend, "where", None), patched=getattr(backend, "patched", None))

    def participant(p: int) -> None:
        t_arr = time.monotonic()
        emit(ev="entered", p=p, t=t_arr, tid=threading.get_native_id())
        try:
            res = backend.join(p)
            emit(ev="released", p=p, t_arr=t_arr, t_rel=time.monotonic(), **res)
        except BaseException:
            emit(ev="error", p=p, t=time.monotonic(), error=traceback.format_exc())

    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "go":
            for p in mine:
                threading.Thread(target=participant, args=(p,), daemon=True, name=f"p{p}").start()
        elif cmd[0] == "snap":
            counter = getattr(backend, "counter", None)
            emit(
                ev="counts",
                tag=cmd[1],
                t=time.monotonic(),
                counts={str(p): c for p, c in (counter.snapshot() if counter else {}).items()},
            )
        elif cmd[0] == "exit":
            break
    # Never shut torch's handlers down (that closes the rendezvous for everyone); leave hard.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
