"""Inference-cost tables (paper Tables 6 and 7) from timing JSONs.

Timing rows carry ``relative_time`` / ``relative_throughput`` as fractions of the
reference (dense) model, 1.0 = same; they are shown in %, like the paper. Table 6 holds the
pruning methods, Table 7 the extension; the dense reference row appears in both. Where the
timing JSON measured decoding, a decoding block follows (:mod:`flexigpt.tables.decode`).
"""

from __future__ import annotations

import logging

import pandas as pd

from flexigpt.storage.registry import ROLES
from flexigpt.tables.decode import decode_block
from flexigpt.tables.labels import METHOD_LABELS, METHOD_ORDER, display_name, method_label, slug
from flexigpt.tables.paper_blocks import paper_title, reference_model
from flexigpt.tables.published import match_published
from flexigpt.tables.render import Block, Table

log = logging.getLogger(__name__)

#: table number → (title, predicate on our rows' method, the paper's fallback model).
SPECS = {6: ("inference cost (pruning)", lambda m: m != ROLES.extension, "llama-2-7b"),
         7: ("inference cost (extension)", lambda m: m in (ROLES.reference, ROLES.extension),
             "tinyllama-1.1b")}
RANK = {m: i for i, m in enumerate(METHOD_ORDER)}
_KINDS = {"Ratio": "pct0", "Seconds": "num3", "Tokens/s": "num0", "Norm. time": "pct1",
          "Throughput": "pct1"}


def _label(method: str, variant: str) -> str:
    if method == ROLES.extension:
        return f"FlexiGPT ({variant})" if variant else "FlexiGPT"
    return method_label(method, variant) if method in METHOD_LABELS else method


def _batch_block(g: pd.DataFrame, title: str, pub: pd.DataFrame, model: str,
                 number: int) -> tuple[Block, pd.DataFrame]:
    """Our timing rows of one (batch, seq_len) in table order: the block (times in %) and
    its CSV rows (``source`` ours, relative times in %, Δ ours − paper where it reports the
    setting)."""
    g = g.assign(_k=g["method"].map(lambda m: RANK.get(m, len(RANK)))).sort_values(
        ["ratio", "_k", "method", "variant"], na_position="first").drop(columns="_k")
    g = g.reset_index(drop=True)
    frame = pd.DataFrame({"Method": [_label(m, v) for m, v in zip(g["method"], g["variant"])],
                          "Ratio": g["ratio"].astype(float) * 100, "Seconds": g["seconds"],
                          "Tokens/s": g["tokens_per_s"], "Norm. time": g["relative_time"] * 100,
                          "Throughput": g["relative_throughput"] * 100})
    block = Block(title, frame, _KINDS,
                  notes=["Norm. time and Throughput relative to the dense model (100%)."])
    delta = []
    for _, r in g.iterrows():
        ref = match_published(pub, (number,), model, r["method"], r["variant"], r["ratio"], None)
        delta.append({"delta_relative_time": None if ref is None else
                      100 * r["relative_time"] - ref["relative_time"],
                      "delta_relative_throughput": None if ref is None else
                      100 * r["relative_throughput"] - ref["relative_throughput"]})
    part = (g.assign(source="ours", relative_time=g["relative_time"] * 100,
                     relative_throughput=g["relative_throughput"] * 100)
            .join(pd.DataFrame(delta, dtype=float)))
    return block, part


def timing_table(timings: pd.DataFrame, pub: pd.DataFrame, model: str, number: int,
                 display: str | None = None,
                 decodes: pd.DataFrame | None = None) -> Table | None:
    """Paper Table 6 (``number=6``) or 7 layout for one timed model; None without rows.
    ``decodes`` (:func:`flexigpt.tables.decode.collect_decodes`) adds the decoding block."""
    title = display_name(model, display)
    what, keep, fallback = SPECS[number]
    rows = timings[timings["model"].eq(model) & timings["method"].map(keep)]
    if not (rows["method"] != ROLES.reference).any():
        log.info("table %d for %s: no timing rows; skipped", number, model)
        return None
    blocks, csv_parts = [], []
    for (batch, seq_len), g in rows.groupby(["batch", "seq_len"], sort=True):
        block, part = _batch_block(g, f"Ours: {title}, batch {batch}, seq_len {seq_len}", pub,
                                   model, number)
        blocks.append(block)
        csv_parts.append(part)
    dec = None
    if decodes is not None and not decodes.empty:
        mine = decodes[decodes["model"].eq(model) & decodes["method"].map(keep)]
        mine = mine.reset_index(drop=True)
        dec = decode_block(mine, f"Ours: {title}, decoding", _label)
        if dec is not None:
            blocks.append(dec)
            csv_parts.append(mine.assign(source="ours-decode"))
    key, same = reference_model(model, pub, (number,), fallback)
    paper = pub[pub["table"].eq(number) & pub["model"].eq(key)].reset_index(drop=True)
    blocks.append(Block(paper_title(key, (number,), same), pd.DataFrame({
        "Method": paper["label"], "Norm. time": paper["relative_time"],
        "Throughput": paper["relative_throughput"]}), _KINDS,
        notes=["Paper: 1× A100; normalised to the unpruned/base model."]))
    ours = pd.concat(csv_parts, ignore_index=True)
    matched = ours[["delta_relative_time", "delta_relative_throughput"]].notna().any(axis=1)
    matched &= ours["source"].eq("ours")
    if matched.any():
        hit = ours[matched]
        blocks.append(Block("Δ ours − paper (same setting, percentage points)", pd.DataFrame({
            "Method": [_label(m, v) for m, v in zip(hit["method"], hit["variant"])],
            "Δ Norm. time": hit["delta_relative_time"].values,
            "Δ Throughput": hit["delta_relative_throughput"].values}),
            {"Δ Norm. time": "delta_pct", "Δ Throughput": "delta_pct"}))
    csv = pd.concat([ours, paper.assign(source="paper")[
        ["source", "model", "label", "method", "variant", "relative_time",
         "relative_throughput", "citation"]]], ignore_index=True)
    name = "table6_inference" if number == 6 else "table7_extension_cost"
    return Table(f"{name}_{slug(model)}", f"Table {number} — {what}, {title}", blocks, csv)
