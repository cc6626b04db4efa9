"""What a compression ratio is a fraction of: every parameter, or every parameter outside the
token embedding, the (untied) LM head and a learned position table.

The paper's LLaMA-2-7B holds 4 % of its parameters in its embeddings, so the two bases
nearly agree there. Gemma 3 270M holds 168M of its 268M parameters in its tied 262K-token
embedding: 30 % of the *total* would take ~80 % of its blocks, while 30 % of the
*non-embedding* parameters takes 30 % of what the blocks hold, as on LLaMA. The basis is an
explicit, recorded setting (``compression_basis`` in a config, ``--basis`` on
``flexigpt compress``); the default ``total`` is the harness's historical definition.

Every method whose removals leave the embeddings alone (all but SliceGPT, whose rotation
slices them: ``MethodFacts.embedding_surgery``) removes the same parameters whichever basis
names the target, so a target on the ``non_embedding`` basis is converted once, at the
edge, into the equal target on the ``total`` basis (:func:`to_total`) and every method,
block-count rule and like-for-like match keeps counting on the total basis. Both achieved
ratios are recorded in the manifest (:func:`achieved_ratios`).
"""

from __future__ import annotations

from typing import Any

from flexigpt.core.params import compression_ratio
from flexigpt.methods.block_count import unique_param_count
from flexigpt.storage.models.adapters import get_adapter

BASES = ("total", "non_embedding")


def check_basis(basis: Any) -> str:
    """``basis`` when it is one of :data:`BASES`; else ``ValueError`` naming the choices."""
    if basis not in BASES:
        raise ValueError(f"compression basis must be one of {list(BASES)}, got {basis!r}")
    return str(basis)


def embedding_parameters(model: Any) -> int:
    """Unique parameters of ``model``'s token embedding, LM head (0 more when tied) and
    learned position table (real or meta-device model; tied tensors counted once)."""
    adapter = get_adapter(model)
    modules = [adapter.embed(model), adapter.lm_head(model), adapter.position_embed(model)]
    seen: set[Any] = set()
    total = 0
    for module in modules:
        if module is None:
            continue
        for p in module.parameters():
            key = id(p) if p.is_meta else (p.untyped_storage().data_ptr(), p.storage_offset())
            if key not in seen:
                seen.add(key)
                total += p.numel()
    return total


def to_total(ratio: float, basis: str, dense_params: int, embedding_params: int) -> float:
    """The ratio on the ``total`` basis that removes what ``ratio`` on ``basis`` removes
    from a model of ``dense_params`` parameters, ``embedding_params`` of them embeddings:
    ``ratio · (dense − E) / dense`` for ``non_embedding``, ``ratio`` itself for ``total``."""
    if check_basis(basis) == "total":
        return ratio
    if not 0 <= embedding_params < dense_params:
        raise ValueError(f"{embedding_params} embedding parameters of {dense_params}: no "
                         "non-embedding basis")
    return ratio * (dense_params - embedding_params) / dense_params


def total_target(model: Any, ratio: float, basis: str) -> float:
    """:func:`to_total` of ``ratio`` on ``model`` (real or meta-device skeleton: parameters
    de-duplicated by identity there, by storage otherwise)."""
    if check_basis(basis) == "total":
        return ratio
    return to_total(ratio, basis, unique_param_count(model), embedding_parameters(model))


def achieved_ratios(dense_params: int, compressed_params: int,
                    embedding_params: int) -> dict[str, float]:
    """``{basis: achieved ratio}`` for both bases of a compression that left
    ``embedding_params`` embedding parameters in place."""
    return {"total": compression_ratio(compressed_params, dense_params),
            "non_embedding": compression_ratio(compressed_params - embedding_params,
                                               dense_params - embedding_params)}
