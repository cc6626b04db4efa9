"""The paper's claims checked against our results (``verdicts.md/.csv``).

One row per claim, setting and (for the like-for-like claims) recovery token budget: the
paper's numbers (:mod:`flexigpt.tables.published`), ours (point values), the 95 % paired
bootstrap interval of the deciding difference Δ = A − B and the verdict. Claims (a)-(f) are
built here, the timing claims (g), (h) in :mod:`flexigpt.tables.timing_claims`, the rows
in :mod:`flexigpt.tables.claim_rows`. The rules (:mod:`flexigpt.tables.decision`, stated
again in the first block of ``verdicts.md``, :func:`~flexigpt.tables.decision.rules_block`):

* Smallest effect that matters, m (:class:`~flexigpt.tables.decision.Rules`; defaults
  ``LOG_PPL_MARGIN`` = 0.02 nats of log-PPL, a PPL ratio of ×1.02, and ``ACCURACY_MARGIN``
  = 1 accuracy point).
  With the interval oriented so that the claim reads Δ' > 0:
  ``supported`` iff the whole interval lies beyond +m (a minimum-effect test),
  ``contradicted`` iff it lies wholly beyond −m, ``no practical difference`` iff it lies
  wholly inside (−m, +m) (equivalence: two one-sided tests at 2.5 % each), otherwise
  ``undecided at this budget`` — an interval that excludes 0 but reaches into (−m, m), or
  that straddles +m or −m, decides nothing (:func:`flexigpt.core.stats.verdict`).
* Multi-benchmark claims ((c) "best on k/6", (f) "better on k/6"): the K tests of one row
  (six benchmarks × comparison runs) are decided together with Holm's step-down at
  family-wise error 5 % on the bootstrap p-values dual to the intervals above
  (:func:`flexigpt.core.stats.holm_verdicts`; with K = 1 it is the interval rule). A benchmark
  is won iff A is supported against every comparison run, lost iff A is contradicted or
  practically tied against one; the row is supported iff at least k benchmarks are won,
  contradicted iff more than 6 − k are lost, else undecided.
* Seeds: ``Seeds`` gives the runs per side; † marks a verdict decided from one training
  seed on a side: its interval covers documents and windows only, not seed variance.
* No interval, no verdict: ``not run in this config`` when a run is missing, ``no records``
  / ``unpaired`` when no paired interval can be formed; (e) is decided only at equal block
  counts and only where the paper has a number; timings (g, h) are reported, never decided.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pandas as pd

from flexigpt.core.lr_search import NEXT_SUFFIX
from flexigpt.storage.registry import ROLES, is_paper_baseline
from flexigpt.tables.claim_rows import (
    BENCHMARKS,
    DIRECTION,
    PAPER_T1,
    PAPER_T5,
    agg_row,
    budget_fields,
    claim_ratios,
    claim_row,
    count_row,
    decide_benchmarks,
    ours_pair,
    pairs_at,
    paper_pair,
    paper_wins,
    tokens_fields,
)
from flexigpt.tables.comparisons import Comparator, Diff, key_of
from flexigpt.tables.decision import MISSING_RUN, NOT_A_CLAIM, Rules, decide, rules_block
from flexigpt.tables.labels import ABLATIONS, method_label
from flexigpt.tables.ladder import ladder_diff, ladders, metric_trend
from flexigpt.tables.marks import verdict_mark
from flexigpt.tables.published import match_published
from flexigpt.tables.render import Block, Table
from flexigpt.tables.row_intervals import setting_key
from flexigpt.tables.rows import is_reference, main_rows, order_rows, table_of
from flexigpt.tables.timing_claims import claim_g, claim_h
from flexigpt.tables.trend import BudgetPair

#: the decision rules of a claim called without its own (the margins' defaults)
DEFAULT_RULES = Rules()
#: the paper's "best on k/6" of Table 1 when its numbers are not at hand
_PAPER_BEST = {0.3: 5, 0.4: 6}


def _paper_ab(pub: pd.DataFrame, r: float, metric: str) -> str:
    """Table 1's FlexiGPT* vs ShortGPT + LoRA* at ``r``; for the average, the reported Δ
    beside the Δ recomputed from the paper's own five task scores when they differ."""
    a, b = (ROLES.subject, "default", r, "final"), (ROLES.comparator, "default", r, "final")
    text = paper_pair(pub, 1, PAPER_T1, a, b, metric)
    if metric != "avg" or not text:
        return text
    ra, rb = (match_published(pub, (1,), PAPER_T1, *k) for k in (a, b))
    if ra is None or rb is None or pd.isna(ra["avg_recomputed"]) or pd.isna(rb["avg_recomputed"]):
        return text
    reported = ra["avg"] - rb["avg"]
    recomputed = ra["avg_recomputed"] - rb["avg_recomputed"]
    if abs(reported - recomputed) < 0.005:
        return text
    return (f"{text} (Δ {reported:+.2f} as reported; {recomputed:+.2f} recomputed from the "
            f"task scores, {ra['avg_recomputed']:.2f} vs {rb['avg_recomputed']:.2f})")


