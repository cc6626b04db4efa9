"""Saving and reloading compressed models: weights + manifest, written atomically.

Layout of a saved model directory::

    <dir>/manifest.json        what was done (method, structure, params, seeds, versions)
    <dir>/config.json          HF config of the compressed architecture (published non-plain
                               models: model_type "flexigpt_compressed" + auto_map, see
                               flexigpt/storage/models/checkpoint_format.py)
    <dir>/modeling_flexigpt_compressed.py   published non-plain models: remote code
    <dir>/model.safetensors    weights; shared storage is stored once
    <dir>/tokenizer*.json ...  the tokenizer
    <dir>/README.md            published models: model card generated from the manifest

    <dir>/.flexigpt-output.json  the output marker (kind, sha256 of every file: fileio)

:func:`save_compressed` writes the checkpoint through :func:`flexigpt.core.fileio.atomic_directory`;
the remote-code file and the model card are export steps it runs only when asked
(``extra_files`` / ``finish``, passed by ``flexigpt.export.publish.publish_compressed``).
``load_compressed`` rebuilds the skeleton through the method registry and loads weights,
so every method's output (baselines included) reloads with one call.

Integrity: the weights are written canonically (sharing metadata in sorted order), so
identical runs give byte-identical files; ``manifest.json`` records the sha256 of the
weights and of every other file the rebuild reads (``files``), and ``load_compressed``
checks them, the structure against ``config.json`` and the weights' sharing against the
rebuilt skeleton. :func:`flexigpt.storage.manifest.manifest_hash` ignores only the fields that are
meant to differ between identical runs (``VOLATILE_KEYS``: timestamps and timings).

Trust (issue 37): loading never runs or unpickles anything a directory brings along, and
reads nothing a save did not record. ``manifest.json``'s ``files`` lists every file the
save wrote besides itself, the weights (``weights``) and the marker; ``load_compressed``
refuses a directory holding any other file (:func:`flexigpt.core.fileio.check_listed`)
except the records that no loader reads (:data:`RECORD_FILES`: the model card, a training
run's log, curve and sweep records), so a tokenizer file dropped in later cannot change the
model under an unchanged ``manifest_hash``. A manifest without ``files`` (saved before file
hashes were recorded, migrated to ``{}``) cannot tell its own files from added ones: it
loads only with ``verify=False`` (check the directory, then save it again to record them).
Every path a manifest or marker names must lie inside the directory
(:func:`flexigpt.core.fileio.check_inside`) or the load stops before anything is opened or
hashed. Weights are safetensors only: pickled formats (``PICKLE_SUFFIXES``) are refused by
name before torch sees them. Remote code is refused in :mod:`flexigpt.storage.models.loading`
(``refuse_remote_code``): every harness load passes ``trust_remote_code=False``.

File I/O (atomic outputs, markers, path and hash checks) lives in :mod:`flexigpt.core.fileio`;
``FORMAT_VERSION`` / ``VOLATILE_KEYS`` / ``manifest_hash`` in :mod:`flexigpt.storage.manifest`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flexigpt.core import devices
from flexigpt.core.fileio import (
    MANIFEST,
    MARKER,
    CheckpointError,
    atomic_directory,
    check_inside,
    check_listed,
    check_output,
    check_safetensors,
    tree_entries,
    verify_files,
)
from flexigpt.core.fileio import outputs as fileio_outputs  # cached_sha256 looked up per call
from flexigpt.storage.manifest import (
    FORMAT_VERSION,
    Manifest,
    Weights,
    migrate_structure,
)
from flexigpt.storage.models.checkpoint_format import compression_spec
from flexigpt.storage.models.loading import (
    family_config,
    load_model,
    parse_dtype,
    refuse_remote_code,
)
from flexigpt.storage.registry import get_method
from flexigpt.storage.structure import check_described

if TYPE_CHECKING:  # transformers itself is imported on first use
    from transformers import PreTrainedModel

__all__ = ["RECORD_FILES", "WEIGHTS", "LoadedModel", "check_saved_files", "empty_model",
           "file_sharing", "load_compressed", "read_manifest", "save_compressed",
           "save_weights", "shared_names"]

WEIGHTS = "model.safetensors"
#: files a saved model directory may hold without its manifest listing them: written after
#: the manifest (the model card; a training run's log, curve and LR-sweep records) and read
#: by no model, config or tokenizer loader
RECORD_FILES = frozenset({"README.md", "train_log.csv", "loss_curve.png", "selection.json",
                          "trial.json"})


@dataclass
class LoadedModel:
    """A model with its tokenizer and (for harness outputs) its manifest."""

    model: nn.Module
    tokenizer: Any
    manifest: Manifest | None


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
    """Rewrite the safetensors header of ``path`` in place with its metadata keys sorted
    (same length: only the order changes)."""
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
                    out_dir: str | os.PathLike, force: bool | None = None,
                    extra_files: Callable[[Path], object] | None = None,
                    finish: Callable[[Path], object] | None = None) -> Manifest:
    """Save weights, config, tokenizer and manifest atomically to ``out_dir``.

    The weights' sha256, file size and sharing map, and the sha256 of every other file the
    rebuild reads (``files``), are added to the returned (and written) manifest, with
    ``format_version`` :data:`FORMAT_VERSION`.

    Args:
        extra_files: called with the staging directory once the weights and ``config.json``
            are written, before the tokenizer is saved and any file is hashed: what it writes
            or rewrites there is recorded in ``files`` (the export step that makes a
            non-plain model self-contained).
        finish: called with the staging directory after ``manifest.json`` is written, before
            the output marker and the rename (the model card: a :data:`RECORD_FILES` file).
        Without them the bare checkpoint is written; models for others to load are saved
        with ``flexigpt.export.publish.publish_compressed``, which passes both.

    Raises:
        TypeError: ``manifest`` is not a :class:`flexigpt.storage.manifest.Manifest`.
        OutputExistsError: ``out_dir`` exists and is not a saved model (unless ``force``).
    """
    if not isinstance(manifest, Manifest):
        raise TypeError(f"save_compressed needs a flexigpt.storage.manifest.Manifest, not a "
                        f"{type(manifest).__name__} (build one with Manifest.new)")
    check_output(out_dir, "model", force)  # before writing anything
    with atomic_directory(out_dir, force=force, kind="model") as tmp:
        shared = save_weights(model, tmp / WEIGHTS)
        config: Any = model.config  # an HF config
        config.save_pretrained(tmp)
        if extra_files is not None:
            extra_files(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        files, _ = tree_entries(tmp)
        manifest = dataclasses.replace(
            manifest, format_version=FORMAT_VERSION,
            weights=Weights(file=WEIGHTS, sha256=fileio_outputs.cached_sha256(tmp / WEIGHTS),
                            bytes=(tmp / WEIGHTS).stat().st_size, shared=shared),
            files={f: fileio_outputs.cached_sha256(tmp / f) for f in files
                   if f not in (WEIGHTS, MANIFEST, MARKER)})
        (tmp / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True))
        if finish is not None:
            finish(tmp)
    return manifest


def read_manifest(model_dir: str | os.PathLike) -> Manifest:
    """The manifest of a saved model (migrated, see :meth:`Manifest.from_dict`); a clear
    :class:`CheckpointError` when it is missing, not JSON, not a saved manifest (no
    ``format_version``), of a newer version, or lacks a key or has one of the wrong type."""
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
    record = manifest.weights
    if record is None:
        raise CheckpointError(f"{str(model_dir / MANIFEST)!r} lacks the required key 'weights'")
    files = manifest.files or {}
    check_inside(model_dir, [record.file, *files], MANIFEST)
    weights = model_dir / record.file
    if not record.file.endswith(".safetensors"):
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
    check_listed(model_dir, {*files, record.file, MANIFEST, MARKER, *RECORD_FILES},
                 MANIFEST)
    if fileio_outputs.cached_sha256(weights) != record.sha256:
        raise CheckpointError(f"weights file {str(weights)!r} is corrupt: its sha256 "
                              "does not match manifest.json")
    verify_files(model_dir, files, MANIFEST)
    return weights


def _check_consistent(model_dir: Path, manifest: Manifest, weights: Path,
                      model: nn.Module) -> None:
    """The structure in config.json and the sharing in the weights match the manifest."""
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
    rebuilt = shared_names(model.state_dict())  # the rebuilt skeleton's sharing
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


def empty_model(config: Any) -> PreTrainedModel:
    """A causal LM skeleton for ``config`` without the cost of random initialisation."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()  # skipped together with initialisation
    return model


