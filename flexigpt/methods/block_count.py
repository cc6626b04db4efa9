"""The one rule that turns a compression target into a number of removed blocks.

Every block-removal method (FlexiGPT pruning, ShortGPT ± LoRA, ReplaceMe, LLM-Streamline)
calls these functions, so rows compared in one table round the same way:

- ``paper``: k = int(ratio · L), the FlexiGPT paper's protocol (9 of 32 blocks at "30 %").
- ``matched``: the k in [1, L) whose *achieved* parameter reduction (each method's own exact
  count: FlexiGPT's adapters, γ's and kept pre-norms included, LLM-Streamline's module through
  its ``Method.ratio_curve``) is nearest to the target;
  ties go to the smaller k. One block of SmolLM2-135M is ≈ 2.6 points of its parameters, so
  a matched row lands within half a block step of its target.

A like-for-like baseline passes the achieved ratio of the FlexiGPT model it is compared with
as its target, so the two rows land within half of the baseline's block step of each other.

Reach (:func:`plan`): a target that no block count gets within half a block step of — below
half of what one block achieves, or more than half a block step beyond what L − 1 blocks
achieve — is refused under either policy (:class:`RatioOutOfReach`), by the DAG-build check
(:mod:`flexigpt.workflow.config_check`) and by ``flexigpt.api.compression.compress`` before any work, unless the
caller accepts the miss (``flexigpt compress --accept-ratio-miss``, which logs target and
achieved); the methods whose ratio is no block count are held to the same half block step
after compressing (``flexigpt.api.ratios.check_achieved``). Inside that range
``matched`` lands within half a step by construction, while ``paper`` keeps its documented
int(ratio · L) (a block fraction, below the parameter target by the adapters' overhead).
:func:`method_plan` computes the achieved ratios of a registered method on a model (real or
meta-device skeleton) the way the method itself counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flexigpt.core.params import count_parameters
from flexigpt.methods.surgery import default_rank, matrix_ranks, saving_per_block
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.registry import METHODS, get_method, validate_ratio

POLICIES = ("matched", "paper")
#: how a block-count method's removal changes the parameter count (``MethodFacts.block_count``)
REMOVALS = ("remove", "replace")


class RatioOutOfReach(ValueError):
    """A ratio that no block count achieves within half a block step."""


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
    A target beyond every block count gets the nearest end; whether that is close enough is
    the reach rule of :func:`plan` (refused unless ``accept_miss``), judged before any work.

    Raises:
        ValueError: fewer than 2 blocks, or no k reduces the parameter count at all.
    """
    if n_blocks < 2:
        raise ValueError(f"removing blocks needs at least 2 blocks, the model has {n_blocks}")
    values = {k: achieved(k) for k in range(1, n_blocks)}
    if max(values.values()) <= 0:
        raise ValueError("no block count reduces the parameter count (each removal adds "
                         "as many parameters as it puts back)")
    return min(values, key=lambda k: (round(abs(values[k] - target), 12), k))


def block_count(policy: str, ratio: float, n_blocks: int,
                achieved: Callable[[int], float]) -> int:
    """Dispatch on ``policy`` (:data:`POLICIES`)."""
    if policy == "paper":
        return paper_block_count(ratio, n_blocks)
    if policy == "matched":
        return nearest_block_count(ratio, achieved, n_blocks)
    raise ValueError(f"policy must be one of {list(POLICIES)}, got {policy!r}")


@dataclass(frozen=True)
class Plan:
    """What a policy makes of ``target`` on one model: ``k`` of ``n_blocks`` blocks removed,
    achieving ``achieved``; ``low``/``high`` are what 1 and ``n_blocks`` − 1 blocks achieve,
    ``first_step``/``last_step`` one block's share at either end."""

    policy: str
    target: float
    n_blocks: int
    k: int
    achieved: float
    low: float
    high: float
    first_step: float
    last_step: float

    @property
    def in_reach(self) -> bool:
        """Some block count achieves ``target`` within half a block step."""
        return (self.low - self.first_step / 2 <= self.target
                <= self.high + self.last_step / 2)

    def summary(self) -> str:
        """``target 0.3, achieved 0.2121 (9 of 30 blocks, policy 'paper')``."""
        return (f"target {self.target:g}, achieved {self.achieved:.4f} ({self.k} of "
                f"{self.n_blocks} blocks, policy {self.policy!r})")

    def out_of_reach(self, what: str = "ratio") -> str:
        """The refusal: target, what the policy would achieve, and the achievable range."""
        side = "above" if self.target > self.high else "below"
        return (f"{what} {self.target:g} is out of reach: removing 1..{self.n_blocks - 1} of "
                f"{self.n_blocks} blocks achieves {self.low:.4f}..{self.high:.4f} (one block "
                f"≈ {self.last_step:.4f}), and the target lies more than half a block step "
                f"{side} that; policy {self.policy!r} would remove {self.k} blocks, "
                f"achieving {self.achieved:.4f}")


