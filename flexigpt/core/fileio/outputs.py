"""Atomic outputs: directories and files that appear complete or not at all.

Every output directory of the harness is written through :func:`atomic_directory`: a
temporary sibling ``.<name>.partial-<pid>-*`` replaces ``<dir>`` by a rename only when the
body succeeded, and gets a marker ``<dir>/.flexigpt-output.json`` (:data:`MARKER`) saying
what kind of output it is and the sha256 of every file it holds.

Safety of outputs (issue 19): ``atomic_directory`` never deletes what it did not create. An
existing non-empty output directory is replaced only when its marker says it is an output
of the same kind and it holds no file the marker does not list (directories written before
markers existed are recognised by their ``manifest.json`` / ``resource.json`` /
``export.json``); anything else raises :class:`OutputExistsError` unless ``force=True``
(CLI ``--force``, :func:`force_outputs`). Replacement is one exchange of the two
directories where the file system has one (:func:`exchange`, Linux ``renameat2``), else two
renames, the previous output moved aside first; a kill between those two leaves the previous
output in ``.<name>.partial-<pid>-*.old-*``, which the next start naming ``<dir>`` renames
back (:func:`restore_swapped`). Leftover ``.<name>.partial-<pid>-*`` siblings of interrupted
saves (dead writer, a marker of the harness's in them) are removed at the start of the next
save to the same output; a folder of that name without one is never touched. Outputs get
the user's umask.

Imports nothing from the harness but :mod:`flexigpt.core.faults`.
"""
from __future__ import annotations

import contextvars
import glob
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flexigpt.core import faults
from flexigpt.core.fileio.exchange import exchange

log = logging.getLogger(__name__)

#: the manifest of a saved model directory (its presence makes an output a ``model``)
MANIFEST = "manifest.json"
#: written by :func:`atomic_directory` into every output directory
MARKER = ".flexigpt-output.json"


class CheckpointError(RuntimeError):
    """A saved model directory is incomplete, corrupt, or inconsistent with its manifest."""


class OutputExistsError(ValueError):
    """An output directory exists and is not a previous output of the same kind."""


_FORCE: contextvars.ContextVar[bool] = contextvars.ContextVar("flexigpt_force", default=False)


@contextmanager
def force_outputs(force: bool = True) -> Iterator[None]:
    """Within the block, :func:`atomic_directory` replaces any existing output (CLI --force)."""
    token = _FORCE.set(bool(force))
    try:
        yield
    finally:
        _FORCE.reset(token)


def current_umask() -> int:
    """The process umask (read without changing it where /proc allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def kind_of(directory: Path) -> str:
    """What a finished output directory holds, from the files it has: ``model``,
    ``export``, ``resource`` or ``directory``."""
    if (directory / MANIFEST).is_file():
        return "model"
    if (directory / "export.json").is_file():
        return "export"
    if (directory / "resource.json").is_file():
        return "resource"
    return "directory"


def tree_entries(directory: Path) -> tuple[list[str], list[str]]:
    """(relative file paths, relative directory paths) under ``directory``, sorted."""
    files: list[str] = []
    dirs: list[str] = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        (dirs if path.is_dir() and not path.is_symlink() else files).append(rel)
    return files, dirs


def read_json_or_none(path: Path) -> Any:
    """The JSON in ``path``; None when it is unreadable or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


#: file names a save writes, for output directories written before markers existed
_LEGACY_MODEL_FILES = re.compile(
    r"(manifest\.json|config\.json|generation_config\.json|model\.safetensors|README\.md|"
    r"modeling_[\w]+\.py|tokenizer[\w.]*|special_tokens_map\.json|added_tokens\.json|"
    r"vocab\.json|merges\.txt|chat_template\.\w+|train_log\.csv|loss_curve\.png|"
    r"selection\.json|trial\.json|export\.json|resource\.json)")


