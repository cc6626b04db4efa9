"""Text generation for any saved model, with self-speculative decoding for FlexiGPT models.

:func:`generate` loads a model directory (``flexigpt.load_compressed``: harness outputs of
every method, or plain HF checkpoints) into a :class:`Generator`, tokenises the prompts with
left padding and runs transformers' ``generate`` (KV cache, greedy or sampling, batches;
:mod:`flexigpt.runtime.generation.transformers_engine`). With ``speculative=True`` a FlexiGPT
(pruned or extended) model decodes with its own weight-sharing draft
(:mod:`flexigpt.runtime.generation.draft`): the draft proposes ``draft_length`` tokens, one forward
of the full model verifies them, so greedy output is token-for-token that of plain greedy
decoding. Greedy speculative decoding runs our own lean loop
(:mod:`flexigpt.runtime.generation.speculative`, ``engine="auto"``/``"lean"``), whose per-round cost
is what the expected speed-up (:func:`flexigpt.runtime.generation.figures.expected_speedup`)
assumes; sampling runs transformers' assisted generation (speculative sampling keeps the
full model's distribution). Both decode the prompts one by one whatever ``batch_size`` is
(``stats["speculative_batch"] == 1``).

Statistics (``GenerationOutput.stats``; on transformers' path counted by forward hooks on
the full model and the draft, on our loops by the loops themselves, rates computed from the
sums by :func:`~flexigpt.runtime.generation.figures.decode_rates`): wall time, tokens/s, prefill
time (first forward) and per-token decode latency (``per_token_ms``: time per decode step
after the first forward, one token per sequence of the batch; plain decoding only), and for
speculative runs the number of draft and full forward passes, the rounds, drafted and
accepted tokens, the acceptance rate α (maximum-likelihood estimate of the per-token
acceptance probability of the speculative decoding analysis: accepted / (accepted +
rejections)), the accepted fraction of drafted tokens and the mean tokens per round. Runs of
our loops also record ``few_row_route`` (:mod:`flexigpt.runtime.generation.few_rows`).

``Generator(..., compile_decode=True)`` decodes on transformers' path with a compiled decode
step (:func:`decode_compile_kwargs`: a static KV cache sized up to a multiple of
:data:`STATIC_CACHE_STEP` positions and ``torch.compile`` of the model's forward, also on the
CPU); the prefill stays eager, the first call of each new shape compiles (minutes on a small
CPU: warm it up before timing). Mathematically the same decoding; compiled kernels may sum in
another order, so greedy tokens can differ where two logits nearly tie (the benchmark checks).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flexigpt.core.devices import model_device
from flexigpt.runtime.generation.draft import (
    DEFAULT_DRAFT_LENGTH,
    SPECULATIVE_METHODS,
    build_draft,
    draft_extra_bytes,
    set_draft_length,
    skipped_blocks,
)
from flexigpt.runtime.generation.few_rows import few_row_route
from flexigpt.runtime.generation.figures import decode_rates, rss_bytes
from flexigpt.runtime.generation.speculative import DecodeResult, greedy_decode, speculative_decode
from flexigpt.runtime.generation.transformers_engine import generate_batches
from flexigpt.storage.artifacts import LoadedModel, load_compressed
from flexigpt.storage.models.adapters import get_adapter

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: the static KV cache of a compiled decode step is sized to the next multiple of this many
#: positions (prompt + new tokens), so prompts of similar length share one compiled graph
STATIC_CACHE_STEP = 256

#: ``torch.compile`` backend of the compiled decode step (tests use ``eager``: Dynamo's graph
#: capture without Inductor's code generation)
COMPILE_BACKEND = "inductor"


def decode_compile_kwargs(prompt_len: int, max_new_tokens: int) -> dict[str, Any]:
    """``generate`` keyword arguments for a compiled decode step: a static cache of
    ``ceil((prompt_len + max_new_tokens) / STATIC_CACHE_STEP) · STATIC_CACHE_STEP`` positions
    and ``torch.compile`` (inductor, default mode: CUDA graphs are not used on the CPU) of
    the forward, on every device (transformers compiles only on accelerators unless told)."""
    from transformers import CompileConfig

    config = CompileConfig(backend=COMPILE_BACKEND)
    config.mode = "default" if COMPILE_BACKEND == "inductor" else None  # type: ignore[assignment]
    config._compile_all_devices = True  # type: ignore[assignment]  # transformers' switch for the CPU
    step = STATIC_CACHE_STEP
    return {"cache_implementation": "static", "compile_config": config,
            "max_cache_len": -(-(prompt_len + max_new_tokens) // step) * step}


#: decoding engines: transformers' ``generate`` (assisted generation when speculative), our
#: lean greedy loops (:mod:`flexigpt.runtime.generation.speculative`; batch 1), or ``auto`` = lean
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


def _check_options(prompts: list[str], max_new_tokens: int, batch_size: int, do_sample: bool,
                   temperature: float, top_p: float, engine: str, speculative: bool) -> bool:
    """Validate :meth:`Generator.generate`'s options; returns whether the lean engine runs.

    Raises:
        ValueError: no prompts, a size below 1, bad sampling settings, an unknown engine or
            sampling asked of the lean engine.
    """
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
    return lean


class Generator:
    """A loaded model (and its draft, built on first speculative use) ready to generate.

    Args:
        model_dir: a saved model directory, or a ``LoadedModel`` / ``(model, tokenizer,
            manifest)`` already in memory.
        dtype: weight dtype when loading.
        device: where a model loaded here goes (:mod:`flexigpt.core.devices`); prompts are
            encoded onto the model's device.
        compile_decode: decode through transformers' ``generate`` with a compiled decode
            step (:func:`decode_compile_kwargs`); the lean loops and speculative decoding
            are refused for such a generator (ValueError).
    """

    def __init__(self, model_dir: Any, dtype: str = "float32", device: str = "cpu",
                 compile_decode: bool = False) -> None:
        if isinstance(model_dir, LoadedModel):
            loaded = model_dir
        elif isinstance(model_dir, tuple):
            loaded = LoadedModel(*model_dir)
        else:
            loaded = load_compressed(model_dir, dtype=dtype, device=device)
        self.model: Any  # a transformers PreTrainedModel (LoadedModel types it nn.Module)
        self.model, self.tokenizer, self.manifest = loaded.model, loaded.tokenizer, loaded.manifest
        self.model.eval()
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        self._draft: PreTrainedModel | None = None
        self.draft_info: dict[str, Any] = {}
        self.compile_decode = bool(compile_decode)

    @property
    def method(self) -> str | None:
        return self.manifest.method if self.manifest is not None else None

    def supports_speculative(self) -> bool:
        return self.method in SPECULATIVE_METHODS

    def draft(self, draft_length: int = DEFAULT_DRAFT_LENGTH) -> PreTrainedModel:
        """The self-speculative draft (built once; shares every tensor with the model)."""
        if self._draft is None:
            n_blocks = len(get_adapter(self.model).layers(self.model))
            structure = self.manifest.structure if self.manifest is not None else None
            skip = skipped_blocks(self.method, structure, n_blocks)
            rss0 = rss_bytes()
            self._draft = build_draft(self.model, skip, draft_length)
            self.draft_info = {"skipped_blocks": skip, "draft_blocks": n_blocks - len(skip),
                               "full_blocks": n_blocks,
                               "extra_bytes": draft_extra_bytes(self._draft, self.model),
                               "build_rss_delta_bytes": rss_bytes() - rss0}
        set_draft_length(self._draft, draft_length)
        return self._draft

    def _speculative_draft(self, draft_length: int) -> PreTrainedModel:
        """:meth:`draft`, refused (ValueError) for a model that is not a FlexiGPT model."""
        if not self.supports_speculative():
            raise ValueError(f"speculative decoding needs a FlexiGPT model "
                             f"({'/'.join(SPECULATIVE_METHODS)}); this one is "
                             f"{self.method or 'a plain checkpoint'!r}")
        return self.draft(draft_length)

    def eos_ids(self) -> set[int]:
        """The model's end-of-sequence token ids (generation config, else the tokenizer's)."""
        eos = self.model.generation_config.eos_token_id
        eos = self.tokenizer.eos_token_id if eos is None else eos
        return set([eos] if isinstance(eos, int) else (eos or []))

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
        lean = _check_options(prompts, max_new_tokens, batch_size, do_sample, temperature,
                              top_p, engine, speculative)
        if self.compile_decode and (lean or speculative):
            raise ValueError("a compiled decode step runs on transformers' plain decoding "
                             "only (engine='transformers', speculative=False)")
        draft = self._speculative_draft(draft_length) if speculative else None
        if speculative or lean:
            batch_size = 1  # assisted generation and our loops: one sequence at a time
        model_eos = self.eos_ids()
        eos_ids: set[int] = set() if ignore_eos else model_eos
        if lean:  # the same rule: EOS masked out when ignored, a stop otherwise
            return self._generate_lean(prompts, max_new_tokens, draft, draft_length,
                                       eos_ids, seed,
                                       suppress_ids=model_eos if ignore_eos else set())
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": do_sample,
                                  "pad_token_id": self.tokenizer.pad_token_id}
        if do_sample:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        if ignore_eos:
            # EOS is masked out (min_new_tokens): every sequence gets max_new_tokens tokens
            kwargs.update(min_new_tokens=max_new_tokens)
        torch.manual_seed(seed)
        batches: Iterator[dict[str, Any]] = (
            self.encode(prompts[start:start + batch_size])
            for start in range(0, len(prompts), batch_size))
        if self.compile_decode:
            batches = ({**enc, "generate_kwargs": decode_compile_kwargs(
                enc["input_ids"].shape[1], max_new_tokens)} for enc in batches)
        new_ids, sums = generate_batches(self.model, draft, batches, kwargs, eos_ids,
                                         clock="streamer" if self.compile_decode else "hooks")
        texts = [self.tokenizer.decode(kept, skip_special_tokens=True) for kept in new_ids]
        stats = self._transformers_stats(len(prompts), new_ids, sums, max_new_tokens,
                                         do_sample, seed, batch_size, speculative,
                                         draft_length)
        return GenerationOutput(prompts=prompts, texts=texts, token_ids=new_ids, stats=stats)

    def _transformers_stats(self, n_prompts: int, new_ids: list[list[int]],
                            sums: dict[str, float], max_new_tokens: int, do_sample: bool,
                            seed: int, batch_size: int, speculative: bool,
                            draft_length: int) -> dict[str, Any]:
        """The statistics of a transformers run from its sums (see the package docstring)."""
        stats: dict[str, Any] = {
            "method": self.method, "prompts": n_prompts,
            "new_tokens": sum(len(t) for t in new_ids), "max_new_tokens": max_new_tokens,
            "do_sample": do_sample, "seed": seed, "batch_size": batch_size,
            "speculative": speculative, "threads": torch.get_num_threads(),
            "wall_s": sums["wall_s"], "batches": sums["batches"],
            "full_forwards": sums["full_forwards"]}
        if speculative:
            stats.update(speculative_batch=1, draft_length=draft_length,
                         draft_forwards=sums["draft_forwards"], rounds=sums["rounds"],
                         drafted=sums["drafted"], accepted=sums["accepted"],
                         rejections=sums["rejections"], draft=dict(self.draft_info))
        else:
            stats.update(prefill_s=sums["prefill_s"], decode_s=sums["decode_s"],
                         decode_steps=sums["decode_steps"])
        stats.update(decode_rates(stats, batch_size), engine="transformers",
                     compiled_decode=self.compile_decode)
        return stats

    def _generate_lean(self, prompts: list[str], max_new_tokens: int, draft: nn.Module | None,
                       draft_length: int, eos_ids: set[int], seed: int,
                       suppress_ids: set[int] | frozenset[int] = frozenset()) -> GenerationOutput:
        """Greedy decoding of each prompt alone with our loops (plain, or speculative with
        ``draft``); the same statistics as the transformers path plus ``few_row_route`` (the
        loops' :func:`~flexigpt.runtime.generation.few_rows.few_row_route` decision for the model's
        device). ``eos_ids`` end a sequence, ``suppress_ids`` are never generated (EOS when
        it is ignored, as transformers' ``min_new_tokens`` does)."""
        route = few_row_route(model_device(self.model))
        runs: list[DecodeResult] = []
        for prompt in prompts:
            ids = self.encode([prompt])["input_ids"][0]
            if draft is None:
                runs.append(greedy_decode(self.model, ids, max_new_tokens, eos_ids,
                                          suppress_ids, route=route))
            else:
                runs.append(speculative_decode(self.model, draft, ids, max_new_tokens,
                                               draft_length, eos_ids, suppress_ids,
                                               route=route))
        new_ids = [r.tokens for r in runs]
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in new_ids]
        stats = self._lean_stats(len(prompts), runs, max_new_tokens, seed, draft is not None,
                                 draft_length, route)
        return GenerationOutput(prompts=prompts, texts=texts, token_ids=new_ids, stats=stats)

    def _lean_stats(self, n_prompts: int, runs: list[DecodeResult], max_new_tokens: int,
                    seed: int, speculative: bool, draft_length: int,
                    route: bool) -> dict[str, Any]:
        """The statistics of a lean run from its per-prompt results."""
        wall = sum(r.wall_s for r in runs)
        stats: dict[str, Any] = {
            "method": self.method, "prompts": n_prompts,
            "new_tokens": sum(len(r.tokens) for r in runs),
            "max_new_tokens": max_new_tokens, "do_sample": False, "seed": seed,
            "batch_size": 1, "speculative": speculative,
            "threads": torch.get_num_threads(), "wall_s": wall, "batches": len(runs),
            "full_forwards": sum(r.full_forwards for r in runs), "engine": "lean",
            "few_row_route": route}
        if not speculative:
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
        return stats


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
        device: where the model is loaded (:mod:`flexigpt.core.devices`).
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
