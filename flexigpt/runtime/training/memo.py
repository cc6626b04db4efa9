"""What the trials of one sweep share: computed once, reused by every trial.

:class:`SweepMemo` is created by :func:`flexigpt.runtime.training.tuning.run_sweep` and passed to
each trial's :func:`flexigpt.runtime.training.runner.train_model`; reusing its values changes no
number (they are what each trial would compute itself).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from flexigpt.methods.calibration import token_windows


@dataclass
class SweepMemo:
    """What the trials of one sweep (one input model, hence one tokenizer) compute alike and
    need only once: the token windows of each text, the step-0 tune perplexity of each
    starting state (:func:`start_key`). Reusing them changes no value.
    """

    windows: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    start_ppl: dict[str, float | None] = field(default_factory=dict)

    def token_windows(self, path: str | os.PathLike, tokenizer: Any,
                      seq_len: int) -> torch.Tensor:
        """:func:`flexigpt.methods.calibration.token_windows` of ``path`` (``[n, seq_len]`` token
        ids), computed on the first call per resolved path and ``seq_len``."""
        key = (str(Path(path).resolve()), int(seq_len))
        if key not in self.windows:
            self.windows[key] = token_windows(path, tokenizer, seq_len)
        return self.windows[key]


def start_key(model: nn.Module, val_windows: torch.Tensor, bf16: bool) -> str:
    """Identity of a step-0 tune-perplexity evaluation: sha256 of the validation windows,
    the compute dtype, every parameter's name / shape / dtype / trainable flag, and the
    values of the trainable ones. The frozen values are not hashed: callers share one memo
    only between trials of one input model (:func:`flexigpt.runtime.training.tuning.run_sweep`),
    whose frozen weights are the same by construction."""
    digest = hashlib.sha256(f"bf16={bool(bf16)}".encode())
    digest.update(val_windows.detach().cpu().contiguous().numpy().tobytes())
    for name, param in model.named_parameters():
        digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}:{param.requires_grad}"
                      .encode())
        if param.requires_grad:
            digest.update(param.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
