"""Options of ReplaceMe."""

from __future__ import annotations

import math
from dataclasses import dataclass

from flexigpt.methods.block_count import check_count_options

#: How ``T`` is estimated: closed-form least squares, or Adam on the cosine objective.
OBJECTIVES = ("lstsq", "cosine")


def _positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class ReplaceMeConfig:
    """ReplaceMe options (official defaults where the paper's code has one).

    Attributes:
        ratio: compression target in (0, 1).
        policy: how ``ratio`` becomes the span length n (:mod:`flexigpt.methods.block_count`, the rule
            ShortGPT and FlexiGPT use): ``matched`` (the n whose parameter reduction is
            nearest to ``ratio``, or to ``match_ratio`` when set) or ``paper``
            (n = int(ratio · L)). The map ``T`` is folded into existing weights, so removing
            n blocks saves exactly n blocks' parameters.
        match_ratio: with ``matched``: the achieved ratio of the model compared with (the DAG
            passes FlexiGPT's), so both land within half a block step. None: ``ratio``.
        objective: ``lstsq`` (official ``lstsq.py``: ``T = (MᵀM + αI)⁻¹ Mᵀ(Y − X + M)`` in
            float64) or ``cosine`` (official ``cosine_dist.py``, ``--accurate``: Adam on
            ``1 − cos(M T + X − M, Y)``, T initialised to the identity).
        alpha: ridge term of ``lstsq`` (official default 0).
        cosine_epochs, cosine_lr, cosine_batch: the cosine optimiser (official: 10 epochs,
            Adam lr 1e-4, 1,024 tokens a step, shuffled with ``seed``).
        batch_size: calibration sequences per forward pass.
        seed: shuffling seed of the cosine optimiser.
    """

    ratio: float = 0.25
    policy: str = "matched"
    match_ratio: float | None = None
    objective: str = "lstsq"
    alpha: float = 0.0
    cosine_epochs: int = 10
    cosine_lr: float = 1e-4
    cosine_batch: int = 1024
    batch_size: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        check_count_options(self)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {list(OBJECTIVES)}, "
                             f"got {self.objective!r}")
        for name in ("alpha", "cosine_lr"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):
                raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")
            setattr(self, name, float(value))
        for name in ("cosine_epochs", "cosine_batch", "batch_size"):
            _positive_int(getattr(self, name), name)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