def plan(policy: str, target: float, n_blocks: int, achieved: Callable[[int], float],
         accept_miss: bool = False, what: str = "ratio") -> Plan:
    """The block count ``policy`` gives for ``target`` and what it achieves.

    Args:
        achieved: achieved parameter reduction of removing k blocks (k in [1, n_blocks)).
        accept_miss: return the plan of an out-of-reach target instead of refusing it.
        what: the name of the target in messages (a flag or config key).

    Raises:
        ValueError: the policy's own refusal (:func:`block_count`, whatever
            ``accept_miss``): ``paper``'s int(ratio · L) = 0; or no block count reduces the
            parameter count.
        RatioOutOfReach: otherwise, ``target`` is out of reach (:attr:`Plan.in_reach`) and
            not ``accept_miss``; the message names ``what``, the target, what the policy
            would achieve and the achievable range.
    """
    if n_blocks < 2:
        raise ValueError(f"removing blocks needs at least 2 blocks, the model has {n_blocks}")
    values = {k: achieved(k) for k in range(1, n_blocks)}
    last = n_blocks - 1
    if values[last] <= 0:
        raise ValueError("no block count reduces the parameter count (each removal adds "
                         "as many parameters as it puts back)")
    k = block_count(policy, target, n_blocks, values.__getitem__)  # the policy's own refusal
    found = Plan(policy, float(target), n_blocks, k, values[k], values[1], values[last],
                 values[1], values[last] - values.get(last - 1, 0.0))
    if not found.in_reach and not accept_miss:
        raise RatioOutOfReach(found.out_of_reach(what))
    return found


def unique_param_count(module: Any) -> int:
    """Unique parameters of ``module``, as :func:`flexigpt.core.params.count_parameters` counts
    them; on the meta device (no storage to tell shared tensors apart) parameters are
    de-duplicated by identity, which is how an HF skeleton ties its embeddings."""
    params = list(module.parameters())
    if any(p.is_meta for p in params):
        return sum(p.numel() for p in params)
    return count_parameters(module)


def achieved_curve(removal: str, model: Any, cfg: Any) -> tuple[int, Callable[[int], float]]:
    """``(n_blocks, achieved)`` of removing k blocks of ``model`` (real or meta skeleton).

    ``remove`` (ShortGPT): k whole blocks (blocks have one shape, so which k does not
    matter); ``replace`` (FlexiGPT): k blocks replaced by weight-shared copies, each saving
    ``flexigpt.methods.surgery.saving_per_block``'s net count for ``cfg``'s rank, output
    norm and pre-norm choice (what ``flexigpt.methods.flexigpt.prune.blocks_to_prune`` counts).
    """
    adapter = get_adapter(model)
    blocks = list(adapter.layers(model))
    dense = unique_param_count(model)
    if removal == "remove":
        per_block = sum(unique_param_count(b) for b in blocks) / len(blocks)
    elif removal == "replace":
        rank = getattr(cfg, "rank", None) or default_rank(model.config.hidden_size)
        ranks = matrix_ranks(adapter, blocks[0], rank)
        per_block = saving_per_block(model, ranks, getattr(cfg, "output_norm", True),
                                     getattr(cfg, "prenorm", "copy"))["net"]
    else:
        raise ValueError(f"removal must be one of {list(REMOVALS)}, got {removal!r}")
    return len(blocks), lambda k: k * per_block / dense


def counts_blocks(method: str) -> bool:
    """Whether registered ``method``'s ratio becomes a number of removed blocks: by the
    registry's ``MethodFacts.block_count`` or the method's own ``Method.ratio_curve``."""
    return METHODS[method].block_count is not None or get_method(method).ratio_curve is not None


def method_plan(method: str, model: Any, cfg: Any, accept_miss: bool = False,
                what: str | None = None) -> Plan | None:
    """:func:`plan` of registered ``method`` with config ``cfg`` on ``model``; None for a
    method whose ratio is not a block count (neither ``MethodFacts.block_count`` nor the
    method's own ``Method.ratio_curve``, e.g. LLM-Streamline's span minus its module). The target
    is ``cfg.match_ratio`` under ``matched`` when set (a like-for-like baseline), else
    ``cfg.ratio``. Raises as :func:`plan`."""
    if not counts_blocks(method):
        return None
    removal, curve = METHODS[method].block_count, get_method(method).ratio_curve
    match: Any = getattr(cfg, "match_ratio", None)
    matched = cfg.policy == "matched" and match is not None
    target = float(match if matched else cfg.ratio)
    what = what or ("match_ratio" if matched else "ratio")  # the option the target came from
    n_blocks, achieved = (curve(model, cfg) if curve is not None
                          else achieved_curve(str(removal), model, cfg))
    return plan(cfg.policy, target, n_blocks, achieved, accept_miss, what)


def check_count_options(cfg: Any) -> None:
    """Config-edge check of a block-count method's ``ratio``, ``match_ratio`` (None or a
    ratio) and ``policy`` (:data:`POLICIES`); normalises the ratios to floats.

    Raises:
        ValueError: naming the bad field.
    """
    cfg.ratio = validate_ratio(cfg.ratio)
    if cfg.match_ratio is not None:
        cfg.match_ratio = validate_ratio(cfg.match_ratio, "match_ratio")
    if cfg.policy not in POLICIES:
        raise ValueError(f"policy must be one of {list(POLICIES)}, got {cfg.policy!r}")


def uniform_block_size(model: Any, method: str) -> int:
    """The parameter count of every decoder block of ``model`` (span methods count removed
    parameters per block, so the span's position must not matter).

    Raises:
        ValueError: the blocks differ in size.
    """
    sizes = {count_parameters(b) for b in get_adapter(model).layers(model)}
    if len(sizes) != 1:
        raise ValueError(f"{method} counts removed parameters per block; this model's blocks "
                         f"differ in size ({sorted(sizes)})")
    return sizes.pop()
