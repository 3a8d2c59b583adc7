"""``store-<E>-<R>.json``: where each round's rank-0 agent hosts the c10d TCPStore.

After a round completes, its rank-0 agent starts a TCPStore on a fresh port
and publishes the address here (exclusive create: one writer per round); the
other agents poll the one file by name until it appears.  The newest
:data:`KEEP_STORE_FILES` files are kept.
"""

from __future__ import annotations

import time

from torch.distributed.elastic.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousStateError,
    RendezvousTimeoutError,
)

from ..errors import RecordError, StorageError
from ..fs.store import Store
from ._torch_private import NodeDesc
from .backend import sleep_jitter
from .codec import (
    STORE_RE,
    StoreAddress,
    decode_store_address,
    encode_store_address,
    store_name,
)
from .runstore import RunFiles

KEEP_STORE_FILES = 4  # store-address files kept (newest rounds)


class StoreAddressBoard(RunFiles):
    """The store-address files of one run directory.

    Args:
        store (Store): the run directory.
        run_id (str): written into and checked in every file.
    """

    def __init__(self, store: Store, run_id: str) -> None:
        self._store = store
        self._run_id = run_id

    def publish(self, a: StoreAddress) -> None:
        """Create ``store-<E>-<R>.json`` (once) and prune old ones.

        Raises:
            RendezvousStateError: the file exists and names another node or address.
            RendezvousConnectionError: the directory cannot be written.
        """
        name = store_name(a.epoch, a.round)
        try:
            # Exclusive create by link() (atomic on NFS, Lustre, GPFS): one
            # address per round even if two agents believed they were rank 0.
            created = self._store.create(name, encode_store_address(self._run_id, a))
        except (OSError, StorageError) as e:
            raise RendezvousConnectionError(f"cannot write {self._where(name)}: {e}") from e
        if not created:
            data = self._read(name)
            try:
                other = decode_store_address(data or b"", self._run_id, a.epoch, a.round)
            except RecordError as e:
                raise RendezvousStateError(f"{self._where(name)} exists and is invalid: {e}") from None
            if other != a:
                raise RendezvousStateError(
                    f"{self._where(name)} already names {other.node} at {other.addr}:{other.port}, not this node"
                )
            return
        try:
            names = self._store.listdir("")
        except OSError:
            return
        keys = sorted((int(m.group(1)), int(m.group(2)), n) for n in names if (m := STORE_RE.match(n)))
        for _, _, n in keys[:-KEEP_STORE_FILES]:
            self._store.remove(n)  # unlink: a late reader gets ENOENT = "not published"

    def wait(self, epoch: int, round_: int, node: NodeDesc, timeout: float) -> StoreAddress:
        """Wait until the rank-0 agent ``node`` has published round ``round_``'s store address.

        Args:
            epoch (int), round_ (int): the lineage and round.
            node (NodeDesc): the round's rank-0 node.
            timeout (float): seconds to wait.

        Raises:
            RendezvousTimeoutError: nothing valid appeared within ``timeout`` seconds.
            RendezvousStateError: the file names another node than ``node``.
            RendezvousConnectionError: the directory cannot be read.
        """
        name = store_name(epoch, round_)
        deadline = time.monotonic() + timeout
        delay = 0.02
        last_err = "not published yet"
        while True:
            data = self._read(name)
            if data is not None:
                try:
                    a = decode_store_address(data, self._run_id, epoch, round_)
                except RecordError as e:
                    last_err = str(e)
                else:
                    if a.node != node:
                        raise RendezvousStateError(
                            f"{self._where(name)} names {a.node}, but rank 0 of round {round_} is {node}"
                        )
                    return a
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"rank 0 ({node}) did not publish the store address {self._where(name)} within "
                    f"{timeout:g} s ({last_err}); raise --rdzv-conf read_timeout if it is slow to start"
                )
            sleep_jitter(delay)
            delay = min(delay * 2, 0.5)
