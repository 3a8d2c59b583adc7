"""Rendezvous benchmark: fsmingle (protocol v2, and v1 from a git worktree) vs. torch's c10d rendezvous.

Modules, one job each:

* :mod:`.common` -- constants, participant layout (processes x threads), addresses, percentiles.
* :mod:`.fsops` -- counting filesystem operations: an in-process counting ``os`` wrapper for
  fsmingle, and ``strace -f`` attribution per thread (any backend, torch included).
* :mod:`.backends` -- what one participant runs: ``fsmingle.rendezvous`` or torch's c10d handler.
* :mod:`.worker` -- the participant process (threads, one per participant; configuration by file).
* :mod:`.filesystems` -- local directory or bindfs mounts with NFS-like client caches.
* :mod:`.harness` -- spawns the processes and runs the "last arrival" scenario once.
* :mod:`.report` -- statistics, markdown tables and the plot, all from one results.json.
* :mod:`.cli` -- the command line (``python -m benchmarks.rdzv --help``).
"""
