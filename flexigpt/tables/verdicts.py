"""The paper's claims checked against our results (``verdicts.md/.csv``).

One row per claim, setting and (for the like-for-like claims) recovery token budget: the
paper's numbers (:mod:`flexigpt.tables.published`), ours (point values), the 95 % paired
bootstrap interval of the deciding difference Δ = A − B and the verdict. The rules (stated
again in the first block of ``verdicts.md``, :func:`rules_block`):

* Smallest effect that matters, m (:class:`Rules`; defaults :data:`LOG_PPL_MARGIN` = 0.02
  nats of log-PPL, a PPL ratio of ×1.02, and :data:`ACCURACY_MARGIN` = 1 accuracy point).
  With the interval oriented so that the claim reads Δ' > 0:
  ``supported`` iff the whole interval lies beyond +m (a minimum-effect test),
  ``contradicted`` iff it lies wholly beyond −m, ``no practical difference`` iff it lies
  wholly inside (−m, +m) (equivalence: two one-sided tests at 2.5 % each), otherwise
  ``undecided at this budget`` — an interval that excludes 0 but reaches into (−m, m), or
  that straddles +m or −m, decides nothing (:func:`flexigpt.stats.verdict`).
* Multi-benchmark claims ((c) "best on k/6", (f) "better on k/6"): the K tests of one row
  (six benchmarks × comparison runs) are decided together with Holm's step-down at
  family-wise error 5 % on the bootstrap p-values dual to the intervals above
  (:func:`flexigpt.stats.holm_verdicts`; with K = 1 it is the interval rule). A benchmark
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

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd

from flexigpt import stats
from flexigpt.tables.build import ABLATIONS, TASK_HEADERS, main_rows, method_label, table_of
from flexigpt.tables.collect import TASKS
from flexigpt.tables.comparisons import NO_RECORDS, NOT_RUN, UNPAIRED, Comparator, Diff, key_of
from flexigpt.tables.intervals import setting_key
from flexigpt.tables.published import match_published, paper_model
from flexigpt.tables.render import Block, Table, si
from flexigpt.tables.trend import BudgetPair, budget_pairs

SUPPORTED, CONTRADICTED, UNDECIDED = "supported", "contradicted", "undecided at this budget"
NO_DIFFERENCE = stats.NO_DIFFERENCE
NOT_A_CLAIM = "not a claim of the paper"
MISSING_RUN = "not run in this config"
REPORTED = "reported (timing; single run, no interval)"
#: smallest differences that matter (defaults of :class:`Rules`)
LOG_PPL_MARGIN = 0.02
ACCURACY_MARGIN = 1.0
SINGLE_SEED = "†"
BENCHMARKS = ("log_ppl", *TASKS)
_STATUS = {NOT_RUN: MISSING_RUN, NO_RECORDS: "no records (point values only)",
           UNPAIRED: "unpaired"}
_STATS_VERDICT = {"supported": SUPPORTED, "contradicted": CONTRADICTED,
                  NO_DIFFERENCE: NO_DIFFERENCE, "undecided": UNDECIDED}
_COL = {"log_ppl": "ppl"}  # metric → column of agg / published
_HEADERS = {"log_ppl": "PPL", **TASK_HEADERS}
_DIRECTION = {"log_ppl": "less"}  # lower log-PPL is better; accuracy: higher
_PAPER_T1 = "llama-2-7b"
_PAPER_T5 = "tinyllama-1.1b"
#: the paper's "best on k/6" of Table 1 when its numbers are not at hand
_PAPER_BEST = {0.3: 5, 0.4: 6}
#: commits that changed decoding measurements: (h) figures from before them say so.
DECODE_FIXES = {"68be9e3797d282a6f5543042e0f380b212fe0dd0": "68be9e3 (lean decode loops, EOS)",
                "bc8534b8be7360161e00bf844ecd43b631b9b794": "bc8534b (BLAS timing before runs)"}


@dataclass(frozen=True)
class Rules:
    """The decision rules' parameters: margins m (log-PPL in nats, accuracy in points) and
    the level of every interval and of the Holm family (family-wise error 1 − level)."""

    log_ppl_margin: float = LOG_PPL_MARGIN
    accuracy_margin: float = ACCURACY_MARGIN
    level: float = stats.LEVEL

    def __post_init__(self) -> None:
        for name in ("log_ppl_margin", "accuracy_margin"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.level != stats.LEVEL:
            raise ValueError(f"level: the comparisons' intervals are at {stats.LEVEL}")

    def margin(self, metric: str) -> float:
        return self.log_ppl_margin if metric == "log_ppl" else self.accuracy_margin


def decide(diff: Diff, direction: str, margin: float = 0.0) -> str:
    """The verdict of one paired difference (``direction``: ``greater`` | ``less``) with
    the smallest effect that matters ``margin`` (:func:`flexigpt.stats.verdict`)."""
    if diff.interval is None:
        return _STATUS.get(diff.status, diff.status)
    return _STATS_VERDICT[diff.interval.verdict(direction, margin)]


def decide_family(diffs: list[Diff], directions: list[str], margins: list[float],
                  level: float = stats.LEVEL) -> list[str]:
    """Verdicts of K differences decided as one family (Holm, family-wise error
    1 − ``level``); a difference without replicates gets its status."""
    idx = [i for i, d in enumerate(diffs) if d.replicates is not None]
    held = stats.holm_verdicts([diffs[i].replicates for i in idx],
                               [directions[i] for i in idx], [margins[i] for i in idx], level)
    out = [_STATUS.get(d.status, d.status) for d in diffs]
    for i, v in zip(idx, held, strict=True):
        out[i] = _STATS_VERDICT[v]
    return out


def decide_count(verdicts: list[str], need: int) -> str:
    """Verdict of "at least ``need`` of these benchmarks are won" from per-benchmark ones:
    a benchmark is lost when contradicted or practically tied (no practical difference)."""
    if all(v == MISSING_RUN for v in verdicts):
        return MISSING_RUN
    won = sum(v == SUPPORTED for v in verdicts)
    lost = sum(v in (CONTRADICTED, NO_DIFFERENCE) for v in verdicts)
    if won >= need:
        return SUPPORTED
    if lost > len(verdicts) - need:
        return CONTRADICTED
    return UNDECIDED


def _num(value: Any, metric: str = "") -> str:
    if value is None or pd.isna(value):
        return "–"
    return f"{float(value):.2f}"


def _agg_row(agg: pd.DataFrame, key: tuple) -> pd.Series | None:
    """The aggregated row of setting ``key`` (None: not in the results)."""
    rows = agg[agg["model"].eq(key[0])]
    hit = [i for i, r in rows.iterrows() if setting_key(r) == key]
    return rows.loc[hit[0]] if hit else None


def _point(agg: pd.DataFrame, key: tuple, metric: str) -> Any:
    row = _agg_row(agg, key)
    return None if row is None else row[_COL.get(metric, metric)]


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


def _seeds(diffs: list[Diff]) -> tuple[str, bool]:
    """``Seeds`` text of the differences that decided a row and whether one side had a
    single seed (then marked †)."""
    pairs = sorted({d.seeds for d in diffs if d.seeds})
    if not pairs:
        return "–", False
    single = any(min(p) == 1 for p in pairs)
    text = ", ".join(" vs ".join(map(str, p)) for p in pairs)
    return text + (f" {SINGLE_SEED}" if single else ""), single


def _row(claim: str, setting: str, paper: str, ours: str, diff: Diff | None, verdict: str,
         metric: str = "", *, budget: str = "–", tokens: float | None = None,
         tokens_per_param: float | None = None, notes: str = "",
         margin: float | None = None, decided_by: list[Diff] | None = None) -> dict[str, Any]:
    iv = diff.interval if diff is not None else None
    digits = 3 if metric == "log_ppl" else 1
    seeds, single = _seeds(decided_by if decided_by is not None else
                           ([diff] if diff is not None else []))
    return {"Claim": claim, "Setting": setting, "Budget": budget, "Paper": paper or "–",
            "Ours": ours, "Metric": metric,
            "Δ [95% CI]": diff.text(digits) if diff is not None else "–", "Seeds": seeds,
            "Verdict": verdict, "Notes": notes, "estimate": iv.estimate if iv else None,
            "ci_low": iv.low if iv else None, "ci_high": iv.high if iv else None,
            "margin": margin, "tokens": tokens, "tokens_per_param": tokens_per_param,
            "single_seed": single}


def _ratios(agg: pd.DataFrame, model: str) -> list[float]:
    rows = main_rows(agg, model)
    found = sorted(r for r in rows["ratio"].dropna().unique() if r > 0)
    return sorted(set(found) | {0.3, 0.4})


def _pairs_at(agg: pd.DataFrame, model: str, r: float) -> list[BudgetPair]:
    """The like-for-like pairs at ratio ``r``, one per recovery token budget
    (:func:`~flexigpt.tables.trend.budget_pairs`); without one, the default keys (so the
    row says what is missing)."""
    return budget_pairs(agg, model, r) or [BudgetPair(round(r, 6), "default", None, None,
                                key_of(agg, model, "flexigpt", "default", r),
                                key_of(agg, model, "shortgpt_lora", "default", r))]


def _budget(pair: BudgetPair) -> dict[str, Any]:
    return {"budget": pair.budget_text(), "tokens": pair.tokens,
            "tokens_per_param": pair.tokens_per_param}


def _paper_ab(pub: pd.DataFrame, r: float, metric: str) -> str:
    """Table 1's FlexiGPT* vs ShortGPT + LoRA* at ``r``; for the average, the reported Δ
    beside the Δ recomputed from the paper's own five task scores when they differ."""
    a, b = ("flexigpt", "default", r, "final"), ("shortgpt_lora", "default", r, "final")
    text = _paper(pub, 1, _PAPER_T1, a, b, metric)
    if metric != "avg" or not text:
        return text
    ra, rb = (match_published(pub, (1,), _PAPER_T1, *k) for k in (a, b))
    if ra is None or rb is None or pd.isna(ra["avg_recomputed"]) or pd.isna(rb["avg_recomputed"]):
        return text
    reported = ra["avg"] - rb["avg"]
    recomputed = ra["avg_recomputed"] - rb["avg_recomputed"]
    if abs(reported - recomputed) < 0.005:
        return text
    return (f"{text} (Δ {reported:+.2f} as reported; {recomputed:+.2f} recomputed from the "
            f"task scores, {ra['avg_recomputed']:.2f} vs {rb['avg_recomputed']:.2f})")


