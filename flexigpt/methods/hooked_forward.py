"""Calibration forwards watched by module hooks: the loop the statistics passes share.

A pass (Block Influence, ReplaceMe's and LLM-Streamline's span statistics, SliceGPT's block-0
inputs) registers forward hooks on blocks or their linears, runs the model over calibration
windows batch by batch, and reads what the hooks kept after each batch. A hook that has
everything it needs from a batch raises :class:`StopForward`: the rest of that batch's forward
(the blocks after the last one watched, the head) is skipped, and :func:`forward_batches` goes
on with the next batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from flexigpt.core.devices import model_device


class StopForward(Exception):
    """Raised by a hook to end the current batch's forward early (caught by
    :func:`forward_batches`)."""


def hook_output(output: Any) -> torch.Tensor:
    """The tensor a forward hook sees as a module's output: a decoder block returns a tuple
    whose first element is the hidden states ``[B, T, D]``; a linear returns the tensor."""
    return output[0] if isinstance(output, (tuple, list)) else output


def hook_input(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    """The hidden states ``[B, T, D]`` a block's forward pre-hook (``with_kwargs=True``) sees,
    passed positionally or as ``hidden_states``."""
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def registered(handles: Iterable[RemovableHandle]) -> Iterator[None]:
    """Keeps the hooks of ``handles`` for the ``with`` body and removes every one on exit,
    however the body ends (an exception, a generator closed early)."""
    kept = list(handles)
    try:
        yield
    finally:
        for handle in kept:
            handle.remove()


def forward_batches(model: nn.Module, windows: torch.Tensor, batch_size: int,
                    attention_mask: torch.Tensor | None = None) -> Iterator[slice]:
    """Run ``model`` (no KV cache, on its own device) over ``windows`` ``[N, T]`` token ids,
    ``batch_size`` windows at a time, with the rows of ``attention_mask`` ``[N, T]`` (None: no
    mask) alike; a :class:`StopForward` raised by a hook ends that batch's forward. Yields each
    batch's row slice ``windows[s]`` after its forward, so the caller reads what the hooks
    kept before the next batch runs."""
    device = model_device(model)
    n = windows.shape[0]
    for start in range(0, n, batch_size):
        rows = slice(start, min(start + batch_size, n))
        mask = None if attention_mask is None else attention_mask[rows].to(device)
        try:
            model(input_ids=windows[rows].to(device), attention_mask=mask, use_cache=False)
        except StopForward:
            pass
        yield rows
