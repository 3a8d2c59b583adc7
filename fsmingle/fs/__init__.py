"""The filesystem layer: what fsmingle keeps in the shared directory, and how it touches it.

Layer: the lowest but one.  It may import :mod:`fsmingle.errors` only; nothing here knows about
sockets, ranks in a world, or the faces.  Inside, bottom to top: ``layout`` (names in a job
directory, the job id's rule), ``records`` (the JSON formats: beacon, claim, release), ``mounts``
(``/proc/self/mountinfo``), ``refusal`` (filesystems that cannot hold an exclusive claim),
``store`` (the primitives: exclusive ``link()`` create, atomic publish, listing, each beside the
NFS/Lustre/GlusterFS fact it relies on), and ``fscheck`` (``fsmingle check``: probes and verdicts,
above the store).
"""
