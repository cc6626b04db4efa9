"""Checks that a directory holds only what was recorded, and nothing outside itself.

Trust (issue 37): a loader reads nothing a save did not record and no path outside the
directory. Every path a record (a manifest's ``files``, an output marker) names must lie
inside the directory — relative, without ``..``, no symlink out (:func:`check_inside`) —
before anything is opened or hashed; a directory may hold no file its record does not list
(:func:`check_listed`) except the engine's own :data:`WORKFLOW_FILES`; every listed file
must be unchanged (:func:`verify_files`, sha256). :func:`verify_marker` applies all three
to a harness-written directory through its ``.flexigpt-output.json`` marker.

Imports nothing from the harness but :mod:`flexigpt.core.fileio.outputs`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath

from flexigpt.core.fileio import outputs  # outputs.cached_sha256 looked up per call (one spy)
from flexigpt.core.fileio.outputs import MARKER, CheckpointError, read_json_or_none, tree_entries

#: files a model card rewrite (``flexigpt export --card``) may change after the save
REWRITABLE = frozenset({"README.md"})
#: files a workflow engine writes into a directory output after the harness saved it
#: (Snakemake touches ``.snakemake_timestamp`` in every ``directory()`` output); no loader
#: reads them, so they are allowed at the top level of any checked directory
WORKFLOW_FILES = frozenset({".snakemake_timestamp"})
#: suffixes of pickled weight formats, which the harness never loads (they can run code)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def escapes(name: str) -> bool:
    """Whether the recorded path ``name`` could name something outside its directory by
    its spelling alone: empty, absolute (POSIX or Windows), or with a ``..`` part."""
    parts = name.replace("\\", "/").split("/")
    return (not name or PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute()
            or bool(PureWindowsPath(name).drive) or ".." in parts)


class InputOverlapError(ValueError):
    """An output path that is, lies inside, or contains one of the command's inputs."""


def beside_prefixes(name: str) -> tuple[str, ...]:
    """The name prefixes of what a save to a path called ``name`` writes, or removes,
    beside it: its staging directories (``.<name>.partial-*``, with the ``.old-*`` a swap
    moves the previous output to; ``..<name>.partial-*`` of a save nested in one) and the
    temporaries of an atomic file write (``.<name>.tmp-*``)."""
    return (f".{name}.partial-", f"..{name}.partial-", f".{name}.tmp-")


def _overlap(target: Path, source: Path) -> str | None:
    """How ``target`` (an output) and ``source`` (an input) overlap, both resolved: ``is``,
    ``lies inside``, ``contains``; None when they are apart."""
    if target == source:
        return "is"
    if source in target.parents:
        return "lies inside"
    if target in source.parents:
        return "contains"
    return None


def _beside_overlap(out: Path, source: Path, beside: Iterable[str]) -> str | None:
    """The path written beside ``out`` that is or contains the input ``source`` (resolved),
    as the user would see it; None when there is none. ``beside`` are the names of the
    fixed siblings in ``out``'s folder (``<out>.ckpt``); every sibling's staging and
    temporary names (:func:`beside_prefixes`) are checked as well."""
    parent = out.parent.resolve()
    names = [out.name, *beside]
    for name in names[1:]:
        sibling = (parent / name).resolve()
        if sibling == source or sibling in source.parents:
            return str(out.parent / name)
    prefixes = tuple(p for name in names for p in beside_prefixes(name))
    for part in (source, *source.parents):
        if part.parent == parent and part.name.startswith(prefixes):
            return str(out.parent / part.name)
    return None


def check_apart(out: str | os.PathLike, inputs: dict[str, str | os.PathLike | None],
                out_flag: str = "--out", beside: Iterable[str] = ()) -> None:
    """Refuse an output that would land in, or replace, an input: ``out`` equal to, inside,
    or containing any existing path of ``inputs`` (``{flag: path}``; None, ``''`` (no path: never
    the working directory) and paths that do not exist, such as hub ids, are skipped), both
    resolved through symlinks. What the command writes beside ``out`` is an output too: the
    siblings named in ``beside`` (names in ``out``'s folder: a trainer's ``<out>.ckpt``, an
    evaluation's records) and every staging, moved-aside and temporary name derived from
    ``out`` and from them (:func:`beside_prefixes`) may neither be nor contain an input.
    One line naming both paths, before any work.

    Raises:
        InputOverlapError: the first overlap found.
    """
    written = Path(out).expanduser().absolute()
    target = written.resolve()
    beside = tuple(beside)
    for flag, path in inputs.items():
        if path is None or str(path) == "" or not Path(path).expanduser().exists():
            continue
        source = Path(path).expanduser().resolve()
        how = _overlap(target, source)
        if how is not None:
            raise InputOverlapError(
                f"{out_flag} {out} ({target}) {how} the input {flag} {path} ({source}): "
                "outputs are kept apart from inputs, so one cannot replace or land in the "
                "other")
        sibling = _beside_overlap(written, source, beside)
        if sibling is not None:
            how = "is" if Path(sibling).resolve() == source else "contains"
            raise InputOverlapError(
                f"{out_flag} {out} writes {sibling} beside it, which {how} the input {flag} "
                f"{path} ({source}): outputs are kept apart from inputs, so one cannot "
                "replace or land in the other")