def claims_ab(agg, pub, comp: Comparator, model: str,
              rules: Rules = Rules()) -> Iterator[dict[str, Any]]:
    """(a) PPL and (b) average accuracy: FlexiGPT* vs ShortGPT + LoRA* per ratio and
    recovery token budget."""
    for tag, metric in (("(a) FlexiGPT* lower PPL than ShortGPT + LoRA*", "log_ppl"),
                        ("(b) FlexiGPT* higher Avg than ShortGPT + LoRA*", "avg")):
        for r in _ratios(agg, model):
            for pair in _pairs_at(agg, model, r):
                d = comp.diff(pair.key_a, pair.key_b, metric)
                m = rules.margin(metric)
                yield _row(tag, f"{100 * r:.0f}%", _paper_ab(pub, r, metric),
                           _ours(agg, pair.key_a, pair.key_b, metric), d,
                           decide(d, _DIRECTION.get(metric, "greater"), m), metric, margin=m,
                           **_budget(pair))


def _family(comp: Comparator, a: tuple, others: list[tuple], rules: Rules,
            ) -> tuple[list[str], list[Diff]]:
    """Per benchmark (:data:`BENCHMARKS`): A against every other run, all 6 × len(others)
    tests decided as one Holm family. A benchmark is supported iff every test is,
    contradicted iff one is, no practical difference iff one is (and none contradicted)."""
    tests = [(metric, b) for metric in BENCHMARKS for b in others]
    diffs = [comp.diff(a, b, metric) for metric, b in tests]
    verdicts = decide_family(diffs, [_DIRECTION.get(m, "greater") for m, _ in tests],
                             [rules.margin(m) for m, _ in tests], rules.level)
    out = []
    for metric in BENCHMARKS:
        vs = [v for (m, _), v in zip(tests, verdicts, strict=True) if m == metric]
        if not vs:
            out.append(MISSING_RUN)
        elif CONTRADICTED in vs or NO_DIFFERENCE in vs:
            out.append(CONTRADICTED if CONTRADICTED in vs else NO_DIFFERENCE)
        elif all(v == SUPPORTED for v in vs):
            out.append(SUPPORTED)
        else:
            out.append(next((v for v in vs if v not in (SUPPORTED, UNDECIDED)), UNDECIDED))
    return out, diffs


