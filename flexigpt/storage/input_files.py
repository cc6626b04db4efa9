"""Reading the user's input files: one clear error naming the file, or verified contents.

Every text the harness reads (calibration, training, perplexity) goes through
:func:`read_text`, every local benchmark file through :func:`check_jsonl`; both check the
file against the sha256 recorded when it was built (:func:`verify_recorded`): resource
builders write through :func:`flexigpt.core.fileio.atomic_directory`, whose
``.flexigpt-output.json`` marker lists the sha256 of every file, so an edited or truncated
calibration text or benchmark file is refused instead of silently changing results. Files
outside any marked directory (a user's own text) have nothing recorded and are read as is.

Checks are cached per (path, size, mtime): a file is hashed and parsed once per process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flexigpt.core.fileio import MARKER, CheckpointError, verify_files


class InputFileError(ValueError):
    """An input file is missing, not a regular file, not UTF-8, malformed, or changed since
    its recorded build."""


#: (absolute path, size, mtime_ns) of files already verified / parsed in this process
_VERIFIED: set[tuple[str, int, int]] = set()
_JSONL_OK: set[tuple[str, int, int]] = set()


def _key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.absolute()), st.st_size, st.st_mtime_ns


def check_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` as a :class:`Path` if it is an existing regular file.

    Raises:
        InputFileError: it does not exist, or is a directory / something else.
    """
    path = Path(path)
    if path.is_dir():
        raise InputFileError(f"{what} {str(path)!r} is a directory, not a text file")
    if not path.exists():
        raise InputFileError(f"{what} {str(path)!r} does not exist")
    if not path.is_file():
        raise InputFileError(f"{what} {str(path)!r} is not a regular file")
    return path


def check_text(path: str | os.PathLike, what: str = "text file") -> Path:
    """:func:`read_text` (a regular UTF-8 file, as recorded), which must hold something.

    Raises:
        InputFileError: as :func:`read_text`, or the file is empty / whitespace only, or
            mostly control characters (:data:`MAX_CONTROL_SHARE`: NUL bytes are valid
            UTF-8 but no text to train, calibrate or score on).
    """
    text = read_text(path, what)
    if not text.strip():
        raise InputFileError(f"{what} {str(path)!r} is empty")
    control = control_share(text)
    if control > MAX_CONTROL_SHARE:
        raise InputFileError(f"{what} {str(path)!r} is {control:.0%} control characters (NUL "
                             "bytes or other non-text), not text")
    return Path(path)


#: the largest share of control characters (other than tab, newline, carriage return and
#: form feed) a text file may hold: a file of NUL bytes or binary data is no text
MAX_CONTROL_SHARE = 0.5


def control_share(text: str) -> float:
    """The share of ``text``'s characters that are control characters (Unicode category
    ``Cc``) other than whitespace; 0.0 for an empty text."""
    import unicodedata

    if not text:
        return 0.0
    control = sum(1 for ch in text if ch not in "\t\n\r\f\v"
                  and unicodedata.category(ch) == "Cc")
    return control / len(text)


def recorded_digest(path: str | os.PathLike) -> tuple[Path, str, str] | None:
    """``(marked directory, relative name, sha256)`` recorded for ``path`` by the nearest
    enclosing directory that has an output marker; None when that marker does not list it
    or no enclosing directory has one."""
    path = Path(path).absolute()
    for directory in path.parents:
        marker = directory / MARKER
        if not marker.is_file():
            continue
        try:
            files = json.loads(marker.read_text(encoding="utf-8")).get("files")
        except (OSError, ValueError, AttributeError):
            return None
        rel = path.relative_to(directory).as_posix()
        digest = files.get(rel) if isinstance(files, dict) else None
        return (directory, rel, digest) if isinstance(digest, str) else None
    return None


def verify_recorded(path: str | os.PathLike, what: str = "file") -> None:
    """Check ``path`` against the sha256 its directory's marker recorded (if any).

    Raises:
        InputFileError: the file's sha256 differs from the recorded one.
    """
    path = Path(path)
    key = _key(path)
    if key in _VERIFIED:
        return
    recorded = recorded_digest(path)
    if recorded is not None:
        directory, rel, digest = recorded
        try:
            verify_files(directory, {rel: digest}, MARKER)
        except CheckpointError:
            raise InputFileError(
                f"{what} {str(path)!r} changed since it was built: its sha256 differs from "
                f"the one recorded in {str(directory / MARKER)!r}; restore it or rebuild "
                f"{str(directory)!r} (flexigpt fetch ... --force)") from None
    _VERIFIED.add(key)


def read_text(path: str | os.PathLike, what: str = "text file") -> str:
    """The UTF-8 contents of a regular file, verified against its recorded sha256.

    Raises:
        InputFileError: missing, a directory, not UTF-8 (names the byte position), or
            changed since its recorded build.
    """
    path = check_file(path, what)
    verify_recorded(path, what)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFileError(
            f"{what} {str(path)!r} is not UTF-8 text: byte 0x{data[err.start]:02x} at "
            f"position {err.start} ({err.reason})") from None


def check_jsonl(path: str | os.PathLike, what: str = "benchmark file") -> Path:
    """Check that ``path`` is a JSON-lines file of objects with one set of keys, as the
    ``datasets`` JSON loader needs it, and that it matches its recorded sha256.

    Blank lines are skipped (the loader skips them too).

    Raises:
        InputFileError: naming the file and the 1-based line of the first bad row.
    """
    path = check_file(path, what)
    verify_recorded(path, what)
    key = _key(path)
    if key in _JSONL_OK:
        return path
    keys: frozenset[str] | None = None
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            row = _parse_row(path, number, raw, what)
            if keys is None:
                keys = frozenset(row)
            elif frozenset(row) != keys:
                raise InputFileError(
                    f"{what} {str(path)!r} line {number}: its keys {sorted(row)} differ "
                    f"from the first row's {sorted(keys)}")
    if keys is None:
        raise InputFileError(f"{what} {str(path)!r} has no rows")
    _JSONL_OK.add(key)
    return path


def _parse_row(path: Path, number: int, raw: bytes, what: str) -> dict:
    """One JSONL row as a dict, or :class:`InputFileError` naming file and line."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise InputFileError(f"{what} {str(path)!r} line {number}: not UTF-8 (byte "
                             f"0x{raw[err.start]:02x} at column {err.start + 1})") from None
    except json.JSONDecodeError as err:
        raise InputFileError(f"{what} {str(path)!r} line {number}: not valid JSON ({err.msg} "
                             f"at column {err.colno}); is the file truncated?") from None
    if not isinstance(row, dict):
        raise InputFileError(f"{what} {str(path)!r} line {number}: a JSON "
                             f"{type(row).__name__}, not an object")
    return row
