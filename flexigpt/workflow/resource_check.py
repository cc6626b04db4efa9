"""Verification of the resource directories a run grid reads, at DAG build: every existing
model checkpoint, benchmark folder and text folder is checked against its build record
(``flexigpt.storage.artifacts``' marker) before any job reads it (:func:`check_resources`), so a
tampered file stops the run before any job starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flexigpt.workflow.config_check import GridView, raise_problems

#: where :func:`check_resources` records the files it verified (relative to the workdir)
VERIFIED_RECORD = Path(".snakemake") / "flexigpt-verified-resources.json"


def resource_dirs(config: dict[str, Any], grid: GridView) -> dict[str, tuple[str, bool]]:
    """``{directory: (config key, whole)}`` of the existing local directories the grid reads:
    model checkpoints and the benchmark folder (``whole``: the directory holds only what
    its build wrote) and the folders of the text files (which also hold the held-out
    split's outputs, so only the files the build recorded are checked)."""
    keys = list(grid.model_paths)
    out: dict[str, tuple[str, bool]] = {}
    for key, path in grid.model_paths.items():
        where = "model.path" if key == keys[0] else "extension.model_path"
        out.setdefault(str(path), (where, True))
    if grid.tasks_dir:
        out.setdefault(str(grid.tasks_dir), ("data.tasks", True))
    data = config.get("data") or {}
    for name in ("calibration_text", "train_text", "validation_text"):
        if data.get(name):
            out.setdefault(str(Path(data[name]).parent), (f"data.{name}", False))
    return {d: v for d, v in out.items() if Path(d).is_dir()}


def _listing(directory: Path) -> list[str]:
    """Every file and symlink under ``directory``, relative, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.is_file() or p.is_symlink())


def _file_states(directory: Path, names: Iterable[str]) -> dict[str, list[int]]:
    """``{name: [device, inode, size, mtime_ns, ctime_ns]}``: a file rewritten in place,
    replaced or touched changes one of them (ctime cannot be set back)."""
    out = {}
    for name in sorted(names):
        try:
            st = (directory / name).lstat()
        except OSError:
            continue
        out[name] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return out


def _unchanged(directory: Path, whole: bool, state: Any) -> bool:
    """Whether ``directory``'s files are in the recorded ``state`` (with ``whole``: and no
    file was added)."""
    if not isinstance(state, dict) or not state:
        return False
    if whole and sorted(state) != _listing(directory):
        return False
    return _file_states(directory, state) == state


def verify_resource(directory: str | os.PathLike, whole: bool) -> dict[str, list[int]] | None:
    """Verify a harness-written ``directory`` against its ``.flexigpt-output.json``
    (``flexigpt.storage.artifacts``: every recorded sha256; with ``whole`` also no unrecorded
    file). Returns the states of the files verified (None: no marker, nothing to check).

    Raises:
        CheckpointError: naming the directory and the changed, missing or added file(s).
    """
    from flexigpt.core.fileio import MARKER, CheckpointError, verify_files, verify_marker

    root = Path(directory)
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    recorded = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(recorded, dict):
        return None
    if whole:
        verify_marker(root)
        return _file_states(root, _listing(root))
    if not all(isinstance(v, str) for v in recorded.values()):
        raise CheckpointError(f"{str(root / MARKER)!r} is not a valid marker (its 'files' "
                              "values must be strings)")
    verify_files(root, recorded, MARKER)
    return _file_states(root, [*recorded, MARKER])


def check_resources(config: dict[str, Any], grid: GridView,
                    record: str | os.PathLike | None = VERIFIED_RECORD) -> None:
    """Verify every existing resource directory of the grid (:func:`resource_dirs`) against
    its build record before any job reads it. Hashing is skipped for a directory whose
    files are in the state ``record`` noted when they last verified (same device, inode,
    size, mtime and ctime: any write or replacement changes one), so a repeated DAG build
    costs a ``stat`` per file; ``record`` None always hashes.

    Raises:
        ConfigError: ``<config key>: changed after its build: '<directory>': <what>``
            (one line per directory, naming the file(s)), before any job starts.
    """
    from flexigpt.core.fileio import CheckpointError, atomic_write_text

    known: dict[str, Any] = {}
    if record is not None:
        try:
            known = json.loads(Path(record).read_text())
        except (OSError, ValueError):
            known = {}
    known = known if isinstance(known, dict) else {}
    verified, problems = {}, []
    for directory, (where, whole) in resource_dirs(config, grid).items():
        key = str(Path(directory).resolve())
        if _unchanged(Path(directory), whole, known.get(key)):
            verified[key] = known[key]
            continue
        try:
            states = verify_resource(directory, whole)
        except CheckpointError as err:
            problems.append(((where, f"changed after its build: {' '.join(str(err).split())}"
                              "; rebuild it (remove the directory and rerun) or restore it"),
                             ""))
            continue
        if states is not None:
            verified[key] = states
    raise_problems(problems)
    merged = {**known, **verified}  # other configs' directories stay recorded
    if record is not None and merged != known:
        Path(record).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record, json.dumps(merged, indent=1, sort_keys=True) + "\n")