def _count_row(claim: str, setting: str, paper: str, names: list[str], per: list[str],
               need: int, diffs: list[Diff], **kw: Any) -> dict[str, Any]:
    won = sum(v == SUPPORTED for v in per)
    detail = "; ".join(f"{b}: {v}" for b, v in zip(BENCHMARKS, per))
    k = len([d for d in diffs if d.replicates is not None])
    notes = kw.pop("notes", "") or ""
    notes = "; ".join(x for x in (notes, f"Holm over {k} tests" if k else "") if x)
    row = _row(claim, setting, paper, f"{won}/{len(per)} supported vs {', '.join(names)}",
               None, decide_count(per, need), "count", decided_by=diffs, notes=notes, **kw)
    row["Δ [95% CI]"] = detail
    return row


def _paper_wins(pub: pd.DataFrame, table: int, model: str, a: tuple,
                others: list[tuple]) -> tuple[int, list[str]] | None:
    """How many of the six benchmarks the paper's row ``a`` (method, variant, ratio) beats
    every row of ``others`` on (PPL: lower; a benchmark without both numbers is skipped),
    and the benchmarks it does not win (``"PIQA 73.23 vs 73.29"``). None without ``a``."""
    ref = match_published(pub, (table,), model, *a, "final")
    if ref is None or paper_model(model) is None:
        return None
    rows = [r for o in others if (r := match_published(pub, (table,), model, *o, "final"))
            is not None]
    won, lost = 0, []
    for metric in BENCHMARKS:
        col = _COL.get(metric, metric)
        theirs = [float(r[col]) for r in rows if not pd.isna(r[col])]
        if pd.isna(ref[col]) or not theirs:
            continue
        best = min(theirs) if metric == "log_ppl" else max(theirs)
        if (ref[col] < best) if metric == "log_ppl" else (ref[col] > best):
            won += 1
        else:
            lost.append(f"{_HEADERS.get(metric, metric)} {float(ref[col]):.2f} vs {best:.2f}")
    return won, lost