def claims_ab(agg, pub, comp: Comparator, model: str,
              rules: Rules = DEFAULT_RULES) -> Iterator[dict[str, Any]]:
    """(a) PPL and (b) average accuracy: FlexiGPT* vs ShortGPT + LoRA* per ratio and
    recovery token budget. At the budgets of a ladder the difference is the ladder's
    (:func:`~flexigpt.tables.ladder.ladder_diff`: jointly resampled, a one-seed side with
    its borrowed seed spread), the one the budget table shows."""
    budget_ladders = ladders(agg, model)
    for tag, metric in (("(a) FlexiGPT* lower PPL than ShortGPT + LoRA*", "log_ppl"),
                        ("(b) FlexiGPT* higher Avg than ShortGPT + LoRA*", "avg")):
        for r in claim_ratios(agg, model):
            points = budget_ladders.get(round(r, 6))
            trend = metric_trend(points, comp.store, metric, n_boot=comp.n_boot,
                                 seed=comp.seed) if points else None
            for pair in pairs_at(agg, model, r):
                d = (ladder_diff(trend, (pair.key_a, pair.key_b))
                     or comp.diff(pair.key_a, pair.key_b, metric))
                m = rules.margin(metric)
                direction = DIRECTION.get(metric, "greater")
                verdict = decide(d, direction, m)
                row = claim_row(tag, f"{100 * r:.0f}%", _paper_ab(pub, r, metric),
                                ours_pair(agg, pair.key_a, pair.key_b, metric), d,
                                verdict, metric, margin=m, **budget_fields(pair))
                row["Sensitivity"] = sensitivity(comp, pair.key_a, pair.key_b, metric,
                                                 direction, m, verdict)
                yield row


def next_key(key: tuple) -> tuple:
    """The setting key of ``key``'s run trained at its next-best learning rates."""
    model, method, variant, ratio, stage = key
    return (model, method, f"{variant}{NEXT_SUFFIX}", ratio, stage)


def sensitivity(comp: Comparator, a: tuple, b: tuple, metric: str, direction: str,
                margin: float, verdict: str) -> str:
    """Does ``verdict`` (A vs B) hold with A, then B, at its next-best learning rates (the
    sensitivity runs, ``tuning.sensitivity``)? ``holds`` when both give the same verdict;
    else what each gives; ``–`` when neither sensitivity run is in the results."""
    checks = [(side, comp.diff(*pair, metric)) for side, pair in
              (("A", (next_key(a), b)), ("B", (a, next_key(b))))
              if comp.has(pair[0]) and comp.has(pair[1])]
    if not checks:
        return "–"
    found = [(side, decide(d, direction, margin), d) for side, d in checks]
    if len(found) == 2 and all(v == verdict for _, v, _ in found):
        return "holds"
    digits = 3 if metric == "log_ppl" else 1
    return "; ".join(f"{side} at next LR: {v} {d.text(digits)}" for side, v, d in found)


def _paper_best(pub: pd.DataFrame, r: float) -> tuple[int, str]:
    """(k, text) of Table 1's "FlexiGPT* best on k/6" at ratio ``r``."""
    t1 = pub[pub["table"].eq(1) & pub["model"].eq(PAPER_T1)
             & (pub["ratio"] - r).abs().lt(1e-6)
             & ~pub["method"].isin([ROLES.reference, ROLES.subject])]
    others = [(m, v, r) for m, v in zip(t1["method"], t1["variant"])]
    got = (paper_wins(pub, 1, PAPER_T1, (ROLES.subject, "default", r), others) if others
           else None)
    if got is None:
        need = _PAPER_BEST.get(round(r, 6), 6)
        return need, f"best on {need}/6"
    won, lost = got
    return won, f"best on {won}/6" + (f" (not {'; '.join(lost)})" if lost else "")


