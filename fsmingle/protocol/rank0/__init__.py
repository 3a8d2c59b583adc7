"""Rank 0's role in a generation, split by concern (see :mod:`.coordinator` for the map).

Layer: part of :mod:`fsmingle.protocol`; imports ``fsmingle.errors``, ``fs``, ``net`` and the
engine's own modules, never the faces.
"""

from .coordinator import Coordinator

__all__ = ["Coordinator"]
