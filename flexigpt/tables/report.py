"""``build_all``: every table and figure from a results tree or explicit file lists."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from flexigpt.core.fileio import atomic_write_text
from flexigpt.tables import ablation, build, sweep, timing
from flexigpt.tables.budget import find_ladders
from flexigpt.tables.build import aggregate
from flexigpt.tables.collect import (
    Inputs,
    collect_results,
    collect_timings,
    discover,
    read_flexigpt_manifest,
    read_train_log,
)
from flexigpt.tables.comparisons import Comparator, comparison_table
from flexigpt.tables.curves import add_reach, recovery_by_ratio
from flexigpt.tables.decode import collect_decodes
from flexigpt.tables.facts import check_facts, with_facts
from flexigpt.tables.labels import slug
from flexigpt.tables.page import write_report
from flexigpt.tables.published import load_published
from flexigpt.tables.render import Table, write_table
from flexigpt.tables.replacement import replacement_table
from flexigpt.tables.row_intervals import RecordStore, add_intervals
from flexigpt.tables.rung_check import rung_check_table
from flexigpt.tables.selections import collect_selections
from flexigpt.tables.verdicts import verdict_table

log = logging.getLogger(__name__)

PathList = list[str | os.PathLike] | None


def _label(path: Path, root: Path | None) -> str:
    """Short label of a file's directory: relative to ``root`` when under it."""
    parent = path.resolve().parent
    if root is not None:
        try:
            return str(parent.relative_to(root.resolve())) or parent.name
        except ValueError:
            pass
    return "/".join(parent.parts[-3:])


def gather_inputs(results_dir: str | os.PathLike | None, results: PathList = None,
                  timings: PathList = None, train_logs: PathList = None,
                  manifests: PathList = None, selections: PathList = None) -> Inputs:
    """Explicit lists win per kind; kinds not given are discovered under ``results_dir``."""
    given = {"results": results, "timings": timings, "train_logs": train_logs,
             "manifests": manifests, "selections": selections}
    if results_dir is None and results is None:
        raise ValueError("give a results directory or an explicit list of result files")
    found = discover(results_dir) if results_dir is not None and any(
        v is None for v in given.values()) else Inputs()
    for kind, paths in given.items():
        if paths is not None:
            setattr(found, kind, [Path(p) for p in paths])
    return found


def build_all(results_dir: str | os.PathLike | None, out_dir: str | os.PathLike, *,
              results: PathList = None, timings: PathList = None, train_logs: PathList = None,
              manifests: PathList = None, selections: PathList = None,
              published: str | os.PathLike | None = None,
              formats: tuple[str, ...] = ("md", "csv", "tex"),
              make_plots: bool = True,
              model_names: Mapping[str, str] | None = None,
              model_facts: Mapping[str, Mapping[str, Any]] | None = None) -> list[Path]:
    """Write Tables 1, 4, 5, 6, 7, the paper-protocol and KD tables and the LR-sweep table
    (per model, where inputs exist), ``verdicts`` / ``comparisons`` (paired bootstrap
    intervals from the per-document records; :mod:`flexigpt.tables.verdicts`), the figures
    and the report, ``report.md`` and ``report.html`` (:mod:`flexigpt.tables.page`: the
    findings and the legend, then every summary table, verdicts first, budget ladders last,
    :mod:`flexigpt.tables.budget`; in the HTML each figure beside the table it plots). Cells
    of rows with records carry 95 % interval half-widths
    (:mod:`flexigpt.tables.row_intervals`).

    Args:
        results_dir: tree to discover inputs in (None: only the explicit lists).
        out_dir: where tables (``.md/.csv/.tex``) and figures (``.png/.pdf``) go.
        results, timings, train_logs, manifests, selections: explicit file lists (e.g. a
            Snakemake rule's inputs; ``selections`` = the LR sweeps' ``selection.json``);
            each replaces discovery for its kind.
        published: the published-numbers CSV (default: the packaged one).
        formats: table formats to write.
        make_plots: also draw the figures.
        model_names: model key → display name for titles (default: the key); file names
            always use the key.
        model_facts: model key → facts of its dense model the tables need but no result
            records (:func:`flexigpt.tables.facts.check_facts`): ``embedding_params`` (for
            the non-embedding achieved ratio) and the run's ``compression_basis``.

    Returns:
        The files written, in order. Raises ResultFileError / FileNotFoundError naming the
        first unreadable or malformed input.
    """
    root = Path(results_dir) if results_dir is not None else None
    inputs = gather_inputs(results_dir, results, timings, train_logs, manifests, selections)
    names = dict(model_names or {})
    bad = {k: v for k, v in names.items() if not isinstance(k, str) or not isinstance(v, str)}
    if bad:
        raise ValueError(f"model_names must map model keys to display names (str), got {bad!r}")
    facts = check_facts(model_facts)
    data = _read_all(inputs, published, root, make_plots)
    if not data.agg.empty:
        data.agg = with_facts(data.agg, facts)
    out = Path(out_dir)
    models = list(dict.fromkeys(data.agg["model"])) if not data.agg.empty else []
    if not models:
        log.info("no evaluation results: tables 1, 4, 5 skipped")
    written, summary, table1 = _result_tables(data, models, names, out, formats)
    timing_written, sweeps = _timing_and_sweep_tables(data, names, out, formats)
    written += timing_written
    summary += sweeps.values()
    ladders = find_ladders(inputs.results, train_logs=inputs.train_logs, model_names=names,
                           search=sweep.choice_status(data.sel) if not data.sel.empty else {})
    for ladder in ladders:
        for table in ladder.tables:
            written += write_table(table, out, tuple(f for f in formats if f != "tex"))
            summary.append(table)
    figures = _Figures()
    if make_plots:
        _figures(data.agg, data.logs, data.records, root, out, names, table1, figures)
        _sweep_figures(data.sel, out, names, sweeps, figures)
        for ladder in ladders:
            for name, files in ladder.figures(out):
                figures.add(files, name)
    if summary and "md" in formats:  # the report pages, then the figures they show
        written += write_report(out, summary, written, figures.beside, figures.loose)
    written += figures.files
    index = out / "index.txt"
    atomic_write_text(index, "".join(f"{p.relative_to(out)}\n" for p in written))
    log.info("wrote %d files to %s", len(written), out)
    return written


