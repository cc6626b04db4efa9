"""Options of the SliceGPT baseline (see docs/baselines.md §2)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from baselines.slicegpt.activations import STORES
from flexigpt.storage.registry import validate_ratio

TARGETS = ("parameters", "slicing_fraction")
HEADS = ("auto", "unsliced", "sliced", "tied")
PCA_DTYPES = ("float64", "float32")
ORIENTATIONS = ("pca", "random")
RECOVERIES = ("none", "lora")


@dataclass
class SliceGPTConfig:
    """SliceGPT options.

    Attributes:
        ratio: with ``target="parameters"`` the whole-model parameter reduction
            ``1 − params(sliced)/params(dense)`` (embeddings, head and shortcut matrices
            counted, shared storage once — ``flexigpt.core.params.count_parameters``); with
            ``target="slicing_fraction"`` the paper's "slicing" s, width ``int((1−s)·D)``
            rounded down to ``round_to``.
        target: ``"parameters"`` (solve the width from a parameter target) or
            ``"slicing_fraction"`` (the paper's "30 %").
        head: treatment of the LM head. Official SliceGPT choices: ``"unsliced"`` (the
            official default: the head keeps its full input width D and is untied from the
            embedding) and ``"sliced"`` (the official code's head slicing: the head input is
            rotated by the last block's Q and sliced to the width; on a tied model the head
            is untied, so it becomes a new V×d′ matrix, counted in the parameters).
            ``"tied"`` is **this harness's variant, not the paper's** (tied models only): the
            head is re-tied to the sliced embedding through a d′×d′ projection after the
            final norm that carries the final-norm scale; the official code never does this.
            ``"auto"`` (default) resolves to an official choice: ``"sliced"`` on models with
            tied embeddings, ``"unsliced"`` otherwise. The resolved head is recorded in
            ``info["head"]`` (with ``info["head_requested"]`` and ``info["head_official"]``).
        round_to: the width is a multiple of this (official ``--round-interval 8``).
        tolerance: with ``target="parameters"`` the achieved ratio must be within this
            of ``ratio`` (absolute), else ``compress`` raises before any calibration work.
        pca_dtype: precision of the second-moment accumulation and eigendecomposition.
        damping: added to the diagonal, as a fraction of its mean (official 0.01).
        orientation: ``"pca"`` (paper) or ``"random"`` (official script default: a random
            rotation inside the kept subspace).
        batch_size: calibration windows per forward batch.
        activations: where the calibration activations ``[N, T, D]`` live while the model
            is sliced: ``"disk"`` (default; an unlinked temporary file in ``$TMPDIR``, one
            batch resident at a time) or ``"memory"`` (one host tensor, the whole buffer
            resident). Results are bit-identical; the store only moves memory.
        seed: seed of the random orientation.
        recovery: the recipe recorded in ``info["recovery"]`` for the shared trainer:
            ``"lora"`` the paper's RFT, ``"none"`` no training (the paper's main results).
        lora_rank, lora_alpha: the RFT LoRA rank and alpha (paper: 32 and 10).
        lora_dropout, lora_lr: RFT dropout and peak learning rate (official code: 0.05 and
            AdamW 2e-4).
    """

    ratio: float = 0.3
    target: str = "parameters"
    head: str = "auto"
    round_to: int = 8
    tolerance: float = 0.01
    pca_dtype: str = "float64"
    damping: float = 0.01
    orientation: str = "pca"
    batch_size: int = 8
    activations: str = "disk"
    seed: int = 0
    recovery: str = "lora"
    lora_rank: int = 32
    lora_alpha: float = 10.0
    lora_dropout: float = 0.05
    lora_lr: float = 2e-4

    def __post_init__(self) -> None:
        self.ratio = validate_ratio(self.ratio, "ratio")
        for name, allowed in (("target", TARGETS), ("head", HEADS), ("pca_dtype", PCA_DTYPES),
                              ("orientation", ORIENTATIONS), ("recovery", RECOVERIES),
                              ("activations", STORES)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
        for name in ("round_to", "batch_size", "lora_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not _number(self.tolerance) or not 0.0 < self.tolerance < 1.0:
            raise ValueError(f"tolerance must be strictly between 0 and 1, got {self.tolerance!r}")
        if not _number(self.damping) or not 0.0 <= self.damping < 1.0:
            raise ValueError(f"damping must be in [0, 1), got {self.damping!r}")
        for name in ("lora_alpha", "lora_lr"):
            value = getattr(self, name)
            if not _number(value) or value <= 0:
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if not _number(self.lora_dropout) or not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}")


def _number(value: object) -> bool:
    """A finite int or float (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