def _others(agg: pd.DataFrame, comp: Comparator, model: str,
            pair: BudgetPair) -> tuple[list[tuple], list[str]]:
    """(keys, names) of the recovered baselines (c) compares against at ``pair``'s ratio and
    budget: the pair's ShortGPT + LoRA* (when run) and every other recovered Table 1 run of
    a paper baseline (:func:`flexigpt.storage.registry.is_paper_baseline`; not FlexiGPT, not KD, not
    the later baselines) trained on the same number of tokens (any, when the budget is
    unknown)."""
    rows = main_rows(agg, model)
    paper = [is_paper_baseline(m, v) for m, v in zip(rows["method"], rows["variant"])]
    at = rows[(rows["ratio"] - pair.ratio).abs().lt(1e-6) & rows["trained"].astype(bool)
              & ~rows["method"].isin([ROLES.reference, ROLES.subject, ROLES.comparator])
              & ~rows["loss"].eq("kd") & pd.Series(paper, index=rows.index, dtype=bool)]
    if pair.tokens is not None and "tokens" in at:
        at = at[at["tokens"].eq(pair.tokens)]
    at = order_rows(at)  # the table order, whatever order the result files were read in
    keys = [pair.key_b] if comp.has(pair.key_b) else []
    names = ["ShortGPT + LoRA*"] if keys else []
    keys += [setting_key(row) for _, row in at.iterrows()]
    names += [method_label(m, v) + "*" for m, v in zip(at["method"], at["variant"])]
    return keys, names


def claim_c(agg, pub, comp: Comparator, model: str,
            rules: Rules = DEFAULT_RULES) -> Iterator[dict[str, Any]]:
    """(c) FlexiGPT* best vs the recovered baselines (paper: 5/6 at 30 %, 6/6 at 40 %),
    per recovery token budget; each row one Holm family."""
    for r in (0.3, 0.4):
        need, paper = _paper_best(pub, r)
        for pair in pairs_at(agg, model, r):
            others, names = _others(agg, comp, model, pair)
            if comp.has(pair.key_a) and others:
                per, diffs = decide_benchmarks(comp, pair.key_a, others, rules)
            else:
                per, diffs = [MISSING_RUN] * len(BENCHMARKS), []
            yield count_row("(c) FlexiGPT* best vs the recovered baselines",
                            f"{100 * r:.0f}%", paper, names or ["–"], per, need, diffs,
                            **budget_fields(pair))


def _ablation_checks(agg: pd.DataFrame, model: str, r: float) -> list[tuple]:
    """(claim, A key, B key, direction, stage) of Table 4's orderings at ratio ``r``."""
    full = {s: key_of(agg, model, ROLES.subject, "default", r, s) for s in ("start", "final")}
    abl = lambda v, s: key_of(agg, model, ROLES.subject, v, r, s)  # noqa: E731
    checks = [(f"(d) full method lower final PPL than '{ABLATIONS[v]}'", full["final"],
               abl(v, "final"), "less", "final")
              for v in ("no_lowrank", "no_outnorm", "no_svdinit")]
    return checks + [
        ("(d) no output norm. → higher start PPL", abl("no_outnorm", "start"), full["start"],
         "greater", "start"),
        ("(d) no SVD init. → lower start PPL", abl("no_svdinit", "start"), full["start"],
         "less", "start"),
        ("(d) no SVD init. → higher final PPL", abl("no_svdinit", "final"), full["final"],
         "greater", "final")]