@dataclass
class _Figures:
    """The figures drawn, in order (``files``), by the table whose numbers each plots
    (``beside``: table name → files) or none (``loose``)."""

    files: list[Path] = field(default_factory=list)
    beside: dict[str, list[Path]] = field(default_factory=dict)
    loose: list[Path] = field(default_factory=list)

    def add(self, files: list[Path], table: str | None = None) -> None:
        self.files += files
        if table is None:
            self.loose += files
        else:
            self.beside.setdefault(table, []).extend(files)


@dataclass
class _Loaded:
    """Everything :func:`build_all` reads, read before anything is written so that a bad
    file fails fast: published numbers, the seed-aggregated frame (with intervals and the
    "tokens to reach" column) and its record store, timings, decoding timings, LR-sweep
    trials, training logs by label and the FlexiGPT manifest records (figures only)."""

    pub: pd.DataFrame
    store: RecordStore
    agg: pd.DataFrame
    times: pd.DataFrame
    decodes: pd.DataFrame
    sel: pd.DataFrame
    logs: dict[str, pd.DataFrame]
    records: list[tuple[Path, dict[str, Any]]]


def _read_all(inputs: Inputs, published: str | os.PathLike | None, root: Path | None,
              make_plots: bool) -> _Loaded:
    """Read and validate every input of :func:`build_all` (figure inputs included)."""
    pub = load_published(published)
    df = collect_results(inputs.results)
    store = RecordStore(df)
    agg = add_intervals(aggregate(df), store) if not df.empty else pd.DataFrame()
    times = collect_timings(inputs.timings)
    decodes = collect_decodes(inputs.timings)
    sel = collect_selections(inputs.selections)
    logs = {_label(p, root): read_train_log(p) for p in inputs.train_logs}
    if not agg.empty:
        agg = add_reach(agg, logs)
    records = [(p, r) for p in inputs.manifests
               if (r := read_flexigpt_manifest(p)) is not None] if make_plots else []
    return _Loaded(pub, store, agg, times, decodes, sel, logs, records)


