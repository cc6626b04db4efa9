"""Text generation for any saved model, with self-speculative decoding for FlexiGPT models.

:mod:`~flexigpt.generation.generator` holds :class:`Generator` and :func:`generate` (the
engines and the statistics they report are described there); the draft is built by
:mod:`~flexigpt.generation.draft`, our greedy loops live in
:mod:`~flexigpt.generation.speculative` (their few-row linears in
:mod:`~flexigpt.generation.few_rows`), the opt-in merged-weights path in
:mod:`~flexigpt.generation.merged` and the decode benchmark in
:mod:`~flexigpt.generation.measure`. This package re-exports the public names.
"""

from __future__ import annotations

from flexigpt.generation.draft import (
                                       DEFAULT_DRAFT_LENGTH,
                                       SPECULATIVE_METHODS,
                                       build_draft,
                                       draft_extra_bytes,
                                       skipped_blocks,
)
from flexigpt.generation.figures import decode_rates, expected_speedup, rss_bytes
from flexigpt.generation.generator import (
                                       ENGINES,
                                       GenerationOutput,
                                       Generator,
                                       generate,
                                       read_prompts,
)

__all__ = ["GenerationOutput", "Generator", "generate", "read_prompts", "expected_speedup",
           "decode_rates", "rss_bytes", "SPECULATIVE_METHODS", "DEFAULT_DRAFT_LENGTH", "ENGINES",
           "build_draft", "skipped_blocks", "draft_extra_bytes"]
