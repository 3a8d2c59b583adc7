"""The filesystem probed for real in a directory: link(), rename() replacement, O_CREAT|O_EXCL.

Each probe creates hidden scratch files (``.fsmingle-probe-*``) with unique names and removes
them, whatever the answer.  :func:`probe_link` is what :mod:`.refusal` decides on;
``fsmingle check`` (:mod:`.doctor`) runs all three.

Sources: link(2) (the errno values a filesystem without hard links answers), rename(2)
(atomic replacement within one directory), open(2) (``O_EXCL``, and its caveats on NFS).
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from ..refusal import errno_name

_PROBE_PREFIX = ".fsmingle-probe-"


@dataclass(frozen=True)
class LinkProbe:
    """Result of one link() probe.

    Attributes:
        ok (bool): link() made a second name for the file (link count 2).
        errno (int | None): the errno link() failed with (None: it succeeded or the probe file
            could not be created).
        detail (str): one line, for messages.
    """

    ok: bool
    errno: int | None
    detail: str


def _scratch_name(directory: str, tag: str) -> str:
    return os.path.join(
        directory, f"{_PROBE_PREFIX}{tag}-{socket.gethostname()[:32]}-{os.getpid()}-{secrets.token_hex(4)}"
    )


def _remove(*paths: str) -> None:
    """Unlink scratch files; one already gone (or never created) is no news for the probe."""
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def probe_link(directory: str) -> LinkProbe:
    """Create a hidden scratch file in ``directory``, link() it to a second hidden name, check
    the link count is 2, remove both.  Never raises for the filesystem's answers; raises
    OSError only if the scratch file cannot be created (not writable, read-only, full: the
    caller's normal error path reports those)."""
    src = _scratch_name(directory, "a")
    dst = src + ".l"
    fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"fsmingle link probe\n")
    finally:
        os.close(fd)
    try:
        try:
            os.link(src, dst)
        except OSError as e:
            return LinkProbe(False, e.errno, f"link() failed with {errno_name(e.errno)} ({os.strerror(e.errno)})")
        try:
            n = os.stat(src).st_nlink
        except OSError as e:
            return LinkProbe(False, None, f"stat() after link() failed: {e.strerror}")
        if n != 2:
            # A filesystem that "links" by copying: a claim made this way is not exclusive proof.
            return LinkProbe(False, None, f"link() succeeded but the link count is {n}, not 2")
        return LinkProbe(True, None, "link() made a second name (link count 2)")
    finally:
        _remove(dst, src)


def _probe_rename(directory: str) -> tuple[bool, str]:
    """Replace a file by rename() and read it back: the new content, never a mix."""
    a = _scratch_name(directory, "r")
    b = a + ".t"
    try:
        with open(a, "wb") as f:
            f.write(b"old")
        with open(b, "wb") as f:
            f.write(b"new")
            f.flush()
            os.fsync(f.fileno())
        os.replace(b, a)
        with open(a, "rb") as f:
            got = f.read()
        return (
            got == b"new",
            "rename() replaced the file atomically"
            if got == b"new"
            else f"after rename() the file reads {got!r}, not the new content",
        )
    except OSError as e:
        return False, f"rename() failed: {errno_name(e.errno)} ({e.strerror})"
    finally:
        _remove(a, b)


def _probe_excl(directory: str) -> tuple[bool, str]:
    """O_CREAT|O_EXCL twice on one name: the second must fail with EEXIST (on this node)."""
    a = _scratch_name(directory, "x")
    try:
        os.close(os.open(a, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            os.close(os.open(a, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return False, "a second O_CREAT|O_EXCL of the same name succeeded"
        except FileExistsError:
            return True, "a second O_CREAT|O_EXCL of the same name failed with EEXIST"
    except OSError as e:
        return False, f"O_CREAT|O_EXCL failed: {errno_name(e.errno)} ({e.strerror})"
    finally:
        _remove(a)