def claim_d(agg, pub, comp: Comparator, model: str,
            rules: Rules = DEFAULT_RULES) -> Iterator[dict[str, Any]]:
    """(d) Table 4 ordering of the ablations."""
    abl = agg[agg["model"].eq(model) & agg["method"].eq(ROLES.subject)
              & table_of(agg).eq("ablation")]
    for r in sorted(set(abl["ratio"].dropna()) | {0.3}):
        for claim, a, b, direction, stage in _ablation_checks(agg, model, r):
            d = comp.diff(a, b, "log_ppl")
            paper = paper_pair(pub, 4, PAPER_T1, (ROLES.subject, a[2], r, stage),
                               (ROLES.subject, b[2], r, stage), "log_ppl")
            yield claim_row(claim, f"{100 * r:.0f}%", paper, ours_pair(agg, a, b, "log_ppl"),
                            d, decide(d, direction, rules.log_ppl_margin), "log_ppl",
                            margin=rules.log_ppl_margin, **tokens_fields(agg, a))


def _blocks(agg: pd.DataFrame, key: tuple) -> int | None:
    row = agg_row(agg, key)
    if row is None or "blocks_pruned" not in row or pd.isna(row["blocks_pruned"]):
        return None
    return int(row["blocks_pruned"])


def _e_verdict(d: Diff, blocks: tuple[int | None, int | None], has_paper: bool,
               margin: float) -> tuple[str, str]:
    """(verdict, note) of one (e) comparison: decided only at equal block counts (a
    replacement block starts near identity, so start PPL tracks the block count) and where
    the paper gives FlexiGPT's start PPL."""
    ba, bb = blocks
    counts = "" if ba is None or bb is None else f"{ba} replaced vs {bb} removed blocks"
    if d.interval is None:
        return decide(d, "less"), counts
    if not has_paper:
        return NOT_A_CLAIM, "; ".join(x for x in (counts, "the paper gives no FlexiGPT "
                                                  "start PPL at this ratio") if x)
    if ba is not None and bb is not None and ba != bb:
        return (f"not decided: unequal block counts ({counts})",
                "confounded: start PPL tracks the number of blocks taken out")
    return decide(d, "less", margin), counts


def claim_e(agg, pub, comp: Comparator, model: str,
            rules: Rules = DEFAULT_RULES) -> Iterator[dict[str, Any]]:
    """(e) FlexiGPT's start PPL (before recovery) ≤ one-shot ShortGPT's, at equal block
    counts: the paper-protocol pair (same int(ratio·L) blocks) when it was run, and the
    matched-ratio pair (decided only when its block counts agree)."""
    for r in claim_ratios(agg, model):
        ref = match_published(pub, (4,), PAPER_T1, ROLES.subject, "default", r, "start")
        paper = paper_pair(pub, (4, 1), PAPER_T1, (ROLES.subject, "default", r, "start"),
                       (ROLES.skip, "default", r, "final"), "log_ppl")
        paper_a, paper_b = (key_of(agg, model, m, "paper", r, s)
                            for m, s in ((ROLES.subject, "start"), (ROLES.skip, "final")))
        pairs = [(", paper protocol", paper_a, paper_b)]
        pairs = [p for p in pairs if comp.has(p[1]) and comp.has(p[2])]
        pairs.append(("", key_of(agg, model, ROLES.subject, "default", r, "start"),
                      key_of(agg, model, ROLES.skip, "default", r, "final")))
        for how, a, b in pairs:
            d = comp.diff(a, b, "log_ppl")
            verdict, note = _e_verdict(d, (_blocks(agg, a), _blocks(agg, b)), ref is not None,
                                       rules.log_ppl_margin)
            note = "; ".join(x for x in ("" if how else "matched ratio", note) if x)
            yield claim_row("(e) FlexiGPT start PPL ≤ ShortGPT (one-shot)",
                            f"{100 * r:.0f}%{how}", paper, ours_pair(agg, a, b, "log_ppl"), d,
                            verdict, "log_ppl", budget="before recovery", notes=note,
                            margin=rules.log_ppl_margin)


def _paper_f(pub: pd.DataFrame, variant: str) -> tuple[int, str]:
    """(k, text) of Table 5: the extension ``variant`` better than the base on k/6."""
    got = paper_wins(pub, 5, PAPER_T5, (ROLES.extension, variant, None),
                     [(ROLES.reference, "default", None)])
    if got is None:
        return 6, "better on 6/6 (the paper's text)"
    avg = paper_pair(pub, 5, PAPER_T5, (ROLES.extension, variant, None, "final"),
                     (ROLES.reference, "default", None, "final"), "avg")
    won, lost = got
    lost_text = f" (not {'; '.join(lost)})" if lost else ""
    return won, f"Avg {avg}; better on {won}/6{lost_text}" if avg else f"better on {won}/6"


