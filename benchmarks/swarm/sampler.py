"""``--sample-rank0``: a statistical profile of rank 0's process by CPU time, at its real speed.

cProfile (``--profile-rank0``) makes rank 0 five to eight times slower and weighs every Python
call far above a system call, so its proportions mislead where sends and reads are most of the
cost (issue 31: at N = 8,192 it made rank 0 too slow to gather the world at all).  Here the
kernel's ``ITIMER_PROF`` interrupts the process every ``interval`` seconds of CPU time (user and
system; the kernel's tick bounds it, 4 ms on this machine) and the stack of the frame that runs
is counted: a system call counts for the Python function that made it.
"""

from __future__ import annotations

import collections
import json
import signal


class Sampler:
    """Counts the Python stacks rank 0's process is found in, by CPU time (``start``/``dump``)."""

    def __init__(self, interval: float = 0.001):
        self.interval = interval
        self.stacks: collections.Counter = collections.Counter()

    def _sample(self, _sig, frame) -> None:
        names = []
        while frame is not None and len(names) < 64:
            code = frame.f_code
            names.append(f"{code.co_filename.rsplit('/', 2)[-2:][-1]}:{code.co_name}")
            frame = frame.f_back
        self.stacks[";".join(reversed(names))] += 1

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)

    def dump(self, path: str) -> None:
        """Stop, and write ``{stack: samples}`` (stacks ``a;b;c``, outermost first) as JSON."""
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        with open(path, "w") as fh:
            json.dump(dict(self.stacks), fh)


def top(path: str, n: int = 30) -> str:
    """The ``n`` functions with the most samples, inclusive (on the stack) and self (running), in %."""
    with open(path) as fh:
        stacks = json.load(fh)
    total = sum(stacks.values()) or 1
    inclusive: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    for stack, k in stacks.items():
        frames = stack.split(";")
        for f in set(frames):
            inclusive[f] += k
        own[frames[-1]] += k
    out = [f"{total} samples"]
    for title, c in (("inclusive", inclusive), ("self", own)):
        out.append(f"--- {title}")
        out += [f"{100 * k / total:5.1f}%  {f}" for f, k in c.most_common(n)]
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    print(top(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30))
