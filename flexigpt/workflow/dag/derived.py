"""Runs derived from the Table 1 runs of a grid: seed replicates (``replicates:``,
:func:`replicate_runs`) and the budget ladder (``budget:``, :func:`budget_runs`).

Both take the runs built so far and return new :class:`~flexigpt.workflow.dag.runs.Run` objects (the
caller adds them); neither reads a default: the config is schema-complete
(:func:`flexigpt.workflow.dag.defaults.with_schema_defaults`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flexigpt.workflow.dag.runs import BUDGET_LR, BUDGET_TASKS, Key, Run, step_tokens, train_default


def table1_ratios(where: str, section: dict[str, Any], ratios: list[float],
                  needed: bool = True) -> list[float]:
    """``section["ratios"]`` (default: every Table 1 ratio); when the section's runs reuse a
    Table 1 run (its learning rates or compressed model), each must be a Table 1 ratio."""
    chosen = list(section.get("ratios", ratios))
    missing = [r for r in chosen if r not in ratios]
    if needed and missing:
        raise ValueError(f"{where}: {missing} not in ratios {list(ratios)} (these runs reuse "
                         "the Table 1 run at the same ratio; add it to ratios or drop it here)")
    return chosen


def _seed_twins(base: dict[Key, Run], seeds: list[int], runs: dict[Key, Run],
                what: str) -> list[Run]:
    """For every run of ``base`` and every seed, a copy at variant ``<variant>_s<seed>``
    with that seed and the labels of the base variant. A link (``match``, ``budget``,
    ``compressed_from``) names the same seed's twin of its run where that twin is made here
    or already in ``runs``; learning rates are the base run's choice (``lr_from``)."""
    def twin(ref: Key | None, seed: int) -> Key | None:
        if ref is None:
            return None
        other = (ref[0], ref[1], f"{ref[2]}_s{seed}", ref[3])
        return other if ref in base or other in runs else ref

    out: list[Run] = []
    for seed in seeds:
        for key, run in base.items():
            if seed == run.seed:
                raise ValueError(f"{what} repeats the base seed {seed}")
            out.append(replace(
                run, variant=f"{run.variant}_s{seed}", seed=int(seed),
                label_variant=run.label_variant or run.variant,
                match=twin(run.match, seed), budget=twin(run.budget, seed),
                lr_from=(run.lr_from or key) if run.recovery else None,
                compressed_from=twin(run.compressed_from, seed)))
    return out


def replicate_runs(runs: dict[Key, Run], spec: dict[str, Any]) -> list[Run]:
    """Seed replicates of Table 1 runs: ``spec = {"seeds": [1, 2], "runs": ["<method>",
    "<method>/<variant>"]}`` → for every named run at every ratio and every seed,
    a copy at variant ``<variant>_s<seed>`` with that seed (calibration sample, data order,
    adapter init) and labels of the base variant, so tables average over seeds. A replicate
    reuses the base run's chosen learning rates (no sweep per seed); its ``match`` and
    ``budget`` point to the same seed's replicate of the run named there when that is
    replicated too.

    Raises:
        ValueError: a named run that is not a Table 1 method/variant, or a seed that equals
            the base seed of a run.
    """
    names = [(method, variant or "default") for method, _, variant in
             (name.partition("/") for name in spec.get("runs", []))]
    base = {k: r for k, r in runs.items() if r.table == "main" and (r.method, r.variant) in names}
    for name in names:
        if not any((r.method, r.variant) == name for r in base.values()):
            raise ValueError(f"replicates.runs names {'/'.join(name)!r}, which is not a "
                             "Table 1 method/variant of this config")
    return _seed_twins(base, list(spec.get("seeds", [])), runs, "replicates.seeds")


def budget_variant(variant: str, tokens: int) -> str:
    """The variant of a budget-ladder point: ``tok<n>`` for a default run, else
    ``<variant>_tok<n>`` (so its paths are a pure function of the wildcards)."""
    return f"tok{tokens}" if variant == "default" else f"{variant}_tok{tokens}"


def _ladder(spec: dict[str, Any], training: dict[str, Any]) -> list[int]:
    """``budget.tokens`` sorted; each a whole number of optimizer steps, so every point's
    schedule ends exactly at its own budget (ValueError otherwise)."""
    ladder = sorted({int(t) for t in spec["tokens"]})
    step = step_tokens(training)
    odd = [t for t in ladder if t % step]
    if odd:
        raise ValueError(f"budget.tokens {odd} are not multiples of the {step} tokens of one "
                         "optimizer step (training.global_batch x training.seq_len)")
    return ladder


def _ladder_bases(runs: dict[Key, Run], spec: dict[str, Any],
                  ratios: list[float]) -> dict[Key, Run]:
    """The Table 1 runs (base seed) the ladder recovers again: ``budget.runs`` at
    ``budget.ratios`` (ValueError for a name that is not a recovered Table 1 run)."""
    chosen = table1_ratios("budget.ratios", spec, ratios)
    names = [(method, variant or "default") for method, _, variant in
             (name.partition("/") for name in spec["runs"])]
    table1 = {k: r for k, r in runs.items() if r.table == "main" and r.label_variant is None}
    for name in names:
        if not any((r.method, r.variant) == name and r.recovery for r in table1.values()):
            raise ValueError(f"budget.runs names {'/'.join(name)!r}, which is not a recovered "
                             "Table 1 method/variant of this config")
    return {k: r for k, r in table1.items()
            if (r.method, r.variant) in names and r.ratio in chosen}


