"""The paper's claims checked against our results (``verdicts.md/.csv``).

One row per claim and setting: the paper's numbers (:mod:`flexigpt.tables.published`), ours
(point values), the 95 % interval of the deciding paired difference and the verdict,
decided by the interval only (:func:`flexigpt.stats.verdict`): ``supported`` /
``contradicted`` / ``undecided at this budget``; ``not run in this config`` when a run is
missing, ``no records`` / ``unpaired`` when no paired interval can be formed. Counted
claims ("best on k of 6 benchmarks"; benchmarks = PPL + the five tasks) decide each
benchmark by its intervals (vs every comparison run), then: supported iff at least k are
supported, contradicted iff more than 6 − k are contradicted, else undecided.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd

from flexigpt.tables.build import ABLATIONS, main_rows, method_label, table_of
from flexigpt.tables.collect import TASKS
from flexigpt.tables.comparisons import NO_RECORDS, NOT_RUN, UNPAIRED, Comparator, Diff, key_of
from flexigpt.tables.published import match_published
from flexigpt.tables.render import Block, Table

SUPPORTED, CONTRADICTED, UNDECIDED = "supported", "contradicted", "undecided at this budget"
MISSING_RUN = "not run in this config"
BENCHMARKS = ("log_ppl", *TASKS)
_STATUS = {NOT_RUN: MISSING_RUN, NO_RECORDS: "no records (point values only)",
           UNPAIRED: "unpaired"}
_COL = {"log_ppl": "ppl"}  # metric → column of agg / published
_PAPER_T1 = "llama-2-7b"
_PAPER_T5 = "tinyllama-1.1b"


def decide(diff: Diff, direction: str) -> str:
    """The verdict of one paired difference (``direction``: ``greater`` | ``less``)."""
    if diff.interval is None:
        return _STATUS.get(diff.status, diff.status)
    v = diff.interval.verdict(direction)
    return UNDECIDED if v == "undecided" else v


def decide_count(verdicts: list[str], need: int) -> str:
    """Verdict of "at least ``need`` of these benchmarks are won" from per-benchmark ones."""
    if all(v == MISSING_RUN for v in verdicts):
        return MISSING_RUN
    won = sum(v == SUPPORTED for v in verdicts)
    lost = sum(v == CONTRADICTED for v in verdicts)
    if won >= need:
        return SUPPORTED
    if lost > len(verdicts) - need:
        return CONTRADICTED
    return UNDECIDED


def _num(value: Any, metric: str) -> str:
    if value is None or pd.isna(value):
        return "–"
    return f"{float(value):.2f}"


def _point(agg: pd.DataFrame, key: tuple, metric: str) -> Any:
    model, method, variant, ratio, stage = key
    rows = agg[agg["model"].eq(model) & agg["method"].eq(method) & agg["variant"].eq(variant)
               & agg["stage"].eq(stage)]
    rows = rows[rows["ratio"].isna()] if ratio is None else rows[
        (rows["ratio"] - ratio).abs().lt(1e-6)]
    return rows[_COL.get(metric, metric)].iloc[0] if len(rows) else None


def _paper(pub: pd.DataFrame, table: int | tuple[int, int], model: str, a: tuple, b: tuple,
           metric: str) -> str:
    """``A vs B`` of the paper's numbers (``a``/``b`` = (method, variant, ratio, stage);
    ``table`` one number or one per side)."""
    vals = []
    tables = table if isinstance(table, tuple) else (table, table)
    for t, (method, variant, ratio, stage) in zip(tables, (a, b)):
        ref = match_published(pub, (t,), model, method, variant, ratio, stage)
        vals.append(_num(None if ref is None else ref[_COL.get(metric, metric)], metric))
    return "" if vals == ["–", "–"] else f"{vals[0]} vs {vals[1]}"


def _ours(agg: pd.DataFrame, a: tuple, b: tuple, metric: str) -> str:
    return f"{_num(_point(agg, a, metric), metric)} vs {_num(_point(agg, b, metric), metric)}"


def _row(claim: str, setting: str, paper: str, ours: str, diff: Diff | None,
         verdict: str, metric: str = "") -> dict[str, Any]:
    iv = diff.interval if diff is not None else None
    digits = 3 if metric == "log_ppl" else 1
    return {"Claim": claim, "Setting": setting, "Paper": paper or "–", "Ours": ours,
            "Metric": metric, "Δ [95% CI]": diff.text(digits) if diff is not None else "–",
            "Verdict": verdict, "estimate": iv.estimate if iv else None,
            "ci_low": iv.low if iv else None, "ci_high": iv.high if iv else None}


_DIRECTION = {"log_ppl": "less"}  # lower log-PPL is better; accuracy: higher


def _ratios(agg: pd.DataFrame, model: str) -> list[float]:
    rows = main_rows(agg, model)
    found = sorted(r for r in rows["ratio"].dropna().unique() if r > 0)
    return sorted(set(found) | {0.3, 0.4})


def claims_ab(agg, pub, comp: Comparator, model: str) -> Iterator[dict[str, Any]]:
    """(a) PPL and (b) average accuracy: FlexiGPT* vs ShortGPT + LoRA* per ratio."""
    for tag, metric in (("(a) FlexiGPT* lower PPL than ShortGPT + LoRA*", "log_ppl"),
                        ("(b) FlexiGPT* higher Avg than ShortGPT + LoRA*", "avg")):
        for r in _ratios(agg, model):
            a, b = (key_of(agg, model, m, "default", r) for m in ("flexigpt", "shortgpt_lora"))
            d = comp.diff(a, b, metric)
            yield _row(tag, f"{100 * r:.0f}%", _paper(pub, 1, _PAPER_T1, ("flexigpt", "default",
                       r, "final"), ("shortgpt_lora", "default", r, "final"), metric),
                       _ours(agg, a, b, metric), d, decide(d, _DIRECTION.get(metric, "greater")),
                       metric)


def _benchmarks(comp: Comparator, a: tuple, others: list[tuple]) -> list[str]:
    """Per benchmark: supported iff A beats every other run, contradicted iff one beats A."""
    out = []
    for metric in BENCHMARKS:
        vs = [decide(comp.diff(a, b, metric), _DIRECTION.get(metric, "greater")) for b in others]
        if not vs:
            out.append(MISSING_RUN)
        elif CONTRADICTED in vs:
            out.append(CONTRADICTED)
        elif all(v == SUPPORTED for v in vs):
            out.append(SUPPORTED)
        else:
            out.append(next((v for v in vs if v not in (SUPPORTED, UNDECIDED)), UNDECIDED))
    return out


def _count_row(claim: str, setting: str, paper: str, names: list[str], per: list[str],
               need: int) -> dict[str, Any]:
    won = sum(v == SUPPORTED for v in per)
    detail = "; ".join(f"{b}: {v}" for b, v in zip(BENCHMARKS, per))
    row = _row(claim, setting, paper, f"{won}/{len(per)} supported vs {', '.join(names)}",
               None, decide_count(per, need), "count")
    row["Δ [95% CI]"] = detail
    return row


def claim_c(agg, pub, comp: Comparator, model: str) -> Iterator[dict[str, Any]]:
    """(c) FlexiGPT* best on 5/6 (30%) and 6/6 (40%) benchmarks vs recovered baselines."""
    rows = main_rows(agg, model)
    for r, need in ((0.3, 5), (0.4, 6)):
        at = rows[(rows["ratio"] - r).abs().lt(1e-6) & rows["trained"].astype(bool)
                  & ~rows["method"].isin(["dense", "flexigpt"]) & ~rows["loss"].eq("kd")]
        others = [key_of(agg, model, m, v, r) for m, v in zip(at["method"], at["variant"])]
        names = [method_label(m, v) + "*" for m, v in zip(at["method"], at["variant"])]
        a = key_of(agg, model, "flexigpt", "default", r)
        per = (_benchmarks(comp, a, others) if comp.has(a) and others
               else [MISSING_RUN] * len(BENCHMARKS))
        yield _count_row("(c) FlexiGPT* best vs the recovered baselines", f"{100 * r:.0f}%",
                         f"best on {need}/6", names or ["–"], per, need)


def claim_d(agg, pub, comp: Comparator, model: str) -> Iterator[dict[str, Any]]:
    """(d) Table 4 ordering of the ablations."""
    abl = agg[agg["model"].eq(model) & agg["method"].eq("flexigpt")
              & table_of(agg).eq("ablation")]
    ratios = sorted(set(abl["ratio"].dropna()) | {0.3})
    for r in ratios:
        full = {s: key_of(agg, model, "flexigpt", "default", r, s) for s in ("start", "final")}
        checks = [(f"(d) full method lower final PPL than '{ABLATIONS[v]}'", full["final"],
                   key_of(agg, model, "flexigpt", v, r, "final"), "less", v, "final")
                  for v in ("no_lowrank", "no_outnorm", "no_svdinit")]
        checks += [("(d) no output norm. → higher start PPL",
                    key_of(agg, model, "flexigpt", "no_outnorm", r, "start"), full["start"],
                    "greater", "no_outnorm", "start"),
                   ("(d) no SVD init. → lower start PPL",
                    key_of(agg, model, "flexigpt", "no_svdinit", r, "start"), full["start"],
                    "less", "no_svdinit", "start"),
                   ("(d) no SVD init. → higher final PPL",
                    key_of(agg, model, "flexigpt", "no_svdinit", r, "final"), full["final"],
                    "greater", "no_svdinit", "final")]
        for claim, a, b, direction, variant, stage in checks:
            d = comp.diff(a, b, "log_ppl")
            pa, pb = (a[1:3], b[1:3])
            paper = _paper(pub, 4, _PAPER_T1, ("flexigpt", pa[1], r, stage),
                           ("flexigpt", pb[1], r, stage), "log_ppl")
            yield _row(claim, f"{100 * r:.0f}%", paper, _ours(agg, a, b, "log_ppl"), d,
                       decide(d, direction), "log_ppl")


def claim_e(agg, pub, comp: Comparator, model: str) -> Iterator[dict[str, Any]]:
    """(e) FlexiGPT's start PPL (before recovery) below one-shot ShortGPT's."""
    for r in _ratios(agg, model):
        a = key_of(agg, model, "flexigpt", "default", r, "start")
        b = key_of(agg, model, "shortgpt", "default", r, "final")
        d = comp.diff(a, b, "log_ppl")
        paper = _paper(pub, (4, 1), _PAPER_T1, ("flexigpt", "default", r, "start"),
                       ("shortgpt", "default", r, "final"), "log_ppl")
        yield _row("(e) FlexiGPT start PPL ≤ ShortGPT (one-shot)", f"{100 * r:.0f}%", paper,
                   _ours(agg, a, b, "log_ppl"), d, decide(d, "less"), "log_ppl")


def claim_f(agg, pub, comp: Comparator, model: str) -> Iterator[dict[str, Any]]:
    """(f) the extension beats the base (and the same-budget controls) on 6/6 benchmarks."""
    bases = [("default", "Base"), ("trained", "Base trained (control)"),
             ("trained_lora", "Base + LoRA (control)")]
    for variant in ("block", "sequential"):
        a = key_of(agg, model, "flexigpt_extend", variant, None)
        for dv, name in bases:
            b = key_of(agg, model, "dense", dv, 0.0)
            per = (_benchmarks(comp, a, [b]) if comp.has(a) and comp.has(b)
                   else [MISSING_RUN] * len(BENCHMARKS))
            paper = "not in the paper"
            if dv == "default":
                avg = _paper(pub, 5, _PAPER_T5, ("flexigpt_extend", variant, None, "final"),
                             ("dense", "default", None, "final"), "avg")
                paper = f"Avg {avg}; better on 6/6" if avg else "better on 6/6"
            yield _count_row(f"(f) FlexiGPT extension ({variant}) beats {name}", "extension",
                             paper, [name], per, 6)


def claim_g(times: pd.DataFrame, pub: pd.DataFrame, model: str) -> Iterator[dict[str, Any]]:
    """(g) inference cost ratios (Tables 6, 7): reported, never decided (no interval)."""
    rows = times[times["model"].eq(model)] if not times.empty else times
    if rows.empty:
        yield _row("(g) inference cost (Tables 6, 7)", "–", "", "not measured", None,
                   "not measured")
        return
    for _, t in rows[~rows["method"].eq("dense")].iterrows():
        table = 7 if t["method"] == "flexigpt_extend" else 6
        ref = match_published(pub, (table,), _PAPER_T1 if table == 6 else _PAPER_T5,
                              t["method"], t["variant"], None, None)
        paper = "" if ref is None else (f"time {_num(ref['relative_time'], '')}%, throughput "
                                        f"{_num(ref['relative_throughput'], '')}%")
        ours = (f"time {100 * t['relative_time']:.1f}%, throughput "
                f"{100 * t['relative_throughput']:.1f}% (batch {t['batch']})")
        yield _row(f"(g) Table {table}: {method_label(t['method'], t['variant'])} relative "
                   "to dense", "", paper, ours, None, "reported (single timing, no interval)")


def claim_h(decodes: pd.DataFrame | None, model: str) -> Iterator[dict[str, Any]]:
    """(h) self-speculative decoding is faster than plain FlexiGPT decoding (paper: 30.11 %
    faster): reported from the decoding timings, never decided (no interval)."""
    from flexigpt.tables.decode import PAPER_SPECULATIVE_FASTER

    rows = (decodes[decodes["model"].eq(model) & decodes["mode"].eq("speculative")]
            if decodes is not None and not decodes.empty else pd.DataFrame())
    if rows.empty:
        return
    for _, d in rows.iterrows():
        same = "identical" if d["identical"] else "NOT identical"
        ours = (f"{100 * (d['speedup'] - 1):+.1f}% (speed-up {d['speedup']:.3f}, bound "
                f"{d['bound']:.3f}; α {d['alpha']:.3f}, c {d['c']:.3f}, k {int(d['k'])}; "
                f"greedy output {same})")
        yield _row(f"(h) self-speculative decoding faster than plain "
                   f"{method_label(d['method'], d['variant'])} decoding", "batch 1",
                   f"+{PAPER_SPECULATIVE_FASTER:.2f}%", ours, None,
                   "reported (single timing, no interval)")


def verdict_table(agg: pd.DataFrame, pub: pd.DataFrame, times: pd.DataFrame,
                  comp: Comparator, models: list[str],
                  decodes: pd.DataFrame | None = None) -> Table | None:
    """``verdicts``: one block per model with results beyond the dense model (None: no
    such model); CSV one row per claim row (+ model). ``decodes``: the decoding timings
    (:func:`flexigpt.tables.decode.collect_decodes`) for claim (h)."""
    blocks, csv = [], []
    for model in models:
        mine = agg[agg["model"].eq(model)]
        if (mine["method"].eq("dense") & mine["variant"].eq("default")).all():
            continue  # only the dense model: no claim to check
        rows = [*claims_ab(agg, pub, comp, model), *claim_c(agg, pub, comp, model),
                *claim_d(agg, pub, comp, model), *claim_e(agg, pub, comp, model),
                *claim_f(agg, pub, comp, model), *claim_g(times, pub, model),
                *claim_h(decodes, model)]
        frame = pd.DataFrame(rows)
        csv.append(frame.assign(model=model))
        shown = frame[["Claim", "Setting", "Paper", "Ours", "Δ [95% CI]", "Verdict"]]
        blocks.append(Block(f"{model}: the paper's claims", shown, notes=[NOTE]))
    if not blocks:
        return None
    return Table("verdicts", "Verdicts on the paper's claims", blocks,
                 pd.concat(csv, ignore_index=True))


NOTE = ("Paper = Llama-2-7B (Tables 1, 4; Table 5: TinyLlama-1.1B), point values; Ours = "
        "point values (A vs B); Δ = A − B paired over the same documents / windows with its "
        "95% bootstrap interval (log-PPL in nats, accuracy in points). The verdict is decided "
        "by the interval alone: supported / contradicted when it excludes 0 on the claimed / "
        "other side, otherwise undecided at this budget. Counted claims: benchmarks = PPL + "
        "the five tasks, each won only if A beats every comparison run by its interval. "
        "Timings (g, h) have no interval and are reported, not decided.")
