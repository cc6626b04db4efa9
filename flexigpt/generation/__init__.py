"""Text generation for any saved model, with self-speculative decoding for FlexiGPT models.

:func:`generate` loads a model directory (``flexigpt.load_compressed``: harness outputs of
every method, or plain HF checkpoints), tokenises the prompts with left padding and runs
transformers' ``generate`` (KV cache, greedy or sampling, batches). With
``speculative=True`` a FlexiGPT (pruned or extended) model decodes with its own
weight-sharing draft (:mod:`flexigpt.generation.draft`): the draft proposes
``draft_length`` tokens, one forward of the full model verifies them, so greedy output is
token-for-token that of plain greedy decoding. Greedy speculative decoding runs our own
lean loop (:mod:`flexigpt.generation.speculative`, ``engine="auto"``/``"lean"``), whose
per-round cost is what the speed-up bound assumes; sampling runs transformers' assisted
generation (speculative sampling keeps the full model's distribution). Both decode the
prompts one by one whatever ``batch_size`` is (``stats["speculative_batch"] == 1``).

Statistics (``GenerationOutput.stats``; on transformers' path counted by forward hooks on
the full model and the draft, on our loops by the loops themselves, rates computed from the
sums by :func:`decode_rates`): wall time, tokens/s, prefill time (first forward) and
per-token decode latency (``per_token_ms``: time per decode step after the first forward,
one token per sequence of the batch; plain decoding only), and for speculative runs the
number of draft and full forward passes, the rounds, drafted and accepted tokens, the
acceptance rate α (maximum-likelihood estimate of the per-token acceptance probability of
the speculative decoding analysis: accepted / (accepted + rejections)), the accepted
fraction of drafted tokens and the mean tokens per round.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from flexigpt.devices import model_device
from flexigpt.generation.draft import (DEFAULT_DRAFT_LENGTH, SPECULATIVE_METHODS, build_draft,
                                       draft_extra_bytes, set_draft_length, skipped_blocks)
from flexigpt.generation.speculative import DecodeResult, greedy_decode, speculative_decode

log = logging.getLogger(__name__)

__all__ = ["GenerationOutput", "Generator", "generate", "read_prompts", "speculative_bound",
           "decode_rates", "rss_bytes", "SPECULATIVE_METHODS", "DEFAULT_DRAFT_LENGTH", "ENGINES",
           "build_draft", "skipped_blocks", "draft_extra_bytes"]

#: decoding engines: transformers' ``generate`` (assisted generation when speculative), our
#: lean greedy loops (:mod:`flexigpt.generation.speculative`; batch 1), or ``auto`` = lean
#: for greedy speculative decoding, transformers otherwise
ENGINES = ("auto", "transformers", "lean")


@dataclass
class GenerationOutput:
    """Texts and figures of one :func:`generate` call."""

    prompts: list[str]
    texts: list[str]  # continuations only
    token_ids: list[list[int]]  # new tokens of each prompt (to and including EOS)
    stats: dict[str, Any] = field(default_factory=dict)


def read_prompts(path: str | os.PathLike) -> list[str]:
    """One prompt per non-empty line of a text file."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise ValueError(f"{str(path)!r} holds no prompts (one per line)")
    return prompts


def speculative_bound(alpha: float, k: int, c: float) -> float:
    """Expected speed-up of speculative decoding over plain decoding:
    ``(1 − α^(k+1)) / ((1 − α)(k·c + 1))`` (Leviathan et al. 2023, Thm 3.8), with α the
    per-token acceptance probability, k the draft length and c the draft/full cost ratio."""
    tokens = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + 1)


