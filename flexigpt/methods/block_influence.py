"""Block Influence (ShortGPT Eq. 1; FlexiGPT Eq. 1), shared by FlexiGPT and ShortGPT.

BI_i = 1 − mean_{samples, tokens} cos(X_i[t], X_{i+1}[t]) where X_i is the hidden state
entering block i and X_{i+1} the one leaving it, captured with forward hooks on each block
(not ``hidden_states[-1]``, which is after the final norm). Cosine is computed in fp32.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from tqdm.auto import tqdm

from flexigpt.core.devices import model_device
from flexigpt.methods.hooked_forward import forward_batches, hook_input, hook_output, registered
from flexigpt.storage.models.adapters import get_adapter


@torch.no_grad()
def block_influence(model: nn.Module, windows: torch.Tensor, batch_size: int = 4,
                    attention_mask: torch.Tensor | None = None,
                    progress: bool = True) -> list[float]:
    """Block Influence of every decoder block.

    Args:
        model: a causal LM with a registered adapter.
        windows: LongTensor ``[N, T]`` of calibration token ids.
        batch_size: sequences per forward.
        attention_mask: optional ``[N, T]`` (1 = real token); pad positions are excluded.
        progress: show a tqdm bar.

    Returns:
        ``[L]`` BI scores (higher = more important), in block order.
    """
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    n_blocks = len(blocks)
    sums = torch.zeros(n_blocks, dtype=torch.float64)
    count = 0
    inputs: dict[int, torch.Tensor] = {}
    cosines: dict[int, torch.Tensor] = {}  # this batch's [B, T] per block, weighed after it

    def pre_hook(idx: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs[idx] = hook_input(args, kwargs).detach()
        return hook

    def post_hook(idx: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict,
                 output: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
            cosines[idx] = torch.nn.functional.cosine_similarity(
                inputs.pop(idx).float(), hook_output(output).detach().float(), dim=-1)
        return hook

    hooks = [handle for i, block in enumerate(blocks) for handle in (
        block.register_forward_pre_hook(pre_hook(i), with_kwargs=True),
        block.register_forward_hook(post_hook(i), with_kwargs=True))]
    masks = (torch.ones_like(windows) if attention_mask is None
             else attention_mask).to(model_device(model))
    with registered(hooks):
        for rows in tqdm(forward_batches(model, windows, batch_size, masks),
                         total=math.ceil(windows.shape[0] / batch_size),
                         desc="block influence", disable=not progress):
            mask = masks[rows]
            for idx, cos in cosines.items():
                sums[idx] += (cos * mask.float()).sum().double()
            cosines.clear()
            count += int(mask.sum())
    if count == 0:
        raise ValueError("block influence needs at least one unmasked token")
    return (1.0 - sums / count).tolist()


def lowest_blocks(scores: list[float], k: int) -> list[int]:
    """Indices of the ``k`` lowest-scoring blocks, sorted by block index (ties: lower index)."""
    if not 0 < k < len(scores):
        raise ValueError(f"cannot prune {k} of {len(scores)} blocks: need 0 < k < {len(scores)}")
    order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
    return sorted(order[:k])


def validate_scores(scores: object) -> list[float] | None:
    """Config-edge check of precomputed scores (``bi_scores`` options): None or finite floats.

    Raises:
        ValueError: not a non-empty list of finite numbers.
    """
    if scores is None:
        return None
    if (not isinstance(scores, (list, tuple)) or not scores
            or any(isinstance(s, bool) or not isinstance(s, (int, float)) for s in scores)
            or not all(math.isfinite(s) for s in scores)):
        raise ValueError(f"bi_scores must be a non-empty list of finite numbers (one per "
                         f"block), got {scores!r}")
    return [float(s) for s in scores]


def scores_for(model: nn.Module, windows: torch.Tensor | None, precomputed: list[float] | None,
               batch_size: int = 4) -> list[float]:
    """``precomputed`` Block Influence if given (checked against the depth), else computed.

    The DAG computes BI once per model and passes it to every method that ranks blocks, so
    FlexiGPT and ShortGPT prune from the same scores.

    Raises:
        ValueError: ``precomputed`` has a different length than the model has blocks, or
            neither scores nor calibration windows were given.
    """
    n_blocks = len(get_adapter(model).layers(model))
    if precomputed is not None:
        if len(precomputed) != n_blocks:
            raise ValueError(f"bi_scores has {len(precomputed)} entries but the model has "
                             f"{n_blocks} blocks")
        return list(precomputed)
    if windows is None or windows.numel() == 0:
        raise ValueError("Block Influence needs calibration windows (or bi_scores)")
    return block_influence(model, windows, batch_size=batch_size)
