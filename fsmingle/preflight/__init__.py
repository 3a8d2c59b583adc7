"""Checks a node makes before it joins: ``gpu`` (``--gpus-per-node``: NVML, else ``nvidia-smi -L``).

Layer: beside :mod:`fsmingle.protocol`.  It may import :mod:`fsmingle.errors`, ``fs`` and
``net``; never the rendezvous engine or the faces.  (The network preflight, ``--check-mesh``,
runs inside the release and lives in :mod:`fsmingle.net.mesh`.)
"""