def _foreign(out: Path, kind: str | None) -> str | None:
    """Why ``out`` must not be replaced by an output of ``kind`` (None: it may be)."""
    if not out.exists():
        return None
    if not out.is_dir():
        return "it is not a directory"
    files, dirs = tree_entries(out)
    marker = read_json_or_none(out / MARKER)
    if not dirs and (not files or (files == [MARKER] and isinstance(marker, dict)
                                   and "staging" in marker)):
        return None  # empty, or a staging directory of the harness not yet written to
    if isinstance(marker, dict) and isinstance(marker.get("files"), dict):
        listed = set(marker["files"]) | {MARKER}
        parents = {p.rsplit("/", i)[0] for p in listed for i in range(1, p.count("/") + 1)}
        extra = [f for f in files if f not in listed] + [d for d in dirs if d not in parents]
        if extra:
            return f"it holds {extra[:3]} that no previous save wrote"
        old = marker.get("kind")
        if kind is not None and old is not None and old != kind:
            return f"it holds a {old} output, not a {kind}"
        return None
    # written before markers: recognise the harness's own layouts
    manifest, stamp = read_json_or_none(out / MANIFEST), read_json_or_none(out / "resource.json")
    if isinstance(stamp, dict) and isinstance(stamp.get("files"), list):
        listed = set(stamp["files"]) | {"resource.json"}
        parents = {p.rsplit("/", i)[0] for p in listed for i in range(1, p.count("/") + 1)}
        extra = [f for f in files if f not in listed] + [d for d in dirs if d not in parents]
        if extra:
            return f"it holds {extra[:3]} that the resource build did not write"
        old = "resource"
    elif (isinstance(manifest, dict) and "format_version" in manifest) or (
            out / "export.json").is_file():
        extra = [f for f in files if "/" in f or not _LEGACY_MODEL_FILES.fullmatch(f)] + dirs
        if extra:
            return f"it holds {extra[:3]} that a save does not write"
        old = "model" if isinstance(manifest, dict) else "export"
    else:
        return "it is not an output of flexigpt-bench (no manifest.json or output marker)"
    if kind is not None and old != kind:
        return f"it holds a {old} output, not a {kind}"
    return None


def foreign_reason(directory: str | os.PathLike, kind: str | None) -> str | None:
    """Why the harness must not replace or delete ``directory`` (None: absent, empty, or an
    output of ``kind`` it wrote that holds nothing its marker does not list); the check
    :func:`check_output` and :func:`atomic_directory` apply, for a caller with its own
    message (a trainer's checkpoint folder, which ``--force`` does not cover)."""
    return _foreign(Path(directory), kind)


def check_output(out_dir: str | os.PathLike, kind: str | None = None,
                 force: bool | None = None) -> None:
    """Raise :class:`OutputExistsError` if saving to ``out_dir`` would destroy foreign data.

    Call it before expensive work; :func:`atomic_directory` checks again when it replaces.
    """
    if _FORCE.get() if force is None else force:
        return
    out = Path(out_dir)
    reason = _foreign(out, kind)
    if reason is not None:
        raise OutputExistsError(
            f"output directory {str(out)!r} exists and {reason}; refusing to replace it "
            "(choose another --out, or pass --force / force=True to replace it)")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _writer_gone(name: str, prefix: str) -> bool:
    """Whether the process whose pid follows ``prefix`` in ``name`` is gone (a name
    without a pid counts as gone; this process is never gone)."""
    pid = name[len(prefix):].split("-", 1)[0]
    return not (pid.isdigit() and (int(pid) == os.getpid() or _pid_alive(int(pid))))


def _harness_made(directory: Path) -> bool:
    """Whether a staging or moved-aside directory is the harness's own: empty (killed
    between its creation and its stamp), or holding an output marker (the staging stamp
    :func:`make_staging` writes first, or a finished output's marker)."""
    try:
        if not any(directory.iterdir()):
            return True
    except OSError:
        return False
    return isinstance(read_json_or_none(directory / MARKER), dict)


def make_staging(out: str | os.PathLike) -> Path:
    """A new staging directory ``.<name>.partial-<pid>-*`` beside ``out``, stamped with an
    output marker at once, so that :func:`clean_partials` knows it for the harness's own
    (the body's final marker replaces the stamp)."""
    out = Path(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))
    (tmp / MARKER).write_text(json.dumps({"staging": os.getpid()}) + "\n")
    return tmp