def _paper_best(pub: pd.DataFrame, r: float) -> tuple[int, str]:
    """(k, text) of Table 1's "FlexiGPT* best on k/6" at ratio ``r``."""
    t1 = pub[pub["table"].eq(1) & pub["model"].eq(_PAPER_T1)
             & (pub["ratio"] - r).abs().lt(1e-6) & ~pub["method"].isin(["dense", "flexigpt"])]
    others = [(m, v, r) for m, v in zip(t1["method"], t1["variant"])]
    got = _paper_wins(pub, 1, _PAPER_T1, ("flexigpt", "default", r), others) if others else None
    if got is None:
        need = _PAPER_BEST.get(round(r, 6), 6)
        return need, f"best on {need}/6"
    won, lost = got
    return won, f"best on {won}/6" + (f" (not {'; '.join(lost)})" if lost else "")


def _others(agg: pd.DataFrame, comp: Comparator, model: str,
            pair: BudgetPair) -> tuple[list[tuple], list[str]]:
    """(keys, names) of the recovered baselines (c) compares against at ``pair``'s ratio and
    budget: the pair's ShortGPT + LoRA* (when run) and every other recovered Table 1
    baseline (not FlexiGPT, not KD) trained on the same number of tokens (any, when the
    budget is unknown)."""
    rows = main_rows(agg, model)
    at = rows[(rows["ratio"] - pair.ratio).abs().lt(1e-6) & rows["trained"].astype(bool)
              & ~rows["method"].isin(["dense", "flexigpt", "shortgpt_lora"])
              & ~rows["loss"].eq("kd")]
    if pair.tokens is not None and "tokens" in at:
        at = at[at["tokens"].eq(pair.tokens)]
    keys = [pair.key_b] if comp.has(pair.key_b) else []
    names = ["ShortGPT + LoRA*"] if keys else []
    keys += [setting_key(row) for _, row in at.iterrows()]
    names += [method_label(m, v) + "*" for m, v in zip(at["method"], at["variant"])]
    return keys, names