def _result_tables(data: _Loaded, models: list[str], names: Mapping[str, str], out: Path,
                   formats: tuple[str, ...],
                   ) -> tuple[list[Path], list[Table], dict[str, str]]:
    """Write ``verdicts`` / ``comparisons`` (never as LaTeX), then Tables 1, paper protocol,
    KD, 4 and 5 per model; returns (files written, the tables for ``report.md``, model →
    the name of its Table 1)."""
    written: list[Path] = []
    summary: list[Table] = []
    table1: dict[str, str] = {}
    comp = Comparator(data.store)
    if models:
        for table in (verdict_table(data.agg, data.pub, data.times, comp, models, data.decodes),
                      comparison_table(data.agg, comp, models)):
            if table is not None:
                written += write_table(table, out, tuple(f for f in formats if f != "tex"))
                summary.append(table)
    for model in models:
        for builder in (build.table1, build.paper_protocol_table, build.kd_table,
                        ablation.table4, build.table5):
            table = builder(data.agg, data.pub, model, display=names.get(model))
            if table is not None:
                written += write_table(table, out, formats)
                summary.append(table)
                if builder is build.table1:
                    table1[model] = table.name
        table = replacement_table(data.agg, comp, model, display=names.get(model))
        if table is not None:
            written += write_table(table, out, tuple(f for f in formats if f != "tex"))
            summary.append(table)
    return written, summary, table1


def _sweep_models(sel: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(sel["model"])) if not sel.empty else []


def _timing_and_sweep_tables(data: _Loaded, names: Mapping[str, str], out: Path,
                             formats: tuple[str, ...]) -> tuple[list[Path], dict[str, Table]]:
    """Write Tables 6 and 7 per timed model and the LR-sweep and rung-check tables per swept
    model (Markdown and CSV only); returns the files written and each swept model's LR-sweep
    table (for the report, where its figure stands beside it)."""
    written: list[Path] = []
    sweeps: dict[str, Table] = {}
    times = data.times
    for model in (list(dict.fromkeys(times["model"])) if not times.empty else []):
        for number in (6, 7):
            table = timing.timing_table(times, data.pub, model, number,
                                        display=names.get(model), decodes=data.decodes)
            if table is not None:
                written += write_table(table, out, formats)
    sweep_formats = tuple(f for f in formats if f in ("md", "csv"))
    for model in _sweep_models(data.sel):
        for make in (sweep.sweep_table, rung_check_table):
            table = make(data.sel, model, names.get(model))
            if table is not None and sweep_formats:
                written += write_table(table, out, sweep_formats)
                if make is sweep.sweep_table:
                    sweeps[model] = table
    return written, sweeps


def _sweep_figures(sel: pd.DataFrame, out: Path, names: Mapping[str, str],
                   sweeps: Mapping[str, Table], figures: _Figures) -> None:
    """``fig_lr_sweep_<model>`` per swept model, beside its LR-sweep table."""
    from flexigpt.tables import plots  # matplotlib only when figures are wanted

    for model in _sweep_models(sel):
        files = plots.lr_sweep(sel, model, out, f"fig_lr_sweep_{slug(model)}", names.get(model))
        figures.add(files, sweeps[model].name if model in sweeps else None)


def _figures(agg: pd.DataFrame, logs: dict[str, pd.DataFrame],
             records: list[tuple[Path, dict[str, Any]]], root: Path | None,
             out: Path, names: Mapping[str, str], table1: Mapping[str, str],
             figures: _Figures) -> None:
    """Accuracy/PPL-vs-ratio and the recovery curves per ratio of each model (beside its
    Table 1), every run's recovery curves, BI bars and distance heat maps (no table's)."""
    from flexigpt.tables import plots  # matplotlib only when figures are wanted

    for model in (list(dict.fromkeys(agg["model"])) if not agg.empty else []):
        stem = f"fig_accuracy_vs_ratio_{slug(model)}"
        figures.add(plots.accuracy_vs_ratio(agg, model, out, stem, names.get(model))
                    + recovery_by_ratio(agg, logs, model, out, names.get(model)),
                    table1.get(model))
    figures.add(plots.recovery_curves(logs, out))
    seen: set[str] = set()
    if not records:
        log.info("BI / distance plots: no FlexiGPT manifests with block_influence; skipped")
    for path, rec in records:
        key = json.dumps([rec["model"], rec["ratio"], rec["block_influence"], rec["pruned_blocks"],
                          rec["base_map"]], sort_keys=True)
        if key in seen:  # a trained copy of the same compressed model
            continue
        seen.add(key)
        name = slug(_label(path, root).replace("/", "_"))
        figures.add(plots.block_influence(rec, out, f"fig_bi_{name}")
                    + plots.distance_heatmap(rec, out, f"fig_distance_{name}"))
