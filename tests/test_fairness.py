"""The fairness contract: one block-count rule, matched compression and trainable budgets,
γ's own learning rate, the KD loss, and no recovery choice that reads the test windows."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_model, make_text, manifest_for

from flexigpt.core.params import count_parameters
from flexigpt.methods.block_count import nearest_block_count, paper_block_count
from flexigpt.methods.calibration import read_documents, split_heldout
from flexigpt.methods.sharing import adapter_trainable
from flexigpt.runtime.training.config import TrainConfig, resolve_plan
from flexigpt.runtime.training.losses import kd_loss
from flexigpt.runtime.training.optim import param_groups
from flexigpt.runtime.training.recipes import BUDGET_TOLERANCE, apply_recipe
from flexigpt.runtime.training.trials import best_trial, diverged_record
from flexigpt.runtime.training.tuning import select_trial
from flexigpt.storage.registry import get_method

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("single_thread")


def _calib(n: int = 4, t: int = 24) -> torch.Tensor:
    return torch.randint(3, 300, (n, t), generator=torch.Generator().manual_seed(0))


def _compress(name: str, model, **options):
    method = get_method(name)
    with torch.no_grad():
        return method.compress(model, None, _calib(), method.make_config(**options))


# ---- one rounding rule -------------------------------------------------------------------
def test_nearest_block_count_rounds_to_nearest_ties_to_fewer():
    step = 0.026  # one SmolLM2 block ≈ 2.6 points
    assert nearest_block_count(0.30, lambda k: k * step, 30) == 12  # 0.312 vs 0.286
    assert nearest_block_count(0.013, lambda k: k * step, 30) == 1  # tie 0.0 / 0.026 → 1 (k ≥ 1)
    assert nearest_block_count(0.039, lambda k: k * step, 30) == 1  # tie 0.026 / 0.052 → fewer
    # beyond every block count: the nearest end (the reach rule of plan() judges it)
    assert nearest_block_count(0.95, lambda k: k * 0.02, 30) == 29
    assert paper_block_count(0.3, 30) == 9  # 0.3·30 = 8.999… in floats
    with pytest.raises(ValueError, match="removes int"):
        paper_block_count(0.1, 5)


def test_flexigpt_and_shortgpt_share_the_rule():
    dense = count_parameters(make_model(layers=8))
    for ratio in (0.3, 0.4):
        flexi = _compress("flexigpt", make_model(layers=8), ratio=ratio, policy="matched")
        net = flexi.info["params"]["removed_per_block"] - flexi.info["params"]["added_per_block"]
        assert flexi.info["k"] == nearest_block_count(ratio, lambda k, net=net: k * net / dense, 8)
        short = _compress("shortgpt", make_model(layers=8), ratio=ratio, policy="matched")
        block = (dense - count_parameters(make_model(layers=7))) / dense
        assert short.info["k"] == nearest_block_count(ratio, lambda k, block=block: k * block, 8)
        for name in ("flexigpt", "shortgpt"):  # paper protocol: the same int(ratio·L)
            res = _compress(name, make_model(layers=8), ratio=ratio, policy="paper")
            assert res.info["k"] == int(ratio * 8)


def test_like_for_like_baseline_matches_flexigpts_achieved_ratio():
    dense = count_parameters(make_model(layers=8))
    flexi = _compress("flexigpt", make_model(layers=8), ratio=0.3, policy="matched")
    achieved = 1 - count_parameters(flexi.model) / dense
    short = _compress("shortgpt_lora", make_model(layers=8), ratio=0.3, policy="matched",
                      match_ratio=achieved)
    step = (dense - count_parameters(make_model(layers=7))) / dense
    got = 1 - count_parameters(short.model) / dense
    assert short.info["match_ratio"] == achieved
    assert abs(got - achieved) <= step / 2 + 1e-9


# ---- equal trainable budget --------------------------------------------------------------
def _plan(recipe: str, **cfg):
    return resolve_plan(TrainConfig(recipe=recipe, **cfg), manifest_for())


def _wide():  # wide enough that one LoRA rank is a small step of the budget
    return make_model(layers=8, hidden=128, intermediate=512)


@pytest.mark.parametrize("ratio", [0.3, 0.4])
def test_shortgpt_lora_budget_within_two_percent_of_flexigpt(ratio):
    flexi = _compress("flexigpt", _wide(), ratio=ratio, policy="matched", rank=32)
    budget = flexi.info["recovery"]["trainable_params"]
    assert budget == adapter_trainable(flexi.model) > 0
    flexi_report = apply_recipe(flexi.model, _plan("flexigpt"))
    assert flexi_report.trainable_parameters == budget  # what FlexiGPT actually trains
    short = _compress("shortgpt", _wide(), ratio=ratio, policy="matched")
    report = apply_recipe(short.model, _plan("lora", lora_budget=budget, lora_alpha=16.0,
                                             lora_rank=8))
    trainable = count_parameters(short.model, trainable_only=True)
    assert report.budget["achieved"] == trainable == report.trainable_parameters
    assert abs(trainable - budget) / budget <= BUDGET_TOLERANCE
    assert report.lora_alpha / report.lora_rank == 16.0 / 8  # LoRA scaling kept


def test_flexigpt_lora_all_spends_the_same_total_budget():
    full = _compress("flexigpt", _wide(), ratio=0.3, policy="matched", rank=32)
    budget = full.info["recovery"]["trainable_params"]
    half = _compress("flexigpt", _wide(), ratio=0.3, policy="matched", rank=16)
    report = apply_recipe(half.model, _plan("flexigpt", lora_other_blocks=True,
                                            lora_budget=budget))
    assert report.lora_injected and abs(report.trainable_parameters - budget) / budget <= 0.02
    with pytest.raises(ValueError, match="lora_other_blocks"):
        _plan("flexigpt", lora_budget=budget)


# ---- γ's own learning rate, KD ---------------------------------------------------------
def test_gamma_has_its_own_parameter_group_and_moves_at_its_lr():
    res = _compress("flexigpt", make_model(layers=8), ratio=0.3, policy="matched")
    model = res.model
    plan = _plan("flexigpt", lr=1e-4, gamma_lr=5e-2)
    apply_recipe(model, plan)
    groups = {g["name"]: g for g in param_groups(model, TrainConfig(), plan)}
    assert groups["gamma"].get("lr") == 5e-2 and groups["gamma"]["weight_decay"] == 0.0
    gammas = [p for n, p in model.named_parameters() if n.endswith("gamma")]
    assert sum(p.numel() for p in groups["gamma"]["params"]) == sum(p.numel() for p in gammas)
    before = [p.detach().clone() for p in gammas]
    opt = torch.optim.AdamW(param_groups(model, TrainConfig(), plan), lr=plan.lr)
    ids = _calib(2, 16)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    moved = max(float((p.detach() - b).abs().max()) for p, b in zip(gammas, before))
    assert 0.02 < moved <= 5e-2 * 1.01  # Adam's first step ≈ the LR per entry


def test_kd_loss_is_zero_for_a_student_equal_to_its_teacher():
    logits = torch.randn(2, 7, 11)
    assert float(kd_loss(logits, logits.clone(), 2.0)) == pytest.approx(0.0, abs=1e-6)
    other = logits + torch.randn_like(logits)
    assert float(kd_loss(other, logits, 2.0)) > 0
    model = make_model(layers=2)
    ids = _calib(2, 16)
    with torch.no_grad():
        out = model(input_ids=ids).logits
    assert float(kd_loss(out, model(input_ids=ids).logits.detach(), 1.0)) < 1e-6


# ---- the test windows are never read by a choice ------------------------------------------
def test_heldout_split_is_by_document_disjoint_and_deterministic(tmp_path):
    src = tmp_path / "validation.txt"
    src.write_text(make_text(n_docs=40))
    counts = split_heldout(src, tmp_path / "a.tune.txt", tmp_path / "a.test.txt")
    tune = read_documents(tmp_path / "a.tune.txt")
    test = read_documents(tmp_path / "a.test.txt")
    assert not set(tune) & set(test) and sorted(tune + test) == sorted(read_documents(src))
    assert counts == {"tune_documents": len(tune), "test_documents": len(test)}
    docs = read_documents(src)  # another order, same split
    (tmp_path / "rev.txt").write_text("\n\n".join(reversed(docs)) + "\n")
    split_heldout(tmp_path / "rev.txt", tmp_path / "b.tune.txt", tmp_path / "b.test.txt")
    assert set(read_documents(tmp_path / "b.tune.txt")) == set(tune)


def _dry_run_jobs(config: str, tmp_path: Path) -> list[tuple[str, str]]:
    out = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile",
                          str(ROOT / "Snakefile"), "-n", "--cores", "2", "--configfile",
                          str(ROOT / config)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    jobs, rule = [], None
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("rule ") and line.endswith(":"):
            rule = line[5:-1]
        elif line.startswith("input:") and rule:
            jobs.append((rule, line))
    return jobs


@pytest.mark.parametrize("config", ["config/config.yaml", "config/smoke.yaml"])
def test_no_recovery_choice_reads_the_test_text(config, tmp_path):
    jobs = _dry_run_jobs(config, tmp_path)
    trials = [inputs for rule, inputs in jobs if rule == "train"]
    evals = [inputs for rule, inputs in jobs if rule == "evaluate"]
    assert trials and evals
    assert all(".tune.txt" in i and ".test.txt" not in i for i in trials)
    assert all(".test.txt" in i and ".tune.txt" not in i for i in evals)


def test_trial_selection_takes_the_lowest_tuning_ppl(tmp_path):
    records = [{"diverged": False, "tune_ppl": 9.0}, diverged_record({}, 1.0, None, "nan"),
               {"diverged": False, "tune_ppl": 7.5}, {"diverged": False, "tune_ppl": 7.5}]
    assert best_trial(records) == 2
    with pytest.raises(ValueError, match="no trial"):
        best_trial([records[1]])
    dirs = []
    for i, ppl in enumerate((5.0, 4.0, math.nan)):
        d = tmp_path / f"t{i}"
        d.mkdir()
        (d / "weights.bin").write_text(str(i))
        (d / "trial.json").write_text(json.dumps(
            {"schema": 1, "diverged": False, "lr": 10.0**-i, "gamma_lr": None,
             "tune_ppl": ppl, "tune_ppl_before": 9.0}))
        dirs.append(d)
    selection = select_trial(dirs, tmp_path / "trained", {"run": "x"})
    assert selection["chosen_trial"] == 1 and selection["chosen"]["lr"] == 0.1
    assert (tmp_path / "trained" / "weights.bin").read_text() == "1"
    assert not (tmp_path / "trained" / "trial.json").exists()
    saved = json.loads((tmp_path / "trained" / "selection.json").read_text())
    assert [t["tune_ppl"] for t in saved["trials"]][:2] == [5.0, 4.0]
