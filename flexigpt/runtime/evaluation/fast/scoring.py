"""Log-probabilities and greedy checks of scored positions, a chunk of logits at a time.

Stock lm-eval takes ``log_softmax`` over the logits of every position of a padded batch and
then ``argmax``: two ``[B, T, V]`` tensors (for SmolLM2's 49k vocabulary, 196 KB per position
each). Here the logits of ``chunk_rows`` scored positions at a time are produced (e.g. by the
LM head on their hidden states), turned ``tile_rows`` rows at a time into log-probabilities by
the same fp32 ``log_softmax`` kernel as stock (so sums over long continuations agree with
stock to float rounding of the logits, not only of the reductions: the kernel's own error is
~1e-5 per token), written into a reused buffer, and reduced with ``max(dim=-1)`` (first
maximum: the tie rule of ``argmax``). Nothing of size ``[N, V]`` is allocated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def score_rows(n_rows: int, logits_of: Callable[[int, int], torch.Tensor], rows: torch.Tensor,
               targets: torch.Tensor, chunk_rows: int = 512, scratch: torch.Tensor | None = None,
               tile_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(L)[rows, targets]`` (fp32) and ``argmax(L[rows]) == targets``.

    Args:
        n_rows: rows ``N`` of the (never materialised) logits ``L [N, V]``.
        logits_of: ``(start, end) -> L[start:end]`` of any float dtype (reduced in fp32).
        rows: ``[K]`` long, row of ``L`` for each scored token (rows may repeat).
        targets: ``[K]`` long, the token whose log-probability is wanted.
        chunk_rows: rows produced by one ``logits_of`` call.
        scratch: optional fp32 ``[≥tile_rows, V]`` buffer for the log-probabilities
            (reused across calls; allocated per call otherwise).
        tile_rows: rows reduced at a time within a chunk (default: the whole chunk). On CPU
            a few rows keep the log-probabilities in L2 cache for the argmax that follows,
            so the chunk's logits are read from memory once instead of three times.

    Returns:
        ``([K] float32 log-probabilities, [K] bool is-greedy)``.
    """
    if rows.ndim != 1 or rows.shape != targets.shape:
        raise ValueError(f"rows and targets must be equal-length vectors, got "
                         f"{tuple(rows.shape)} and {tuple(targets.shape)}")
    tile_rows = chunk_rows if tile_rows is None else tile_rows
    if chunk_rows < 1 or tile_rows < 1:
        raise ValueError(f"chunk_rows and tile_rows must be positive, got {chunk_rows} and "
                         f"{tile_rows}")
    picked = torch.empty(rows.shape, dtype=torch.float32, device=rows.device)
    greedy = torch.empty(rows.shape, dtype=torch.bool, device=rows.device)
    order = torch.argsort(rows, stable=True)
    starts = [chunk + tile for chunk in range(0, n_rows, chunk_rows)
              for tile in range(0, min(chunk_rows, n_rows - chunk), tile_rows)]
    edges = torch.searchsorted(rows[order], torch.tensor(starts + [n_rows], device=rows.device,
                                                          dtype=rows.dtype)).tolist()
    tile_index = 0
    for start in range(0, n_rows, chunk_rows):
        block = logits_of(start, min(start + chunk_rows, n_rows))
        for offset in range(0, block.shape[0], tile_rows):
            mine = order[edges[tile_index]:edges[tile_index + 1]]
            tile_index += 1
            if not len(mine):
                continue
            tile = block[offset:offset + tile_rows].float()
            n, vocab = tile.shape
            if scratch is None or scratch.shape[0] < n or scratch.shape[1] != vocab \
                    or scratch.device != tile.device or scratch.dtype != torch.float32:
                scratch = torch.empty(max(n, min(tile_rows, n_rows)), vocab,
                                      dtype=torch.float32, device=tile.device)
            logp = torch.ops.aten._log_softmax.out(tile, -1, False, out=scratch[:n])
            local, tgt = rows[mine] - start - offset, targets[mine]
            picked[mine] = logp[local, tgt]
            greedy[mine] = logp.max(dim=-1).indices[local] == tgt
    return picked, greedy
