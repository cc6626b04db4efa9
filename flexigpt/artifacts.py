"""Saving and reloading compressed models: weights + manifest, written atomically.

Layout of a saved model directory::

    <dir>/manifest.json        what was done (method, structure, params, seeds, versions)
    <dir>/config.json          HF config of the compressed architecture (non-plain models:
                               model_type "flexigpt_compressed" + auto_map, see
                               flexigpt/export/checkpoint.py)
    <dir>/modeling_flexigpt_compressed.py   non-plain models: transformers remote code
    <dir>/model.safetensors    weights; shared storage is stored once
    <dir>/tokenizer*.json ...  the tokenizer
    <dir>/README.md            model card generated from the manifest

    <dir>/.flexigpt-output.json  written by ``atomic_directory``: what kind of output this is
                               and the sha256 of every file it wrote (see below)

``load_compressed`` rebuilds the skeleton through the method registry and loads weights,
so every method's output (baselines included) reloads with one call.

Safety of outputs (issue 19): ``atomic_directory`` never deletes what it did not create. An
existing non-empty output directory is replaced only when its ``.flexigpt-output.json``
marker says it is an output of the same kind and it holds no file the marker does not list
(directories written before markers existed are recognised by their ``manifest.json`` /
``resource.json`` / ``export.json``); anything else raises :class:`OutputExistsError` unless
``force=True`` (CLI ``--force``). Replacement is a rename, and leftover
``.<name>.partial-<pid>-*`` siblings of interrupted saves (dead writer) are removed at the
start of the next save to the same output. Outputs get the user's umask.

Integrity: the weights are written canonically (sharing metadata in sorted order), so
identical runs give byte-identical files; ``manifest.json`` records the sha256 of the
weights and of every other file the rebuild reads (``files``), and ``load_compressed``
checks them, the structure against ``config.json`` and the weights' sharing against the
rebuilt skeleton. :func:`manifest_hash` ignores only the fields that are meant to differ
between identical runs (:data:`VOLATILE_KEYS`: timestamps and timings).

Trust (issue 37): loading never runs or unpickles anything a directory brings along, and
reads nothing a save did not record. ``manifest.json``'s ``files`` lists every file the
save wrote besides itself, the weights (``weights``) and the marker; ``load_compressed``
refuses a directory holding any other file (:func:`check_listed`) except the records that
no loader reads (:data:`RECORD_FILES`: the model card, a training run's log, curve and
sweep records), so a tokenizer file dropped in later cannot change the model under an
unchanged :func:`manifest_hash`. A manifest without ``files`` (saved before file hashes
were recorded, migrated to ``{}``) cannot tell its own files from added ones: it loads
only with ``verify=False`` (check the directory, then save it again to record them).
Every path a manifest or marker names must lie inside the directory — relative, without
``..``, no symlink out (:func:`check_inside`) — or the load stops before anything is
opened or hashed. Weights are safetensors only: pickled formats (:data:`PICKLE_SUFFIXES`)
are refused by name before torch sees them. A harness-written directory without a
manifest is held to its marker the same way (:func:`verify_marker`). Remote code is
refused in :mod:`flexigpt.models.loading` (``refuse_remote_code``): every harness load
passes ``trust_remote_code=False``.
"""

from __future__ import annotations

import contextvars
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import torch
from torch import nn

from flexigpt import faults

if TYPE_CHECKING:
    from flexigpt.manifest import Manifest

MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
#: the ``format_version`` :func:`save_compressed` writes (see :mod:`flexigpt.manifest`)
FORMAT_VERSION = 1
#: written by :func:`atomic_directory` into every output directory
MARKER = ".flexigpt-output.json"
#: manifest keys (at any depth outside ``structure``) that differ between identical runs;
#: :func:`manifest_hash` leaves them out
VOLATILE_KEYS = frozenset({"created", "compress_seconds", "timings", "train_seconds",
                           "wall_seconds", "tokens_per_second", "build_seconds", "built_at"})
#: files a model card rewrite (``flexigpt export --card``) may change after the save
_REWRITABLE = frozenset({"README.md"})
#: files a saved model directory may hold without its manifest listing them: written after
#: the manifest (the model card; a training run's log, curve and LR-sweep records) and read
#: by no model, config or tokenizer loader
RECORD_FILES = frozenset({"README.md", "train_log.csv", "loss_curve.png", "selection.json",
                          "trial.json"})
