"""Saving and reloading compressed models: weights + manifest, written atomically.

Layout of a saved model directory::

    <dir>/manifest.json        what was done (method, structure, params, seeds, versions)
    <dir>/config.json          HF config of the compressed architecture
    <dir>/model.safetensors    weights; shared storage is stored once
    <dir>/tokenizer*.json ...  the tokenizer

``load_compressed`` rebuilds the skeleton through the method registry and loads weights,
so every method's output (baselines included) reloads with one call.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A saved model directory is incomplete, corrupt, or inconsistent with its manifest."""


@dataclass
class LoadedModel:
    """A model with its tokenizer and (for harness outputs) its manifest."""

    model: nn.Module
    tokenizer: Any
    manifest: dict[str, Any] | None


@contextmanager
def atomic_directory(out_dir: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory that replaces ``out_dir`` only on success.

    Nothing that looks complete is left behind if the body raises or is interrupted.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file via a temporary sibling and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
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


def manifest_hash(manifest: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a manifest (identifies an evaluated model)."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def save_compressed(model: nn.Module, tokenizer: Any, manifest: dict[str, Any],
                    out_dir: str | os.PathLike) -> dict[str, Any]:
    """Save weights, config, tokenizer and manifest atomically to ``out_dir``.

    ``manifest`` must hold ``method`` and ``structure`` (see ``CompressionResult``). The
    weights' sha256 and file size are added to the returned (and written) manifest.
    """
    from safetensors.torch import save_model

    for key in ("method", "structure"):
        if key not in manifest:
            raise ValueError(f"manifest lacks required key {key!r}")
    with atomic_directory(out_dir) as tmp:
        save_model(model, str(tmp / WEIGHTS))
        model.config.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        manifest = {**manifest, "format_version": FORMAT_VERSION,
                    "weights": {"file": WEIGHTS, "sha256": sha256_file(tmp / WEIGHTS),
                                "bytes": (tmp / WEIGHTS).stat().st_size}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def read_manifest(model_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(model_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{str(path)!r} does not exist") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{str(path)!r} is not valid JSON: {err}") from None


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
        device: device of the returned weights.
        verify: check the weights' sha256 against the manifest before loading.

    Raises:
        CheckpointError: missing/corrupt files, checksum mismatch, or weights that do not
            match the rebuilt architecture.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_model as st_load_model
    from transformers import AutoConfig, AutoTokenizer

    from flexigpt.models.loading import load_model, parse_dtype
    from flexigpt.registry import get_method

    model_dir = Path(model_dir)
    if not (model_dir / MANIFEST).is_file():
        model, tok = load_model(str(model_dir), dtype=dtype, device=device)
        return LoadedModel(model, tok, None)
    manifest = read_manifest(model_dir)
    weights = model_dir / manifest.get("weights", {}).get("file", WEIGHTS)
    if not weights.is_file():
        raise CheckpointError(f"weights file {str(weights)!r} is missing")
    if verify and "sha256" in manifest.get("weights", {}):
        if sha256_file(weights) != manifest["weights"]["sha256"]:
            raise CheckpointError(f"weights file {str(weights)!r} is corrupt: its sha256 "
                                  "does not match manifest.json")
    config = AutoConfig.from_pretrained(model_dir)
    model = get_method(manifest["method"]).rebuild(config, manifest["structure"])
    try:
        missing, unexpected = st_load_model(model, str(weights), strict=False)
    except (SafetensorError, OSError, RuntimeError) as err:
        raise CheckpointError(f"cannot load {str(weights)!r}: {err}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{str(weights)!r} does not match the rebuilt {manifest['method']} model: "
            f"missing {list(missing)[:5]}, unexpected {list(unexpected)[:5]}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device=device, dtype=parse_dtype(dtype)).eval()
    return LoadedModel(model, tokenizer, manifest)
