"""The one rule that turns a compression target into a number of removed blocks.

Every block-removal method (FlexiGPT pruning, ShortGPT, ShortGPT + LoRA) calls these two
functions, so rows compared in one table round the same way:

- ``paper``: k = int(ratio · L), the FlexiGPT paper's protocol (9 of 32 blocks at "30 %").
- ``matched``: the k in [1, L) whose *achieved* parameter reduction (each method's own exact
  count: FlexiGPT's adapters, γ's and kept pre-norms included) is nearest to the target;
  ties go to the smaller k. One block of SmolLM2-135M is ≈ 2.6 points of its parameters, so
  a matched row lands within half a block step of its target.

A like-for-like baseline passes the achieved ratio of the FlexiGPT model it is compared with
as its target, so the two rows land within half of the baseline's block step of each other.
"""

from __future__ import annotations

from collections.abc import Callable

POLICIES = ("matched", "paper")


def paper_block_count(ratio: float, n_blocks: int) -> int:
    """k = int(ratio · n_blocks) (float-guarded: 0.3 · 30 counts as 9).

    Raises:
        ValueError: k would be 0 or would remove every block.
    """
    k = int(ratio * n_blocks + 1e-9)
    if not 0 < k < n_blocks:
        raise ValueError(f"ratio {ratio} under policy 'paper' removes int({ratio}·{n_blocks}) "
                         f"= {k} of {n_blocks} blocks; need 0 < k < {n_blocks}")
    return k


def nearest_block_count(target: float, achieved: Callable[[int], float], n_blocks: int) -> int:
    """The k in [1, n_blocks) whose ``achieved(k)`` is nearest to ``target`` (ties: smaller k).

    Raises:
        ValueError: fewer than 2 blocks, no k reduces the parameter count at all, or the
            target lies more than half a block step beyond the last block count.
    """
    if n_blocks < 2:
        raise ValueError(f"removing blocks needs at least 2 blocks, the model has {n_blocks}")
    values = {k: achieved(k) for k in range(1, n_blocks)}
    if max(values.values()) <= 0:
        raise ValueError("no block count reduces the parameter count (each removal adds "
                         "as many parameters as it saves); lower the adapter rank")
    best = min(values, key=lambda k: (round(abs(values[k] - target), 12), k))
    last = n_blocks - 1
    step = values[last] - values.get(last - 1, 0.0)
    if best == last and target - values[last] > step / 2:
        raise ValueError(f"ratio {target} is unreachable: removing {last} of {n_blocks} blocks "
                         f"achieves only {values[last]:.4f}")
    return best


def block_count(policy: str, ratio: float, n_blocks: int,
                achieved: Callable[[int], float]) -> int:
    """Dispatch on ``policy`` (:data:`POLICIES`)."""
    if policy == "paper":
        return paper_block_count(ratio, n_blocks)
    if policy == "matched":
        return nearest_block_count(ratio, achieved, n_blocks)
    raise ValueError(f"policy must be one of {list(POLICIES)}, got {policy!r}")