def _rebuild(model_dir: Path, manifest: Manifest, config: Any) -> nn.Module:
    """The skeleton ``manifest``'s method rebuilds from its structure on ``config``, once the
    structure is checked (:mod:`flexigpt.storage.structure`: ``info`` agrees with it, the method's
    ``check_structure``); :class:`CheckpointError` naming ``model_dir`` when it does not fit."""
    method = get_method(manifest.method)
    try:
        check_described(manifest.structure, manifest.info)
        if method.check_structure is not None:
            method.check_structure(manifest.structure, config)
    except ValueError as err:
        raise CheckpointError(f"{str(model_dir)!r}: manifest.json does not describe this "
                              f"model: {err}") from None
    try:
        return method.rebuild(config, manifest.structure)
    except (KeyError, ValueError, TypeError, IndexError) as err:
        raise CheckpointError(f"{str(model_dir)!r}: cannot rebuild the {manifest.method!r} "
                              f"model from manifest.json's structure ({type(err).__name__}: "
                              f"{err})") from None


def _load_weights(model: nn.Module, weights: Path, method: str) -> None:
    """Load the safetensors file ``weights`` into the rebuilt ``model`` (in place); every
    tensor of either must have its counterpart, else :class:`CheckpointError`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model as st_load_model

    check_safetensors(weights)  # a damaged file named, with what is wrong
    try:
        missing, unexpected = st_load_model(model, str(weights), strict=False)
    except (SafetensorError, OSError, RuntimeError) as err:
        raise CheckpointError(f"cannot load {str(weights)!r}: {err}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{str(weights)!r} does not match the rebuilt {method} model: "
            f"missing {list(missing)[:5]}, unexpected {list(unexpected)[:5]}")


def load_compressed(model_dir: str | os.PathLike, dtype: str | torch.dtype = "float32",
                    device: str = "cpu", verify: bool = True) -> LoadedModel:
    """Rebuild a model saved by :func:`save_compressed` (any method) or a plain HF checkpoint.

    Args:
        model_dir: a harness output directory (with ``manifest.json``) or a plain HF
            checkpoint directory / hub id (loaded with ``load_model``; manifest None).
        dtype: dtype of the returned weights.
        device: where the weights go, a :mod:`flexigpt.core.devices` setting.
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
    from transformers import AutoTokenizer

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
    model = _rebuild(model_dir, manifest, config)
    if verify:
        _check_consistent(model_dir, manifest, weights, model)
    _load_weights(model, weights, manifest.method)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, config=config, trust_remote_code=False)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device=device, dtype=parse_dtype(dtype)).eval()
    return LoadedModel(model, tokenizer, manifest)
