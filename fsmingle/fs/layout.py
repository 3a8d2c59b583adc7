"""Names inside one job directory: where each record of the protocol lives.

Layout of ``<dir>/<job_id>/``::

    gen-00000007/                       one directory per generation (mkdir: exclusive)
        master/                         made with the generation; holds rank 0's endpoint only,
            beacon-<instance>.json      so members find the master by listing a 1-entry directory
        beacon-<instance>.json          each participant, replaced on every heartbeat
        rank-00000.claim                owner of rank 0 (link(): exclusive, immutable)
        rank-00001.claim
        release.json                    the decision, written once (link()): released | restart
        store/                          the generation's FolderStore (fs/folderstore.py), made by rank 0
                                        before the release, so no member's lookup of it precedes it

Why a ``master/`` directory: a name looked up before it exists can stay
"absent" in a client's negative lookup cache for the cache's lifetime (61 s
measured on GlusterFS with ``nl-cache``; NFS ``lookupcache=all``), while a
listing of its parent shows it at once.  Members therefore never look up the
master by name: they list ``master/``, which every joiner creates (exclusive
``mkdir``, ``EEXIST`` is fine) before anyone could have looked it up.
"""

from __future__ import annotations

import re

from ..errors import ConfigError

GEN_RE = re.compile(r"^gen-(\d{8})$")
CLAIM_RE = re.compile(r"^rank-(\d{5,})\.claim$")
BEACON_RE = re.compile(r"^beacon-([0-9a-f]{8,64})\.json$")
RELEASE = "release.json"
MASTER_DIR = "master"
MAX_GENERATION = 99_999_999


def gen_name(g: int) -> str:
    """``gen-00000007`` for generation 7."""
    return f"gen-{g:08d}"


def claim_name(g: int, r: int) -> str:
    return f"{gen_name(g)}/rank-{r:05d}.claim"


def beacon_name(g: int, instance: str) -> str:
    return f"{gen_name(g)}/beacon-{instance}.json"


def release_name(g: int) -> str:
    return f"{gen_name(g)}/{RELEASE}"


def member_chunk_name(g: int, writer: str, k: int) -> str:
    """Chunk ``k`` of a big release's member list (written before ``release.json`` names its digest)."""
    return f"{gen_name(g)}/release-{writer}-{k:05d}.json"


def master_dir(g: int) -> str:
    return f"{gen_name(g)}/{MASTER_DIR}"


def store_dir(g: int) -> str:
    """``gen-00000007/store``: generation 7's FolderStore directory (``Rendezvous.folder_store``)."""
    return f"{gen_name(g)}/store"


def master_name(g: int, instance: str) -> str:
    return f"{master_dir(g)}/beacon-{instance}.json"


def claimed_ranks(names: list[str]) -> list[int]:
    """Ranks whose claim files appear in a listing of a generation directory, sorted."""
    # The prefix first: half a big generation's names are beacons, and a regex match costs 4x that.
    return sorted(int(m.group(1)) for m in map(CLAIM_RE.match, [n for n in names if n[:5] == "rank-"]) if m)


def ranges(nums: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (for messages that name ranks)."""
    out, i = [], 0
    nums = sorted(nums)
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}" if j > i + 1 else f"{nums[i]}, {nums[j]}")
        i = j + 1
    return ", ".join(out)


# The job id names the job directory, so its rule lives with the other names (used by the
# options table, the scheduler environment and the torchrun backend alike).
MAX_JOB_ID_LEN = 128
_JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@=-]*$")


def validate_job_id(job_id: str) -> str:
    """Return ``job_id`` if it is safe as one directory name.

    Allowed: letters, digits and ``. _ + @ = -`` (Slurm array ids like
    ``123_4`` and Kubernetes names fit), starting with a letter or digit, at
    most 128 characters.

    Raises:
        ConfigError: empty, too long, ``.``/``..``, or containing ``/``, NUL,
            whitespace, control or other characters.
    """
    if not job_id:
        raise ConfigError("no job id: pass --job-id or set FSMINGLE_JOB_ID (the same on every node)")
    if len(job_id) > MAX_JOB_ID_LEN:
        raise ConfigError(f"job id is {len(job_id)} characters long; at most {MAX_JOB_ID_LEN} are allowed")
    if job_id in (".", "..") or not _JOB_ID_RE.match(job_id):
        raise ConfigError(
            f"job id {job_id!r} is not allowed: use letters, digits and . _ + @ = - only, starting with a "
            "letter or digit (no '/', '..', spaces or control characters)"
        )
    return job_id