#: suffixes of pickled weight formats, which the harness never loads (they can run code)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


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


@dataclass
class LoadedModel:
    """A model with its tokenizer and (for harness outputs) its manifest."""

    model: nn.Module
    tokenizer: Any
    manifest: Manifest | None


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


def _kind_of(directory: Path) -> str:
    """What a finished output directory holds, from the files it has."""
    if (directory / MANIFEST).is_file():
        return "model"
    if (directory / "export.json").is_file():
        return "export"
    if (directory / "resource.json").is_file():
        return "resource"
    return "directory"


def _entries(directory: Path) -> tuple[list[str], list[str]]:
    """(relative file paths, relative directory paths) under ``directory``, sorted."""
    files, dirs = [], []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        (dirs if path.is_dir() and not path.is_symlink() else files).append(rel)
    return files, dirs


def _read_json(path: Path) -> Any:
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
    files, dirs = _entries(out)
    if not files and not dirs:
        return None
    marker = _read_json(out / MARKER)
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
    manifest, stamp = _read_json(out / MANIFEST), _read_json(out / "resource.json")
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


def clean_partials(out_dir: str | os.PathLike) -> list[Path]:
    """Remove ``.<name>.partial-*`` siblings left by interrupted saves to ``out_dir``, and
    the ``..<name>.partial-*`` ones of a save nested in such a staging directory (a model
    saved into the staging directory of a training output).

    A partial whose writer process (pid in its name) is still alive is kept.
    """
    out = Path(out_dir)
    removed = []
    if not out.parent.is_dir():
        return removed
    prefixes = (f".{out.name}.partial-", f"..{out.name}.partial-")
    for path in out.parent.iterdir():
        prefix = next((p for p in prefixes if path.name.startswith(p)), None)
        if prefix is None:
            continue
        pid = path.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and (int(pid) == os.getpid() or _pid_alive(int(pid))):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


#: (device, inode, size, mtime_ns) → sha256, so a file is hashed once per process
_SHA_CACHE: dict[tuple[int, int, int, int], str] = {}


def _cached_sha(path: Path) -> str:
    st = path.stat()
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256_file(path)
    return _SHA_CACHE[key]


def _write_marker(directory: Path) -> None:
    files, _ = _entries(directory)
    inner = _read_json(directory / MARKER)
    kind = _kind_of(directory)
    if kind == "directory" and isinstance(inner, dict) and inner.get("kind"):
        kind = inner["kind"]
    marker = {"kind": kind, "files": {
        f: (f"symlink:{os.readlink(directory / f)}" if (directory / f).is_symlink()
            else _cached_sha(directory / f)) for f in files if f != MARKER}}
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
    check_output(out, kind, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_partials(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-{os.getpid()}-", dir=out.parent))
    old = None
    try:
        yield tmp
        faults.point("save:staged")
        _write_marker(tmp)
        check_output(out, _kind_of(tmp) if kind is None else kind, force)
        _apply_umask(tmp)
        if out.is_symlink() or out.is_file():
            out.unlink()
        elif out.exists():
            old = out.parent / f"{tmp.name}.old-{secrets.token_hex(4)}"
            os.replace(out, old)
            faults.point("save:swap")
        os.replace(tmp, out)
    finally:
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
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _stable(value: Any, inside_structure: bool = False) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v, inside_structure or k == "structure") for k, v in value.items()
                if inside_structure or k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_stable(v, inside_structure) for v in value]
    return value


def manifest_hash(manifest: Manifest) -> str:
    """sha256 of the canonical JSON (``to_dict()``) of a manifest (identifies an evaluated model).

    The manifest holds the structure (base map, ranks, ...), the weights' sha256 (which
    covers their sharing metadata) and the sha256 of every other file the rebuild reads, so
    the hash covers the whole checkpoint. Fields in :data:`VOLATILE_KEYS` (``created``
    timestamps, timings) are left out: identical runs give identical hashes.
    """
    stable = _stable(manifest.to_dict())
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()


