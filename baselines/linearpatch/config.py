"""Options of LinearPatch."""

from __future__ import annotations

from dataclasses import dataclass

from flexigpt.methods.block_count import check_count_options


@dataclass
class LinearPatchConfig:
    """LinearPatch options (official defaults where its code has one).

    Attributes:
        ratio: compression target in (0, 1).
        policy: how ``ratio`` becomes the span length n (:mod:`flexigpt.methods.block_count`,
            the harness's one rule): n blocks' parameters saved minus the patch's, so
            ``matched`` lands within half a block step of ``match_ratio`` (FlexiGPT's
            achieved ratio, passed by the DAG) or of ``ratio``.
        match_ratio: see ``policy``; None: ``ratio``.
        rotate: the official ``insert_type``: True (``rotate``, the default of its scripts):
            ``P = H·diag(s)·Hᵀ`` with ``s`` measured on Hadamard-rotated activations, a dense
            ``d × d`` patch; False (``diag``): ``P = diag(s)`` on the raw channels, stored
            as ``d`` scales.
        batch_size: calibration windows per forward pass (the statistics are per window, as
            the official code's batch of one: the result does not depend on it).
    """

    ratio: float = 0.25
    policy: str = "matched"
    match_ratio: float | None = None
    rotate: bool = True
    batch_size: int = 4

    def __post_init__(self) -> None:
        check_count_options(self)
        if not isinstance(self.rotate, bool):
            raise ValueError(f"rotate must be true or false, got {self.rotate!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
