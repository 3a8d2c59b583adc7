"""Which keys a FolderStore holds, linearizably: ``list_keys`` and ``num_keys`` (issue 30).

A listing of the store directory shows which keys have a directory; whether each holds a value is
a read of its log.  Reading the keys one after another, each freshly, is not enough: a client that
deletes ``a`` and then sets ``b`` could be answered ``[a, b]``, a set of keys that never existed at
one instant (``a`` read before the delete, ``b`` after the set).  So the answer is a **double
collect** (Afek et al., "Atomic snapshots of shared memory", JACM 1993): collect every key's newest
version freshly (the store directory and each epoch probed before its listing is trusted), collect
again, and answer when both collects found the same version of every key.  Versions are never
reused (a version is the pair (epoch, number); epoch names are never made twice), so a key whose
version is the same in both collects held it all the time between them, and every key with a value
then had its directory listed by the second collect (made before its first version, probed before
listed).  Between the two collects is an instant at which the keys answered were exactly the keys
with values: the linearization point, inside the call.
"""

from __future__ import annotations

from .folderstore_log import EPOCH0, KEY_RE, key_of_dir


def live_keys(kv, op) -> list[str]:
    """The keys of ``kv`` (a :class:`fsmingle.fs.folderstore.FolderKV`) that hold a value, sorted.

    Cost: two collects when no key changes meanwhile -- per collect a probe and a listing of the
    store directory, and per key the fresh read of ``try_get``.  Writes during a collect make it
    collect again, after a pause that grows from ``poll_min`` to ``poll_max``.

    Raises:
        the store's timeout error: keys kept changing during every pair of collects until the
            store's timeout (``op``'s deadline); or a version stayed unreadable that long.
    """
    before: dict[str, tuple[str, int]] | None = None
    pause = kv.poll_min
    while True:
        kv.probe("")  # the store directory's own listing, fresh: a key made before now is listed
        ids: dict[str, tuple[str, int]] = {}
        keys: list[str] = []
        for name in kv.store.listdir(""):
            if not KEY_RE.match(name):
                continue
            kv.adopt(name)
            st = kv.resolve(None, name, op, fresh=True)
            if (st.ep, st.n) != (EPOCH0, 0):  # never written: as if its directory were not there yet
                ids[name] = (st.ep, st.n)
            if st.value is not None:
                key = key_of_dir(name)
                keys.append(st.ver.key if key is None else key)
        if ids == before:
            return sorted(keys)
        if before is not None:  # a key changed between the collects: collect again, a little later
            kv.nap(op, pause * (1 + kv.rng.random() / 4), "the keys kept changing during every listing")
            pause = min(pause * 2, kv.poll_max)
        before = ids
