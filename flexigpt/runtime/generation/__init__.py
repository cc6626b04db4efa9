"""Text generation for any saved model, with self-speculative decoding for FlexiGPT models.

:mod:`~flexigpt.runtime.generation.generator` holds :class:`Generator` and :func:`generate` (the
engines and the statistics they report are described there); the draft is built by
:mod:`~flexigpt.runtime.generation.draft`, our greedy loops live in
:mod:`~flexigpt.runtime.generation.speculative` (their few-row linears in
:mod:`~flexigpt.runtime.generation.few_rows`), the opt-in merged-weights path in
:mod:`~flexigpt.runtime.generation.merged` and the decode benchmark in
:mod:`~flexigpt.runtime.generation.measure`. This package re-exports the public names.
"""

from __future__ import annotations

from flexigpt.runtime.generation.draft import (
                                       DEFAULT_DRAFT_LENGTH,
                                       SPECULATIVE_METHODS,
                                       build_draft,
                                       draft_extra_bytes,
                                       skipped_blocks,
)
from flexigpt.runtime.generation.figures import decode_rates, expected_speedup, rss_bytes
from flexigpt.runtime.generation.generator import (
                                       ENGINES,
                                       GenerationOutput,
                                       Generator,
                                       generate,
                                       read_prompts,
)

__all__ = ["GenerationOutput", "Generator", "generate", "read_prompts", "expected_speedup",
           "decode_rates", "rss_bytes", "SPECULATIVE_METHODS", "DEFAULT_DRAFT_LENGTH", "ENGINES",
           "build_draft", "skipped_blocks", "draft_extra_bytes"]