def decode_rates(sums: Mapping[str, float], batch_size: int = 1) -> dict[str, float]:
    """The rates of a decoding run, from its sums (one home for every path that reports them:
    transformers' ``generate``, our lean loops, and chunked runs combined in
    :func:`flexigpt.generation.measure.combine`).

    ``sums`` holds ``new_tokens`` and ``wall_s``; plain runs add ``decode_s`` and
    ``decode_steps`` (forwards after the first, one token per sequence of the batch),
    speculative runs ``rounds``, ``drafted``, ``accepted`` and ``rejections``. Returns
    ``tokens_per_s``, then ``per_token_ms`` and ``decode_tokens_per_s`` (plain) or ``alpha``
    (accepted / (accepted + rejections): the per-token acceptance probability's
    maximum-likelihood estimate), ``accepted_fraction`` (of drafted tokens) and
    ``tokens_per_round`` (speculative); NaN where a count is 0."""
    def ratio(num: float, den: float, scale: float = 1.0) -> float:
        return scale * num / den if den > 0 else math.nan

    out = {"tokens_per_s": ratio(sums["new_tokens"], sums["wall_s"])}
    if "decode_steps" in sums:
        steps = sums["decode_steps"]
        out["per_token_ms"] = ratio(sums["decode_s"], steps, 1e3)
        out["decode_tokens_per_s"] = (ratio(steps * batch_size, sums["decode_s"]) if steps
                                      else math.nan)
    if "rounds" in sums:
        accepted = sums["accepted"]
        out["alpha"] = ratio(accepted, accepted + sums["rejections"])
        out["accepted_fraction"] = ratio(accepted, sums["drafted"])
        out["tokens_per_round"] = ratio(sums["new_tokens"], sums["rounds"])
    return out


class _Recorder:
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