def clean_partials(out_dir: str | os.PathLike) -> list[Path]:
    """Remove ``.<name>.partial-*`` siblings left by interrupted saves to ``out_dir``, and
    the ``..<name>.partial-*`` ones of a save nested in such a staging directory (a model
    saved into the staging directory of a training output).

    A partial whose writer process (pid in its name) is still alive is kept, and so is a
    directory the harness did not make, whatever its name (no output marker in it: see
    :func:`_harness_made`); it is named in a warning instead.
    """
    out = Path(out_dir)
    removed: list[Path] = []
    if not out.parent.is_dir():
        return removed
    prefixes = (f".{out.name}.partial-", f"..{out.name}.partial-")
    for path in out.parent.iterdir():
        prefix = next((p for p in prefixes if path.name.startswith(p)), None)
        if prefix is None or not _writer_gone(path.name, prefix):
            continue
        if path.is_dir() and not path.is_symlink():
            if not _harness_made(path):
                log.warning("left %s alone: it is named like a staging directory of %s but "
                            "flexigpt-bench did not make it (no output marker)", path, out)
                continue
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def restore_swapped(out_dir: str | os.PathLike) -> Path | None:
    """Put back the previous output of a save cut between the two renames of its swap.

    Where the file system cannot exchange two directories in one step,
    :func:`atomic_directory` moves the previous output aside
    (``.<name>.partial-<pid>-*.old-*``) and then renames the new one into place; a kill
    between the two leaves no ``out_dir``. When ``out_dir`` is missing and such a folder of
    a dead writer holds an output marker, it is renamed back to ``out_dir`` (the newest if
    there are several). Returns the folder restored from, None when there was nothing to
    restore; call it first on every start that names ``out_dir``, and say so.
    """
    out = Path(out_dir)
    if out.exists() or out.is_symlink() or not out.parent.is_dir():
        return None
    prefix = f".{out.name}.partial-"
    found = [p for p in out.parent.iterdir()
             if p.name.startswith(prefix) and ".old-" in p.name and p.is_dir()
             and not p.is_symlink() and _writer_gone(p.name, prefix)
             and isinstance(read_json_or_none(p / MARKER), dict)
             and "staging" not in read_json_or_none(p / MARKER)]
    if not found:
        return None
    old = max(found, key=lambda p: p.stat().st_mtime_ns)
    os.replace(old, out)
    return old


#: (device, inode, size, mtime_ns) → sha256, so a file is hashed once per process
_SHA_CACHE: dict[tuple[int, int, int, int], str] = {}


def cached_sha256(path: Path) -> str:
    """:func:`sha256_file` of ``path``, computed once per (device, inode, size, mtime)."""
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256_file(path)
    return _SHA_CACHE[key]


def _write_marker(directory: Path) -> None:
    files, _ = tree_entries(directory)
    inner = read_json_or_none(directory / MARKER)
    kind = kind_of(directory)
    if kind == "directory" and isinstance(inner, dict) and inner.get("kind"):
        kind = inner["kind"]
    marker = {"kind": kind, "files": {
        f: (f"symlink:{os.readlink(directory / f)}" if (directory / f).is_symlink()
            else cached_sha256(directory / f)) for f in files if f != MARKER}}
    (directory / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n")


def _apply_umask(directory: Path) -> None:
    mask = current_umask()
    directory.chmod(0o777 & ~mask)
    for path in directory.rglob("*"):
        if path.is_symlink():
            continue
        if path.is_dir():
            path.chmod(0o777 & ~mask)
        elif path.stat().st_mode & 0o777 == 0o600:  # mkstemp's mode: widen per umask
            path.chmod(0o666 & ~mask)


@contextmanager
def atomic_directory(out_dir: str | os.PathLike, force: bool | None = None,
                     kind: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling directory that replaces ``out_dir`` only on success.

    Nothing that looks complete is left behind if the body raises or is interrupted, and
    nothing is destroyed that this harness did not write: an existing non-empty ``out_dir``
    must be a previous output of the same ``kind`` (see :func:`check_output`) unless
    ``force`` (default: :func:`force_outputs`' setting). ``kind`` (``model``, ``export``,
    ...) is checked up front when given and inferred from the written files at the end.

    Raises:
        OutputExistsError: ``out_dir`` holds something else (nothing is written).
    """
    out = Path(out_dir)
    force = _FORCE.get() if force is None else force
    restored = restore_swapped(out)
    if restored is not None:
        log.warning("restored the previous output %s from %s (a save was cut between the two "
                    "renames of its swap)", out, restored.name)
    check_output(out, kind, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_partials(out)
    tmp = make_staging(out)
    old = None
    try:
        yield tmp
        faults.point("save:staged")
        _write_marker(tmp)
        check_output(out, kind_of(tmp) if kind is None else kind, force)
        _apply_umask(tmp)
        if out.is_symlink() or out.is_file():
            out.unlink()
        elif out.exists() and exchange(tmp, out):  # one step: tmp now holds the previous
            faults.point("save:swap")
            return
        elif out.exists():
            old = out.parent / f"{tmp.name}.old-{secrets.token_hex(4)}"
            os.replace(out, old)
            faults.point("save:swap")
        os.replace(tmp, out)
    finally:
        if old is not None and old.exists() and not out.exists():
            os.replace(old, out)  # interrupted between the renames: the previous stays
        for leftover in (tmp, old):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a UTF-8 text file atomically (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write a file via a temporary sibling and ``os.replace`` (mode per umask); the
    temporaries of an earlier write of ``path`` that was killed are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.tmp-*"):
        if stale.is_file():
            stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~current_umask())
        faults.point("write:staged")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """The hex sha256 of the file at ``path``, read in ``chunk``-byte blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
