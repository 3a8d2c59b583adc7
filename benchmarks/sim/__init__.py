"""Discrete-event simulator of a rendezvous at scale, running fsmingle's REAL policy code.

Every participant is a real :class:`fsmingle.protocol.participant.Participant` (with the real
:class:`~fsmingle.protocol.rank0.coordinator.Coordinator` / :class:`~fsmingle.protocol.member.Member` roles); only its
store, transport and clock are simulated:

* :mod:`.mds` -- an in-memory shared filesystem behind a metadata-server cost model: every
  operation is charged ``op_latency`` (client<->server round trip) plus service time on one
  server queue whose capacity is ``ops_per_s`` (the "op/s ceiling"); a listing also costs
  ``entry_cost`` seconds of server time per directory entry returned.  Operations are counted
  per participant with the same categories, and the same mapping from store calls to system
  calls, as the real harness's counting wrapper (:mod:`benchmarks.rdzv.fsops`).
* :mod:`.net` -- an in-memory network: a message arrives ``net_latency`` seconds after it was
  sent and wakes its receiver.
* :mod:`.engine` -- a virtual clock and an event queue.  Each participant has its own local
  time: it wakes at its scheduled time (or when a message arrives), runs one ``step()``, whose
  filesystem operations move its local time forward, and sleeps ``next_delay()``.  With
  ``cores`` set, steps also queue for that many CPU cores and each step costs the CPU time
  the policy code really took in this process (``time.thread_time``) times ``cpu_scale`` plus
  ``syscall_cost`` per operation/message (the 2-core machine of the real runs).

Run ``python -m benchmarks.sim --help``.
"""
