"""``publish_compressed``: save a compressed model so the ecosystem can load it.

A published directory is what :func:`flexigpt.storage.artifacts.save_compressed` writes (weights,
``config.json``, tokenizer, ``manifest.json``, marker) plus the two export steps:

* inside the staging directory, before any file is hashed into the manifest:
  :func:`flexigpt.export.checkpoint.make_self_contained` (a non-plain model's
  ``config.json`` gets ``model_type`` ``flexigpt_compressed`` + ``auto_map``, and the
  standalone ``modeling_flexigpt_compressed.py`` is copied in), so the manifest's
  ``files`` records them;
* after ``manifest.json`` is written: :func:`flexigpt.export.card.write_model_card`
  (``README.md``, a record file the manifest does not list).

Every harness caller that saves a model for others to use (``flexigpt.api.compression.compress``, the
trainer) publishes through here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from flexigpt.export.card import write_model_card
from flexigpt.export.checkpoint import make_self_contained
from flexigpt.storage.artifacts import save_compressed
from flexigpt.storage.manifest import Manifest


def publish_compressed(model: nn.Module, tokenizer: Any, manifest: Manifest,
                       out_dir: str | os.PathLike, force: bool | None = None) -> Manifest:
    """Save ``model`` atomically to ``out_dir`` as a self-contained, carded checkpoint.

    Same arguments, return value and errors as :func:`flexigpt.storage.artifacts.save_compressed`
    (``manifest`` must be a :class:`flexigpt.storage.manifest.Manifest`, checked before anything
    is written; ``force`` replaces an ``out_dir`` that is not a saved model).

    Returns:
        The manifest written to ``out_dir/manifest.json`` (``files`` includes the
        rewritten ``config.json`` and, where written, the modeling file).
    """
    def self_contained(staging: Path) -> None:
        make_self_contained(staging, model, manifest)

    return save_compressed(model, tokenizer, manifest, out_dir, force=force,
                           extra_files=self_contained, finish=write_model_card)
