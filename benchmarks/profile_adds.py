"""Where a contended ``add`` spends its calls and its time: the ranks' cProfiles of one barrier, summed.

``python -m benchmarks.bench_folderstore ... --profile DIR`` leaves ``DIR/rank-<r>.prof`` (each rank's ``add("b", 1)``);
``python -m benchmarks.profile_adds DIR`` prints, per add (the sum over the ranks divided by their number):

* every system call the store made (``os.listdir``, ``os.link``, ``os.open``...): calls and wall milliseconds --
  wall, not CPU: through a busy FUSE daemon a call mostly waits in its queue;
* every FolderStore function (``fsmingle/fs/``): calls, and cumulative wall milliseconds (its callees in).

The profiler slows Python by a fixed factor, not the calls' waits: the counts are exact, the times comparable only
with each other.
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import pstats

# The os functions a store call makes that reach the filesystem (getpid, urandom, fspath... do not).
FS_CALLS = {"open", "read", "write", "close", "fstat", "lstat", "stat", "listdir", "scandir", "link", "unlink", "mkdir"}
FS_CALLS |= {"rmdir", "rename", "fsync"}


def _label(func: tuple[str, int, str]) -> str:
    path, line, name = func
    return f"{name}" if path == "~" else f"{os.path.basename(path)}:{line}({name})"


def _short(f: tuple) -> str:
    """A builtin's short name from its pstats key: ``<built-in method posix.listdir>`` -> ``listdir``."""
    return f[2].split(".")[-1].rstrip(">")


def summary(d: str) -> str:
    files = sorted(glob.glob(os.path.join(d, "rank-*.prof")))
    if not files:
        raise SystemExit(f"no rank-*.prof in {d}: run bench_folderstore with --profile {d}")
    st = pstats.Stats(files[0], stream=io.StringIO())
    for f in files[1:]:
        st.add(f)
    n = len(files)
    stats = st.stats  # {func: (primitive calls, calls, tottime, cumtime, callers)}
    out = [f"{n} ranks, one add(b, 1) each; per add:", "", "| system call | calls | wall ms |", "|---|--:|--:|"]
    sys_calls = {f: v for f, v in stats.items() if f[0] == "~" and _short(f) in FS_CALLS}
    # the link count read past the cache: a raw statx(2) through ctypes (the counting wrapper's, under a benchmark)
    sys_calls |= {(f[0], f[1], "statx"): v for f, v in stats.items() if f[2] == "statx" and f[0].endswith("fsops.py")}
    sleep = [v for f, v in stats.items() if f[0] == "~" and "time.sleep" in f[2]]
    for f, v in sorted(sys_calls.items(), key=lambda kv: -kv[1][1]):
        out.append(f"| {_short(f)} | {v[1] / n:.2f} | {1000 * v[2] / n:.1f} |")
    if sleep:
        out.append(f"| (sleep) | {sum(v[1] for v in sleep) / n:.2f} | {1000 * sum(v[2] for v in sleep) / n:.1f} |")
    out += ["", "| FolderStore function | calls | cumulative wall ms |", "|---|--:|--:|"]
    ours = {f: v for f, v in stats.items() if f"{os.sep}fsmingle{os.sep}fs{os.sep}" in f[0]}
    for f, v in sorted(ours.items(), key=lambda kv: -kv[1][3])[:25]:
        out.append(f"| {_label(f)} | {v[1] / n:.2f} | {1000 * v[3] / n:.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="the --profile directory of a bench_folderstore run")
    print(summary(ap.parse_args().dir))


if __name__ == "__main__":
    main()