def budget_runs(runs: dict[Key, Run], spec: dict[str, Any], ratios: list[float],
                training: dict[str, Any]) -> list[Run]:
    """The budget axis: every run of ``budget.runs`` at every ratio of ``budget.ratios``,
    recovered again at every ``budget.tokens`` point as a run of its own (variant
    :func:`budget_variant`, table ``budget``): it trains the Table 1 run's compressed model
    for exactly that many tokens (its own warm-up + cosine schedule, annealed at its
    budget: never a checkpoint of a longer run). A point equal to ``training.tokens`` is the
    Table 1 run itself (no second run).

    Links: ``budget`` and ``lr_from`` name the same point's twin of the run they name
    (when that run is on the ladder too). Learning rates (``budget.lr``): ``sweep`` (default)
    = the recipe's tuning grid on the tuning split at every point; ``smallest`` = the
    smallest point sweeps, the others reuse its choice (``lr_from``). ``budget.tasks: top``
    scores the tasks only at the largest point (perplexity at every point).
    ``budget.replicates`` adds training seeds at chosen budgets (:func:`_budget_replicates`);
    ``budget.until`` stops chosen runs below the top of the ladder for one sitting
    (:func:`_until`).

    Raises:
        ValueError: a name that is not a recovered Table 1 run, a ratio not in ``ratios``, a
            point that is not a whole number of optimizer steps, an unknown ``lr`` /
            ``tasks`` choice, a replicated budget off the ladder.
    """
    if not spec:
        return []
    ladder = _ladder(spec, training)
    base_tokens = int(training.get("tokens", train_default("tokens")))
    bases = _ladder_bases(runs, spec, ratios)
    lr_mode, tasks = spec["lr"], spec["tasks"]
    if lr_mode not in BUDGET_LR or tasks not in BUDGET_TASKS:
        raise ValueError(f"budget.lr must be one of {BUDGET_LR} and budget.tasks one of "
                         f"{BUDGET_TASKS}, got {lr_mode!r} and {tasks!r}")
    top_only = tasks == "top"

    def at(ref: Key | None, tokens: int) -> Key | None:
        """The run standing for ``ref`` at ``tokens`` (ref itself off the ladder)."""
        if ref is None or ref not in bases or tokens == base_tokens:
            return ref
        return (ref[0], ref[1], budget_variant(ref[2], tokens), ref[3])

    until = _until(spec, ladder)
    out: list[Run] = []
    for tokens in ladder:
        for key, run in bases.items():
            if tokens == base_tokens or tokens > until.get((run.method, run.variant), tokens):
                continue
            lr_from = at(run.lr_from, tokens)
            if lr_from is None and lr_mode == "smallest" and tokens != ladder[0]:
                lr_from = at(key, ladder[0])
            out.append(replace(
                run, variant=budget_variant(run.variant, tokens), tokens=tokens,
                table="budget", budget_tokens=tokens, budget_variant=run.variant,
                compressed_from=run.compressed_from or key, budget=at(run.budget, tokens),
                lr_from=lr_from, scored_tasks=not top_only or tokens == ladder[-1]))
    return out + _budget_replicates(out, spec.get("replicates") or {}, ladder, base_tokens, runs)


def _until(spec: dict[str, Any], ladder: list[int]) -> dict[tuple[str, str], int]:
    """``budget.until`` (``{"method/variant": tokens}``): the largest budget a run is taken to
    in this sitting (a ladder too long for one sitting is split into configs that resume
    into one results folder: the points a sitting leaves out are added by the next, every
    other path unchanged). ValueError for a run not in ``budget.runs`` or a budget off the
    ladder."""
    out: dict[tuple[str, str], int] = {}
    names = set(spec["runs"])
    for name, tokens in (spec.get("until") or {}).items():
        if name not in names or int(tokens) not in ladder:
            raise ValueError(f"budget.until: {name!r}: {tokens} must name a run of budget.runs "
                             f"and a budget of budget.tokens {ladder}")
        method, _, variant = name.partition("/")
        out[(method, variant or "default")] = int(tokens)
    return out


def _budget_replicates(points: list[Run], spec: dict[str, Any], ladder: list[int],
                       base_tokens: int, runs: dict[Key, Run]) -> list[Run]:
    """Seed replicates of ladder points (``budget.replicates = {"seeds": [1, 2], "tokens":
    [131072], "runs": ["flexigpt"]}``): every run of those budgets (of ``runs``, default
    every ladder run) again with each seed, on the same seed's
    compressed model where ``replicates:`` made one (else the base seed's), reusing the
    base seed's learning rates. The point at ``training.tokens`` is a Table 1 run: its seeds
    come from ``replicates:`` (ValueError here, as for a budget off the ladder)."""
    if not spec.get("seeds"):
        return []
    chosen = sorted({int(t) for t in spec.get("tokens", [])})
    wrong = [t for t in chosen if t not in ladder or t == base_tokens]
    if not chosen or wrong:
        raise ValueError(f"budget.replicates.tokens must name budgets of budget.tokens other "
                         f"than training.tokens ({base_tokens}: seed it with replicates:), got "
                         f"{wrong or chosen}")
    names = {(m, v or "default") for m, _, v in (n.partition("/") for n in spec.get("runs", []))}
    base = {r.key: r for r in points if r.budget_tokens in chosen
            and (not names or (r.method, r.budget_variant) in names)}
    missing = names - {(r.method, r.budget_variant) for r in points}
    if missing:
        raise ValueError(f"budget.replicates.runs names {sorted('/'.join(n) for n in missing)}, "
                         "which are not in budget.runs")
    return _seed_twins(base, list(spec["seeds"]), runs, "budget.replicates.seeds")
