"""Text files from Hugging Face hub datasets (the paper's MiniPile / SlimPajama), for users
with hub access. Output format matches the offline wiki text: one document per paragraph."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tqdm.auto import tqdm

from flexigpt.core.fileio import atomic_write_text

log = logging.getLogger(__name__)


def build_hub_text(dataset: str, split: str, out_path: str | os.PathLike,
                   max_documents: int | None = None, text_field: str = "text") -> int:
    """Stream ``dataset[split]`` from the hub into ``out_path``; returns the document count.

    Documents are whitespace-normalised within paragraphs so that a blank line always
    separates documents. Written atomically.

    Raises:
        RuntimeError: the dataset cannot be reached (no network / unknown id / gated).
    """
    from datasets import load_dataset

    try:
        stream = load_dataset(dataset, split=split, streaming=True)
    except Exception as err:  # datasets raises many types for "not reachable"
        raise RuntimeError(f"cannot load hub dataset {dataset!r} split {split!r}: {err}") from None
    docs: list[str] = []
    for row in tqdm(stream, desc=f"{dataset}:{split}", total=max_documents):
        text = " ".join(str(row[text_field]).split())
        if text:
            docs.append(text)
        if max_documents is not None and len(docs) >= max_documents:
            break
    if not docs:
        raise RuntimeError(f"hub dataset {dataset!r} split {split!r} has no text")
    atomic_write_text(Path(out_path), "\n\n".join(docs) + "\n")
    log.info("wrote %d documents to %s", len(docs), out_path)
    return len(docs)
