"""The budget axis (issue 33): the ladder's run grid, its learning-rate choice, the recovery
curves in tuning-split perplexity, and the budget tables and figures."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from flexigpt.runtime.evaluation.results import write_records
from flexigpt.runtime.training.config import TrainConfig, curve_every_steps
from flexigpt.runtime.training.loop import lr_factor
from flexigpt.tables import curves
from flexigpt.tables.budget import build_budget
from flexigpt.workflow.dag import RunGrid, step_tokens

ROOT = Path(__file__).resolve().parent.parent
KEY = "smollm2-135m-budget"


def load(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


def budget_grid(**over) -> RunGrid:
    config = load("config/budget.yaml")
    config["budget"].update(over)
    return RunGrid.from_config(config)


def ladder(grid: RunGrid, method: str) -> dict[int, object]:
    """tokens → the run recovering ``method`` at that budget (Table 1's at training.tokens)."""
    runs = [r for r in grid.runs.values()
            if r.method == method and r.recovery and r.label_variant is None]
    return {TrainConfig(**grid.train_params(r)).tokens: r for r in runs}


# ---- the run grid ---------------------------------------------------------------------------
def test_budget_grid_paths_params_and_schedules():
    grid = budget_grid()
    spec = load("config/budget.yaml")["budget"]
    assert spec["tokens"][0] == 32768 and spec["tokens"][-1] >= 1 << 20  # 32K -> 1M
    for method in ("flexigpt", "shortgpt_lora"):
        points = ladder(grid, method)
        assert sorted(points) == sorted(spec["tokens"])
        table1 = points[32768]
        assert table1.variant == "default" and table1.table == "main"
        for tokens, run in points.items():
            cfg = TrainConfig(**grid.train_params(run))
            # a finished run at its own budget: the schedule is exactly its tokens, and the
            # learning rate anneals to its floor on its last step
            assert cfg.steps() * cfg.global_batch * cfg.seq_len == tokens
            assert lr_factor(cfg, cfg.steps())(cfg.steps() - 1) == pytest.approx(
                cfg.min_lr_ratio)
            if tokens == 32768:
                continue
            assert run.key == (KEY, method, f"tok{tokens}", "r0.3") and run.table == "budget"
            assert run.prefix == f"results/{KEY}/{method}/tok{tokens}/r0.3"
            assert run.compressed_dir == table1.compressed_dir  # the same compressed model
            assert run.stages() == ["final"]
            assert run.trained_dir.endswith(f"tok{tokens}/r0.3/trained")
            labels = run.labels("final")
            assert labels["table"] == "budget" and labels["budget_tokens"] == tokens
            assert labels["variant"] == f"tok{tokens}" and labels["budget_variant"] == "default"
            # tasks only at the largest budget (budget.tasks: top), perplexity everywhere
            tasks = grid.eval_params(run, "final")["tasks"]
            assert bool(tasks) == (tokens == max(spec["tokens"]))
    lora = ladder(grid, "shortgpt_lora")[131072]
    assert lora.budget == (KEY, "flexigpt", "tok131072", "r0.3")  # same point's twin
    assert lora.match == (KEY, "flexigpt", "default", "r0.3")
    base = {r.key for m in ("flexigpt", "shortgpt_lora", "replaceme", "streamline")
            for r in ladder(grid, m).values()}
    rest = {(r.method, r.variant) for r in grid.runs.values()
            if r.key not in base and r.label_variant is None}
    assert rest == {("replaceme", "default"), ("streamline", "default")}  # their one-shot rows


def test_learning_rates_per_budget_point():
    swept = budget_grid(lr="sweep")
    for method, recipe in (("flexigpt", "flexigpt"), ("shortgpt_lora", "lora")):
        grid_points = swept.tuning["grid"][recipe]
        for tokens, run in ladder(swept, method).items():
            trials = swept.trials(run)  # the recipe's grid on the tuning split, every point
            assert run.lr_from is None and len(trials) == math.prod(map(len, grid_points.values()))
            assert {t.get("lr") for t in trials} == set(grid_points["lr"])
            assert {TrainConfig(**swept.train_params(run, t)).tokens
                    for t in swept.trial_ids(run)} == {tokens}
    reused = budget_grid(lr="smallest")  # config/budget.yaml's choice
    for method in ("flexigpt", "shortgpt_lora"):
        points = ladder(reused, method)
        smallest = points[min(points)]
        assert smallest.lr_from is None and len(reused.trials(smallest)) == 2
        for tokens, run in points.items():
            if tokens != min(points):
                assert run.lr_from == smallest.key
                assert reused.trials(run) == [{"lr_from": smallest.prefix}]


def test_training_seeds_on_the_ladder():
    """Seeds at the smallest budget come from ``replicates:`` (the Table 1 runs), at a
    larger one from ``budget.replicates``: same budget, tokens and learning rates as the
    base seed's point, the same seed's compressed model, links to the same seed's twins,
    labels of the base point (so tables pool the seeds), and only the runs named."""
    grid = budget_grid()
    spec = load("config/budget.yaml")["budget"]["replicates"]
    for seed in spec["seeds"]:
        for method in ("flexigpt", "shortgpt_lora"):
            small = grid.runs[(KEY, method, f"default_s{seed}", "r0.3")]
            assert small.seed == seed and small.label_variant == "default"
            for tokens in spec["tokens"]:
                base = grid.runs[(KEY, method, f"tok{tokens}", "r0.3")]
                twin = grid.runs[(KEY, method, f"tok{tokens}_s{seed}", "r0.3")]
                assert (twin.seed, twin.tokens, twin.table) == (seed, tokens, "budget")
                assert twin.label_variant == f"tok{tokens}" and twin.budget_tokens == tokens
                assert twin.lr_from == base.lr_from  # the base seed's choice, not swept again
                assert twin.compressed_from == small.key
                assert twin.labels("final")["variant"] == base.labels("final")["variant"]
        lora = grid.runs[(KEY, "shortgpt_lora", f"tok131072_s{seed}", "r0.3")]
        assert lora.budget == (KEY, "flexigpt", f"tok131072_s{seed}", "r0.3")
        assert lora.match == (KEY, "flexigpt", f"default_s{seed}", "r0.3")
    seeded = {(r.method, r.variant) for r in grid.runs.values() if r.seed}
    assert not {m for m, _ in seeded} - set(spec["runs"])  # replaceme/lora keeps one seed
    assert ("replaceme", "lora_tok131072") in {(r.method, r.variant) for r in grid.runs.values()}


def test_budget_config_errors():
    config = load("config/budget.yaml")
    for over, message in (({"tokens": [32768, 100000]}, "multiples"),
                          ({"runs": ["shortgpt"]}, "not a recovered Table 1"),
                          ({"ratios": [0.4]}, "not in ratios"),
                          ({"lr": "largest"}, "budget.lr"),
                          ({"replicates": {"seeds": [1], "tokens": [32768]}}, "replicates:"),
                          ({"replicates": {"seeds": [1], "tokens": [65536]}}, "65536"),
                          ({"replicates": {"seeds": [0], "tokens": [131072]}}, "base seed 0"),
                          ({"replicates": {"seeds": [1], "tokens": [131072],
                                           "runs": ["shortgpt"]}}, "not in budget.runs"),
                          ({"until": {"shortgpt": 131072}}, "budget.until"),
                          ({"until": {"replaceme/lora": 100000}}, "budget.until")):
        bad = copy.deepcopy(config)
        bad["budget"].update(over)
        with pytest.raises(ValueError, match=message):
            RunGrid.from_config(bad)


def test_no_budget_choice_reads_the_test_split(tmp_path):
    """Every train job of the budget config reads the tuning split and never the test text,
    in its inputs (dry run) and in its parameters (the grid)."""
    grid = budget_grid(lr="sweep")
    test_text = grid.test_text
    for run in grid.runs.values():
        if run.recovery:
            params = [grid.train_params(run, t) for t in grid.trial_ids(run)] + grid.trials(run)
            assert test_text not in json.dumps(params)
    out = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile",
                          str(ROOT / "Snakefile"), "-n", "--cores", "2", "--configfile",
                          str(ROOT / "config/budget.yaml")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rule, train_inputs, evaluated = None, [], []
    for line in map(str.strip, out.stdout.splitlines()):
        if line.startswith("rule ") and line.endswith(":"):
            rule = line[5:-1]
        elif line.startswith("input:") and rule == "train":
            train_inputs.append(line)
        elif line.startswith("output:") and rule == "evaluate":
            evaluated.append(line)
    assert len(train_inputs) == sum(r.recovery for r in grid.runs.values()) == 20
    assert len(evaluated) == sum(len(r.stages()) for r in grid.runs.values()) == 25
    assert all(".tune.txt" in i and ".test.txt" not in i for i in train_inputs)
    assert any("/tok1048576/r0.3/" in line for line in evaluated)


# ---- the recovery curve: tuning-split perplexity every N tokens -------------------------------
def test_eval_every_tokens_reaches_the_trainer_config():
    grid = budget_grid()
    top = ladder(grid, "flexigpt")[1048576]
    cfg = TrainConfig(**grid.train_params(top))
    assert cfg.eval_every * cfg.global_batch * cfg.seq_len == 65536
    # default (no key): every 8 x the tokens one evaluation reads (16 windows x 256)
    default = RunGrid.from_config(load("config/config.yaml"))
    run = default.run("smollm2-135m", "flexigpt", "default", "r0.3")
    assert default.train_params(run)["eval_every"] == 8 * 16 * 256 // (8 * 256)
    assert curve_every_steps(0, step_tokens=2048, eval_tokens=4096) == 0
    assert curve_every_steps(5000, step_tokens=2048, eval_tokens=4096) == 2  # rounded
    assert curve_every_steps(10, step_tokens=2048, eval_tokens=4096) == 1
    with pytest.raises(ValueError, match="eval_every_tokens"):
        curve_every_steps(-1, step_tokens=2048, eval_tokens=4096)
    assert step_tokens({"global_batch": 8, "seq_len": 256}) == 2048


def test_train_job_logs_the_tune_curve(tiny_checkpoint, text_file, tmp_path, monkeypatch):
    """The train script with a grid trial's eval_every: tuning-split PPL at every
    eval_every-th step of the log (and at the start and end)."""
    from conftest import run_script

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = {"tokens": 6 * 4 * 32, "seq_len": 32, "micro_batch": 2, "global_batch": 4,
              "eval_windows": 2, "checkpoint_every": 0, "warmup_min_steps": 0, "bf16": "off",
              "recipe": "lora", "lora_rank": 4, "device": "cpu", "lr": 5e-3,
              "eval_every": curve_every_steps(2 * 4 * 32, step_tokens=4 * 32, eval_tokens=64)}
    out = tmp_path / "trained"
    run_script("train", tmp_path, monkeypatch,
               params={"trials": [{"config": config, "point": {"lr": 5e-3}}],
                       "meta": {"run": "test"}, "rung": 0.5, "teacher": None},
               inputs={"model": tiny_checkpoint, "text": text_file, "tune": text_file},
               outputs={"model": out})
    log = pd.read_csv(out / "train_log.csv")
    assert list(log.loc[log["ppl"].notna(), "step"]) == [0, 2, 4, 6]


def _log(ppl_at: dict[int, float], losses: list[float]) -> pd.DataFrame:
    n = len(losses)
    return pd.DataFrame({"step": range(n + 1), "tokens": [1000 * i for i in range(n + 1)],
                         "loss": [None, *losses], "lr": 1e-3,
                         "ppl": [ppl_at.get(i) for i in range(n + 1)]})


def test_curves_read_the_tune_ppl_column(tmp_path):
    """Tokens-to-reach and the recovery figure read the tune-split PPL column (training loss
    only for logs without a PPL curve), whatever the training loss says."""
    smol = "smollm2-135m"
    flat = [5.0] * 6  # a training loss that never moves: the PPL decides
    flex = _log({0: 900.0, 2: 300.0, 4: 150.0, 6: 120.0}, flat)
    base = _log({0: 800.0, 3: 200.0, 6: 160.0}, flat)
    agg = pd.DataFrame([{"model": smol, "method": m, "variant": "default", "ratio": 0.3,
                         "stage": "final", "table": "main", "trained": True, "loss": "lm"}
                        for m in ("flexigpt", "shortgpt_lora")])
    logs = {f"{smol}/flexigpt/default/r0.3/trained": flex,
            f"{smol}/shortgpt_lora/default/r0.3/trained": base}
    out = curves.add_reach(agg, logs).set_index("method")
    assert out.at["flexigpt", "tokens_to_baseline"] == "4K"  # PPL 150 <= 160 at step 4
    assert out.at["flexigpt", "tokens_to_baseline_metric"] == "ppl"
    assert list(curves.tune_curve(flex)["ppl"]) == [900.0, 300.0, 150.0, 120.0]
    # an old log (PPL at start and end only) falls back to the training loss for the pair
    logs[f"{smol}/shortgpt_lora/default/r0.3/trained"] = _log({0: 800.0, 6: 160.0}, flat)
    assert curves.add_reach(agg, logs).set_index("method").at[
        "flexigpt", "tokens_to_baseline_metric"] == "loss"
    logs[f"{smol}/shortgpt_lora/default/r0.3/trained"] = base
    figs = {}
    from flexigpt.tables import plots

    real = plots.save_figure
    plots.save_figure = lambda fig, o, stem: figs.setdefault(stem, fig) and real(fig, o, stem)
    try:
        curves.recovery_by_ratio(agg, logs, smol, tmp_path)
    finally:
        plots.save_figure = real
    ax = figs[f"fig_recovery_{smol}_r0.3"].axes[0]
    assert ax.get_ylabel() == curves.AXIS["ppl"] and ax.get_yscale() == "log"
    assert [list(line.get_ydata()) for line in ax.lines[:1]] == [[900.0, 300.0, 150.0, 120.0]]


# ---- the budget tables and figure ----------------------------------------------------------
FIXTURE = ROOT / "tests/fixtures/results/eval/smollm2-135m/shortgpt-default-r0.3-final-s0.json"
TASKS = ("arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag")
N_DOCS, N_WIN, TOK = 120, 30, 100
DIFFICULTY = 3.0 + np.random.default_rng(0).normal(0, 0.3, N_WIN)


def write_point(root: Path, method: str, tokens: int, gap: float, correct: int | None,
                table: str = "budget", seed: int = 0, base: str = "default") -> Path:
    """A result JSON with records: per-window log-PPL = shared difficulty + ``gap`` (0 for
    the baseline); the first ``correct`` documents of each task right (None: no tasks).
    ``seed`` > 0: a seed replicate (its own folder, the base point's labels); ``base``: the
    recovered variant the ladder point belongs to."""
    data = json.loads(FIXTURE.read_text())
    variant = base if table == "main" else (f"tok{tokens}" if base == "default"
                                            else f"{base}_tok{tokens}")
    folder = variant + (f"_s{seed}" if seed else "")
    data.update(method=method, recovery={"recipe": "lora", "loss": "lm", "tokens": tokens,
                                          "lr": 4e-3, "lr_source": "tuning sweep of 2 trial(s)"},
                trained_tokens=tokens)
    nll = (DIFFICULTY + gap) * TOK
    data["perplexity"].update(value=math.exp(nll.sum() / (TOK * N_WIN)), n_windows=N_WIN)
    data["tasks"] = {} if correct is None else {
        t: {**data["tasks"][t], "value": correct / N_DOCS, "n_docs": N_DOCS} for t in TASKS}
    data["labels"] = {"model": "smollm2-135m", "method": method, "variant": variant,
                      "ratio": 0.3, "stage": "final", "seed": seed, "table": table,
                      "loss": "lm", "protocol": "matched"}
    if table == "budget":
        data["labels"].update(budget_tokens=tokens, budget_variant=base)
    path = root / "smollm2-135m" / method / folder / "r0.3" / "eval_final.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    docs = [] if correct is None else [
        {"task": t, "data_sha256": data["tasks"][t].get("data_sha256"), "metric": "acc_norm",
         "doc_id": i, "acc_norm": float(i < correct), "doc_hash": f"{t}{i}"}
        for t in TASKS for i in range(N_DOCS)]
    data["records"] = write_records(path, docs, {
        "text": "t.txt", "text_sha256": "1" * 64, "seq_len": 512, "n_windows": N_WIN,
        "nll": nll.tolist(), "tokens": [TOK] * N_WIN, "total_nll": float(nll.sum()),
        "n_tokens": TOK * N_WIN})
    path.write_text(json.dumps(data))
    return path


