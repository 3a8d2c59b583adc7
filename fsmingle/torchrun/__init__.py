"""``torchrun --rdzv-backend fsmingle``: torch elastic rendezvous through a shared directory.

Usage, the same command on every node (nothing else running anywhere)::

    torchrun --rdzv-backend fsmingle --rdzv-endpoint /shared/rdzv --rdzv-id exp42 \\
        --nnodes 2:4 --nproc-per-node 2 train.py

Modules (details and reasons in ``docs/torchrun-backend.md``):

* :mod:`~fsmingle.torchrun.handler`: the entry point and
  :class:`~fsmingle.torchrun.handler.FsRendezvousHandler`, torch's own
  ``DynamicRendezvousHandler`` policy with fsmingle's store, heartbeats and
  run boundaries.
* :mod:`~fsmingle.torchrun.backend`: the compare-and-set state on versioned
  JSON files created with ``link()``.
* :mod:`~fsmingle.torchrun.heartbeat`: per-node heartbeat files and the
  counter-based liveness view; :mod:`~fsmingle.torchrun.fold` puts its
  verdicts into the state torch reads.
* :mod:`~fsmingle.torchrun.storeaddr`: the round's TCPStore address files.
* :mod:`~fsmingle.torchrun.codec`: every file's JSON form.
* :mod:`~fsmingle.torchrun.conf`: the ``--rdzv-conf`` keys.
* :mod:`~fsmingle.torchrun._torch_private`: every private torch name used.

Import order matters: importing ``torch.distributed.elastic.rendezvous`` makes
torch's registry import every ``torchrun.handlers`` entry point, i.e.
``fsmingle.torchrun.handler``.  If that happened halfway through one of this
package's modules, the handler would find it half-initialised (and torch only
logs the failure: the backend would silently be missing).  So the package
imports torch's rendezvous package first, before any of its own modules.
"""

import torch.distributed.elastic.rendezvous  # noqa: F401  # see above: first, before any module here
