"""The network layer: the direct channel to rank 0, addresses and interfaces, this host's identity.

Layer: above :mod:`fsmingle.fs`.  It may import :mod:`fsmingle.errors` and ``fsmingle.fs`` (the
record types it carries: ``HostId``, addresses); never the rendezvous engine or the faces.
Modules: ``channel`` (TCP framing, the Hub and Link, the handshake's HMAC), ``netaddr`` (which
address to announce), ``hostinfo`` (who this process is, whether a local process is alive, who
holds a port), ``mesh`` (``--check-mesh``: reaching ring neighbours before the release).
"""
