"""The on-disk format of a FolderStore key (names, version files) and the two filesystem primitives it adds.

Layout (``docs/folderstore.md`` gives the argument)::

    store/
        k-<hex of the key's UTF-8>/        one directory per key (h-<sha256> for keys over 100 bytes)
            e-000000000000/                epoch 0: made by every process's first use (mkdir, EEXIST fine);
                v-000000000001             never retired, sealed by its 2nd version
                v-000000000002             a seal: a version whose header names the next epoch
            e-000000000001-<16 hex>/       a later epoch: made (mkdir of a never-used random name) only by
                v-000000000001 ...         the writer about to seal its predecessor; retired whole
                a-<12 digits>-<token>-<amount>  a delta's hint: made by its writer after its link() won
                                           (a hard link of the same file), read from listings only
            .p-*, .tmp-*                   probes and temporaries (hidden: never listed)

Versions are created by ``PosixStore.create(..., fsync=False)`` (why a version needs no fsync:
``docs/folderstore.md``); :func:`probe_dir`, which makes the next listing of a directory fresh,
lives here because only the FolderStore needs it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets

from ..errors import CorruptStateError, FsmingleError
from .store import _tmp_name, _unlink_quiet, storage_error

# Digits are ASCII ([0-9]): \d matches every Unicode digit, which sorts above "9", and the newest version is found as
# the greatest name that is one (FolderKV._listed); fsmingle writes ASCII only, a foreign name is no version of ours.
VERSION_RE = re.compile(r"^v-([0-9]{12})$")
# A delta's hint: its slot, token and amount in a name, so that one listing tells every hinted delta's amount.
HINT_RE = re.compile(r"^a-([0-9]{12})-([0-9a-f]{16})-(-?[0-9]{1,64})$")
KEY_RE = re.compile(r"^(k-[0-9a-f]*|h-[0-9a-f]{64})$")
# A later epoch's name may end in its capacity (``-c<versions>``, its seal's slot): chosen by the writer that made it
# and read from the name by every writer and reader (names are never reused); no suffix: the release's SEAL_AT.
EPOCH_RE = re.compile(r"^e-([0-9]{12})(?:-[0-9a-f]{16}(?:-c([1-9][0-9]{0,3}))?)?$")
EPOCH0 = "e-000000000000"
MAX_HEX_KEY = 100  # bytes of key spelled in hex in the directory name (200 characters + "k-": under NAME_MAX 255)
MAX_RECORD = 1 << 21  # PosixStore.read refuses files over 2 MiB (as untrusted): no version file may be larger
MAX_KEY = 4096  # bytes of a key's UTF-8: its JSON in a version header is at most 6 x that (\uXXXX escapes)
MAX_VALUE = MAX_RECORD - 32 * 1024  # so that the longest key's header (< 25 KiB) always fits beside the value
SCHEMA = 2
_UNREADABLE = (
    "listed but unreadable: a client cache that keeps a lost race's ENOENT (GlusterFS nl-cache without "
    "upcalls: `gluster volume set VOL performance.nl-cache off`, `fsmingle check` names it), or a file "
    "removed by hand (remove the store)"
)
# A write whose create or link() kept failing with EIO may have taken effect (a soft mount's timeout after the
# server did it, a reply lost for good): its timeout must not read as "nothing happened" (a retry counts twice).
_UNKNOWN_EFFECT = "whether it took effect is unknown: an add retried may count twice; a set can be read back"


def check_key(key: str) -> bytes:
    """The UTF-8 bytes of ``key``, refused if longer than :data:`MAX_KEY`.

    Raises:
        ValueError: the key is over ``MAX_KEY`` bytes: every version file carries the key in its
            header and must stay under the record limit (``MAX_RECORD``, 2 MiB) beside a value of
            ``MAX_VALUE`` bytes, or the next read would refuse it as damaged.
        TypeError: the key is not a ``str``.
    """
    if not isinstance(key, str):
        raise TypeError(f"FolderStore keys are str, not {type(key).__name__}")
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_KEY:
        raise ValueError(
            f"FolderStore keys are at most {MAX_KEY} bytes (UTF-8); {key[:40]!r}... has {len(raw)}: every version "
            f"file holds its key, and must stay under the {MAX_RECORD}-byte record limit"
        )
    return raw


def key_dir(key: str) -> str:
    """The directory name of ``key``: its UTF-8 bytes in hex (never a path), hashed when long.

    Hex, not base64: case-insensitive filesystems (SMB exports, some FUSE mounts) would merge
    base64 names that differ only in case.

    Raises:
        ValueError: the key is over :data:`MAX_KEY` bytes (:func:`check_key`).
    """
    raw = check_key(key)
    if len(raw) <= MAX_HEX_KEY:
        return "k-" + raw.hex()
    return "h-" + hashlib.sha256(raw).hexdigest()


def key_of_dir(name: str) -> str | None:
    """The key a ``k-`` directory names (None for ``h-``: read it from a version)."""
    if name.startswith("k-"):
        return bytes.fromhex(name[2:]).decode("utf-8", "surrogatepass")
    return None


def version_name(n: int) -> str:
    return f"v-{n:012d}"


def hint_name(n: int, token: str, amount: int) -> str | None:
    """The hint of a delta ``("add", amount)`` with ``token`` at version ``n``; None where it would not fit."""
    name = f"a-{n:012d}-{token}-{amount}"
    return name if HINT_RE.match(name) else None


def epoch_number(name: str) -> int:
    m = EPOCH_RE.match(name)
    return int(m.group(1)) if m else -1


def new_epoch_name(number: int, cap: int | None = None) -> str:
    """A name no directory ever had: a later epoch is never re-created by a stale writer (ABA); ``cap``: its
    capacity (the slot of its seal) in the name, None for the store's default (an old name's meaning)."""
    return f"e-{number:012d}-{secrets.token_hex(8)}" + ("" if cap is None else f"-c{cap}")


def epoch_cap(name: str, default: int) -> int:
    """The capacity of epoch ``name`` (versions it holds, the last one its seal): from its name, else ``default``.

    Raises:
        CorruptStateError: a capacity under 2 (no writer makes one: version 1 is full, a seal follows it).
    """
    m = EPOCH_RE.match(name)
    if m is None or m.group(2) is None:
        return default
    if int(m.group(2)) < 2:
        raise CorruptStateError(f"epoch {name} names a capacity under 2 (not a FolderStore epoch); remove the store")
    return int(m.group(2))


def as_bytes(v) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, list):  # torch passes std::vector<uint8_t> as a list of ints in some paths
        return bytes(v)
    raise TypeError(f"store values are bytes or str, not {type(v).__name__}")


class Version:
    """One immutable version of a key: ``op`` is ``set``, ``del`` (a tombstone) or ``add`` (a delta: its value an
    integer to add to the version below, :mod:`.folderstore_add`); ``next``, on a
    seal, names the epoch that continues the key's log (the seal's own value is current until then); ``sealing``:
    its writer seals its epoch at once (a counter's creating add: others wait for that seal rather than make one).
    ``sealing`` is an optional header field: a reader that predates it ignores it (and only makes a seal itself)."""

    __slots__ = ("key", "next", "op", "sealing", "token", "value")

    def __init__(self, key: str, op: str, token: str, value: bytes, next: str | None = None, sealing: bool = False):
        self.key, self.op, self.token, self.value, self.next = key, op, token, value, next
        self.sealing = sealing

    @property
    def live(self) -> bool:
        return self.op == "set"

    def encode(self) -> bytes:
        head = {"schema": SCHEMA, "kind": "kv", "key": self.key, "op": self.op, "token": self.token}
        if self.next is not None:
            head["next"] = self.next
        if self.sealing:
            head["sealing"] = True
        head["len"] = len(self.value)
        data = json.dumps(head, separators=(",", ":")).encode() + b"\n" + self.value
        if len(data) > MAX_RECORD:  # never reached within MAX_KEY and MAX_VALUE; never written past it
            raise ValueError(f"FolderStore version of {self.key[:40]!r} would be {len(data)} bytes, over {MAX_RECORD}")
        return data

    @classmethod
    def decode(cls, data: bytes, where: str) -> Version:
        head, sep, value = data.partition(b"\n")
        try:
            h = json.loads(head) if sep else None
            ok = (
                isinstance(h, dict)
                and h.get("schema") == SCHEMA
                and h.get("kind") == "kv"
                and h.get("op") in ("set", "del", "add")
                and isinstance(h.get("key"), str)
                and isinstance(h.get("token"), str)
                and h.get("len") == len(value)
                and (h.get("next") is None or (isinstance(h["next"], str) and EPOCH_RE.match(h["next"]) is not None))
                and isinstance(h.get("sealing", False), bool)
            )
        except ValueError:
            ok = False
        if not ok:
            raise CorruptStateError(f"{where} is not a FolderStore version (damaged or foreign); remove the store")
        return cls(h["key"], h["op"], h["token"], value, h.get("next"), h.get("sealing", False) is True)


def probe_dir(root: str, name: str) -> bool:
    """Create and remove a hidden file in directory ``name``: False if the directory is missing.

    Why: a listing may come from the client's directory cache (NFS: up to ``acdirmax``); a change
    this client makes in the directory goes to the server, whose reply carries the directory's new
    change attribute (NFSv3 wcc data, NFSv4 change_info), and a client that finds it moved drops
    its cached listing -- so the next ``readdir`` shows every name created before the probe.
    Three system calls, no data, no ``fsync``.

    Raises:
        StorageError: the filesystem refuses the create (read-only, full, permissions).
    """
    p = os.path.join(root, name, ".p-" + _tmp_name()[5:])
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno in (errno.ESTALE, errno.ENOTDIR):
            return False
        raise storage_error(e, "write in", os.path.dirname(p)) from None
    os.close(fd)
    _unlink_quiet(p)
    return True


class FolderStoreTimeout(FsmingleError, TimeoutError):
    """A FolderStore operation did not finish within its timeout (the torch face raises ``DistStoreError``)."""


class State:
    """Where a key's log stands: epoch ``ep``, its newest version number ``n`` and the version ``ver``
    whose value is current (``n == 0``: ``ep`` is empty and ``ver`` is the seal that named it, or
    None when the key was never written)."""

    __slots__ = ("ep", "n", "ver")

    def __init__(self, ep: str, n: int, ver: Version | None):
        self.ep, self.n, self.ver = ep, n, ver

    @property
    def value(self) -> bytes | None:
        return self.ver.value if self.ver is not None and self.ver.live else None


class Op:
    """One call's deadline (``None``: none) and what it is doing, for its timeout message."""

    __slots__ = ("deadline", "secs", "what")

    def __init__(self, clock, secs: float | None, what: str):
        self.secs, self.what = secs, what
        self.deadline = clock.monotonic() + secs if secs else None
