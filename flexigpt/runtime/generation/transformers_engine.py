"""Decoding with transformers' ``generate`` (assisted generation when a draft is given),
counted by forward hooks on the model and the draft.

:func:`generate_batches` runs ``generate`` once per batch of encoded prompts and sums what
the hooks saw: wall time, prefill time (the model's first forward), decode time and steps
(its later forwards) and, with a draft, the verification rounds with their drafted and
accepted tokens (recovered from the model's calls by :func:`assisted_rounds`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class CallRecorder:
    """Forward hooks counting calls of a module, with input/mask lengths and end times."""

    def __init__(self, module: nn.Module) -> None:
        self.calls: list[tuple[int, int, float]] = []  # (input len, mask len, end time)
        self._pending: list[tuple[int, int]] = []
        self._handles = [module.register_forward_pre_hook(self._pre, with_kwargs=True),
                         module.register_forward_hook(self._post)]

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        n_in = ids.shape[1] if ids is not None else kwargs["inputs_embeds"].shape[1]
        self._pending.append((n_in, mask.shape[-1] if mask is not None else -1))

    def _post(self, module: nn.Module, args: tuple, output: Any) -> None:
        n_in, n_mask = self._pending.pop()
        self.calls.append((n_in, n_mask, time.perf_counter()))

    def reset(self) -> None:
        self.calls.clear()
        self._pending.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def assisted_rounds(calls: list[tuple[int, int, float]], prompt_len: int,
                    final_len: int) -> list[tuple[int, int]]:
    """``(drafted, accepted)`` per verification round of one assisted-generation run, from
    the full model's calls: round r sees ``S_{r−1} + c_r`` mask positions and feeds
    ``c_r + 1`` tokens (round 0: the prompt + ``c_0``); each round adds ``n_r + 1`` tokens."""
    lengths = []  # sequence length before each round
    drafted = []
    for r, (n_in, n_mask, _) in enumerate(calls):
        if r == 0:
            lengths.append(prompt_len)
            drafted.append(n_in - prompt_len)
        else:
            drafted.append(n_in - 1)
            lengths.append(n_mask - (n_in - 1))
    lengths.append(final_len)
    return [(drafted[r], lengths[r + 1] - lengths[r] - 1) for r in range(len(calls))]


class StepClock:
    """A ``generate`` streamer that only notes when each token arrives, for runs whose
    forward is compiled (forward hooks registered per call would change the compiled
    module's guards and recompile it): ``generate`` hands it the prompt before the prefill,
    then every step's new tokens right after that step's forward and token choice.
    Same surface as :class:`CallRecorder`: :attr:`calls` holds one ``(0, -1, end time)`` per
    forward (lengths unknown: plain decoding only)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    @property
    def calls(self) -> list[tuple[int, int, float]]:
        return [(0, -1, t) for t in self.times[1:]]  # the first put is the prompt

    def reset(self) -> None:
        self.times.clear()

    def remove(self) -> None:
        pass


@contextlib.contextmanager
def quiet_transformers(quiet: bool) -> Iterator[None]:
    """Silence transformers' warnings about the assistant's own ``generate`` call (it passes
    a generation config together with length arguments, by design)."""
    if not quiet:
        yield
        return
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _cut_at_eos(rows: list[list[int]], eos_ids: set[int]) -> list[list[int]]:
    """Each row of new tokens up to and including its first token of ``eos_ids``."""
    out = []
    for row in rows:
        kept = []
        for tok in row:
            kept.append(tok)
            if tok in eos_ids:
                break
        out.append(kept)
    return out


def _add_batch(sums: dict[str, float], calls: list[tuple[int, int, float]],
               draft_calls: list | None, t0: float, t1: float, prompt_len: int,
               final_len: int) -> None:
    """Add one ``generate`` call (from ``t0`` to ``t1``) to ``sums``: the model's forwards
    ``calls``, the draft's ``draft_calls`` (None: no draft) and, with a draft, its rounds."""
    sums["wall_s"] += t1 - t0
    sums["batches"] += 1
    sums["full_forwards"] += len(calls)
    if calls:
        sums["prefill_s"] += calls[0][2] - t0
        sums["decode_s"] += calls[-1][2] - calls[0][2]
        sums["decode_steps"] += len(calls) - 1
    if draft_calls is not None:
        sums["draft_forwards"] += len(draft_calls)
        for drafted, accepted in assisted_rounds(calls, prompt_len, final_len):
            sums["rounds"] += 1
            sums["drafted"] += drafted
            sums["accepted"] += accepted
            sums["rejections"] += int(accepted < drafted)


def generate_batches(model: Any, draft: PreTrainedModel | None,
                     batches: Iterable[dict[str, Any]], kwargs: dict[str, Any],
                     eos_ids: set[int], clock: str = "hooks"
                     ) -> tuple[list[list[int]], dict[str, float]]:
    """``model.generate(**batch, **kwargs)`` for each encoded batch (``input_ids`` /
    ``attention_mask`` ``[batch, prompt_len]``, left-padded, and optionally
    ``generate_kwargs``: more ``generate`` arguments for that batch alone), with
    ``assistant_model=draft`` when a draft is given. ``clock`` says how the forwards are
    timed: ``hooks`` (:class:`CallRecorder` on the model and the draft) or ``streamer``
    (:class:`StepClock`; plain decoding only, for compiled forwards). ``model`` is a
    transformers causal LM (typed ``Any``: ``PreTrainedModel`` does not declare
    ``generate``, its ``GenerationMixin`` subclasses do).

    Returns:
        the new token ids of every prompt in order (cut after the first of ``eos_ids``), and
        the sums: ``wall_s, prefill_s, decode_s, decode_steps, full_forwards,
        draft_forwards, rounds, drafted, accepted, rejections, batches``.
    """
    if clock not in ("hooks", "streamer") or (clock == "streamer" and draft is not None):
        raise ValueError(f"clock must be 'hooks', or 'streamer' without a draft; got {clock!r}")
    full_rec = CallRecorder(model) if clock == "hooks" else StepClock()
    streamer = {"streamer": full_rec} if isinstance(full_rec, StepClock) else {}
    draft_rec = CallRecorder(draft) if draft is not None else None
    new_ids: list[list[int]] = []
    sums = {"wall_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0,
            "full_forwards": 0, "draft_forwards": 0, "rounds": 0, "drafted": 0,
            "accepted": 0, "rejections": 0, "batches": 0}
    assistant = {"assistant_model": draft} if draft is not None else {}
    try:
        for enc in batches:
            full_rec.reset()
            if draft_rec is not None:
                draft_rec.reset()
            enc = dict(enc)
            extra = enc.pop("generate_kwargs", {})
            t0 = time.perf_counter()
            with torch.inference_mode(), quiet_transformers(draft is not None):
                out = model.generate(**enc, **kwargs, **extra, **assistant, **streamer)
            t1 = time.perf_counter()
            prompt_len = enc["input_ids"].shape[1]
            _add_batch(sums, list(full_rec.calls),
                       list(draft_rec.calls) if draft_rec is not None else None,
                       t0, t1, prompt_len, out.shape[1])
            new_ids.extend(_cut_at_eos(out[:, prompt_len:].tolist(), eos_ids))
    finally:
        full_rec.remove()
        if draft_rec is not None:
            draft_rec.remove()
    return new_ids, sums
