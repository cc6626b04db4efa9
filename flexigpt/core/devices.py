"""The one device setting: ``auto | cpu | cuda | cuda:<i>``, resolved in one place.

Every heavy step (Block Influence, compression — base selection, surgery, SliceGPT's
calibration and rotation, LLM-Pruner's importance —, training, perplexity, both evaluation
backends, inference timing, generation) receives the setting and resolves it here, through
the model loaders (:func:`flexigpt.storage.models.loading.load_model`,
:func:`flexigpt.storage.artifacts.load_compressed`) or directly; after loading, every step computes
on the device of the model's parameters (``model_device``), never on a device of its own.

``auto`` is CUDA (the current CUDA device) where one is available, else the CPU. Precision
is set per step by the config, not here: weights load in the ``dtype`` of the step (fp32 by
default), evaluation and training use bf16 autocast where the device runs it natively
(:mod:`flexigpt.core.precision`); SVDs, PCA and Block Influence's cosines accumulate in fp32 or
fp64 on whatever device the weights are on.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a device is resolved (config checks stay light)
    import torch
    from torch import nn

#: what the ``device`` setting accepts (config key, ``--device`` of every CLI command).
DEVICE_SPEC = "auto | cpu | cuda | cuda:<index>"
_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(spec: object) -> str:
    """``spec`` if it is a valid device setting (config-edge check, no CUDA query).

    Raises:
        ValueError: not one of :data:`DEVICE_SPEC`.
    """
    if not isinstance(spec, str) or not _PATTERN.match(spec):
        raise ValueError(f"device must be {DEVICE_SPEC}, got {spec!r}")
    return spec


def resolve_device(spec: str | torch.device | None = "auto") -> str:
    """The torch device string a step runs on (``None`` = ``auto``).

    Raises:
        ValueError: bad setting, CUDA asked for where there is none, or an index past the
            visible CUDA devices.
    """
    import torch

    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = check_device("auto" if spec is None else spec)
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r}: CUDA is not available on this machine "
                             f"(torch {torch.__version__}); use device 'cpu' or 'auto'")
        index = int(spec.partition(":")[2] or torch.cuda.current_device())
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA "
                             f"device(s) visible")
    return spec


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (where its forward runs)."""
    return next(model.parameters()).device