def _rounds(calls: list[tuple[int, int, float]], prompt_len: int,
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


class Generator:
    """A loaded model (and its draft, built on first speculative use) ready to generate.

    Args:
        model_dir: a saved model directory, or a ``LoadedModel`` / ``(model, tokenizer,
            manifest)`` already in memory.
        dtype: weight dtype when loading.
        device: where a model loaded here goes (:mod:`flexigpt.devices`); prompts are
            encoded onto the model's device.
    """

    def __init__(self, model_dir: Any, dtype: str = "float32", device: str = "cpu") -> None:
        from flexigpt.artifacts import LoadedModel, load_compressed

        if isinstance(model_dir, LoadedModel):
            loaded = model_dir
        elif isinstance(model_dir, tuple):
            loaded = LoadedModel(*model_dir)
        else:
            loaded = load_compressed(model_dir, dtype=dtype, device=device)
        self.model, self.tokenizer, self.manifest = loaded.model, loaded.tokenizer, loaded.manifest
        self.model.eval()
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        self._draft: nn.Module | None = None
        self.draft_info: dict[str, Any] = {}

    @property
    def method(self) -> str | None:
        return self.manifest.method if self.manifest is not None else None

    def supports_speculative(self) -> bool:
        return self.method in SPECULATIVE_METHODS

    def draft(self, draft_length: int = DEFAULT_DRAFT_LENGTH) -> nn.Module:
        """The self-speculative draft (built once; shares every tensor with the model)."""
        if self._draft is None:
            from flexigpt.models.adapters import get_adapter

            n_blocks = len(get_adapter(self.model).layers(self.model))
            skip = skipped_blocks(self.method, self.manifest.structure, n_blocks)
            rss0 = rss_bytes()
            self._draft = build_draft(self.model, skip, draft_length)
            self.draft_info = {"skipped_blocks": skip, "draft_blocks": n_blocks - len(skip),
                               "full_blocks": n_blocks,
                               "extra_bytes": draft_extra_bytes(self._draft, self.model),
                               "build_rss_delta_bytes": rss_bytes() - rss0}
        set_draft_length(self._draft, draft_length)
        return self._draft

    # ---- generation -----------------------------------------------------------------------
    def encode(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        if enc["input_ids"].shape[1] == 0:
            raise ValueError("prompts encode to no tokens")
        device = model_device(self.model)
        return {"input_ids": enc["input_ids"].to(device),
                "attention_mask": enc["attention_mask"].to(device)}

    def generate(self, prompts: list[str], max_new_tokens: int = 64, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, batch_size: int = 1,
                 seed: int = 0, speculative: bool = False,
                 draft_length: int = DEFAULT_DRAFT_LENGTH,
                 ignore_eos: bool = False, engine: str = "auto") -> GenerationOutput:
        """See :func:`generate`."""
        prompts = list(prompts)
        if not prompts:
            raise ValueError("no prompts given")
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError("max_new_tokens and batch_size must be ≥ 1")
        if do_sample and (temperature <= 0 or not 0 < top_p <= 1):
            raise ValueError(f"sampling needs temperature > 0 and 0 < top_p ≤ 1, got "
                             f"{temperature}, {top_p}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        lean = engine == "lean" or (engine == "auto" and speculative and not do_sample)
        if lean and do_sample:
            raise ValueError("the lean engine decodes greedily; sampling needs "
                             "engine='transformers'")
        draft = None
        if speculative:
            if not self.supports_speculative():
                raise ValueError(f"speculative decoding needs a FlexiGPT model "
                                 f"({'/'.join(SPECULATIVE_METHODS)}); this one is "
                                 f"{self.method or 'a plain checkpoint'!r}")
            draft = self.draft(draft_length)
            batch_size = 1  # transformers' assisted generation: one sequence at a time
        if lean:
            batch_size = 1  # our loops decode one sequence at a time
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": do_sample,
                                  "pad_token_id": self.tokenizer.pad_token_id}
        if do_sample:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        eos = self.model.generation_config.eos_token_id
        eos = self.tokenizer.eos_token_id if eos is None else eos
        model_eos = set([eos] if isinstance(eos, int) else (eos or []))
        eos_ids: set[int] = set() if ignore_eos else model_eos
        if ignore_eos:
            # EOS is masked out (min_new_tokens): every sequence gets max_new_tokens tokens
            kwargs.update(min_new_tokens=max_new_tokens)
        if lean:  # the same rule: EOS masked out when ignored, a stop otherwise
            return self._generate_lean(prompts, max_new_tokens, draft, draft_length,
                                       eos_ids, seed,
                                       suppress_ids=model_eos if ignore_eos else set())

        torch.manual_seed(seed)
        full_rec = _Recorder(self.model)
        draft_rec = _Recorder(draft) if draft is not None else None
        texts: list[str] = []
        new_ids: list[list[int]] = []
        agg = {"wall_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0,
               "full_forwards": 0, "draft_forwards": 0, "rounds": 0, "drafted": 0,
               "accepted": 0, "rejections": 0, "batches": 0}
        try:
            for start in range(0, len(prompts), batch_size):
                batch = prompts[start:start + batch_size]
                enc = self.encode(batch)
                full_rec.reset()
                if draft_rec is not None:
                    draft_rec.reset()
                t0 = time.perf_counter()
                with torch.inference_mode(), _quiet_transformers(draft is not None):
                    out = self.model.generate(**enc, **kwargs,
                                              **({"assistant_model": draft} if draft else {}))
                t1 = time.perf_counter()
                prompt_len = enc["input_ids"].shape[1]
                calls = list(full_rec.calls)
                agg["wall_s"] += t1 - t0
                agg["batches"] += 1
                agg["full_forwards"] += len(calls)
                if calls:
                    agg["prefill_s"] += calls[0][2] - t0
                    agg["decode_s"] += calls[-1][2] - calls[0][2]
                    agg["decode_steps"] += len(calls) - 1
                if draft_rec is not None:
                    agg["draft_forwards"] += len(draft_rec.calls)
                    for drafted, accepted in _rounds(calls, prompt_len, out.shape[1]):
                        agg["rounds"] += 1
                        agg["drafted"] += drafted
                        agg["accepted"] += accepted
                        agg["rejections"] += int(accepted < drafted)
                for row in out[:, prompt_len:].tolist():
                    kept = []
                    for tok in row:
                        kept.append(tok)
                        if tok in eos_ids:
                            break
                    new_ids.append(kept)
                    texts.append(self.tokenizer.decode(kept, skip_special_tokens=True))
        finally:
            full_rec.remove()
            if draft_rec is not None:
                draft_rec.remove()
        n_new = sum(len(t) for t in new_ids)
        stats: dict[str, Any] = {
            "method": self.method, "prompts": len(prompts), "new_tokens": n_new,
            "max_new_tokens": max_new_tokens, "do_sample": do_sample, "seed": seed,
            "batch_size": batch_size, "speculative": speculative, "threads":
            torch.get_num_threads(), "wall_s": agg["wall_s"], "batches": agg["batches"],
            "full_forwards": agg["full_forwards"]}
        if speculative:
            stats.update(speculative_batch=1, draft_length=draft_length,
                         draft_forwards=agg["draft_forwards"], rounds=agg["rounds"],
                         drafted=agg["drafted"], accepted=agg["accepted"],
                         rejections=agg["rejections"], draft=dict(self.draft_info))
        else:
            stats.update(prefill_s=agg["prefill_s"], decode_s=agg["decode_s"],
                         decode_steps=agg["decode_steps"])
        stats.update(decode_rates(stats, batch_size), engine="transformers")
        return GenerationOutput(prompts=prompts, texts=texts, token_ids=new_ids, stats=stats)

    def _generate_lean(self, prompts: list[str], max_new_tokens: int, draft: nn.Module | None,
                       draft_length: int, eos_ids: set[int], seed: int,
                       suppress_ids: set[int] = frozenset()) -> GenerationOutput:
        """Greedy decoding of each prompt alone with our loops (plain, or speculative with
        ``draft``); the same statistics as the transformers path. ``eos_ids`` end a
        sequence, ``suppress_ids`` are never generated (EOS when it is ignored, as
        transformers' ``min_new_tokens`` does)."""
        runs: list[DecodeResult] = []
        for prompt in prompts:
            ids = self.encode([prompt])["input_ids"][0]
            if draft is None:
                runs.append(greedy_decode(self.model, ids, max_new_tokens, eos_ids,
                                          suppress_ids))
            else:
                runs.append(speculative_decode(self.model, draft, ids, max_new_tokens,
                                               draft_length, eos_ids, suppress_ids))
        new_ids = [r.tokens for r in runs]
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in new_ids]
        wall = sum(r.wall_s for r in runs)
        n_new = sum(len(t) for t in new_ids)
        stats: dict[str, Any] = {
            "method": self.method, "prompts": len(prompts), "new_tokens": n_new,
            "max_new_tokens": max_new_tokens, "do_sample": False, "seed": seed,
            "batch_size": 1, "speculative": draft is not None,
            "threads": torch.get_num_threads(), "wall_s": wall, "batches": len(runs),
            "full_forwards": sum(r.full_forwards for r in runs), "engine": "lean"}
        if draft is None:
            prefill = sum(r.prefill_s for r in runs)
            stats.update(prefill_s=prefill, decode_s=wall - prefill,
                         decode_steps=sum(r.full_forwards - 1 for r in runs))
        else:
            stats.update(speculative_batch=1, draft_length=draft_length,
                         draft_forwards=sum(r.draft_forwards for r in runs),
                         rounds=sum(r.rounds for r in runs),
                         drafted=sum(r.drafted for r in runs),
                         accepted=sum(r.accepted for r in runs),
                         rejections=sum(r.rejections for r in runs),
                         draft=dict(self.draft_info))
        stats.update(decode_rates(stats))
        return GenerationOutput(prompts=prompts, texts=texts, token_ids=new_ids, stats=stats)


def generate(model_dir: Any, prompts: list[str], max_new_tokens: int = 64,
             do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
             batch_size: int = 1, seed: int = 0, speculative: bool = False,
             draft_length: int = DEFAULT_DRAFT_LENGTH, dtype: str = "float32",
             ignore_eos: bool = False, device: str = "cpu",
             engine: str = "auto") -> GenerationOutput:
    """Generate continuations of ``prompts`` with the model saved in ``model_dir``.

    Args:
        model_dir: any directory ``flexigpt.load_compressed`` reads (or a ``LoadedModel``).
        prompts: the prompts (batched in order, left-padded).
        max_new_tokens: tokens generated per prompt (fewer when EOS comes first).
        do_sample: sample (``temperature``, nucleus ``top_p``; no top-k cut) instead of
            greedy decoding.
        batch_size: prompts per ``generate`` call (1 for speculative runs).
        seed: torch seed set once before the first batch (sampling is reproducible).
        speculative: self-speculative decoding with the FlexiGPT draft.
        draft_length: tokens the draft proposes per verification (k).
        dtype: weight dtype.
        ignore_eos: generate exactly ``max_new_tokens`` per prompt (benchmarks).
        device: where the model is loaded (:mod:`flexigpt.devices`).
        engine: ``transformers`` (``generate``; assisted generation when speculative),
            ``lean`` (our greedy loops, one prompt at a time) or ``auto`` (lean for greedy
            speculative decoding, transformers otherwise); see :data:`ENGINES`.

    Returns:
        :class:`GenerationOutput` with the continuations and the statistics.
    """
    gen = Generator(model_dir, dtype=dtype, device=device)
    return gen.generate(prompts, max_new_tokens=max_new_tokens, do_sample=do_sample,
                        temperature=temperature, top_p=top_p, batch_size=batch_size,
                        seed=seed, speculative=speculative, draft_length=draft_length,
                        ignore_eos=ignore_eos, engine=engine)


@contextlib.contextmanager
def _quiet_transformers(quiet: bool):
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


def rss_bytes() -> int:
    """Resident set size of this process in bytes (0 where /proc is unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
