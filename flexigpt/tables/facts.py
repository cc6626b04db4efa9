"""Facts of a run's dense model that the tables need and no result file records.

``model_facts`` maps a model key to::

    {"embedding_params": int,      # token embedding + untied LM head + position table
     "compression_basis": str}     # what the run's ratios are fractions of (total | non_embedding)

They are computed from the model's config by :func:`flexigpt.workflow.dag.table_inputs.model_facts` (a
meta-device skeleton, no weights), passed to :func:`flexigpt.tables.build_all` by the DAG's
``tables`` rule and kept in a run archive's index, so a rebuilt table shows them too.
With them Table 1 shows both achieved ratios (:func:`non_embedding_ratio`): of all
parameters, and of the parameters outside the embeddings, which is what a ratio of an
embedding-heavy model (Gemma 3 270M: 168M of 268M) is a fraction of.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from flexigpt.methods.compression_basis import BASES
from flexigpt.storage.registry import METHODS
from flexigpt.tables.rows import column_or_nan

#: the agg columns :func:`with_facts` adds
EMBEDDING, BASIS, ACHIEVED = "embedding_params", "compression_basis", "achieved_ratio_non_embedding"


def check_facts(facts: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """``facts`` as plain dicts, each entry checked; ``ValueError`` naming the model and key
    of the first bad one."""
    checked: dict[str, dict[str, Any]] = {}
    for model, entry in (facts or {}).items():
        if not isinstance(model, str) or not isinstance(entry, Mapping):
            raise ValueError(f"model_facts must map model keys to objects, got {model!r}")
        embedding = entry.get(EMBEDDING)
        if not isinstance(embedding, int) or isinstance(embedding, bool) or embedding < 0:
            raise ValueError(f"model_facts[{model!r}].{EMBEDDING} must be an integer >= 0, "
                             f"got {embedding!r}")
        basis = entry.get(BASIS, "total")
        if basis not in BASES:
            raise ValueError(f"model_facts[{model!r}].{BASIS} must be one of {list(BASES)}, "
                             f"got {basis!r}")
        checked[model] = {EMBEDDING: embedding, BASIS: basis}
    return checked


def with_facts(agg: pd.DataFrame, facts: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """``agg`` with :data:`EMBEDDING`, :data:`BASIS` (from ``facts``; missing for a model
    without facts) and :data:`ACHIEVED` (:func:`non_embedding_ratio`) columns; unchanged
    when there are no facts."""
    if not facts:
        return agg
    out = agg.assign(**{
        EMBEDDING: agg["model"].map(lambda m: facts.get(m, {}).get(EMBEDDING)).astype(float),
        BASIS: agg["model"].map(lambda m: facts.get(m, {}).get(BASIS))})
    return out.assign(**{ACHIEVED: non_embedding_ratio(out)})


def non_embedding_ratio(rows: pd.DataFrame) -> pd.Series:
    """1 − (compressed − E) / (dense − E) per row, E = the model's embedding parameters;
    NaN where E is unknown or the method removes embedding parameters itself (SliceGPT's
    rotation slices them: ``MethodFacts.embedding_surgery``), whose compressed embedding
    is not E."""
    embedding = column_or_nan(rows, EMBEDDING)
    dense = column_or_nan(rows, "params_dense")
    kept = column_or_nan(rows, "params_compressed") - embedding
    ratio = 1 - kept / (dense - embedding)
    surgery = rows["method"].map(lambda m: m in METHODS and METHODS[m].embedding_surgery)
    return ratio.where(~surgery.astype(bool))


def basis_note(rows: pd.DataFrame) -> str | None:
    """What the two achieved columns count and which one the targets are on; None without
    facts."""
    embedding = column_or_nan(rows, EMBEDDING).dropna()
    if embedding.empty:
        return None
    dense = column_or_nan(rows, "params_dense").dropna()
    basis = column_or_nan(rows, BASIS).dropna()
    share = (f" ({embedding.iloc[0] / 1e6:.1f}M of {dense.iloc[0] / 1e6:.1f}M here)"
             if len(dense) else "")
    on = ("all parameters" if basis.empty or basis.iloc[0] == "total"
          else "the parameters outside the embeddings")
    return ("Achieved (non-emb.) = 1 − (compressed − E)/(dense − E), E = the token embedding, "
            f"untied LM head and position table{share}; – where the method slices the "
            f"embedding itself (SliceGPT). Ratio targets are fractions of {on} "
            "(config compression_basis).")