def claim_f(agg, pub, comp: Comparator, model: str,
            rules: Rules = DEFAULT_RULES) -> Iterator[dict[str, Any]]:
    """(f) the extension beats the base on k/6 benchmarks, k from the paper's Table 5
    (5/6 for both patterns), and the same-budget controls (beyond the paper) on as many;
    each row one Holm family."""
    bases = [("default", "Base"), ("trained", "Base trained (control)"),
             ("trained_lora", "Base + LoRA (control)")]
    for variant in ("block", "sequential"):
        need, paper_text = _paper_f(pub, variant)
        a = key_of(agg, model, ROLES.extension, variant, None)
        for dv, name in bases:
            b = key_of(agg, model, ROLES.reference, dv, 0.0)
            if comp.has(a) and comp.has(b):
                per, diffs = decide_benchmarks(comp, a, [b], rules)
            else:
                per, diffs = [MISSING_RUN] * len(BENCHMARKS), []
            paper = (paper_text if dv == "default"
                     else f"not in the paper (k = {need} as for Base)")
            yield count_row(f"(f) FlexiGPT extension ({variant}) beats {name}", "extension",
                            paper, [name], per, need, diffs, **tokens_fields(agg, a))


SHOWN = ["Claim", "Setting", "Budget", "Paper", "Ours", "Δ [95% CI]", "Seeds", "Verdict",
         "Sensitivity", "Notes"]


def verdict_table(agg: pd.DataFrame, pub: pd.DataFrame, times: pd.DataFrame,
                  comp: Comparator, models: list[str], decodes: pd.DataFrame | None = None,
                  rules: Rules | None = None) -> Table | None:
    """``verdicts``: the decision rules (:func:`rules_block`), then one block per model
    with results beyond the dense model (None: no such model); CSV one row per claim row
    (+ model). ``decodes``: the decoding timings (:func:`flexigpt.tables.decode
    .collect_decodes`) for claim (h); ``rules``: margins (default :class:`Rules`)."""
    rules = rules or Rules()
    blocks, csv = [], []
    for model in models:
        mine = agg[agg["model"].eq(model)]
        if (is_reference(mine) & mine["variant"].eq("default")).all():
            continue  # only the dense model: no claim to check
        rows = [*claims_ab(agg, pub, comp, model, rules),
                *claim_c(agg, pub, comp, model, rules), *claim_d(agg, pub, comp, model, rules),
                *claim_e(agg, pub, comp, model, rules), *claim_f(agg, pub, comp, model, rules),
                *claim_g(times, pub, model), *claim_h(decodes, model)]
        frame = pd.DataFrame(rows)
        if "Sensitivity" not in frame:
            frame["Sensitivity"] = None
        frame["Sensitivity"] = frame["Sensitivity"].fillna("–")
        csv.append(frame.assign(model=model))
        blocks.append(Block(f"{model}: the paper's claims", frame[SHOWN], notes=[NOTE],
                            marks={"Verdict": verdict_mark}))
    if not blocks:
        return None
    rules_shown = replace(rules_block(rules), marks={"Rule": verdict_mark})  # the marks' key
    return Table("verdicts", "Verdicts on the paper's claims", [rules_shown, *blocks],
                 pd.concat(csv, ignore_index=True))


NOTE = ("Paper = Llama-2-7B (Tables 1, 4; Table 5: TinyLlama-1.1B), point values; Ours = "
        "point values (A vs B); Δ = A − B paired over the same documents / windows with its "
        "95% bootstrap interval (log-PPL in nats, accuracy in points); the verdicts follow "
        "the decision rules above (margins, Holm for counted claims, † = one seed). "
        "Sensitivity (claims a, b): the verdict again with FlexiGPT* (A), then ShortGPT + "
        "LoRA* (B), trained at the next-best learning rates of its own search (the best "
        "neighbour of its choice): holds = both give this verdict, else what each gives; – = "
        "no sensitivity run in this config. An undecided accuracy row says from which difference "
        "this evaluation decides: the margin plus its interval's half-width.")