def claim_c(agg, pub, comp: Comparator, model: str,
            rules: Rules = Rules()) -> Iterator[dict[str, Any]]:
    """(c) FlexiGPT* best vs the recovered baselines (paper: 5/6 at 30 %, 6/6 at 40 %),
    per recovery token budget; each row one Holm family."""
    for r in (0.3, 0.4):
        need, paper = _paper_best(pub, r)
        for pair in _pairs_at(agg, model, r):
            others, names = _others(agg, comp, model, pair)
            if comp.has(pair.key_a) and others:
                per, diffs = _family(comp, pair.key_a, others, rules)
            else:
                per, diffs = [MISSING_RUN] * len(BENCHMARKS), []
            yield _count_row("(c) FlexiGPT* best vs the recovered baselines",
                             f"{100 * r:.0f}%", paper, names or ["–"], per, need, diffs,
                             **_budget(pair))


def _ablation_checks(agg: pd.DataFrame, model: str, r: float) -> list[tuple]:
    """(claim, A key, B key, direction, stage) of Table 4's orderings at ratio ``r``."""
    full = {s: key_of(agg, model, "flexigpt", "default", r, s) for s in ("start", "final")}
    abl = lambda v, s: key_of(agg, model, "flexigpt", v, r, s)  # noqa: E731
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


def _tokens_of(agg: pd.DataFrame, key: tuple) -> dict[str, Any]:
    """Budget fields of the row ``key`` (``before recovery`` at the start stage)."""
    if key[4] == "start":
        return {"budget": "before recovery"}
    row = _agg_row(agg, key)
    t = None if row is None or "tokens" not in row or pd.isna(row["tokens"]) else row["tokens"]
    return {"budget": "–" if t is None else f"{si(float(t))} tokens",
            "tokens": None if t is None else float(t)}


def claim_d(agg, pub, comp: Comparator, model: str,
            rules: Rules = Rules()) -> Iterator[dict[str, Any]]:
    """(d) Table 4 ordering of the ablations."""
    abl = agg[agg["model"].eq(model) & agg["method"].eq("flexigpt")
              & table_of(agg).eq("ablation")]
    for r in sorted(set(abl["ratio"].dropna()) | {0.3}):
        for claim, a, b, direction, stage in _ablation_checks(agg, model, r):
            d = comp.diff(a, b, "log_ppl")
            paper = _paper(pub, 4, _PAPER_T1, ("flexigpt", a[2], r, stage),
                           ("flexigpt", b[2], r, stage), "log_ppl")
            yield _row(claim, f"{100 * r:.0f}%", paper, _ours(agg, a, b, "log_ppl"), d,
                       decide(d, direction, rules.log_ppl_margin), "log_ppl",
                       margin=rules.log_ppl_margin, **_tokens_of(agg, a))


def _blocks(agg: pd.DataFrame, key: tuple) -> int | None:
    row = _agg_row(agg, key)
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
            rules: Rules = Rules()) -> Iterator[dict[str, Any]]:
    """(e) FlexiGPT's start PPL (before recovery) ≤ one-shot ShortGPT's, at equal block
    counts: the paper-protocol pair (same int(ratio·L) blocks) when it was run, and the
    matched-ratio pair (decided only when its block counts agree)."""
    for r in _ratios(agg, model):
        ref = match_published(pub, (4,), _PAPER_T1, "flexigpt", "default", r, "start")
        paper = _paper(pub, (4, 1), _PAPER_T1, ("flexigpt", "default", r, "start"),
                       ("shortgpt", "default", r, "final"), "log_ppl")
        pairs = [(", paper protocol", *(key_of(agg, model, m, "paper", r, s)
                                        for m, s in (("flexigpt", "start"),
                                                     ("shortgpt", "final"))))]
        pairs = [p for p in pairs if comp.has(p[1]) and comp.has(p[2])]
        pairs.append(("", key_of(agg, model, "flexigpt", "default", r, "start"),
                      key_of(agg, model, "shortgpt", "default", r, "final")))
        for how, a, b in pairs:
            d = comp.diff(a, b, "log_ppl")
            verdict, note = _e_verdict(d, (_blocks(agg, a), _blocks(agg, b)), ref is not None,
                                       rules.log_ppl_margin)
            note = "; ".join(x for x in ("" if how else "matched ratio", note) if x)
            yield _row("(e) FlexiGPT start PPL ≤ ShortGPT (one-shot)", f"{100 * r:.0f}%{how}",
                       paper, _ours(agg, a, b, "log_ppl"), d, verdict, "log_ppl",
                       budget="before recovery", notes=note, margin=rules.log_ppl_margin)


