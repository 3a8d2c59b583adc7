"""What a participant is doing: its :class:`State`, and the :class:`Progress` it reports to displays."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class State(enum.Enum):
    """Where a participant is; the values are what progress displays show."""

    JOIN = "joining"
    CONTEST = "contesting"  # asked for a rank that is claimed: judging its holder
    WORLD_FULL = "world-full"  # first-come, every rank claimed: watching for a free place
    WAIT = "waiting"  # holds a rank; rank 0 gathers members, a member waits on its connection
    DECIDING = "deciding"  # acknowledged a release, then lost rank 0: reading the decision
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class Progress:
    """What a waiting participant knows, for progress displays.

    Attributes:
        job_id (str), generation (int), mode (str), size (int): the world.
        present (tuple[int, ...] | None): ranks present (claimed, or connected
            to rank 0), if known; None until known.
        missing (tuple[int, ...] | None): ranks not present, if known.
        rank (int | None): the rank this participant holds.
        elapsed (float): seconds since the rendezvous started.
        remaining (float): seconds until the timeout.
        state (str): a :class:`State` value.
        note (str): the latest notable event ("generation 3 voided: ...").
    """

    job_id: str
    generation: int
    mode: str
    size: int
    present: tuple[int, ...] | None
    missing: tuple[int, ...] | None
    rank: int | None
    elapsed: float
    remaining: float
    state: str
    note: str = ""
