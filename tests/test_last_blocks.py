"""Recipe ``last_blocks`` (ShortGPT + fine-tuning of the last k blocks, the final norm and the
LM head; Reassessing Layer Pruning in LLMs): its trainable set, its errors, its place in the
DAG (the ``shortgpt/last3`` variant of the default config) and one real training run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_model, manifest_for

from flexigpt.core.params import count_parameters
from flexigpt.runtime.training.config import TrainConfig, resolve_plan
from flexigpt.runtime.training.recipes import apply_recipe
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.workflow.dag import RunGrid

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("single_thread")


def _plan(**cfg):
    return resolve_plan(TrainConfig(recipe="last_blocks", **cfg), manifest_for())


def _expected(model, k: int, *, tied: bool) -> int:
    """Parameters of the last k blocks, the final norm and the head (+ nothing for a tied
    embedding: it is the head's own storage), counted independently of the recipe."""
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    modules = [*blocks[len(blocks) - k:], adapter.final_norm(model), adapter.lm_head(model)]
    seen, total = set(), 0
    for module in modules:
        for p in module.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel()
    if not tied:
        assert adapter.embed(model).weight.data_ptr() not in seen
    return total


@pytest.mark.parametrize("family", ["llama", "qwen2", "opt"])
@pytest.mark.parametrize("tied", [True, False])
def test_trainable_set_is_last_blocks_norm_and_head(family, tied):
    model = make_model(family, layers=5, tied=tied)
    report = apply_recipe(model, _plan(last_blocks=2))
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    assert report.trainable_parameters == _expected(model, 2, tied=tied)
    assert report.trainable_parameters == count_parameters(model, trainable_only=True)
    assert report.last_blocks == 2 and report.tied_embedding is tied
    for i, block in enumerate(blocks):
        assert all(p.requires_grad is (i >= 3) for p in block.parameters()), i
    assert adapter.embed(model).weight.requires_grad is tied
    assert not report.lora_injected


def test_bad_k_is_named():
    with pytest.raises(ValueError, match="needs last_blocks"):
        TrainConfig(recipe="last_blocks")
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="last_blocks must be an integer"):
            TrainConfig(recipe="last_blocks", last_blocks=bad)
    with pytest.raises(ValueError, match="applies to recipe 'last_blocks' only"):
        TrainConfig(recipe="lora", last_blocks=3)
    # recipe left open (the method's own, resolved from the manifest): checked there
    with pytest.raises(ValueError, match="applies to recipe 'last_blocks' only"):
        resolve_plan(TrainConfig(last_blocks=3), manifest_for())
    with pytest.raises(ValueError, match="below the model's block count"):
        apply_recipe(make_model(layers=3), _plan(last_blocks=3))


def test_default_config_runs_shortgpt_last3_with_its_own_sweep():
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    grid = RunGrid.from_config(config)
    runs = {r.setting: r for r in grid.runs.values()
            if (r.method, r.variant) == ("shortgpt", "last3")}
    assert set(runs) == {f"r{x:g}" for x in config["ratios"]}
    for setting, run in runs.items():
        assert run.recovery and run.recovery_recipe() == "last_blocks"
        # trains ShortGPT's own compressed model (no second compression)
        assert run.compressed_from == (run.model, "shortgpt", "default", setting)
        lrs = config["tuning"]["grid"]["last_blocks"]["lr"]
        assert [t["lr"] for t in grid.trials(run)] == lrs
        for trial in grid.trial_ids(run):
            params = grid.train_params(run, trial)
            assert params["recipe"] == "last_blocks" and params["last_blocks"] == 3
            assert params["tokens"] == config["training"]["tokens"]  # same tokens as Table 1
            TrainConfig(**params)  # valid as given


def test_training_moves_only_the_trainable_set(tiny_checkpoint, text_file, tmp_path):
    from flexigpt.runtime.training.runner import train_model
    from flexigpt.storage.artifacts import load_compressed

    cfg = TrainConfig(recipe="last_blocks", last_blocks=2, lr=1e-3, tokens=32 * 4 * 4,
                      seq_len=32, micro_batch=2, global_batch=4, eval_windows=2,
                      checkpoint_every=0, bf16="off", warmup=1)
    train_model(tiny_checkpoint, tmp_path / "out", cfg, text_file, text_file)
    before = load_compressed(tiny_checkpoint).model.state_dict()
    after = load_compressed(tmp_path / "out").model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "nothing trained"
    # 4-block tiny Llama: blocks 2 and 3, the final norm and the (tied) head/embedding
    allowed = ("model.layers.2.", "model.layers.3.", "model.norm.", "lm_head.",
               "model.embed_tokens.")
    assert all(k.startswith(allowed) for k in changed), sorted(changed)
    assert any(k.startswith("model.layers.3.") for k in changed)


def test_schema_lists_every_recipe_and_grid_key():
    """The config schema's recipe enum and tuning-grid keys are the trainer's and the DAG's
    (they are written out in YAML, so a test keeps them from drifting)."""
    from flexigpt.runtime.training.recipe_table import RECIPES
    from flexigpt.workflow.dag import GRID_KEYS

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    recipe = schema["$defs"]["train_overrides"]["properties"]["recipe"]
    assert recipe["enum"] == list(RECIPES)
    grid = schema["properties"]["tuning"]["properties"]["grid"]["properties"]
    assert set(grid) == set(GRID_KEYS)