def test_budget_table_and_figure(tmp_path):
    """A 1K (Table 1) / 4K / 16K ladder whose log-PPL gap shrinks by 0.1 nats per 4x: the
    table lists each budget's paired differences, the fit recovers the slope and crosses
    zero beyond the ladder; accuracy (at 1K and 16K only) is fitted through two points."""
    root = tmp_path / "r"
    files = [write_point(root, "shortgpt_lora", 1000, 0.0, 60, table="main"),
             write_point(root, "flexigpt", 1000, 0.3, 50, table="main")]
    for tokens, gap, correct in ((4000, 0.2, None), (16000, 0.1, 70)):
        files += [write_point(root, "shortgpt_lora", tokens, 0.0, correct and 60),
                  write_point(root, "flexigpt", tokens, gap, correct)]
    logs = []
    for method in ("flexigpt", "shortgpt_lora"):  # the top budget passed over its text twice
        trained = root / "smollm2-135m" / method / "tok16000" / "r0.3" / "trained"
        trained.mkdir(parents=True)
        (trained / "manifest.json").write_text(json.dumps(
            {"history": [{"stage": "train", "epochs": 1.0 if method == "flexigpt" else 2.0}]}))
        logs.append(trained / "train_log.csv")
    out = tmp_path / "o"
    written = build_budget(files, out, train_logs=logs, n_boot=200)
    names = {p.name for p in written}
    assert {"budget_smollm2-135m_r0.3.md", "budget_smollm2-135m_r0.3.csv",
            "fig_budget_smollm2-135m_r0.3.png"} <= names
    csv = pd.read_csv(out / "budget_smollm2-135m_r0.3.csv")
    rows = csv[csv["kind"].eq("budget")].set_index("tokens")
    assert list(rows.index) == [1000, 4000, 16000]
    assert rows["log_ppl_diff"].tolist() == pytest.approx([0.3, 0.2, 0.1], rel=1e-5)
    assert rows["avg_diff"].tolist()[0] == pytest.approx(-100 * 10 / N_DOCS, rel=1e-5)
    assert math.isnan(rows.at[4000, "avg_diff"])  # no tasks at that budget
    fit = csv[csv["kind"].eq("fit")].set_index("metric")
    assert fit.at["log_ppl", "slope"] == pytest.approx(-0.1 / math.log10(4), rel=1e-5)
    assert float(fit.at["log_ppl", "crossover"]) == pytest.approx(64000, rel=1e-5)
    assert fit.at["log_ppl", "at_tokens"] == pytest.approx(0.15 * 134515008, rel=1e-5)
    assert fit.at["avg", "slope"] == pytest.approx((100 * 20 / N_DOCS) / math.log10(16),
                                                   rel=1e-5)
    md = (out / "budget_smollm2-135m_r0.3.md").read_text()
    assert "Δ log-PPL [95% CI]" in md and "+0.300 [" in md and "fit: slope" in md
    assert "never a checkpoint of a longer run" in md
    assert rows.at[16000, "epochs"] == 2.0 and math.isnan(rows.at[4000, "epochs"])
    assert "seen more than once" in md
    # Table 1 alone (no ladder in the results): nothing is written
    assert build_budget(files[:2], tmp_path / "none") == []
    assert not (tmp_path / "none").exists()


