"""Reading one torchrun run's files through the state store, with torch's error type.

Shared by the state backend (``backend.py``) and the store-address board (``storeaddr.py``):
both read records by name from ``<endpoint>/<run id>/`` and must surface a filesystem failure as
torch's ``RendezvousConnectionError``, which torchrun's agent reports and retries.
"""

from __future__ import annotations

from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

from ..fs.store import Store


class RunFiles:
    """Mixin: ``_read``/``_where`` over ``self._store`` (a :class:`fsmingle.fs.store.Store`) and
    ``self._run_id`` (str), which the class using it sets."""

    _store: Store
    _run_id: str

    def _read(self, name: str) -> bytes | None:
        """Contents of ``name``; None if it is not there (yet).

        Raises:
            RendezvousConnectionError: the directory cannot be read (permissions, I/O error).
        """
        try:
            # A fresh open() per read: NFS promises close-to-open consistency only; ENOENT and
            # ESTALE (pruned, replaced; or a name a negative dentry hides for a while, never
            # forever: lookup revalidation) come back as None.
            return self._store.read(name)
        except OSError as e:
            raise RendezvousConnectionError(f"cannot read {self._where(name)}: {e}") from e

    def _where(self, name: str = "") -> str:
        """``name``'s path for messages (``run_id/name`` for a store without paths)."""
        p = getattr(self._store, "path", None)
        return p(name) if callable(p) else f"{self._run_id}/{name}"
