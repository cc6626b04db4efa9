"""Options of LLM-Streamline."""

from __future__ import annotations

import math
from dataclasses import dataclass

from flexigpt.methods.block_count import check_count_options

#: The lightweight replacement: one decoder block initialised from the span's first block
#: (the official code's default, a stock architecture) or a 2-layer ReLU FFN (d → 4d → d).
MODULES = ("block", "ffn")


@dataclass
class StreamlineConfig:
    """LLM-Streamline options (official defaults where its code has one).

    Attributes:
        ratio: compression target in (0, 1).
        policy: how ``ratio`` becomes the span length n (:mod:`flexigpt.methods.block_count`, the
            harness's one rule): the parameters saved are n blocks' minus the module's, so
            ``matched`` lands within half a block step of ``match_ratio`` (FlexiGPT's
            achieved ratio, passed by the DAG) or of ``ratio``.
        match_ratio: see ``policy``; None: ``ratio``.
        module: :data:`MODULES`.
        epochs: passes over the calibration windows' hidden-state pairs (the official code
            makes one pass over 0.06-1.3B tokens; the harness fits on its calibration set).
        lr, min_lr, weight_decay, grad_clip: official AdamW settings (2e-4 → 5e-5 by a cosine
            schedule after a 1 % warm-up, weight decay 1e-3, gradient norm clipped at 5).
        batch_size: calibration sequences per optimizer step (and per forward pass).
        seed: order of the sequences, and the FFN's initialisation.
    """

    ratio: float = 0.25
    policy: str = "matched"
    match_ratio: float | None = None
    module: str = "block"
    epochs: int = 10
    lr: float = 2e-4
    min_lr: float = 5e-5
    weight_decay: float = 1e-3
    grad_clip: float = 5.0
    batch_size: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        check_count_options(self)
        if self.module not in MODULES:
            raise ValueError(f"module must be one of {list(MODULES)}, got {self.module!r}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):
                raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")
            setattr(self, name, float(value))
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed lr ({self.lr})")
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
