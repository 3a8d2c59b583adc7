"""What a participant is doing: its :class:`State`, and the :class:`Progress` it reports to displays."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence
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


class RankSet(Sequence[int]):
    """The ranks ``0..size-1`` except ``missing``: an immutable, sorted sequence stored as what is *not* in it.

    A member learns who is present from rank 0's status messages, which name only the missing
    ranks; holding the present ones as a tuple would cost every member O(N) memory and CPU per
    message (O(N^2) over a world: measured as the simulator's memory blow-up at N = 16,384).
    ``len``, ``in`` and equality are O(len(missing)); iteration and indexing are O(N).

    Args:
        size (int): world size (nnodes in node mode).
        missing (Iterable[int]): ranks not present; values outside ``0..size-1`` are ignored.
    """

    __slots__ = ("size", "missing", "_gone")

    def __init__(self, size: int, missing: Iterable[int] = ()):
        gone = frozenset(r for r in missing if 0 <= r < size)
        self.size, self.missing, self._gone = size, tuple(sorted(gone)), gone

    @classmethod
    def of(cls, size: int, present: Iterable[int]) -> RankSet:
        """The set holding exactly ``present`` (O(size))."""
        here = set(present)
        return cls(size, (r for r in range(size) if r not in here))

    def __len__(self) -> int:
        return self.size - len(self.missing)

    def __contains__(self, r: object) -> bool:
        return isinstance(r, int) and 0 <= r < self.size and r not in self._gone

    def __iter__(self) -> Iterator[int]:
        return (r for r in range(self.size) if r not in self._gone)

    def __getitem__(self, i):
        return tuple(self)[i]  # an index or a slice; O(N)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankSet):
            return self.size == other.size and self.missing == other.missing
        if isinstance(other, tuple | list):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.size, self.missing))

    def __repr__(self) -> str:
        return f"RankSet(size={self.size}, missing={list(self.missing)})"


@dataclass(frozen=True)
class Progress:
    """What a waiting participant knows, for progress displays.

    Attributes:
        job_id (str), generation (int), mode (str), size (int): the world.
        present (RankSet | None): ranks present (claimed, or connected to rank 0),
            a sorted ``Sequence[int]``, if known; None until known.
        missing (tuple[int, ...] | None): ranks not present, if known.
        rank (int | None): the rank this participant holds.
        elapsed (float): seconds since the rendezvous started.
        remaining (float): seconds until the timeout.
        state (str): a :class:`State` value.
        note (str): the latest notable event ("generation 3 voided: ...").
        spare_for (int): while this participant waits as a spare with its timeout held, the
            generation it backs (``remaining`` then does not run down); 0 otherwise.
        held (float | None): seconds the timeout has been held by peer jobs pending in the
            scheduler's queue (:mod:`fsmingle.protocol.queue`), while it is held; None otherwise.
        queue_left (float | None): seconds of ``--queue-timeout`` left while held (None: no bound).
    """

    job_id: str
    generation: int
    mode: str
    size: int
    present: RankSet | None
    missing: tuple[int, ...] | None
    rank: int | None
    elapsed: float
    remaining: float
    state: str
    note: str = ""
    spare_for: int = 0
    held: float | None = None
    queue_left: float | None = None
