"""The CLI's checks before heavy work, and the one line an output write failure becomes.

:func:`check_writable` proves that ``--out`` can be written (by creating and removing a
nameless temporary file where the save will create its staging directory), so a read-only
or unwritable output fails in a second, naming ``--out``, not after loading and
compressing a model and naming a staging directory. :func:`write_failure` turns an I/O
error raised while a command writes its output (disk full surfaced by safetensors as
``SafetensorError``, ``OSError`` on a staging file) into one line naming ``--out``; the
atomic save has already removed its staging directory, so a previous output is intact.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from pathlib import Path


class OutputNotWritableError(OSError):
    """The output path cannot be written (read-only file system, permissions, a file where
    a directory must be)."""


#: errors that are a full disk wherever they are raised while an output is written
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (what ``mkdir -p`` would create in)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(path.anchor or ".")


def _probe(directory: Path) -> OSError | None:
    """The error of creating a file in ``directory`` (None: it can be written). The probe
    is nameless where the file system allows (``O_TMPFILE``), else removed at once."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return None
    except OSError as err:
        return err


def check_writable(out: str | os.PathLike, flag: str = "--out",
                   directory: bool = True) -> None:
    """Raise :class:`OutputNotWritableError` naming ``flag`` and ``out`` unless ``out`` can be
    (re)written: the directory its save creates it in (the nearest existing ancestor of its
    parent) must be a writable directory, and an existing output directory (``directory``:
    the output is a directory) must be writable too (replacing it removes its files).

    Tested by creating a file there, so it holds for root, read-only mounts and immutable
    directories alike.
    """
    out = Path(out)
    home = _nearest_existing(out.parent)
    if not home.is_dir():
        raise OutputNotWritableError(f"cannot write {flag} {str(out)!r}: {str(home)!r} is "
                                     "not a directory")
    targets = [home] + ([out] if directory and out.is_dir() and not out.is_symlink() else [])
    for target in targets:
        err = _probe(target)
        if err is not None:
            raise OutputNotWritableError(
                f"cannot write {flag} {str(out)!r}: {str(target)!r} is not writable "
                f"({err.strerror or err})")


def check_free_space(out: str | os.PathLike, need: int, what: str,
                     flag: str = "--out") -> None:
    """Raise :class:`OutputNotWritableError` naming ``flag`` and ``out`` when the file system
    ``out`` is written on has less than ``need`` bytes free (``what``: where the estimate
    comes from), so a full disk is found before the compute, not at write time."""
    import shutil

    home = _nearest_existing(Path(out).parent)
    free = shutil.disk_usage(home if home.is_dir() else home.parent).free
    if need > free:
        raise OutputNotWritableError(
            f"{flag} {str(out)!r}: {free / 2**30:.2f} GiB free on its file system, the output "
            f"needs about {need / 2**30:.2f} GiB ({what}); free space or choose another {flag}")


def _io_reason(err: BaseException) -> str | None:
    """The I/O problem behind ``err`` if it is a failed write (else None): an ``OSError``'s
    strerror, or the ``I/O error: ...`` part of a safetensors serialisation error."""
    if isinstance(err, OSError):
        return err.strerror or str(err)
    if type(err).__name__ == "SafetensorError":
        found = re.search(r"I/O error: (.*?)(?: \(os error \d+\))?(?: at path .*)?$", str(err))
        if "serializ" in str(err) and found:
            return found.group(1)
    return None


def _inside(filename: object, out: Path) -> bool:
    """Whether an error's file is ``out``, in it, or in a staging / checkpoint sibling of it."""
    if not isinstance(filename, (str, bytes, os.PathLike)):
        return False
    path = Path(os.fsdecode(filename)).absolute()
    out = out.absolute()
    siblings = (f".{out.name}.partial-", f"..{out.name}.partial-", f"{out.name}.ckpt")
    for part in (path, *path.parents):
        if part == out or (part.parent == out.parent and part.name.startswith(siblings)):
            return True
    return False


def write_failure(err: BaseException, out: str | os.PathLike | None,
                  flag: str = "--out") -> str | None:
    """One line for an I/O error raised while writing ``out`` (None: ``err`` is not one).

    A full disk (``ENOSPC``/``EDQUOT``/``EFBIG``, also as safetensors' ``SafetensorError``)
    counts wherever it is raised; any other ``OSError`` counts when its file is ``out``, in
    it, or in its staging or checkpoint siblings (whose names the user never chose).
    """
    if out is None:
        return None
    reason = _io_reason(err)
    if reason is None:
        return None
    out = Path(out)
    if isinstance(err, OSError) and err.errno not in _FULL and not (
            _inside(err.filename, out) or _inside(err.filename2, out)):
        return None
    return (f"cannot write {flag} {str(out)!r}: {reason} (nothing was replaced: a previous "
            "output there is intact)")