#: methods the default config gained after the fixture was written (their runs are new; every
#: other run must be exactly as it was)
ADDED_LATER = {"replaceme", "streamline", "linearpatch"}
#: ``(method, variant)`` runs added later to methods that were there (ShortGPT + fine-tuning
#: of the last 3 blocks and the head)
ADDED_VARIANTS = {("shortgpt", "last3"), ("flexigpt", "default_next"),
                  ("shortgpt_lora", "default_next")}


def test_default_config_grid_is_unchanged():
    """The default config's runs, paths and every job parameter are what they were before
    the budget axis (tests/fixtures/default_grid.json, written from the code before it, and
    rewritten once on purpose: the bracketing search's start points and rung 1); the
    only new parameter is the trainer's ``eval_every``, which never changes a trajectory
    (flexigpt.runtime.training.runner._NOT_TRAJECTORY) and for this config evaluates only at the
    end of each 16-step run (every 16 steps)."""
    from flexigpt.runtime.training.runner import _NOT_TRAJECTORY

    golden = json.loads((ROOT / "tests/fixtures/default_grid.json").read_text())
    grid = RunGrid.from_config(load("config/config.yaml"))
    runs = {}
    for key, run in sorted(grid.runs.items()):
        if run.method in ADDED_LATER or (run.method, run.variant) in ADDED_VARIANTS:
            continue
        rec = {"prefix": run.prefix, "compressed_dir": run.compressed_dir,
               "final_dir": run.final_dir(), "stages": run.stages(),
               "compress": run.compress_params(), "trials": grid.trials(run),
               "eval": {s: grid.eval_params(run, s) for s in run.stages()},
               "refs": {w: getattr(run, w) for w in ("match", "budget", "lr_from",
                                                     "compressed_from")}}
        if run.recovery:
            rec["train"] = {t: grid.train_params(run, t) for t in grid.trial_ids(run)}
            for params in rec["train"].values():
                assert params.pop("eval_every") == 16 and "eval_every" in _NOT_TRAJECTORY
        runs["/".join(key)] = rec
    def old(paths):
        new = [f"/{m}/" for m in ADDED_LATER] + [f"/{m}/{v}/" for m, v in ADDED_VARIANTS]
        return [p for p in paths if not any(n in p for n in new)]

    now = {"runs": runs, "eval_targets": sorted(old(grid.eval_targets())),
           "figures": {k: old(v) for k, v in grid.figure_inputs().items()}, "inference": old(grid.inference_targets()),
           "rung": grid.tuning_rung}
    assert {run.method for run in grid.runs.values()} >= ADDED_LATER
    assert {(run.method, run.variant) for run in grid.runs.values()} >= ADDED_VARIANTS
    assert json.loads(json.dumps(now, sort_keys=True, default=list)) == golden


