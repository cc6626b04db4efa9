"""Checking a model folder of the local Hugging Face hub cache against the hashes the hub
recorded for its files.

``huggingface_hub`` stores each downloaded file once, as ``blobs/<etag>``, and links it
into ``snapshots/<commit>/<path>``. The ETag is what the hub recorded for the file: the
sha256 of a large (LFS) file, the git blob sha1 of a small one. ``huggingface_hub`` checks
a download's size, never its content, so a file changed in transit, by a mirror or in the
cache is only caught by hashing it here: :func:`snapshot_problems`.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from flexigpt.core.fileio import outputs  # outputs.cached_sha256 looked up per call

_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")


def git_blob_sha1(path: str | os.PathLike) -> str:
    """The git object id of the file at ``path`` (``sha1("blob <size>\\0" + bytes)``)."""
    digest = hashlib.sha1(b"blob %d\0" % Path(path).stat().st_size)
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def file_problem(path: Path) -> str | None:
    """What is wrong with one file of a snapshot folder (None: it holds what the hub
    recorded): not a link to a blob of the cache, a blob named by no hash, or a blob whose
    bytes hash to something else than its name."""
    if not path.is_symlink():
        return f"{path.name} is no link into the hub cache's blobs, so its hash is unknown"
    blob = path.resolve()
    if blob.parent.name != "blobs" or not blob.is_file():
        return f"{path.name} links to {str(blob)!r}, not to a file of the hub cache's blobs"
    etag = blob.name
    if _SHA256.fullmatch(etag):
        actual, kind = outputs.cached_sha256(blob), "sha256"
    elif _GIT_SHA1.fullmatch(etag):
        actual, kind = git_blob_sha1(blob), "git blob sha1"
    else:
        return f"{path.name}: the hub gave no hash for it (ETag {etag!r})"
    if actual != etag:
        return f"{path.name}: {kind} {actual[:12]}…, the hub recorded {etag[:12]}…"
    return None


def snapshot_problems(folder: str | os.PathLike) -> list[str]:
    """One line per file of the snapshot ``folder`` (its files at every depth) that is not
    what the hub recorded (:func:`file_problem`); empty when every one is."""
    folder = Path(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_symlink() or p.is_file())
    return [problem for p in files if (problem := file_problem(p)) is not None]
