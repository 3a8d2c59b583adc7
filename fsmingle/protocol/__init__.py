"""The rendezvous engine: one participant's protocol (v2), from joining a generation to its release.

Layer: above ``fs`` and ``net``.  It may import :mod:`fsmingle.errors`, ``fsmingle.fs`` and
``fsmingle.net``; never the faces (CLI, API, options, torchrun).  Read ``participant`` first (the
driver and its rules), then ``joining``, ``member`` and ``rank0`` (rank 0's role, split by concern),
with ``decision`` the pure core.  Others: ``leaving`` (deciding, timeouts, withdrawal: the commit
window), ``outside`` (contesting a rank, a full world), ``genreader`` (reading a generation),
``liveness`` (judging a heartbeat), ``states``, ``timing``, ``cleanup`` (retiring old
generations), ``testhooks`` (pause points for real-process tests).
"""