def check_inside(directory: str | os.PathLike, names: Iterable[str], what: str) -> None:
    """Raise :class:`CheckpointError` unless every path in ``names`` (recorded in ``what``)
    lies inside ``directory``: relative, without ``..``, and not a symlink (or under a
    symlinked folder) that resolves outside. Reads no file: call it before opening or
    hashing any recorded path, so a record cannot make the loader read (or reveal the
    existence of) anything outside the directory."""
    directory = Path(directory)
    root = directory.resolve()
    bad = sorted(n for n in names
                 if escapes(n) or not (directory / n).resolve().is_relative_to(root))
    if bad:
        raise CheckpointError(f"{str(directory)!r}: {what} names {bad[:5]} outside the "
                              "directory (absolute, '..' or a symlink out); refusing to open it")


def unlisted(directory: str | os.PathLike, allowed: Iterable[str]) -> list[str]:
    """The files under ``directory`` (relative POSIX paths, symlinks included, any depth)
    that are not in ``allowed`` nor top-level :data:`WORKFLOW_FILES`, sorted."""
    allowed = {*allowed, *WORKFLOW_FILES}
    files, _ = tree_entries(Path(directory))
    return [f for f in files if f not in allowed]


def check_listed(directory: str | os.PathLike, allowed: Iterable[str], what: str) -> None:
    """Raise :class:`CheckpointError` naming every file in ``directory`` that is not in
    ``allowed`` (what ``what`` records): a file added after the save could change what
    transformers' loaders read (tokenizer side files, chat templates) unnoticed."""
    extra = unlisted(directory, allowed)
    if extra:
        raise CheckpointError(
            f"{str(directory)!r} holds {extra[:8]}{' …' if len(extra) > 8 else ''} that "
            f"{what} does not list (added after the save?); flexigpt-bench loads only the "
            "files a save recorded — remove them")


def verify_files(model_dir: str | os.PathLike, recorded: dict[str, str], what: str) -> None:
    """Raise :class:`CheckpointError` naming every file whose sha256 differs from
    ``recorded`` (or is missing). Every recorded path is checked to lie inside
    ``model_dir`` (:func:`check_inside`) before any is opened. A ``symlink:<target>`` entry
    (a marker's record of a symlink) must still be that symlink; :data:`REWRITABLE`
    files and the marker are not hashed."""
    model_dir = Path(model_dir)
    check_inside(model_dir, recorded, what)
    bad, missing = [], []
    for name, digest in sorted(recorded.items()):
        path = model_dir / name
        if name in REWRITABLE or name == MARKER:
            continue
        if digest.startswith("symlink:"):
            if not path.is_symlink():
                missing.append(name)
            elif os.readlink(path) != digest[len("symlink:"):]:
                bad.append(name)
        elif not path.is_file():
            missing.append(name)
        elif outputs.cached_sha256(path) != digest:
            bad.append(name)
    if missing:
        raise CheckpointError(f"{str(model_dir)!r}: {missing} recorded in {what} are missing")
    if bad:
        raise CheckpointError(f"{str(model_dir)!r}: {bad} changed since the save (sha256 "
                              f"differs from {what})")


def verify_marker(directory: str | os.PathLike) -> None:
    """Check a harness-written directory against its ``.flexigpt-output.json``: every
    recorded path inside the directory, no file the marker does not list, every listed
    file unchanged (no marker: nothing to check). Raises :class:`CheckpointError` naming
    what is wrong."""
    marker = read_json_or_none(Path(directory) / MARKER)
    if isinstance(marker, dict) and isinstance(marker.get("files"), dict):
        recorded = marker["files"]
        if not all(isinstance(v, str) for v in recorded.values()):
            raise CheckpointError(f"{str(Path(directory) / MARKER)!r} is not a valid marker "
                                  "(its 'files' values must be strings)")
        check_inside(directory, recorded, MARKER)
        check_listed(directory, {*recorded, MARKER}, MARKER)
        verify_files(directory, recorded, MARKER)


def check_safetensors(path: str | os.PathLike) -> None:
    """Refuse a damaged safetensors file before a library reads it, naming the file and
    what is wrong: shorter than the 8-byte header length, a header longer than the file,
    a header that is not a JSON object, or tensor data that ends past the file's end
    (truncated, or a header alone). Reads the header only.

    Raises:
        CheckpointError: one line naming ``path``.
    """
    import json

    path = Path(path)
    size = path.stat().st_size
    damaged = f"weights file {str(path)!r} is damaged"
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{damaged}: {size} bytes, too short for a safetensors "
                                  "header")
        length = int.from_bytes(head, "little")
        if 8 + length > size:
            raise CheckpointError(f"{damaged}: its header claims {length:,} bytes, the file "
                                  f"holds {size - 8:,} after the length (truncated?)")
        try:
            header = json.loads(fh.read(length))
        except ValueError:
            header = None
    if not isinstance(header, dict):
        raise CheckpointError(f"{damaged}: its header is not a safetensors JSON header")
    ends = [entry["data_offsets"][1] for key, entry in header.items()
            if key != "__metadata__" and isinstance(entry, dict)
            and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2
            and isinstance(entry["data_offsets"][1], int)]
    data = size - 8 - length
    if ends and max(ends) > data:
        raise CheckpointError(f"{damaged}: truncated, its tensors need {max(ends):,} bytes of "
                              f"data and it holds {data:,}")
