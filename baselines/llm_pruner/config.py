"""Options of the LLM-Pruner block-wise baseline."""

from __future__ import annotations

from dataclasses import dataclass

from flexigpt.storage.registry import validate_ratio

POLICIES = ("matched", "paper")


@dataclass
class LLMPrunerConfig:
    """LLM-Pruner options.

    Attributes:
        ratio: with ``policy="matched"`` the parameter reduction target (whole model,
            embeddings and head counted, ``flexigpt.core.params.count_parameters``); with
            ``policy="paper"`` LLM-Pruner's ``--pruning_ratio``, the fraction of groups (heads
            and FFN channels) removed in each pruned layer (paper label: 0.25 on layers
            [4, 30) of LLaMA-7B is its "20 %", 19.5 % of the parameters).
        policy: ``"matched"`` (search the group fraction so the achieved ratio is nearest to
            ``ratio``, within ``tolerance``) or ``"paper"`` (group fraction = ``ratio``).
        layer_start: first pruned layer (0-based); None: round(4·L/32), at least 1 (LLM-Pruner
            keeps the first 4 of 32 LLaMA layers).
        layer_end: one past the last pruned layer; None: L − max(1, round(2·L/32)) (the
            paper keeps the last 2 of 32).
        n_windows: calibration windows used for the gradients, the first ones given
            (default 10, the paper's N = 10 samples; None: all given).
        batch_size: windows per backward pass (gradients are accumulated over all windows).
        tolerance: largest accepted |achieved − ratio| under ``"matched"``.
    """

    ratio: float = 0.3
    policy: str = "matched"
    layer_start: int | None = None
    layer_end: int | None = None
    n_windows: int | None = 10
    batch_size: int = 1
    tolerance: float = 0.01

    def __post_init__(self) -> None:
        self.ratio = validate_ratio(self.ratio)
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        for name in ("layer_start", "layer_end"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")
        if (self.layer_start is not None and self.layer_end is not None
                and self.layer_end <= self.layer_start):
            raise ValueError(f"layer_end ({self.layer_end}) must be greater than "
                             f"layer_start ({self.layer_start})")
        for name in ("n_windows", "batch_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.tolerance, (int, float)) or not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {self.tolerance!r}")

    def layer_range(self, n_layers: int) -> tuple[int, int]:
        """``[start, end)`` of the pruned layers of an ``n_layers``-block model.

        Raises:
            ValueError: the range is empty or exceeds the model.
        """
        start = self.layer_start if self.layer_start is not None else max(
            1, round(4 * n_layers / 32))
        end = self.layer_end if self.layer_end is not None else n_layers - max(
            1, round(2 * n_layers / 32))
        if not 0 <= start < end <= n_layers:
            raise ValueError(f"pruned layer range [{start}, {end}) is empty or outside the "
                             f"model's {n_layers} layers (set layer_start/layer_end)")
        return start, end