def _paper_f(pub: pd.DataFrame, variant: str) -> tuple[int, str]:
    """(k, text) of Table 5: the extension ``variant`` better than the base on k/6."""
    got = _paper_wins(pub, 5, _PAPER_T5, ("flexigpt_extend", variant, None),
                      [("dense", "default", None)])
    if got is None:
        return 6, "better on 6/6 (the paper's text)"
    avg = _paper(pub, 5, _PAPER_T5, ("flexigpt_extend", variant, None, "final"),
                 ("dense", "default", None, "final"), "avg")
    won, lost = got
    lost_text = f" (not {'; '.join(lost)})" if lost else ""
    return won, f"Avg {avg}; better on {won}/6{lost_text}" if avg else f"better on {won}/6"


def claim_f(agg, pub, comp: Comparator, model: str,
            rules: Rules = Rules()) -> Iterator[dict[str, Any]]:
    """(f) the extension beats the base on k/6 benchmarks, k from the paper's Table 5
    (5/6 for both patterns), and the same-budget controls (beyond the paper) on as many;
    each row one Holm family."""
    bases = [("default", "Base"), ("trained", "Base trained (control)"),
             ("trained_lora", "Base + LoRA (control)")]
    for variant in ("block", "sequential"):
        need, paper_text = _paper_f(pub, variant)
        a = key_of(agg, model, "flexigpt_extend", variant, None)
        for dv, name in bases:
            b = key_of(agg, model, "dense", dv, 0.0)
            if comp.has(a) and comp.has(b):
                per, diffs = _family(comp, a, [b], rules)
            else:
                per, diffs = [MISSING_RUN] * len(BENCHMARKS), []
            paper = (paper_text if dv == "default"
                     else f"not in the paper (k = {need} as for Base)")
            yield _count_row(f"(f) FlexiGPT extension ({variant}) beats {name}", "extension",
                             paper, [name], per, need, diffs, **_tokens_of(agg, a))


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
                   "to dense", "", paper, ours, None, REPORTED,
                   notes=timing_provenance(t.get("file")))


