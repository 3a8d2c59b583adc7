"""Who was slow: a released generation's arrivals as a table, a terminal timeline and a picture.

The numbers come from the release record: each member's ``arrival``
(:class:`fsmingle.fs.records.Member`) is the time in seconds after the first
arrival at which rank 0 saw it, on rank 0's monotonic clock -- one clock, so
the offsets compare even when the nodes' wall clocks disagree.  Used by
``fsmingle status JOB`` (always the table), ``--timeline`` and ``--plot FILE.png``.
"""

from __future__ import annotations

from ..errors import ConfigError, StorageError
from ..fs.chunks import attach_members
from ..fs.layout import member_chunk_name
from ..fs.records import RecordError, Release

__all__ = ["TIMELINE_WIDTH", "members_of", "plot", "table", "timeline"]

TIMELINE_WIDTH = 40  # characters of the terminal timeline's time axis


def members_of(store, rel: Release) -> list[dict] | None:
    """Every member of ``rel`` in rank order: ``rank``, ``host``, ``addr``, ``arrival`` (seconds).

    A big world's members are stored apart in chunk files (``release-<writer>-<k>.json``,
    :func:`fsmingle.fs.chunks.encode_release`); they are read from ``store`` then.

    Returns:
        list[dict] | None: None if a chunk is missing or does not match its digest.
    """
    if rel.member_chunks:
        chunks = [store.read(member_chunk_name(rel.generation, rel.writer, k)) for k in range(len(rel.member_chunks))]
        if any(c is None for c in chunks):
            return None
        try:
            rel = attach_members(rel, chunks)
        except RecordError:
            return None
    return [
        {"rank": m.rank, "host": m.host.hostname, "addr": m.addr, "arrival": round(m.arrival, 3)}
        for m in sorted(rel.members, key=lambda m: m.rank)
    ]


def table(world: list[dict]):
    """A rich table of the members in rank order with their arrival offsets."""
    from rich.table import Table

    t = Table(title="arrivals (seconds after the first, on rank 0's clock)")
    for c in ("rank", "host", "address", "arrival"):
        t.add_column(c, justify="right" if c in ("rank", "arrival") else "left")
    for m in world:
        t.add_row(str(m["rank"]), m["host"], m["addr"], f"+{m['arrival']:.2f} s")
    return t


def timeline(world: list[dict], width: int = TIMELINE_WIDTH):
    """A rich table drawing the arrivals on one time axis, first arrival at the top.

    Each row is one member; ``●`` sits at its arrival on an axis of ``width``
    characters from 0 to the last arrival, the ``─`` before it is the wait.
    """
    from rich.table import Table
    from rich.text import Text

    last = max((m["arrival"] for m in world), default=0.0)
    t = Table(
        title=f"arrival timeline: 0 .. {last:.1f} s (one column = {last / width:.2g} s)"
        if last
        else "arrival timeline: everyone at once"
    )
    for c in ("rank", "host", "arrival"):
        t.add_column(c, justify="right" if c != "host" else "left")
    t.add_column("0 s" + " " * max(0, width - 3 - len(f"{last:.1f} s")) + f"{last:.1f} s", no_wrap=True)
    for m in sorted(world, key=lambda m: (m["arrival"], m["rank"])):
        pos = round(m["arrival"] / last * (width - 1)) if last else 0
        slow = last and m["arrival"] >= 0.5 * last and m["arrival"] > 0
        bar = Text("─" * pos, style="dim") + Text("●", style="bold red" if slow else "bold green")
        t.add_row(str(m["rank"]), m["host"], f"+{m['arrival']:.2f} s", bar)
    return t


def plot(world: list[dict], path: str, title: str) -> None:
    """Draw the arrivals into a PNG file: one row per member (rank order, rank 0 at the top).

    Args:
        world (list[dict]): from :func:`members_of`.
        path (str): the picture to write (PNG).
        title (str): its title.

    Raises:
        ConfigError: matplotlib is not installed (``pip install 'fsmingle[plot]'``), or
            ``path`` does not end in ``.png``.
        StorageError: the file cannot be written.
    """
    if not path.lower().endswith(".png"):
        raise ConfigError(f"--plot {path}: give a file name ending in .png")
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on a login node; must precede pyplot
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib, which is not installed: pip install 'fsmingle[plot]'") from None
    n = len(world)
    fig, ax = plt.subplots(figsize=(8, min(2 + 0.25 * n, 40)))
    ys = [m["rank"] for m in world]
    xs = [m["arrival"] for m in world]
    ax.hlines(ys, 0, xs, color="0.7", linewidth=1)
    last = max(xs, default=0.0)
    ax.scatter(xs, ys, c=["tab:red" if last and x >= 0.5 * last and x > 0 else "tab:green" for x in xs], zorder=3)
    if n <= 60:
        ax.set_yticks(ys, [f"{m['rank']} {m['host']}" for m in world])
    ax.invert_yaxis()
    ax.set_xlabel("arrival, seconds after the first (rank 0's clock)")
    ax.set_ylabel("rank")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as e:
        raise StorageError(f"--plot {path}: cannot write it: {e.strerror or e}") from None
    finally:
        plt.close(fig)
