"""Tables, published numbers and figures built from the fixture results tree.

Golden Markdown lives in tests/fixtures/results/golden/; regenerate it after an intended
change with ``FLEXIGPT_UPDATE_GOLDEN=1 pytest tests/test_tables.py`` and review the diff.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from flexigpt.cli import main as cli_main
from flexigpt.tables import ResultFileError, build_all
from flexigpt.tables.build import aggregate, table1
from flexigpt.tables.collect import collect_results, discover, parse_result
from flexigpt.tables.published import avg_mismatches, load_published, paper_model
from flexigpt.tables.render import Block, bold_mask

FIXTURES = Path(__file__).parent / "fixtures" / "results"
GOLDEN = FIXTURES / "golden"
EVAL = FIXTURES / "eval" / "smollm2-135m"
SMOL = "smollm2-135m"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, list[Path]]:
    """Everything (tables + figures) built once from the fixture tree."""
    out = tmp_path_factory.mktemp("tables")
    return out, build_all(FIXTURES, out)


def _golden_names() -> list[str]:
    return sorted(p.name for p in GOLDEN.glob("*.md"))


def test_discovery_classifies_by_content() -> None:
    found = discover(FIXTURES)
    assert len(found.results) == 24 and len(found.timings) == 2
    assert len(found.train_logs) == 2 and len(found.manifests) == 3
    assert not any(p.name in ("config.json", "samples_arc_easy.json") for p in found.results)


def test_discovery_skips_json_without_result_schema(tmp_path) -> None:
    """A benchmark-script JSON with task scores next to the results is not a result."""
    shutil.copytree(EVAL, tmp_path / "eval")
    (tmp_path / "bench.json").write_text(json.dumps({"tasks": {"piqa": {"speedup": 2.0}}}))
    assert len(discover(tmp_path).results) == len(discover(EVAL).results)


def test_golden_set_is_complete(built) -> None:
    out, _ = built
    produced = sorted(p.name for p in out.glob("*.md"))
    if os.environ.get("FLEXIGPT_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        for old in GOLDEN.glob("*.md"):
            old.unlink()
        for name in produced:
            shutil.copy(out / name, GOLDEN / name)
    assert produced == _golden_names()
    assert "table1_smollm2-135m.md" in produced


@pytest.mark.parametrize("name", _golden_names())
def test_markdown_matches_golden(built, name: str) -> None:
    out, _ = built
    assert (out / name).read_text(encoding="utf-8") == (GOLDEN / name).read_text(encoding="utf-8")


def test_table1_values_bold_and_seed_mean(built) -> None:
    out, _ = built
    csv = pd.read_csv(out / "table1_smollm2-135m.csv")
    ours = csv[csv["source"].eq("ours")].set_index(["method", "ratio"])
    flex = ours.loc[("flexigpt", 0.3)]
    assert flex["n_seeds"] == 2
    assert flex["ppl"] == pytest.approx((22.41 + 22.63) / 2)
    assert flex["arc_easy"] == pytest.approx(100 * (0.4520 + 0.4480) / 2)
    tasks = [flex[t] for t in ("arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag")]
    assert flex["avg"] == pytest.approx(sum(tasks) / 5)
    assert ours.loc[("shortgpt", 0.3), "num_layers"] == 21
    assert ours.loc[("shortgpt", 0.3), "achieved_ratio"] == pytest.approx(
        9 * 3540096 / 134515008, abs=1e-6)
    md = (out / "table1_smollm2-135m.md").read_text()
    # Old files: no blocks_pruned → Layers; recovery tokens from trained_tokens.
    assert "| FlexiGPT* | 30% | 21.5% | 30 | 41K | **22.52** |" in md  # lowest PPL in its group
    assert "| Dense | 0% | 0.0% | 30 | – | 15.84 |" in md              # one-row group: not bold
    assert "| ShortGPT (one-shot) | 30% | 23.7% | 21 | – | 98.31 |" in md
    assert "One block of this model ≈ 2.63 points of the parameter ratio" in md
    assert "block-count rule" not in md  # old files: no claim about the protocol
    assert "a different model, for reference only (no deltas)" in md
    assert "Δ" not in md  # no paper counterpart for SmolLM2: no fake deltas
    assert "61.40†" in md and "62.68**†" in md and "| 62.28 |" in md and "| 61.60 |" in md
    tex = (out / "table1_smollm2-135m.tex").read_text()
    assert r"\textbf{22.52}" in tex and r"30\%" in tex and r"$^\dagger$" in tex


@pytest.mark.parametrize("model,table,label", [("llama-3-8b", 2, "Llama-3-8B"),
                                               ("opt-1.3b", 3, "OPT-1.3B")])
def test_paper_tables_2_and_3_from_runs_of_their_models(tmp_path, model, table, label) -> None:
    """A run of the paper's Llama-3-8B (Table 2) or OPT (Table 3) gets that table's rows
    beside its own, and deltas where the setting matches (OPT: PPL only in the paper)."""
    tree = tmp_path / "eval" / model
    tree.mkdir(parents=True)
    for f in (FIXTURES / "eval" / "llama-2-7b").glob("*.json"):
        data = json.loads(f.read_text())
        data["labels"]["model"] = model
        data["model_dir"] = data["model_dir"].replace("llama-2-7b", model)
        (tree / f.name).write_text(json.dumps(data))
    out = tmp_path / "tables"
    build_all(tmp_path, out)
    md = (out / f"table1_{model}.md").read_text()
    assert f"### Paper ({label}): FlexiGPT NAACL 2025, Table {table}\n" in md
    assert "for reference only" not in md
    csv = pd.read_csv(out / f"table1_{model}.csv")
    ours = csv[csv["source"].eq("ours")].set_index("method")
    paper = csv[csv["source"].eq("paper")]
    assert set(paper["citation"]) == {f"FlexiGPT NAACL 2025, Table {table}"}
    flexi = paper[paper["method"].eq("flexigpt") & paper["ratio"].eq(0.3)].iloc[0]
    assert ours.loc["flexigpt", "delta_ppl"] == pytest.approx(6.60 - flexi["ppl"])
    dense = paper[paper["method"].eq("dense")].iloc[0]
    assert ours.loc["dense", "delta_ppl"] == pytest.approx(5.20 - dense["ppl"])
    if table == 3:  # the paper's OPT table has no task scores: no task deltas
        assert ours["delta_arc_easy"].isna().all()
        assert paper["label"].str.contains("ShortGPT + FT", regex=False).any()


def test_deltas_only_for_the_same_setting(built) -> None:
    out, _ = built
    csv = pd.read_csv(out / "table1_llama-2-7b.csv")
    ours = csv[csv["source"].eq("ours")].set_index("method")
    assert ours.loc["flexigpt", "delta_ppl"] == pytest.approx(6.60 - 6.55)
    assert ours.loc["flexigpt", "delta_arc_easy"] == pytest.approx(63.01 - 62.84)
    # Δ Avg is against the recomputed paper mean (62.28), not the misprinted 62.68.
    assert ours.loc["flexigpt", "delta_avg"] == pytest.approx(ours.loc["flexigpt", "avg"] - 62.28)
    assert ours.loc["dense", "delta_ppl"] == pytest.approx(5.20 - 5.11)
    smol = pd.read_csv(out / "table1_smollm2-135m.csv")
    assert smol.filter(like="delta_").isna().all().all()
    t4 = pd.read_csv(out / "table4_ablation_llama-2-7b.csv")
    row = t4[t4["source"].eq("ours") & t4["variant"].eq("no_outnorm")].iloc[0]
    assert row["delta_ppl_start"] == pytest.approx(9012.0 - 8648.94)
    t6 = pd.read_csv(out / "table6_inference_llama-2-7b.csv")
    short = t6[t6["source"].eq("ours") & t6["method"].eq("shortgpt")].iloc[0]
    assert short["delta_relative_time"] == pytest.approx(100 * 1.40 / 2.10 - 65.4, abs=0.01)


def test_partial_grid(tmp_path: Path) -> None:
    files = [EVAL / "dense-default-rnone-final-s0.json",
             EVAL / "shortgpt-default-r0.4-final-s0.json"]
    written = build_all(None, tmp_path, results=files, make_plots=False)
    names = sorted(p.name for p in written)
    assert names == ["comparisons.csv", "comparisons.md", "report.html", "report.md",
                     "table1_smollm2-135m.csv",
                     "table1_smollm2-135m.md", "table1_smollm2-135m.tex", "verdicts.csv",
                     "verdicts.md"]
    md = (tmp_path / "table1_smollm2-135m.md").read_text()
    assert "| ShortGPT (one-shot) | 40% | 31.6% | 18 | 287.40 |" in md
    assert "FlexiGPT*" not in md.split("### Paper")[0]
    # Missing tasks and missing PPL still give a table (Avg shown as "–").
    data = json.loads(files[1].read_text())
    del data["tasks"]["piqa"]
    data["perplexity"] = None
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(data))
    build_all(None, tmp_path / "p", results=[files[0], partial], make_plots=False)
    md = (tmp_path / "p" / "table1_smollm2-135m.md").read_text()
    assert ("| ShortGPT (one-shot) | 40% | 31.6% | 18 | – | 31.20 | 22.10 | – | 49.40 | 27.10 "
            "| – |") in md
    agg = aggregate(collect_results([files[0], partial]))
    csv = table1(agg, load_published(), SMOL).csv.set_index(["source", "method"])
    assert pd.isna(csv.loc[("ours", "shortgpt"), "avg"])
    assert pd.isna(csv.loc[("ours", "shortgpt"), "ppl"])


def test_missing_result_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "eval.json"
    with pytest.raises(FileNotFoundError, match="nowhere/eval.json"):
        build_all(None, tmp_path / "out", results=[missing], make_plots=False)


@pytest.mark.parametrize("corrupt, message", [
    (lambda d: "{not json", "not valid JSON"),
    (lambda d: {k: v for k, v in d.items() if k != "labels"}, "missing required key 'labels'"),
    (lambda d: {**d, "labels": {**d["labels"], "stage": "middle"}}, "labels.stage"),
    (lambda d: {**d, "labels": {k: v for k, v in d["labels"].items() if k != "seed"}},
     "'labels.seed'"),
    (lambda d: {**d, "tasks": {"piqa": {"metric": "acc", "value": 63.1}}}, "tasks.piqa.value"),
    (lambda d: {**d, "perplexity": {"text": "x"}}, "'perplexity.value'"),
    (lambda d: {**d, "schema": 2}, "unsupported schema"),
])
def test_malformed_result_file_is_named(tmp_path: Path, corrupt, message: str) -> None:
    data = json.loads((EVAL / "shortgpt-default-r0.3-final-s0.json").read_text())
    bad = tmp_path / "bad_result.json"
    new = corrupt(data)
    bad.write_text(new if isinstance(new, str) else json.dumps(new))
    with pytest.raises(ResultFileError, match=message) as err:
        parse_result(bad)
    assert str(bad) in str(err.value)


def test_duplicate_results_are_rejected(tmp_path: Path) -> None:
    src = EVAL / "shortgpt-default-r0.3-final-s0.json"
    copy = tmp_path / "copy.json"
    shutil.copy(src, copy)
    with pytest.raises(ResultFileError, match="duplicate result"):
        collect_results([src, copy])


def test_cli(tmp_path: Path, capsys) -> None:
    assert cli_main(["tables", "--results", str(FIXTURES), "--out", str(tmp_path / "a"),
                     "--no-plots", "--formats", "md"]) == 0
    assert (tmp_path / "a" / "table5_extension_smollm2-135m.md").exists()
    assert not (tmp_path / "a" / "table5_extension_smollm2-135m.csv").exists()
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    assert cli_main(["tables", "--result-files", str(bad), "--out", str(tmp_path / "b")]) == 2


def test_published_numbers() -> None:
    pub = load_published()
    assert sorted(pub["table"].unique()) == [1, 2, 3, 4, 5, 6, 7]
    assert pub["citation"].str.startswith("FlexiGPT NAACL 2025, Table ").all()
    unpruned = pub[pub["table"].eq(1) & pub["method"].eq("dense")].iloc[0]
    assert unpruned["avg_recomputed"] == pytest.approx(69.02, abs=1e-9)
    bad = avg_mismatches(pub)
    got = zip(bad["table"], bad["label"], bad["ratio"], bad["avg"], bad["avg_recomputed"])
    assert sorted(got) == [
        (1, "FlexiGPT*", 0.3, 62.68, 62.28), (1, "ShortGPT + LoRA*", 0.3, 61.40, 61.60)]
    t4 = pub[pub["table"].eq(4)].set_index(["variant", "stage"])["ppl"]
    assert t4[("no_outnorm", "start")] == 8648.94 and t4[("default", "final")] == 6.55
    t7 = pub[pub["table"].eq(7) & pub["method"].eq("flexigpt_extend")]
    assert t7["relative_time"].item() == 139.1
    assert paper_model("meta-llama/Llama-2-7b-hf") == "llama-2-7b" and paper_model(SMOL) is None


def test_bold_per_group_on_displayed_values() -> None:
    frame = pd.DataFrame({"Ratio": [30, 30, 40, 40, 0],
                          "PPL": [7.001, 7.004, 9.0, float("nan"), 5.0],
                          "Acc": [50.0, 60.0, 40.0, 41.0, 70.0]})
    block = Block("t", frame, {"Ratio": "pct0", "PPL": "ppl", "Acc": "num"},
                  {"PPL": "min", "Acc": "max"}, group="Ratio")
    # 7.001 and 7.004 both display as 7.00: a tie; NaN and one-row groups are never bold.
    assert bold_mask(block) == {(0, "PPL"), (1, "PPL"), (1, "Acc"), (3, "Acc")}


def test_plots_written(built) -> None:
    out, written = built
    stems = ["fig_accuracy_vs_ratio_smollm2-135m", "fig_recovery_loss",
             "fig_bi_models_smollm2-135m_flexigpt_default_r0.3",
             "fig_distance_models_smollm2-135m_flexigpt_default_r0.3"]
    for stem in stems:
        for ext in ("png", "pdf"):
            path = out / f"{stem}.{ext}"
            assert path in written and path.stat().st_size > 1000
    assert (out / stems[0]).with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The trained copy of the same compressed model is not plotted twice.
    assert not any("trained" in p.name for p in written)


def test_plots_skip_without_inputs(tmp_path: Path, caplog) -> None:
    files = [EVAL / "dense-default-rnone-final-s0.json"]
    with caplog.at_level(logging.INFO, logger="flexigpt.tables"):
        written = build_all(None, tmp_path, results=files, train_logs=[], manifests=[])
    assert written == []
    assert (tmp_path / "index.txt").read_text() == ""
    text = caplog.text
    assert "no compressed results; skipped" in text and "no train_log.csv files; skipped" in text
    assert "no FlexiGPT manifests" in text


def test_malformed_figure_and_timing_inputs_fail_first(tmp_path: Path) -> None:
    log_file = tmp_path / "run" / "train_log.csv"
    log_file.parent.mkdir()
    log_file.write_text("step,tokens,lr\n1,100,0.1\n")
    files = [EVAL / "shortgpt-default-r0.3-final-s0.json"]
    expected = r"run/train_log.csv: missing column\(s\) \['loss', 'ppl'\]"
    with pytest.raises(ResultFileError, match=expected):
        build_all(None, tmp_path / "out", results=files, train_logs=[log_file])
    assert not (tmp_path / "out").exists()  # nothing half-written
    timing = json.loads((FIXTURES / "timing" / "inference_smollm2-135m.json").read_text())
    del timing["rows"][1]["relative_time"]
    bad = tmp_path / "timing.json"
    bad.write_text(json.dumps(timing))
    expected = r"timing.json: missing required key 'rows\[1\].relative_time'"
    with pytest.raises(ResultFileError, match=expected):
        build_all(None, tmp_path / "out", results=files, timings=[bad], make_plots=False)


def test_only_flexigpt_manifests_feed_the_base_map_plot(tmp_path) -> None:
    """ShortGPT manifests also record Block Influence but have no replacements to plot."""
    from flexigpt.tables.collect import read_flexigpt_manifest

    info = {"block_influence": [0.3, 0.1, 0.2], "removed_blocks": [1]}
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"method": "shortgpt", "info": info, "config": {"ratio": 0.3}}))
    assert read_flexigpt_manifest(short) is None
    flex = tmp_path / "flex.json"
    flex.write_text(json.dumps({"method": "flexigpt", "config": {"ratio": 0.3},
                                "info": {"block_influence": [0.3, 0.1, 0.2],
                                         "pruned_blocks": [1], "base_map": {"1": 2}}}))
    assert read_flexigpt_manifest(flex)["base_map"] == {1: 2}
    flex.write_text(json.dumps({"method": "flexigpt", "info": {"block_influence": [0.3]}}))
    with pytest.raises(ResultFileError, match="pruned_blocks"):
        read_flexigpt_manifest(flex)


def test_recovery_plot_draws_the_ppl_before_training(tmp_path, monkeypatch) -> None:
    """Step 0 has a held-out PPL but no loss: it must still appear in the PPL panel."""
    from flexigpt.tables import plots

    captured = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, stem: captured.setdefault("fig", fig))
    log_df = pd.DataFrame({"step": [0, 1, 2], "tokens": [0, 2048, 4096],
                           "loss": [None, 4.0, 3.5], "lr": [None, 1e-3, 1e-4],
                           "ppl": [140.0, None, 70.0]})
    plots.recovery_curves({"flexigpt/r0.3": log_df}, tmp_path)
    ppl_axis = captured["fig"].axes[1]
    assert list(ppl_axis.lines[0].get_ydata()) == [140.0, 70.0]



# ---- the matched-protocol DAG: labels.table, blocks_pruned, recovery, selection.json ----

BASE = EVAL / "shortgpt-default-r0.3-final-s0.json"
TASK_KEYS = ("arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag")
DISPLAY = "SmolLM2-135M-Instruct (dequantised from a Q4_1 GGUF)"


def _recovery(trainable: int, lr: float, gamma: float | None = None, loss: str = "lm",
              recipe: str = "lora", tokens: int = 2_000_000, budget: dict | None = None) -> dict:
    return {"recipe": recipe, "loss": loss, "lr": lr, "gamma_lr": gamma,
            "trainable_params": trainable, "tokens": tokens, "budget": budget,
            "lr_source": "sweep"}


def _write_result(root: Path, method: str, variant: str, ratio: float | None, *, table: str,
                  ppl: float, acc: float, achieved: float | None = None,
                  blocks: int | None = None, recovery: dict | None = None,
                  stage: str = "final", layers: int = 30, protocol: str | None = None,
                  model: str = SMOL) -> Path:
    data = json.loads(BASE.read_text())
    data["method"] = method
    data["num_layers"] = layers
    data["parameters"]["achieved_ratio"] = achieved if achieved is not None else (
        None if method == "dense" else ratio)
    data["blocks_pruned"] = blocks
    data["recovery"] = recovery
    data["trained_tokens"] = recovery["tokens"] if recovery else 0
    data["perplexity"]["value"] = ppl
    for task in TASK_KEYS:
        data["tasks"][task]["value"] = acc
    data["labels"] = {"model": model, "method": method, "variant": variant, "ratio": ratio,
                      "stage": stage, "seed": 0, "table": table,
                      "loss": recovery["loss"] if recovery else None,
                      "protocol": protocol}
    setting = f"r{ratio}" if ratio is not None else "full"
    path = root / model / method / variant / setting / f"eval_{stage}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _write_selection(root: Path, run: str, trials: list[tuple], chosen: int) -> Path:
    """A selection record as flexigpt.runtime.training.tuning.select_trial writes it; a trial whose
    PPL is None diverged (lr kept, everything else null)."""
    def trial(lr, gamma, ppl):
        if ppl is None:
            return {"lr": lr, "gamma_lr": gamma, "tune_ppl": None, "tune_ppl_before": None,
                    "trainable_params": None, "tokens": None, "diverged": True, "budget": None}
        return {"lr": lr, "gamma_lr": gamma, "tune_ppl": ppl, "tune_ppl_before": 90.0,
                "trainable_params": 1_500_000, "tokens": 500_000, "diverged": False,
                "budget": None}
    path = root / run / "trained" / "selection.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "schema": 1, "run": run, "tune_text": "resources/text/wiki/tune.txt", "tune_windows": 16,
        "grid": [{"lr": t[0], "gamma_lr": t[1]} for t in trials], "metric": "tune_ppl",
        "chosen_trial": chosen, "chosen": {"lr": trials[chosen][0], "gamma_lr": trials[chosen][1]},
        "trials": [trial(*t) for t in trials]}))
    return path


@pytest.fixture()
def new_tree(tmp_path: Path) -> Path:
    """A results tree in the new format: every table, plus LR sweeps."""
    root = tmp_path / "results"
    m = dict(protocol="matched")
    flex = _recovery(1_460_000, 3e-4, gamma=1e-2, recipe="flexigpt")
    lora_all = _recovery(1_450_000, 2e-4, gamma=1e-2, recipe="flexigpt_lora_all",
                         budget={"target": 1_460_000, "achieved": 1_450_000, "rank": 7,
                                 "rel_error": -0.0068})
    _write_result(root, "dense", "default", None, table="dense", ppl=15.84, acc=0.50)
    _write_result(root, "flexigpt", "default", 0.3, table="main", ppl=22.5, acc=0.45,
                  achieved=0.2401, blocks=9, recovery=flex, **m)
    _write_result(root, "flexigpt", "default", 0.3, table="main", ppl=95.0, acc=0.30,
                  achieved=0.2401, blocks=9, stage="start", **m)
    _write_result(root, "flexigpt", "lora_all", 0.3, table="main", ppl=22.9, acc=0.44,
                  achieved=0.2401, blocks=9, recovery=lora_all, **m)
    _write_result(root, "shortgpt", "default", 0.3, table="main", ppl=98.3, acc=0.36,
                  achieved=0.2369, blocks=9, layers=21, **m)
    _write_result(root, "shortgpt_lora", "default", 0.3, table="main", ppl=24.1, acc=0.43,
                  achieved=0.2369, blocks=9, layers=21, recovery=_recovery(1_470_000, 1e-3), **m)
    _write_result(root, "slicegpt", "default", 0.3, table="main", ppl=41.8, acc=0.40,
                  achieved=0.2405, **m)
    _write_result(root, "slicegpt", "rft", 0.3, table="main", ppl=30.2, acc=0.41,
                  achieved=0.2405, recovery=_recovery(1_200_000, 5e-4), **m)
    _write_result(root, "llm_pruner", "default", 0.3, table="main", ppl=60.0, acc=0.38,
                  achieved=0.2398, **m)
    _write_result(root, "llm_pruner", "lora", 0.3, table="main", ppl=33.0, acc=0.40,
                  achieved=0.2398, recovery=_recovery(1_300_000, 5e-4), **m)
    p = dict(protocol="paper")
    _write_result(root, "flexigpt", "paper", 0.3, table="paper_protocol", ppl=22.5, acc=0.45,
                  achieved=0.2151, blocks=9, recovery=flex, **p)
    _write_result(root, "shortgpt", "paper", 0.3, table="paper_protocol", ppl=98.3, acc=0.36,
                  achieved=0.2369, blocks=9, layers=21, **p)
    _write_result(root, "shortgpt_lora", "paper", 0.3, table="paper_protocol", ppl=24.1,
                  acc=0.43, achieved=0.2369, blocks=9, layers=21,
                  recovery=_recovery(1_470_000, 1e-3), **p)
    _write_result(root, "flexigpt", "kd", 0.3, table="kd", ppl=21.0, acc=0.46, achieved=0.2401,
                  blocks=9, recovery={**flex, "loss": "kd"}, **m)
    _write_result(root, "slicegpt", "rft_kd", 0.3, table="kd", ppl=29.0, acc=0.42,
                  achieved=0.2405, recovery=_recovery(1_200_000, 5e-4, loss="kd"), **m)
    _write_result(root, "shortgpt_lora", "kd", 0.4, table="kd", ppl=30.0, acc=0.40,
                  achieved=0.3158, blocks=12, layers=18,
                  recovery=_recovery(1_470_000, 1e-3, loss="kd"), **m)
    _write_result(root, "flexigpt_extend", "block", None, table="extension", ppl=15.0, acc=0.52,
                  recovery=_recovery(3_260_000, 1e-4, recipe="extend"), layers=40)
    _write_result(root, "dense", "trained", None, table="extension", ppl=15.3, acc=0.505,
                  recovery=_recovery(134_515_008, 1e-5, recipe="full"))
    _write_result(root, "dense", "trained_lora", None, table="extension", ppl=15.4, acc=0.503,
                  recovery=_recovery(3_260_000, 1e-4))
    _write_selection(root, f"{SMOL}/flexigpt/default/r0.3",
                     [(1e-4, 1e-2, 25.0), (3e-4, 1e-2, 22.6), (1e-3, 1e-2, 24.0),
                      (1e-4, 1e-3, 26.0), (3e-4, 1e-3, 23.0), (1e-3, 1e-3, None)], 1)
    _write_selection(root, f"{SMOL}/shortgpt_lora/default/r0.3",
                     [(3e-4, None, 26.0), (1e-3, None, 24.2), (3e-3, None, 25.0)], 1)
    _write_selection(root, f"{SMOL}/flexigpt_extend/block/L40",
                     [(1e-4, None, 15.1), (3e-4, None, 15.6)], 0)
    return root


def _block_rows(md: str, title: str) -> dict[str, list[str]]:
    """Rows of the Markdown block under ``### title`` keyed by their first cell."""
    part = md.split(f"### {title}", 1)[1].split("\n### ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in part.splitlines() if line.startswith("| ")]
    head, body = rows[0], rows[1:]
    return {"__header__": [h.strip() for h in head],
            **{r[0].strip(): [c.strip() for c in r] for r in body}}


def test_new_table1_columns_one_shot_and_footnotes(new_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    build_all(new_tree, out, make_plots=False, model_names={SMOL: DISPLAY})
    md = (out / f"table1_{SMOL}.md").read_text()
    assert md.startswith(f"## Table 1 — compression results, {DISPLAY}")
    rows = _block_rows(md, f"Ours: {DISPLAY}")
    assert rows["__header__"] == ["Method", "Ratio", "Achieved", "Blocks", "Trainable (M)",
                                  "Tokens", "LR", "PPL", "ARC-e", "ARC-c", "PIQA", "WinoG.",
                                  "HellaS.", "Avg"]
    assert set(rows) - {"__header__"} == {
        "Dense", "SliceGPT (one-shot)", "SliceGPT + RFT*", "LLM-Pruner (one-shot)",
        "LLM-Pruner + LoRA*", "ShortGPT (one-shot)", "ShortGPT + LoRA*", "FlexiGPT*",
        "FlexiGPT + LoRA on unpruned blocks*"}  # no paper-protocol, KD, ablation or extension row
    assert rows["FlexiGPT*"][:7] == ["FlexiGPT*", "30%", "24.0%", "9", "1.46", "2M",
                                     "3e-4 (γ 1e-2)"]
    assert rows["SliceGPT (one-shot)"][3:7] == ["–", "–", "–", "–"]
    assert rows["ShortGPT (one-shot)"][3] == "9"
    assert rows["Dense"][1:4] == ["0%", "0.0%", "–"]
    notes = md.split("### Paper")[0]
    step = 100 * 0.2369 / 9
    assert f"One block of this model ≈ {step:.2f} points of the parameter ratio" in notes
    assert "share the block-count rule" in notes
    assert "(one-shot) = evaluated right after compression, never trained." in notes
    assert ("Trainable counts matched to a parameter budget (FlexiGPT + LoRA on unpruned "
            "blocks): largest |relative error| 0.68%.") in notes
    csv = pd.read_csv(out / f"table1_{SMOL}.csv")
    flex = csv[csv["source"].eq("ours") & csv["variant"].eq("lora_all")].iloc[0]
    assert flex["trainable_params"] == 1_450_000 and flex["lr"] == pytest.approx(2e-4)
    assert flex["blocks_pruned"] == 9 and flex["table"] == "main"
    tex = (out / f"table1_{SMOL}.tex").read_text()
    assert r"3e-4 ($\gamma$ 1e-2)" in tex


def test_paper_protocol_table(new_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    build_all(new_tree, out, make_plots=False)
    md = (out / f"table1_paper_protocol_{SMOL}.md").read_text()
    rows = _block_rows(md, f"Ours: {SMOL}, paper protocol")
    assert rows["__header__"][:7] == ["Method", "Ratio", "Achieved", "Blocks", "Trainable (M)",
                                      "Tokens", "LR"]
    assert set(rows) - {"__header__"} == {"Dense", "ShortGPT (one-shot)", "ShortGPT + LoRA*",
                                          "FlexiGPT*"}
    assert rows["FlexiGPT*"][2:4] == ["21.5%", "9"]
    assert "int(ratio·L) (L = 30 here)" in md
    assert "### Paper (Llama-2-7B)" in md  # the paper's own protocol, for reference


def test_kd_table_pairs_each_kd_row_with_its_lm_row(new_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    build_all(new_tree, out, make_plots=False)
    md = (out / f"table_kd_{SMOL}.md").read_text()
    part = md.split("### Ours")[1].split("\n\n")[1]
    lines = [[c.strip() for c in line.strip("|").split(" | ")] for line in part.splitlines()]
    assert lines[0] == ["Method", "Ratio", "Loss", "Achieved", "Trainable (M)", "Tokens", "PPL",
                        "ARC-e", "ARC-c", "PIQA", "WinoG.", "HellaS.", "Avg"]
    body = [(r[0], r[1], r[2]) for r in lines[2:]]
    assert body == [("SliceGPT + RFT*", "30%", "LM"), ("SliceGPT + RFT*", "30%", "KD"),
                    ("FlexiGPT*", "30%", "LM"), ("FlexiGPT*", "30%", "KD"),
                    ("ShortGPT + LoRA*", "40%", "KD")]
    assert "No LM-loss counterpart in the results for: ShortGPT + LoRA (KD)." in md
    csv = pd.read_csv(out / f"table_kd_{SMOL}.csv")
    assert list(csv["loss"]) == ["lm", "kd", "lm", "kd", "kd"]


def test_table5_has_the_lora_control_and_trainable(new_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    build_all(new_tree, out, make_plots=False)
    md = (out / f"table5_extension_{SMOL}.md").read_text()
    rows = _block_rows(md, f"Ours: {SMOL}, extension")
    assert rows["__header__"][:4] == ["Method", "Layers", "Params (M)", "Trainable (M)"]
    assert list(rows)[1:] == ["Base", "Base trained on the same tokens (control)",
                              "Base + LoRA with the extension's trainable count (control)",
                              "FlexiGPT (Block)"]
    assert rows["Base + LoRA with the extension's trainable count (control)"][3] == "3.26"
    assert rows["Base"][3] == "–"
    # Table 1 keeps out every extension row.
    assert "control" not in (out / f"table1_{SMOL}.md").read_text().split("### Paper")[0]


def test_lr_sweep_table_and_figure(new_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    written = build_all(new_tree, out, model_names={SMOL: DISPLAY})
    png = out / f"fig_lr_sweep_{SMOL}.png"
    assert png in written and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 1000
    assert (out / f"lr_sweep_{SMOL}.md") in written and (out / f"lr_sweep_{SMOL}.csv") in written
    assert not (out / f"lr_sweep_{SMOL}.tex").exists()
    csv = pd.read_csv(out / f"lr_sweep_{SMOL}.csv")
    assert len(csv) == 11
    chosen = csv[csv["chosen"]].set_index("run")
    assert chosen.loc[f"{SMOL}/flexigpt/default/r0.3", "lr"] == pytest.approx(3e-4)
    assert chosen.loc[f"{SMOL}/flexigpt/default/r0.3", "gamma_lr"] == pytest.approx(1e-2)
    assert chosen.loc[f"{SMOL}/shortgpt_lora/default/r0.3", "lr"] == pytest.approx(1e-3)
    md = (out / f"lr_sweep_{SMOL}.md").read_text()
    assert md.startswith(f"## Recovery LR sweeps, {DISPLAY}")
    assert "| FlexiGPT @ r0.3 | 3e-4 | 1e-2 | 1.50 | 500K | 90.00 | **22.60** | ✓ |" in md
    assert "| FlexiGPT @ r0.3 | 1e-3 | 1e-3 | – | – | – | – | diverged |" in md
    assert "Chosen trial is not the lowest" not in md


def test_lr_sweep_figure_has_a_panel_per_ratio_and_gamma_lines(new_tree, tmp_path,
                                                             monkeypatch) -> None:
    from flexigpt.tables import plots
    from flexigpt.tables.collect import discover
    from flexigpt.tables.selections import collect_selections

    captured = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, out, stem: captured.setdefault(
        stem, fig) and [])
    sel = collect_selections(discover(new_tree).selections)
    plots.lr_sweep(sel, SMOL, tmp_path, "fig")
    axes = [ax for ax in captured["fig"].axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["ratio 30%", "other settings (L40)"]
    assert [line.get_label() for line in axes[1].lines][:1] == ["FlexiGPT (Block) @ L40"]
    labels = [line.get_label() for line in axes[0].lines if not line.get_label().startswith("_")]
    assert labels == ["ShortGPT + LoRA", "FlexiGPT, γ LR 1e-3", "FlexiGPT, γ LR 1e-2",
                      "diverged (non-finite tune PPL)"]
    assert axes[0].get_xscale() == "log"
    ringed = [line for line in axes[0].lines if line.get_label().startswith("_")]
    assert sorted(float(line.get_xdata()[0]) for line in ringed) == [3e-4, 1e-3]


@pytest.mark.parametrize("corrupt, message", [
    (lambda d: {k: v for k, v in d.items() if k != "trials"}, "missing required key 'trials'"),
    (lambda d: {**d, "run": "smollm2-135m/flexigpt"}, "'run' must be"),
    (lambda d: {**d, "chosen": {"lr": 5e-2, "gamma_lr": None}}, r"is not trials\[1\]"),
    (lambda d: {k: v for k, v in d.items() if k != "chosen_trial"} | {
        "chosen": {"lr": 5e-2, "gamma_lr": None}}, "is not one of the trials"),
    (lambda d: {**d, "chosen_trial": 7}, "'chosen_trial' 7 is out of range"),
    (lambda d: {**d, "trials": [d["trials"][0], {**d["trials"][1], "diverged": True}]},
     r"the chosen trial \(trials\[1\]\) diverged"),
    (lambda d: {**d, "trials": [{**d["trials"][0], "tokens": 1.5}] + d["trials"][1:]},
     r"'trials\[0\]\.tokens'"),
    (lambda d: {**d, "trials": []}, "'trials' is empty"),
    (lambda d: {**d, "trials": [{**d["trials"][0], "lr": -1.0}]}, r"'trials\[0\].lr' must be > 0"),
    (lambda d: {**d, "trials": [{**d["trials"][0], "tune_ppl": "low"}]},
     r"'trials\[0\]\.tune_ppl'"),
    (lambda d: {**d, "schema": 2}, "unsupported schema"),
])
def test_malformed_selection_is_named(new_tree: Path, tmp_path: Path, corrupt, message) -> None:
    from flexigpt.tables.selections import read_selection

    good = new_tree / SMOL / "shortgpt_lora" / "default" / "r0.3" / "trained" / "selection.json"
    bad = tmp_path / "bad" / "selection.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps(corrupt(json.loads(good.read_text()))))
    with pytest.raises(ResultFileError, match=message) as err:
        read_selection(bad)
    assert str(bad) in str(err.value)
    with pytest.raises(ResultFileError, match="bad/selection.json"):  # fails before writing
        build_all(None, tmp_path / "out", results=[BASE], selections=[bad], make_plots=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("corrupt, message", [
    (lambda d: {**d, "labels": {**d["labels"], "table": "Main"}}, "labels.table must be one of"),
    (lambda d: {**d, "labels": {**d["labels"], "loss": "lm"}}, "disagrees with recovery.loss"),
    (lambda d: {**d, "blocks_pruned": "nine"}, "'blocks_pruned'"),
    (lambda d: {**d, "recovery": {**d["recovery"], "lr": -1e-4}}, "'recovery.lr' must be > 0"),
    (lambda d: {**d, "recovery": {k: v for k, v in d["recovery"].items() if k != "loss"}},
     "missing required key 'recovery.loss'"),
    (lambda d: {**d, "recovery": {**d["recovery"], "loss": "mse"}}, "recovery.loss must be"),
    (lambda d: {**d, "recovery": {**d["recovery"], "budget": {"target": 1}}},
     "'recovery.budget.achieved'"),
    (lambda d: {**d, "recovery": {**d["recovery"], "tokens": "2M"}}, "'recovery.tokens'"),
])
def test_malformed_comparison_fields_are_named(new_tree: Path, tmp_path: Path, corrupt,
                                               message) -> None:
    good = new_tree / SMOL / "flexigpt" / "kd" / "r0.3" / "eval_final.json"
    bad = tmp_path / "bad_result.json"
    bad.write_text(json.dumps(corrupt(json.loads(good.read_text()))))
    with pytest.raises(ResultFileError, match=message) as err:
        parse_result(bad)
    assert str(bad) in str(err.value)


def test_old_and_new_result_files_mix(new_tree: Path, tmp_path: Path) -> None:
    """Old files (no table / blocks / recovery) classify by method and variant and render."""
    old = parse_result(EVAL / "shortgpt_lora-default-r0.3-final-s0.json")
    assert old["table"] == "main" and old["labels_table"] is None and old["trained"]
    assert old["tokens"] == 40960 and pd.isna(old["trainable_params"])
    assert parse_result(EVAL / "dense-trained-rnone-final-s0.json")["table"] == "extension"
    assert parse_result(EVAL / "flexigpt-no_outnorm-r0.3-final-s0.json")["table"] == "ablation"
    files = [EVAL / "dense-default-rnone-final-s0.json",
             EVAL / "shortgpt-default-r0.4-final-s0.json",
             new_tree / SMOL / "flexigpt" / "default" / "r0.3" / "eval_final.json"]
    build_all(None, tmp_path, results=files, make_plots=False)
    rows = _block_rows((tmp_path / f"table1_{SMOL}.md").read_text(), f"Ours: {SMOL}")
    assert rows["ShortGPT (one-shot)"][1:4] == ["40%", "31.6%", "–"]  # no blocks_pruned: –
    assert rows["FlexiGPT*"][3] == "9"


def test_recovery_with_unknown_fields_still_renders(new_tree: Path, tmp_path: Path) -> None:
    """The evaluator writes null for what a manifest does not record: shown as –."""
    src = new_tree / SMOL / "slicegpt" / "rft" / "r0.3" / "eval_final.json"
    data = json.loads(src.read_text())
    data["recovery"] = {"recipe": None, "loss": "lm", "lr": None, "gamma_lr": None,
                        "trainable_params": None, "tokens": None, "budget": None,
                        "lr_source": "unknown"}
    src.write_text(json.dumps(data))
    row = parse_result(src)
    assert row["trained"] and row["lr"] is None and row["lr_source"] == "unknown"
    build_all(new_tree, tmp_path / "out", make_plots=False)
    rows = _block_rows((tmp_path / "out" / f"table1_{SMOL}.md").read_text(), f"Ours: {SMOL}")
    assert rows["SliceGPT + RFT*"][3:7] == ["–", "–", "–", "–"]


def test_html_rendering_escapes_text_and_bolds_the_best():
    from flexigpt.tables.render import Block, Table, html_page

    frame = pd.DataFrame({"Method": ["<A> & B", "C"], "PPL": [5.0, 4.0]})
    block = Block("rows <1>", frame, {"PPL": "ppl"}, {"PPL": "min"}, notes=["a < b"])
    page = html_page("T & t", [Table("t", "title", [block], frame)])
    assert "&lt;A&gt; &amp; B" in page and "<A>" not in page
    assert "<b>4.00</b>" in page and "<b>5.00</b>" not in page
    assert "<h3>rows &lt;1&gt;</h3>" in page and "<p>a &lt; b</p>" in page
    assert page.count("<tr>") == 3 and "<title>T &amp; t</title>" in page
