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
    assert "| FlexiGPT* | 30% | 21.5% | 30 | **22.52** |" in md  # lowest PPL in its ratio group
    assert "| Dense | 0% | 0.0% | 30 | 15.84 |" in md          # a one-row group is never bold
    assert "a different model, for reference only (no deltas)" in md
    assert "Δ" not in md  # no paper counterpart for SmolLM2: no fake deltas
    assert "61.40†" in md and "62.68**†" in md and "| 62.28 |" in md and "| 61.60 |" in md
    tex = (out / "table1_smollm2-135m.tex").read_text()
    assert r"\textbf{22.52}" in tex and r"30\%" in tex and r"$^\dagger$" in tex


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
    assert names == ["table1_smollm2-135m.csv", "table1_smollm2-135m.md", "table1_smollm2-135m.tex"]
    md = (tmp_path / "table1_smollm2-135m.md").read_text()
    assert "| ShortGPT | 40% | 31.6% | 18 | 287.40 |" in md
    assert "FlexiGPT*" not in md.split("### Paper")[0]
    # Missing tasks and missing PPL still give a table (Avg shown as "–").
    data = json.loads(files[1].read_text())
    del data["tasks"]["piqa"]
    data["perplexity"] = None
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(data))
    build_all(None, tmp_path / "p", results=[files[0], partial], make_plots=False)
    md = (tmp_path / "p" / "table1_smollm2-135m.md").read_text()
    assert "| ShortGPT | 40% | 31.6% | 18 | – | 31.20 | 22.10 | – | 49.40 | 27.10 | – |" in md
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
