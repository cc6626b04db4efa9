"""Token windows from a plain-text corpus, for calibration, training and perplexity.

Text files hold one document per paragraph (documents separated by a blank line).
Documents are tokenized without special tokens and joined with EOS into one stream; the
stream is cut into consecutive non-overlapping windows of ``seq_len`` tokens, each
prefixed with BOS when the tokenizer has one (so a window is ``[BOS] + seq_len-1`` tokens).
Windows never contain padding.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a window is built: split_heldout needs none
    import torch


class CalibrationDataError(ValueError):
    """The text file is missing, a directory, not UTF-8, changed since its recorded build,
    empty, or too short for the requested windows."""


def read_documents(path: str | os.PathLike) -> list[str]:
    """Documents of a text file (split on blank lines), stripped, empties dropped.

    The file is read by :func:`flexigpt.storage.input_files.read_text`: checked against the sha256 its
    resource build recorded, decoded as UTF-8.

    Raises:
        CalibrationDataError: one line naming the file and the problem.
    """
    from flexigpt.storage.input_files import InputFileError, read_text

    path = Path(path)
    try:
        text = read_text(path, "text file")
    except InputFileError as err:
        raise CalibrationDataError(str(err)) from None
    docs = [d.strip() for d in text.split("\n\n")]
    docs = [d for d in docs if d]
    if not docs:
        raise CalibrationDataError(f"text file {str(path)!r} is empty")
    return docs


def token_stream(path: str | os.PathLike, tokenizer: Any,  # an HF tokenizer (duck-typed)
                 max_tokens: int | None = None) -> torch.Tensor:
    """All documents as one LongTensor ``[n_tokens]`` (EOS between documents).

    Tokenizes documents in order and stops once ``max_tokens`` tokens are collected.
    """
    import torch

    eos = tokenizer.eos_token_id
    ids: list[int] = []
    docs = read_documents(path)
    for start in range(0, len(docs), 256):
        batch = tokenizer(docs[start:start + 256], add_special_tokens=False)["input_ids"]
        for doc_ids in batch:
            ids.extend(doc_ids)
            if eos is not None:
                ids.append(eos)
        if max_tokens is not None and len(ids) >= max_tokens:
            break
    return torch.tensor(ids[:max_tokens] if max_tokens else ids, dtype=torch.long)


def token_windows(path: str | os.PathLike, tokenizer: object, seq_len: int,
                  n_windows: int | None = None, seed: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of the text as a LongTensor ``[N, seq_len]``.

    Args:
        path: text file (one document per paragraph).
        tokenizer: a HF tokenizer.
        seq_len: tokens per window, BOS included.
        n_windows: how many windows; None means every full window of the file.
        seed: if given, the ``n_windows`` are sampled without replacement with this seed
            from all windows (in file order otherwise).

    Raises:
        CalibrationDataError: file missing/empty, or fewer full windows than ``n_windows``.
    """
    import torch

    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    bos = getattr(tokenizer, "bos_token_id", None)
    body = seq_len - 1 if bos is not None else seq_len
    need = None if n_windows is None or seed is not None else n_windows * body
    stream = token_stream(path, tokenizer, max_tokens=need)
    available = stream.numel() // body
    if available == 0 or (n_windows is not None and available < n_windows):
        raise CalibrationDataError(
            f"text file {str(path)!r} is too short: {stream.numel()} tokens make {available} "
            f"window(s) of {seq_len} tokens, {n_windows or 1} needed")
    windows = stream[: available * body].view(available, body)
    if n_windows is not None:
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
            idx = torch.randperm(available, generator=gen)[:n_windows].sort().values
            windows = windows[idx]
        else:
            windows = windows[:n_windows]
    if bos is not None:
        windows = torch.cat([torch.full((windows.shape[0], 1), bos), windows], dim=1)
    return windows.contiguous()


def split_heldout(path: str | os.PathLike, tune_out: str | os.PathLike,
                  test_out: str | os.PathLike, tune_fraction: float = 0.5) -> dict[str, int]:
    """Split a held-out text by document into a tuning part and a test part.

    A document goes to the tuning split when the first 8 bytes of its sha256 read as an
    integer fall below ``tune_fraction · 2⁶⁴``: a pure function of the document, so the
    split does not depend on file order and no document is in both. Recovery choices
    (learning rates, the training curve) read only ``tune_out``; perplexity only
    ``test_out``. Both files are written atomically.

    Raises:
        CalibrationDataError: the text is missing or empty, or one split would be empty.
    """
    from flexigpt.core.fileio import atomic_write_text

    if not 0.0 < tune_fraction < 1.0:
        raise ValueError(f"tune_fraction must be in (0, 1), got {tune_fraction!r}")
    tune: list[str] = []
    test: list[str] = []
    threshold = int(tune_fraction * 2**64)
    for doc in read_documents(path):
        digest = int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[:8], "big")
        (tune if digest < threshold else test).append(doc)
    if not tune or not test:
        raise CalibrationDataError(f"text file {str(path)!r} has too few documents to split "
                                   f"({len(tune)} tune, {len(test)} test)")
    atomic_write_text(tune_out, "\n\n".join(tune) + "\n")
    atomic_write_text(test_out, "\n\n".join(test) + "\n")
    return {"tune_documents": len(tune), "test_documents": len(test)}