def shared_names(state_dict: dict[str, torch.Tensor]) -> dict[str, str]:
    """``{dropped name: kept name}`` of tensors sharing storage, as safetensors stores them
    (the kept name of a group is its first complete name in sorted order), sorted."""
    from safetensors.torch import _remove_duplicate_names

    groups = _remove_duplicate_names(state_dict)
    return dict(sorted((dropped, kept) for kept, names in groups.items() for dropped in names))


def save_weights(model: nn.Module, path: str | os.PathLike) -> dict[str, str]:
    """``safetensors.torch.save_model`` with a canonical header (byte-identical reruns).

    safetensors keeps the metadata in a hash map, so the ``{dropped: kept}`` entries of
    shared tensors come out in a different order on every save; the header is rewritten
    with the metadata keys sorted (same length: only the order changes). Returns the
    sharing map (also in the file's metadata, plus ``format: pt``).
    """
    from safetensors.torch import save_file

    state_dict = model.state_dict()
    shared = shared_names(state_dict)
    for dropped in shared:
        del state_dict[dropped]
    state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    save_file(state_dict, str(path), metadata={"format": "pt", **shared})
    _canonical_header(Path(path))
    return shared


def _canonical_header(path: Path) -> None:
    import struct

    with open(path, "r+b") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        meta = header.pop("__metadata__", None)
        ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta else {}) | header
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > n:  # never expected: same content, other order
            raise CheckpointError(f"{str(path)!r}: canonical safetensors header is longer")
        fh.seek(8)
        fh.write(text + b" " * (n - len(text)))