def _is_ancestor(older: str, newer: str) -> bool | None:
    """Whether commit ``older`` is an ancestor of ``newer`` in this checkout (None when git
    or either commit is unavailable)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "merge-base", "--is-ancestor", older, newer], cwd=root,
                             capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(out.returncode)


def timing_provenance(path: Any, fixes: dict[str, str] | None = None) -> str:
    """Where a timing row's figures come from: the timing JSON's recorded commit and date,
    and each commit of ``fixes`` ({full sha: name}) that commit predates, when git can tell
    ("" when nothing is recorded)."""
    from flexigpt.tables.collect import read_json

    if path is None or (isinstance(path, float) and math.isnan(path)):
        return ""
    try:
        data = read_json(path)
    except Exception:  # noqa: BLE001 - a note, never a failure
        return ""
    commit = (data.get("provenance") or {}).get("git_commit")
    created = str(data.get("created") or "")[:10]
    if not commit:
        return f"measured {created}; commit not recorded" if created else ""
    stale = [name for fix, name in (fixes or {}).items()
             if commit != fix and _is_ancestor(fix, commit) is False]
    text = f"measured at commit {commit[:7]}" + (f" ({created})" if created else "")
    return text + (f"; predates the decoding fixes of {', '.join(stale)}" if stale else "")


def claim_h(decodes: pd.DataFrame | None, model: str) -> Iterator[dict[str, Any]]:
    """(h) self-speculative decoding is faster than plain FlexiGPT decoding (paper: 30.11 %
    faster): reported from the decoding timings, never decided (no interval); the note says
    which commit measured them."""
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
                   f"+{PAPER_SPECULATIVE_FASTER:.2f}%", ours, None, REPORTED,
                   notes=timing_provenance(d.get("file"), DECODE_FIXES))


SHOWN = ["Claim", "Setting", "Budget", "Paper", "Ours", "Δ [95% CI]", "Seeds", "Verdict",
         "Notes"]


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
        if (mine["method"].eq("dense") & mine["variant"].eq("default")).all():
            continue  # only the dense model: no claim to check
        rows = [*claims_ab(agg, pub, comp, model, rules),
                *claim_c(agg, pub, comp, model, rules), *claim_d(agg, pub, comp, model, rules),
                *claim_e(agg, pub, comp, model, rules), *claim_f(agg, pub, comp, model, rules),
                *claim_g(times, pub, model), *claim_h(decodes, model)]
        frame = pd.DataFrame(rows)
        csv.append(frame.assign(model=model))
        blocks.append(Block(f"{model}: the paper's claims", frame[SHOWN], notes=[NOTE]))
    if not blocks:
        return None
    return Table("verdicts", "Verdicts on the paper's claims", [rules_block(rules), *blocks],
                 pd.concat(csv, ignore_index=True))


def rules_block(rules: Rules) -> Block:
    """The first block of ``verdicts.md``: every rule a verdict follows, with its numbers."""
    m, a = rules.log_ppl_margin, rules.accuracy_margin
    pct = 100 * (1 - rules.level)
    items = [
        ("Interval", f"{100 * rules.level:.0f}% paired percentile bootstrap of Δ = A − B over "
         "the same documents / windows (2000 replicates; seeds resampled too where a side "
         "has several runs)"),
        ("Smallest effect that matters m", f"log-PPL {m:g} nats (PPL ratio ×{math.exp(m):.3f}); "
         f"accuracy {a:g} point(s), per task and for the average"),
        (SUPPORTED, "the whole interval lies beyond +m on the claimed side (minimum-effect "
         "test)"),
        (CONTRADICTED, "the whole interval lies beyond −m on the other side"),
        (NO_DIFFERENCE, "the whole interval lies inside (−m, +m) (equivalence: two one-sided "
         f"tests at {pct / 2:g}% each); neither supported nor contradicted"),
        (UNDECIDED, "anything else: an interval that touches or straddles ±m, including one "
         "that excludes 0 but reaches into (−m, +m)"),
        ("Multi-benchmark claims (c), (f)", "the row's K tests (6 benchmarks × comparison "
         f"runs) form one family: Holm step-down at family-wise error {pct:g}% on the "
         "bootstrap p-values dual to the intervals (each outcome's one-sided tail fraction "
         "beyond ±m, doubled; K = 1 gives the interval rule). A benchmark is won iff "
         "supported against every comparison run and lost iff contradicted or of no practical "
         "difference against one; the row is supported iff ≥ k are won, contradicted iff "
         "more than 6 − k are lost"),
        (f"Seeds, {SINGLE_SEED}", f"runs per side; {SINGLE_SEED} = decided from a single "
         "training seed on a side: the interval covers documents and windows, not "
         "training seeds"),
        ("Budget", "recovery tokens of the compared runs (tokens per dense-model parameter; "
         "the paper: 1B / 6.7B ≈ 0.15); like-for-like claims get one row per budget run"),
        ("(e)", "decided only at equal block counts (the paper-protocol pair when run) and "
         "only where the paper gives FlexiGPT's start PPL; else "
         f"'{NOT_A_CLAIM}' or 'not decided: unequal block counts'"),
        ("(g), (h)", "timings: a single run each, reported, never decided; Notes give the "
         "commit that measured them"),
    ]
    return Block("Decision rules", pd.DataFrame(items, columns=["Rule", "Definition"]))


NOTE = ("Paper = Llama-2-7B (Tables 1, 4; Table 5: TinyLlama-1.1B), point values; Ours = "
        "point values (A vs B); Δ = A − B paired over the same documents / windows with its "
        "95% bootstrap interval (log-PPL in nats, accuracy in points); the verdicts follow "
        "the decision rules above (margins, Holm for counted claims, † = one seed).")