def test_tables_script_writes_the_ladder(tmp_path, monkeypatch):
    """The tables rule's script: the budget table and figure beside the other tables, listed
    in index.txt, the table in report.md too."""
    from conftest import run_script

    root = tmp_path / "results"
    evals = [write_point(root, m, tokens, gap if m == "flexigpt" else 0.0, 60, table=table)
             for tokens, gap, table in ((1000, 0.3, "main"), (8000, 0.1, "budget"))
             for m in ("flexigpt", "shortgpt_lora")]
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "tables"
    run_script("tables", tmp_path, monkeypatch,
               params={"figures": {"manifests": [], "train_logs": [], "selections": []},
                       "model_names": {}},
               inputs={"evals": evals, "inference": []}, outputs={"tables": out})
    listed = (out / "index.txt").read_text().split()
    assert "budget_smollm2-135m_r0.3.md" in listed and "fig_budget_smollm2-135m_r0.3.png" in listed
    assert "table1_smollm2-135m.md" in listed
    assert "against the recovery budget" in (out / "report.md").read_text()  # ladder in report


def test_seeds_widen_the_trend_and_one_seed_budgets_borrow_the_nearest_spread(tmp_path):
    """Three seeds at 1K (Table 1) and 4K, one at 16K: the log-PPL gap is a constant shift per
    run, so documents add no variance and every interval is the seed component alone. At
    16K (one seed per side) it is the variance measured at 4K, the nearest budget:
    var(FlexiGPT seeds) + var(ShortGPT + LoRA seeds); the slope's interval is wider than the
    documents-only one of the same estimates, and a slope whose interval holds 0 is
    reported as an undecided trend with no crossover."""
    root = tmp_path / "r"
    spread = {"flexigpt": 0.05, "shortgpt_lora": 0.02}
    files = []
    for tokens, gap, table in ((1000, 0.3, "main"), (4000, 0.2, "budget")):
        for seed, sign in ((0, 0), (1, 1), (2, -1)):
            for method, base_gap in (("flexigpt", gap), ("shortgpt_lora", 0.0)):
                files.append(write_point(root, method, tokens, base_gap + sign * spread[method],
                                         50 if method == "flexigpt" else 60, table, seed))
    files += [write_point(root, "flexigpt", 16000, 0.1, 70),
              write_point(root, "shortgpt_lora", 16000, 0.0, 60)]
    out = tmp_path / "o"
    build_budget(files, out, n_boot=2000, make_plots=False)
    csv = pd.read_csv(out / "budget_smollm2-135m_r0.3.csv")
    rows = csv[csv["kind"].eq("budget")].set_index("tokens")
    assert rows.at[1000, "log_ppl_seeds"] == "3+3 (measured)"
    assert rows.at[16000, "log_ppl_seeds"] == "1+1 (A from 4K, B from 4K)"
    borrowed = math.sqrt(0.05 ** 2 + 0.02 ** 2)  # sample variances of {g-s, g, g+s}: s^2
    half = (rows.at[16000, "log_ppl_high"] - rows.at[16000, "log_ppl_low"]) / 2
    assert half == pytest.approx(1.96 * borrowed, rel=0.15)
    seeded = csv[csv["kind"].eq("fit")].set_index("metric").loc["log_ppl"]
    assert seeded["slope"] == pytest.approx(-0.1 / math.log10(4), rel=1e-5)
    assert seeded["slope_high"] - seeded["slope_low"] > 0.05  # documents alone: ~0
    md = (out / "budget_smollm2-135m_r0.3.md").read_text()
    if seeded["slope_low"] < 0 < seeded["slope_high"]:
        assert "undecided: the slope's interval contains 0" in md and "crossover" not in md


