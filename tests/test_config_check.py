"""Configs are validated as written and up front: at DAG build, naming run, key path, problem."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flexigpt.workflow.config_check import ConfigError
from flexigpt.workflow.dag import RunGrid

ROOT = Path(__file__).resolve().parent.parent
SMOKE = yaml.safe_load((ROOT / "config/smoke.yaml").read_text())


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # config paths are relative to the workflow root


def grid_error(mutate) -> str:
    cfg = copy.deepcopy(SMOKE)
    mutate(cfg)
    with pytest.raises(ConfigError) as err:
        RunGrid.from_config(cfg)
    return str(err.value)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT))
                                        for p in (ROOT / "config").glob("*.yaml")))
def test_shipped_configs_pass(path):
    RunGrid.from_config(yaml.safe_load((ROOT / path).read_text()))


#: overlays (config/overlays/): laid over the config they name, as `flexigpt run` does
OVERLAYS = {"config/overlays/budget-sitting1.yaml": "config/budget.yaml"}


def test_every_overlay_is_listed():
    assert {str(p.relative_to(ROOT)) for p in (ROOT / "config/overlays").glob("*.yaml")} \
        == set(OVERLAYS)


@pytest.mark.parametrize("overlay,base", sorted(OVERLAYS.items()))
def test_shipped_overlays_pass_over_their_config(overlay, base):
    from flexigpt.cli.commands.run import merged_config

    RunGrid.from_config(merged_config([str(ROOT / base), str(ROOT / overlay)]))


@pytest.mark.parametrize("mutate,run,where,problem", [
    (lambda c: c["ablations"]["variants"].update(no_lowrank={"distanse": "full"}),
     "tiny-llama/flexigpt/no_lowrank/r0.3", "ablations.variants.no_lowrank",
     "unknown flexigpt option 'distanse'; did you mean 'distance'?"),
    (lambda c: c["methods"]["flexigpt"]["variants"]["lora_all"]["options"].update(polcy="paper"),
     "tiny-llama/flexigpt/lora_all/r0.3", "methods.flexigpt.variants.lora_all.options",
     "unknown flexigpt option 'polcy'; did you mean 'policy'?"),
    (lambda c: c["methods"]["flexigpt"]["options"].update(policy="papr"),
     "tiny-llama/flexigpt/default/r0.3", "methods.flexigpt.options", "policy must be one of"),
    (lambda c: c["methods"]["flexigpt"]["variants"]["lora_all"]["training"].update(
        lora_other_block=True), "tiny-llama/flexigpt/lora_all/r0.3",
     "methods.flexigpt.variants.lora_all.training",
     "unknown training option 'lora_other_block'; did you mean 'lora_other_blocks'?"),
    (lambda c: c["training"].update(micro_batch=3), "/", "training",
     "global_batch (8) must be a multiple of micro_batch (3)"),
    (lambda c: c["tuning"]["grid"]["flexigpt"].update(lr=[-1.0]), "/flexigpt/",
     "tuning.grid.flexigpt", "lr must be a positive number"),
    (lambda c: c["methods"]["shortgpt"]["variants"]["last3"]["training"].pop("last_blocks"),
     "tiny-llama/shortgpt/last3/r0.3", "methods.shortgpt.variants.last3.training",
     "recipe 'last_blocks' needs last_blocks"),
    (lambda c: c["methods"]["shortgpt_lora"].update(training={"last_blocks": 2}),
     "tiny-llama/shortgpt_lora/default/r0.3", "methods.shortgpt_lora.training",
     "applies to recipe 'last_blocks' only"),
])
def test_bad_option_names_run_key_and_problem(mutate, run, where, problem):
    message = grid_error(mutate)
    line = next(ln for ln in message.splitlines() if problem in ln)
    assert run in line and f": {where}: " in line, message


def test_rank_that_cannot_compress_uses_the_compress_bound(resources_workdir):
    from flexigpt.methods.flexigpt.prune import FlexiGPTConfig
    from flexigpt.methods.surgery import check_flexigpt_rank
    from flexigpt.storage.models.loading import load_model

    message = grid_error(lambda c: c["methods"]["flexigpt"]["variants"]["lora_all"]["options"]
                         .update(rank=5000))
    assert "run tiny-llama/flexigpt/lora_all/r0.3: methods.flexigpt.variants.lora_all" \
           ".options: rank 5000 is too large to compress" in message
    best = int(re.search(r"largest useful rank for this model is (\d+)", message).group(1))
    tiny = resources_workdir / "resources/models/tiny-llama"  # the smoke config's model
    model, _ = load_model(str(tiny))  # what `flexigpt compress` checks on the real weights
    check_flexigpt_rank(model, FlexiGPTConfig(rank=best))
    with pytest.raises(ValueError, match=f"largest useful rank for this model is {best}"):
        check_flexigpt_rank(model, FlexiGPTConfig(rank=best + 1))
    assert best < model.config.hidden_size


def test_lora_rank_at_hidden_size_rejected(resources_workdir):
    message = grid_error(lambda c: c["methods"]["slicegpt"]["options"].update(lora_rank=128))
    assert ("run tiny-llama/slicegpt/default/r0.3: methods.slicegpt.options: lora_rank 128 is "
            "not below the model's hidden size 128") in message
    assert "largest useful lora_rank is 127" in message


def test_missing_local_model_path_rejected():
    def mutate(cfg):
        cfg["model"]["path"] = "resources/models/nope"
        cfg["model"].pop("resource")

    message = grid_error(mutate)
    assert "model.path: model 'tiny-llama': 'resources/models/nope' looks like a local path " \
           "but does not exist" in message
    assert "model.resource" in message and "flexigpt fetch" in message


def test_hub_id_and_resource_model_paths_pass(tmp_path, monkeypatch):
    cfg = copy.deepcopy(SMOKE)
    monkeypatch.chdir(tmp_path)  # a resource model need not exist yet: its rule builds it
    RunGrid.from_config(cfg)
    cfg["model"]["path"] = "HuggingFaceTB/SmolLM2-135M"  # a hub id is fetched by its job
    cfg["model"].pop("resource")
    RunGrid.from_config(cfg)


def test_dry_run_reports_typo_before_any_job(tmp_path):
    cfg = copy.deepcopy(SMOKE)
    cfg["ablations"]["variants"]["no_lowrank"] = {"distanse": "full"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile",
                          str(ROOT / "Snakefile"), "-n", "--cores", "1", "--configfile",
                          str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert ("run tiny-llama/flexigpt/no_lowrank/r0.3: ablations.variants.no_lowrank: unknown "
            "flexigpt option 'distanse'; did you mean 'distance'?") in text
    assert "rule compress" not in text


def test_tables_rule_needs_the_directories_its_figures_read(tmp_path):
    """Training logs / manifests are files inside directory outputs (params): the directories
    themselves are inputs, so a deleted ``trained/`` is rebuilt rather than missed."""
    out = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile",
                          str(ROOT / "Snakefile"), "-n", "--cores", "1", "--configfile",
                          str(ROOT / "config/smoke.yaml")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    block = out.stdout.split("rule tables:", 1)[1]
    inputs = set(block.split("input:", 1)[1].split("\n", 1)[0].replace(" ", "").split(","))
    grid = RunGrid.from_config(copy.deepcopy(SMOKE))
    figures = grid.figure_inputs()
    for path in figures["train_logs"] + figures["manifests"]:
        assert str(Path(path).parent) in inputs


@pytest.mark.parametrize("mutate,where", [
    (lambda c: c["kd"].update(ratios=[0.5]), "kd.ratios: [0.5] not in ratios [0.3]"),
    (lambda c: c["paper_protocol"].update(ratios=[0.45]),
     "paper_protocol.ratios: [0.45] not in ratios [0.3]"),
    (lambda c: c["ablations"].update(ratio=0.4), "ablations.ratio: [0.4] not in ratios [0.3]"),
])
def test_sections_reusing_table1_runs_need_its_ratios(mutate, where):
    cfg = copy.deepcopy(SMOKE)
    mutate(cfg)
    with pytest.raises(ValueError, match=re.escape(where)):
        RunGrid.from_config(cfg)


def test_distance_rank_beyond_every_matrix_rank_rejected(resources_workdir):
    message = grid_error(lambda c: c["ablations"]["variants"]["no_lowrank"].update(
        distance_rank=4096))
    line = next(ln for ln in message.splitlines() if "distance_rank 4096" in ln)
    assert "tiny-llama/flexigpt/no_lowrank/r0.3" in line and "largest useful" in line


def test_method_that_cannot_handle_the_family_is_refused_at_dag_build(tmp_path, monkeypatch):
    """An OPT model in a config whose SliceGPT is registered for Llama only: refused before
    any job, naming the method, the family and the key path; the methods that handle OPT
    (all, as registered) pass."""
    import dataclasses

    from transformers import OPTConfig, OPTForCausalLM

    from flexigpt.storage.registry import METHODS

    path = tmp_path / "tiny-opt"
    OPTForCausalLM(OPTConfig(vocab_size=300, hidden_size=64, num_hidden_layers=4, ffn_dim=128,
                             num_attention_heads=4, word_embed_proj_dim=64)).save_pretrained(path)

    def mutate(cfg):
        cfg["model"]["path"] = str(path)
        cfg["model"].pop("resource")

    grid = copy.deepcopy(SMOKE)
    mutate(grid)
    try:
        RunGrid.from_config(grid)
    except ConfigError as err:  # other checks may fire on this model, never the family one
        assert "family" not in str(err), str(err)
    monkeypatch.setitem(METHODS, "slicegpt",
                        dataclasses.replace(METHODS["slicegpt"], families=("llama",)))
    message = grid_error(mutate)
    assert "methods.slicegpt" in message and "does not support the 'opt' family" in message
    assert "methods.llm_pruner" not in message
    assert "methods.flexigpt:" not in message and "methods.shortgpt:" not in message


def test_a_hub_text_file_is_built_only_from_its_own_split():
    """``resources/text/<name>/<split>.txt`` is the entry's split: asking for another split's
    file of the same entry is refused, naming the file the entry does build (before: the
    entry's text was written under any split's name)."""
    cfg = copy.deepcopy(SMOKE)
    cfg["data"]["hub_text"] = {"minipile": {"dataset": "JeanKaddour/minipile",
                                            "split": "validation"}}
    grid = RunGrid.from_config(cfg)
    assert grid.hub_text_source("minipile", "validation")["dataset"] == "JeanKaddour/minipile"
    with pytest.raises(ValueError, match=r"resources/text/minipile/train\.txt: .*'validation'.*"
                                         r"resources/text/minipile/validation\.txt"):
        grid.hub_text_source("minipile", "train")
    with pytest.raises(ValueError, match="no data.hub_text entry 'wiki'"):
        grid.hub_text_source("wiki", "train")