def file_sharing(path: str | os.PathLike) -> dict[str, str]:
    """The ``{dropped: kept}`` sharing recorded in a safetensors file's metadata."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        names = set(fh.keys())
    return {k: v for k, v in meta.items() if v in names and k not in names}


def save_compressed(model: nn.Module, tokenizer: Any, manifest: Manifest,
                    out_dir: str | os.PathLike, force: bool | None = None) -> Manifest:
    """Save weights, config, tokenizer and manifest atomically to ``out_dir``.

    The weights' sha256, file size and sharing map, and the sha256 of every other file the
    rebuild reads (``files``), are added to the returned (and written) manifest, with
    ``format_version`` :data:`FORMAT_VERSION`.

    Raises:
        TypeError: ``manifest`` is not a :class:`flexigpt.manifest.Manifest`.
        OutputExistsError: ``out_dir`` exists and is not a saved model (unless ``force``).
    """
    import dataclasses

    from flexigpt.export.card import write_model_card
    from flexigpt.manifest import Manifest, Weights

    if not isinstance(manifest, Manifest):
        raise TypeError(f"save_compressed needs a flexigpt.manifest.Manifest, not a "
                        f"{type(manifest).__name__} (build one with Manifest.new)")
    from flexigpt.export.checkpoint import make_self_contained

    check_output(out_dir, "model", force)  # before writing anything
    with atomic_directory(out_dir, force=force, kind="model") as tmp:
        shared = save_weights(model, tmp / WEIGHTS)
        model.config.save_pretrained(tmp)
        # non-plain architectures: custom model_type + auto_map + standalone modeling file
        make_self_contained(tmp, model, manifest)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        files, _ = _entries(tmp)
        manifest = dataclasses.replace(
            manifest, format_version=FORMAT_VERSION,
            weights=Weights(file=WEIGHTS, sha256=_cached_sha(tmp / WEIGHTS),
                            bytes=(tmp / WEIGHTS).stat().st_size, shared=shared),
            files={f: _cached_sha(tmp / f) for f in files
                   if f not in (WEIGHTS, MANIFEST, MARKER)})
        (tmp / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True))
        write_model_card(tmp)
    return manifest


def read_manifest(model_dir: str | os.PathLike) -> Manifest:
    """The manifest of a saved model (migrated, see :meth:`Manifest.from_dict`); a clear
    :class:`CheckpointError` when it is missing, not JSON, not a saved manifest (no
    ``format_version``), of a newer version, or lacks a key or has one of the wrong type."""
    from flexigpt.manifest import Manifest

    path = Path(model_dir) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{str(path)!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{str(path)!r} is not valid JSON: {err}") from None
    manifest = Manifest.from_dict(data, source=repr(str(path)))
    if manifest.format_version is None:
        raise CheckpointError(f"{str(path)!r} lacks the required key 'format_version'")
    return manifest


def escapes(name: str) -> bool:
    """Whether the recorded path ``name`` could name something outside its directory by
    its spelling alone: empty, absolute (POSIX or Windows), or with a ``..`` part."""
    from pathlib import PurePosixPath, PureWindowsPath

    parts = name.replace("\\", "/").split("/")
    return (not name or PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute()
            or bool(PureWindowsPath(name).drive) or ".." in parts)


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
    that are not in ``allowed``, sorted."""
    allowed = set(allowed)
    files, _ = _entries(Path(directory))
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
    (a marker's record of a symlink) must still be that symlink; :data:`_REWRITABLE`
    files and the marker are not hashed."""
    model_dir = Path(model_dir)
    check_inside(model_dir, recorded, what)
    bad, missing = [], []
    for name, digest in sorted(recorded.items()):
        path = model_dir / name
        if name in _REWRITABLE or name == MARKER:
            continue
        if digest.startswith("symlink:"):
            if not path.is_symlink():
                missing.append(name)
            elif os.readlink(path) != digest[len("symlink:"):]:
                bad.append(name)
        elif not path.is_file():
            missing.append(name)
        elif _cached_sha(path) != digest:
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
    marker = _read_json(Path(directory) / MARKER)
    if isinstance(marker, dict) and isinstance(marker.get("files"), dict):
        recorded = marker["files"]
        if not all(isinstance(v, str) for v in recorded.values()):
            raise CheckpointError(f"{str(Path(directory) / MARKER)!r} is not a valid marker "
                                  "(its 'files' values must be strings)")
        check_inside(directory, recorded, MARKER)
        check_listed(directory, {*recorded, MARKER}, MARKER)
        verify_files(directory, recorded, MARKER)


def check_saved_files(model_dir: str | os.PathLike, manifest: Manifest,
                      verify: bool = True) -> Path:
    """The weights path of the saved model in ``model_dir``, once its manifest's paths
    and the directory's files can be trusted; nothing is opened or hashed before the
    paths are checked.

    Always: every path ``manifest`` names lies inside ``model_dir`` and the weights are
    safetensors. With ``verify``: the manifest has a file list (``files``) and the
    directory holds no file it does not list besides :data:`RECORD_FILES`, the manifest
    and the marker; then the weights' and every listed file's sha256 match.

    Raises:
        CheckpointError: naming the directory and the offending path(s).
    """
    model_dir = Path(model_dir)
    files = manifest.files or {}
    check_inside(model_dir, [manifest.weights.file, *files], MANIFEST)
    weights = model_dir / manifest.weights.file
    if not manifest.weights.file.endswith(".safetensors"):
        raise CheckpointError(f"weights file {str(weights)!r} is not safetensors; "
                              "flexigpt-bench loads safetensors only (pickled weights can "
                              "run code when loaded)")
    if not weights.is_file():
        raise CheckpointError(f"weights file {str(weights)!r} is missing")
    if not verify:
        return weights
    if not files:
        raise CheckpointError(
            f"{str(model_dir / MANIFEST)!r} has no file list ('files': saved before "
            "flexigpt-bench recorded every file), so files added after its save cannot be "
            "told apart; check the directory, then load it with "
            "load_compressed(dir, verify=False) and save it again")
    check_listed(model_dir, {*files, manifest.weights.file, MANIFEST, MARKER, *RECORD_FILES},
                 MANIFEST)
    if _cached_sha(weights) != manifest.weights.sha256:
        raise CheckpointError(f"weights file {str(weights)!r} is corrupt: its sha256 "
                              "does not match manifest.json")
    verify_files(model_dir, files, MANIFEST)
    return weights


def _skeleton_sharing(model: nn.Module) -> dict[str, str]:
    return shared_names(model.state_dict())


def _check_consistent(model_dir: Path, manifest: Manifest, weights: Path,
                      model: nn.Module) -> None:
    """The structure in config.json and the sharing in the weights match the manifest."""
    from flexigpt.export.checkpoint import compression_spec
    from flexigpt.manifest import migrate_structure

    spec = compression_spec(model_dir)
    if spec is not None:
        if spec.get("method") != manifest.method:
            raise CheckpointError(f"{str(model_dir)!r}: manifest method {manifest.method!r} "
                                  f"differs from config.json's {spec.get('method')!r}")
        # config.json holds the structure as saved: migrate it as the manifest's was
        written = spec.get("structure")
        written = migrate_structure(manifest.method, written) if isinstance(
            written, dict) else {}
        if written != manifest.structure:
            keys = sorted(k for k in set(written) | set(manifest.structure)
                          if written.get(k) != manifest.structure.get(k))
            raise CheckpointError(f"{str(model_dir)!r}: manifest structure differs from "
                                  f"config.json's in {keys}")
    in_file = file_sharing(weights)
    rebuilt = _skeleton_sharing(model)
    if in_file != rebuilt:
        diff = sorted(set(in_file.items()) ^ set(rebuilt.items()))
        raise CheckpointError(
            f"{str(weights)!r}: the weights' sharing does not match the model the manifest's "
            f"structure rebuilds (e.g. {[f'{a} <- {b}' for a, b in diff[:3]]}); was "
            "manifest.json (base_map, structure) edited?")
    recorded = manifest.weights.shared if manifest.weights is not None else None
    if recorded is not None and recorded != in_file:
        raise CheckpointError(f"{str(weights)!r}: sharing differs from manifest.json's "
                              "weights.shared")


def empty_model(config: Any) -> nn.Module:
    """A causal LM skeleton for ``config`` without the cost of random initialisation."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # skipped together with initialisation
    return model


def load_compressed(model_dir: str | os.PathLike, dtype: str | torch.dtype = "float32",
                    device: str = "cpu", verify: bool = True) -> LoadedModel:
    """Rebuild a model saved by :func:`save_compressed` (any method) or a plain HF checkpoint.

    Args:
        model_dir: a harness output directory (with ``manifest.json``) or a plain HF
            checkpoint directory / hub id (loaded with ``load_model``; manifest None).
        dtype: dtype of the returned weights.
        device: where the weights go, a :mod:`flexigpt.devices` setting.
        verify: check that the directory holds only the files the manifest lists (besides
            :data:`RECORD_FILES`), the sha256 of the weights and of those files, the
            structure in config.json and the weights' sharing against the manifest.
            Whatever ``verify`` says, the manifest's paths must lie inside the directory,
            the weights must be safetensors and no remote code is run (see the module
            docstring, "Trust").

    Raises:
        CheckpointError: missing/corrupt/unlisted files, a path outside the directory,
            checksum mismatch, or weights that do not match the rebuilt architecture.
        ModelLoadError: the tokenizer needs remote code.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_model as st_load_model
    from transformers import AutoTokenizer

    from flexigpt import devices
    from flexigpt.export.checkpoint import family_config
    from flexigpt.models.loading import load_model, parse_dtype, refuse_remote_code
    from flexigpt.registry import get_method

    device = devices.resolve_device(device)  # a bad setting fails before any reading
    model_dir = Path(model_dir)
    if not (model_dir / MANIFEST).is_file():
        model, tok = load_model(str(model_dir), dtype=dtype, device=device, verify=verify)
        return LoadedModel(model, tok, None)
    manifest = read_manifest(model_dir)  # saved: weights and files are recorded
    weights = check_saved_files(model_dir, manifest, verify)
    # config.json's auto_map is the self-contained format's own (never used here)
    refuse_remote_code(model_dir, files=("tokenizer_config.json",))
    config = family_config(model_dir)  # the family's config, also for self-contained dirs
    try:
        model = get_method(manifest.method).rebuild(config, manifest.structure)
    except (KeyError, ValueError, TypeError, IndexError) as err:
        raise CheckpointError(f"{str(model_dir)!r}: cannot rebuild the {manifest.method!r} "
                              f"model from manifest.json's structure ({type(err).__name__}: "
                              f"{err})") from None
    if verify:
        _check_consistent(model_dir, manifest, weights, model)
    try:
        missing, unexpected = st_load_model(model, str(weights), strict=False)
    except (SafetensorError, OSError, RuntimeError) as err:
        raise CheckpointError(f"cannot load {str(weights)!r}: {err}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{str(weights)!r} does not match the rebuilt {manifest.method} model: "
            f"missing {list(missing)[:5]}, unexpected {list(unexpected)[:5]}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, config=config, trust_remote_code=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device=device, dtype=parse_dtype(dtype)).eval()
    return LoadedModel(model, tokenizer, manifest)
