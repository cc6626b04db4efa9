"""Options of ShortGPT and of ShortGPT + LoRA recovery."""

from __future__ import annotations

from dataclasses import dataclass

from flexigpt.methods.block_count import POLICIES
from flexigpt.methods.block_influence import validate_scores
from flexigpt.storage.registry import validate_ratio


@dataclass
class ShortGPTConfig:
    """ShortGPT options.

    Attributes:
        ratio: compression target in (0, 1).
        policy: how ``ratio`` becomes a block count k (:mod:`flexigpt.methods.block_count`, the rule
            FlexiGPT uses too). ``"matched"``: the k whose parameter reduction
            (``flexigpt.core.params.count_parameters``, embeddings and head included) is nearest
            to ``ratio`` — or to ``match_ratio`` when set (ties: fewer blocks);
            ``"paper"``: k = int(ratio · L), the FlexiGPT paper's label (9 of 32 blocks for
            "30 %" on LLaMA-2-7B, which is 27 % of its parameters).
        match_ratio: with ``matched``: the achieved ratio of the model this one is compared
            with (the DAG passes the FlexiGPT model's at the same target), so both rows land
            within half a ShortGPT block step of each other. None: use ``ratio``.
        batch_size: sequences per forward pass when computing Block Influence.
        bi_scores: precomputed Block Influence, one per block (the DAG shares FlexiGPT's);
            None computes it from the calibration windows.
    """

    ratio: float = 0.3
    policy: str = "matched"
    batch_size: int = 4
    bi_scores: list[float] | None = None
    match_ratio: float | None = None

    def __post_init__(self) -> None:
        self.ratio = validate_ratio(self.ratio)
        if self.match_ratio is not None:
            self.match_ratio = validate_ratio(self.match_ratio, "match_ratio")
        self.bi_scores = validate_scores(self.bi_scores)
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")


@dataclass
class ShortGPTLoRAConfig(ShortGPTConfig):
    """ShortGPT + LoRA recovery ("ShortGPT + LoRA*" of the FlexiGPT paper).

    Attributes:
        lora_rank: rank of the recovery LoRA on every linear of the remaining blocks; None
            chooses the rank whose trainable count is closest to FlexiGPT's adapters at the
            same ratio and policy.
        flexigpt_rank: FlexiGPT's replacement-block LoRA rank used for that budget; None
            means hidden_size // 16 (256 on LLaMA-2-7B, the paper's rank).
    """

    lora_rank: int | None = None
    flexigpt_rank: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("lora_rank", "flexigpt_rank"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
