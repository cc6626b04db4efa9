"""Decoding figures of Tables 6/7: what generation costs, beside the paper's forward timing.

Read from the ``decode`` section of the timing JSONs (:func:`flexigpt.runtime.evaluation.inference
.run_inference_cost`): per timed model, greedy decoding at batch 1 and at a larger batch,
and for FlexiGPT models self-speculative decoding with the weight-sharing draft (one extra
row). ``Norm. time`` is end-to-end time per generated token at batch 1 relative to the dense
model (its tokens/s over the row's), so plain and speculative rows compare directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from flexigpt.storage.registry import ROLES
from flexigpt.tables.render import Block
from flexigpt.tables.schema import ResultFileError, need_number, read_json

#: the paper's claim: self-speculative decoding is 30.11 % faster than plain FlexiGPT decoding
PAPER_SPECULATIVE_FASTER = 30.11

KINDS = {"Ratio": "pct0", "Prefill ms": "num1", "ms/token": "num", "Tokens/s b1": "num1",
         "Tokens/s bB": "num1", "Norm. time": "pct1", "Peak Δ MB": "num0", "α": "num3",
         "Speed-up": "num3", "Bound": "num3"}


def parse_decode(path: str | Path) -> pd.DataFrame:
    """Decode rows of one timing JSON (empty frame when it measured no decoding): model,
    method, variant, ratio, mode (``plain`` / ``speculative``), prompts, new_tokens, batch,
    prefill_ms, per_token_ms, tokens_per_s_b1, tokens_per_s_bb, peak_delta_mb, and for
    speculative rows k, alpha, c, speedup, bound, identical."""
    path = Path(path)
    data = read_json(path)
    dec = data.get("decode")
    if not dec:
        return pd.DataFrame()
    head = {"file": str(path), "model": data.get("model"), "prompts": dec.get("prompts"),
            "new_tokens": dec.get("new_tokens"), "batch": dec.get("batch")}
    rows = []
    for i, e in enumerate(dec.get("rows") or []):
        where = f"decode.rows[{i}]."
        b1, bb = e.get("batch1") or {}, e.get("batched") or {}
        name = {**head, "method": e.get("method"), "variant": e.get("variant"),
                "ratio": e.get("ratio")}
        at1, atb = where + "batch1.", where + "batched."
        rows.append({**name, "mode": "plain",
                     "prefill_ms": need_number(path, e, "prefill_ms", where),
                     "per_token_ms": need_number(path, b1, "per_token_ms", at1),
                     "tokens_per_s_b1": need_number(path, b1, "tokens_per_s", at1),
                     "tokens_per_s_bb": need_number(path, bb, "tokens_per_s", atb),
                     "peak_delta_mb": need_number(path, b1, "peak_rss_delta_mb", at1)})
        spec = e.get("speculative")
        for k, s in (spec or {}).get("by_k", {}).items():
            at = f"{where}speculative.by_k[{k}]."
            rows.append({**name, "mode": "speculative", "k": int(k),
                         "tokens_per_s_b1": need_number(path, s, "tokens_per_s", at),
                         "peak_delta_mb": need_number(path, s, "peak_rss_delta_mb", at),
                         "alpha": need_number(path, s, "alpha", at),
                         "c": need_number(path, spec, "c", where),
                         "speedup": need_number(path, s, "speedup", at),
                         "bound": need_number(path, s, "bound", at),
                         "identical": bool(s.get("identical"))})
    if not rows:
        raise ResultFileError(path, "'decode.rows' is empty")
    return pd.DataFrame(rows)


def collect_decodes(paths: Sequence[str | Path]) -> pd.DataFrame:
    """Decode rows of every timing JSON (empty frame when none measured decoding)."""
    frames = [f for f in (parse_decode(p) for p in paths) if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def decode_block(rows: pd.DataFrame, title: str, label: Any) -> Block | None:
    """The decoding block of one Table 6/7 (``rows``: this table's decode rows, the dense
    reference among them; ``label(method, variant)`` names a row). None without rows."""
    if rows.empty:
        return None
    ref = rows[rows["method"].eq(ROLES.reference) & rows["mode"].eq("plain")]
    dense_tps = float(ref["tokens_per_s_b1"].iloc[0]) if not ref.empty else math.nan
    names = [label(m, v) + (f" + self-speculative (k={int(k)})" if mode == "speculative" else "")
             for m, v, mode, k in zip(rows["method"], rows["variant"], rows["mode"],
                                      rows.get("k", pd.Series([None] * len(rows))))]
    frame = pd.DataFrame({
        "Method": names, "Ratio": rows["ratio"].astype(float) * 100,
        "Prefill ms": rows["prefill_ms"], "ms/token": rows["per_token_ms"],
        "Tokens/s b1": rows["tokens_per_s_b1"], "Tokens/s bB": rows["tokens_per_s_bb"],
        "Norm. time": dense_tps / rows["tokens_per_s_b1"] * 100,
        "Peak Δ MB": rows["peak_delta_mb"],
        "α": rows.get("alpha"), "Speed-up": rows.get("speedup"), "Bound": rows.get("bound")})
    frame = frame.dropna(axis=1, how="all").reset_index(drop=True)
    first = rows.iloc[0]
    notes = [f"Greedy decoding of {int(first['prompts'])} held-out prompts, "
             f"{int(first['new_tokens'])} new tokens each (EOS ignored); ms/token = one decode "
             f"step at batch 1 after the prefill; Tokens/s end to end at batch 1 and at batch "
             f"{int(first['batch'])}; Norm. time = dense tokens/s (batch 1) over the row's; "
             f"Peak Δ MB = RSS rise while decoding (KV cache, activations)."]
    spec = rows[rows["mode"].eq("speculative")]
    if not spec.empty:
        same = "identical to" if spec["identical"].all() else "NOT identical to"
        notes.append(f"Self-speculative: the draft is the model without its replacement/repeat "
                     f"blocks (every weight shared); its greedy output is {same} plain "
                     f"decoding. Speed-up over the same model's plain batch-1 decoding; Bound "
                     f"= (1 − α^(k+1)) / ((1 − α)(k·c + 1)) for the measured α and "
                     f"draft/full cost c. Paper: {PAPER_SPECULATIVE_FASTER:.2f}% faster than "
                     f"plain FlexiGPT decoding (Llama-2-7B, 1× A100).")
    return Block(title, frame, {k: v for k, v in KINDS.items() if k in frame.columns},
                 notes=notes)
