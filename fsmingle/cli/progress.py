"""Showing a waiting user what is happening: a live line on a terminal, plain lines in a log.

On a terminal (stderr is a TTY) a single line is redrawn with rich::

    exp42 gen 3: 5/8 nodes — waiting for node ranks 2, 6, 7 (1m12s, timeout in 8m48s)

In a log file (Slurm output, no TTY) the same text is logged as a plain line
on every change and every ``every`` seconds, never with control characters.
Everything goes through the stdlib logger ``fsmingle`` so programs embedding
fsmingle can route or silence it.
"""

from __future__ import annotations

import logging
import sys
import time

from ..fs.layout import ranges
from ..protocol.states import Progress

log = logging.getLogger("fsmingle")


def fmt_duration(seconds: float) -> str:
    """``72.4`` -> ``"1m12s"``; ``3700`` -> ``"1h01m40s"``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m{s % 60:02d}s"


def describe(p: Progress) -> str:
    """One human line for a :class:`~fsmingle.protocol.participant.Progress`."""
    unit = "nodes" if p.mode == "node" else "ranks"
    who = "node ranks" if p.mode == "node" else "ranks"
    if p.present is None:
        count = f"?/{p.size} {unit}"
        waiting = "waiting"
    else:
        count = f"{len(p.present)}/{p.size} {unit}"
        waiting = f"waiting for {who} {ranges(list(p.missing))}" if p.missing else "complete, releasing"
        if p.missing and len(p.missing) > 16:
            waiting = f"waiting for {len(p.missing)} {who}"
    if p.state == "contesting":
        waiting = f"rank {p.rank if p.rank is not None else ''} is claimed; checking its holder".replace("  ", " ")
    elif p.state == "world-full":
        waiting = "all ranks claimed by others; watching for a free place"
    me = f" [this: {'node rank' if p.mode == 'node' else 'rank'} {p.rank}]" if p.rank is not None else ""
    return f"{p.job_id} gen {p.generation}: {count} — {waiting}{me} ({fmt_duration(p.elapsed)}, {timeout_word(p)})"


def timeout_word(p: Progress) -> str:
    """``timeout in 8m48s``; while peer jobs pending in the scheduler's queue hold it,
    ``timeout held: peer jobs pending (held 2m00s, --queue-timeout in 8m00s)``; while a spare
    given ``--spare-timeout`` waits for a place, ``a spare for gen 3, timeout held``."""
    if p.spare_for:  # a spare: its --timeout does not run, and starts over once a world forms with it
        return f"a spare for gen {p.spare_for}, timeout held"
    if p.held is None:
        return f"timeout in {fmt_duration(p.remaining)}"
    bound = "" if p.queue_left is None else f", --queue-timeout in {fmt_duration(p.queue_left)}"
    return f"timeout held: peer jobs pending (held {fmt_duration(p.held)}{bound})"


class Reporter:
    """A progress callback that renders to the terminal or to the log.

    Args:
        quiet (bool): show nothing but errors.
        every (float): seconds between plain lines when nothing changes (no TTY).
        stream: where the live line goes (default ``sys.stderr``).
    """

    def __init__(self, quiet: bool = False, every: float = 30.0, stream=None):
        self.quiet = quiet
        self.every = every
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_text = ""
        self._last_key = None
        self._last_debug = None
        self._last_time = 0.0
        self._live = None
        if self.tty and not quiet:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=self.stream), transient=True, auto_refresh=False)
            self._live.start()

    def __call__(self, p: Progress) -> None:
        if self.quiet:
            return
        key = (p.generation, p.present, p.state, p.note, p.rank, p.held is None)
        if key != self._last_debug:
            # Shown with --verbose only (the 'fsmingle' logger at DEBUG): every change of state.
            self._last_debug = key
            log.debug(
                "state: generation %d %s, this rank %s, claimed %s, missing %s%s%s",
                p.generation,
                p.state,
                p.rank,
                list(p.present) if p.present is not None else "?",
                list(p.missing) if p.missing is not None else "?",
                f", note: {p.note}" if p.note else "",
                "" if p.held is None else f", {timeout_word(p)}",
            )
        text = describe(p)
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(text), refresh=True)
            return
        key = (p.generation, p.present, p.state, p.note, p.held is None)
        now = time.monotonic()
        if key != self._last_key or now - self._last_time >= self.every:
            self._last_key, self._last_time = key, now
            log.info("%s", text)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


class WarnOnce:
    """Warnings about one file (or other key) rate-limited: the first in full, then only counted.

    ``warn(key, msg)`` logs the first warning for ``key``; repeats are counted
    and :meth:`flush` logs one line per key that repeated ("... 110 more
    times").  Polling loops call it every round without flooding the log.

    Args:
        logger (logging.Logger): where the lines go (default: the ``fsmingle`` logger).
    """

    def __init__(self, logger: logging.Logger | None = None):
        self.log = logger or log
        self.counts: dict[str, int] = {}

    def warn(self, key: str, msg: str, *args) -> None:
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        if n == 0:
            self.log.warning(msg, *args)

    def flush(self) -> None:
        """Log how often each warning repeated since it was shown; reset the counts."""
        for key, n in self.counts.items():
            if n > 1:
                self.log.warning("(the warning about %s repeated %d more times)", key, n - 1)
        self.counts = {k: 1 for k in self.counts}