def test_every_strategy_on_the_ladder_against_the_comparator(tmp_path):
    """ReplaceMe + LoRA* and LLM-Streamline + LoRA* on the ladder beside the pair: the
    strategies table gives each one's paired difference to ShortGPT + LoRA* per budget, its
    trend, and whether its advantage at the smallest budget persists, vanishes or reverses
    at the largest; a strategy never seeded borrows the spread pooled over the seeded ones."""
    root = tmp_path / "r"
    files = []
    for seed, sign in ((0, 0), (1, 1), (2, -1)):
        for method, gap in (("flexigpt", 0.3), ("shortgpt_lora", 0.0)):
            files.append(write_point(root, method, 1000, gap + 0.03 * sign, 55, "main", seed))
    for tokens in (4000, 16000):
        files += [write_point(root, "flexigpt", tokens, 0.2, 55 if tokens == 16000 else None),
                  write_point(root, "shortgpt_lora", tokens, 0.0,
                              55 if tokens == 16000 else None)]
    ladders = {"replaceme": (-0.5, -0.4, -0.3), "streamline": (-0.3, 0.0, 0.4)}
    for method, gaps in ladders.items():
        for tokens, gap in zip((1000, 4000, 16000), gaps, strict=True):
            files.append(write_point(root, method, tokens, gap,
                                     None if tokens == 4000 else 55,
                                     "main" if tokens == 1000 else "budget", base="lora"))
    out = tmp_path / "o"
    written = {p.name for p in build_budget(files, out, n_boot=1000)}
    assert {"budget_strategies_smollm2-135m_r0.3.md", "budget_strategies_smollm2-135m_r0.3.csv",
            "fig_budget_strategies_smollm2-135m_r0.3.png"} <= written
    csv = pd.read_csv(out / "budget_strategies_smollm2-135m_r0.3.csv")
    budget = csv[csv["kind"].eq("budget")]
    rm = budget[budget["method"].eq("replaceme")].set_index("tokens")
    assert rm["variant"].eq("lora").all()
    assert rm["log_ppl_diff"].tolist() == pytest.approx([-0.5, -0.4, -0.3], rel=1e-5)
    assert rm.at[4000, "log_ppl_seeds"] == "1+1 (A from 1K pooled, B from 1K)"
    ref = budget[budget["method"].eq("shortgpt_lora")]
    assert ref["log_ppl_diff"].isna().all() and list(ref["tokens"]) == [1000, 4000, 16000]
    trend = csv[csv["kind"].eq("trend") & csv["metric"].eq("log_ppl")].set_index("method")
    assert trend.at["replaceme", "verdict"] == "persists"
    assert trend.at["streamline", "verdict"] == "reverses"
    assert trend.at["flexigpt", "verdict"].startswith("no advantage to keep (worse")
    assert trend.at["streamline", "slope"] == pytest.approx(0.7 / math.log10(16), rel=1e-5)
    md = (out / "budget_strategies_smollm2-135m_r0.3.md").read_text()
    assert "Does the initialisation advantage survive more tokens?" in md
    assert "| LLM-Streamline + LoRA* | Δ log-PPL | +0.5813" in md  # its Δ rises: it
    assert "loses ground on ShortGPT + LoRA* with tokens" in md      # loses ground


def test_a_sitting_stops_chosen_runs_below_the_top_and_changes_nothing_else():
    """``budget.until`` (config/overlays/budget-sitting1.yaml) leaves out the chosen runs'
    larger points only: every other run of the grid, and its parameters, are those of the
    full ladder, so the next sitting resumes into the same results folder."""
    from flexigpt.cli.commands.run import merged_config

    full = budget_grid()
    sitting = RunGrid.from_config(merged_config(
        [str(ROOT / "config/budget.yaml"), str(ROOT / "config/overlays/budget-sitting1.yaml")]))
    left_out = set(full.runs) - set(sitting.runs)
    assert left_out == {(KEY, m, "lora_tok1048576", "r0.3") for m in ("replaceme", "streamline")}
    assert not set(sitting.runs) - set(full.runs)
    for key, run in sitting.runs.items():
        if run.recovery:
            assert sitting.train_params(run) == full.train_params(full.runs[key])
        for stage in run.stages():
            assert sitting.eval_params(run, stage) == full.eval_params(full.runs[key], stage)
