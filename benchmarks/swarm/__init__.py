"""The swarm benchmark (issue 31): rank 0's real code at large N without a thread per participant.

* :mod:`.driver` -- one process stepping many real ``Participant`` state machines with one scheduler
  (a heap of wake-ups and one epoll), over the real directory and real loopback sockets;
* :mod:`.run` -- one run of a scenario (``last``, ``cold``, ``storm``) over several such processes;
* ``__main__`` -- ``python -m benchmarks.swarm``: sizes × scenarios, ``results.json`` and ``results.md``.
"""
