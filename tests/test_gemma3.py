"""Gemma 3 (``gemma3_text``) through every method, on a tiny random model: what each method
means on sandwich norms and interleaved sliding-window / global layers (docs/families.md),
and the checkpoint contract — a saved model reloads to identical logits and loads in plain
transformers exactly (stock checkpoints) or not at all."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_model, manifest_for, perturb_norms

from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.methods.sharing import OutputNorm, SharedLoRALinear
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.models import UnsupportedArchitectureError, get_adapter
from flexigpt.storage.registry import get_method

pytestmark = pytest.mark.usefixtures("single_thread")

CALIB = torch.randint(3, 300, (4, 24), generator=torch.Generator().manual_seed(0))
CALIB[:, 0] = 0
IDS = torch.randint(3, 300, (2, 20), generator=torch.Generator().manual_seed(1))
#: name → (method, options); every method registered for the ``gemma3`` family
CASES = {
    "dense": ("dense", {}),
    "flexigpt": ("flexigpt", {"ratio": 0.3, "gamma_init": 0.1}),
    "flexigpt_shared_norms": ("flexigpt", {"ratio": 0.3, "prenorm": "share",
                                           "gamma_init": 0.1}),
    "flexigpt_extend": ("flexigpt_extend", {"layers": 9, "gamma_init": 0.1}),
    "shortgpt": ("shortgpt", {"ratio": 0.3}),
    "streamline": ("streamline", {"ratio": 0.3, "epochs": 1}),
    "streamline_ffn": ("streamline", {"ratio": 0.3, "epochs": 1, "module": "ffn"}),
    "llm_pruner": ("llm_pruner", {"ratio": 0.3}),
}
PLAIN = ("dense", "shortgpt", "streamline")


def gemma(layers: int = 6) -> torch.nn.Module:
    """A tiny Gemma 3 with non-trivial norms (five sliding layers to one global)."""
    model = make_model("gemma3_text", layers=layers)
    perturb_norms(model)
    return model


def compress(name: str, model: torch.nn.Module | None = None):
    method, options = CASES[name]
    spec = get_method(method)
    with torch.no_grad():
        return spec.compress(model if model is not None else gemma(), None, CALIB,
                             spec.make_config(**options))


def logits(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_adapter_roles():
    model = gemma()
    adapter = get_adapter(model)
    block = adapter.layers(model)[0]
    assert adapter.family == "gemma3"
    assert adapter.writers() == ("post_attention_layernorm", "post_feedforward_layernorm")
    assert adapter.post_attn_norm(block) is block.pre_feedforward_layernorm
    assert set(adapter.block_norms(block)) == {
        "input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm",
        "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"}
    assert adapter.residual_stream_problems(model.config)  # the sandwich norms are named


def test_block_removal_keeps_each_blocks_attention_type():
    """ShortGPT drops blocks: ``layer_types`` follow the kept blocks, so a global block stays
    global wherever it lands (HF reads the mask and rotary base by position)."""
    model = gemma()
    types = list(model.config.layer_types)
    res = compress("shortgpt", model)
    removed = res.structure["removed_blocks"]
    kept = [t for i, t in enumerate(types) if i not in removed]
    assert res.model.config.layer_types == kept
    for i, block in enumerate(get_adapter(res.model).layers(res.model)):
        assert block.self_attn.layer_idx == i and block.self_attn.layer_type == kept[i]


def test_flexigpt_replacement_keeps_its_positions_attention_type():
    """A weight-shared replacement shares its base's linears, not its attention pattern: at a
    sliding position it attends through the window even when its base is global; the output
    normalisation wraps the post-norms (what the block adds to the residual stream), the
    block's own norms stay its own unless ``prenorm="share"``."""
    dense = gemma()
    types = list(dense.config.layer_types)
    res = compress("flexigpt")
    model = res.model
    assert model.config.layer_types == types
    blocks = get_adapter(model).layers(model)
    base_map = {int(k): v for k, v in res.structure["base_map"].items()}
    assert base_map
    for i, j in base_map.items():
        block, base = blocks[i], blocks[j]
        assert block.self_attn.layer_type == types[i]
        assert isinstance(block.self_attn.q_proj, SharedLoRALinear)
        assert block.self_attn.q_proj.base_layer is base.self_attn.q_proj
        assert isinstance(block.post_attention_layernorm, OutputNorm)
        assert isinstance(block.post_feedforward_layernorm, OutputNorm)
        assert block.input_layernorm is not base.input_layernorm
        assert block.self_attn.q_norm is not base.self_attn.q_norm
    shared = compress("flexigpt_shared_norms").model
    sblocks = get_adapter(shared).layers(shared)
    for i, j in compress("flexigpt_shared_norms").structure["base_map"].items():
        block, base = sblocks[int(i)], sblocks[j]
        assert block.self_attn.q_norm is base.self_attn.q_norm
        assert block.post_attention_layernorm.inner is base.post_attention_layernorm


def test_extension_repeats_keep_their_sources_attention_type():
    res = compress("flexigpt_extend")
    layout, types = res.structure["layout"], res.model.config.layer_types
    dense_types = gemma().config.layer_types
    assert len(types) == len(layout) == 9
    assert types == [dense_types[src] for src in layout]


def test_llm_pruner_keeps_the_single_kv_group_shapes_consistent():
    """Gemma 3 270M has one KV head: the harness's GQA unit (a KV head with its query heads)
    leaves nothing to prune in attention there; the MLP channels carry the ratio."""
    model = make_model("gemma3_text", layers=6, heads=4, kv_heads=1)
    perturb_norms(model)
    res = compress("llm_pruner", model)
    for block in get_adapter(res.model).layers(res.model):
        assert block.self_attn.k_proj.out_features == 16  # the one KV head kept
    assert torch.isfinite(logits(res.model)).all()


@pytest.mark.parametrize("method", ["slicegpt", "replaceme"])
def test_refused_before_any_work_in_one_line(method):
    spec = get_method(method)
    cfg = spec.make_config(ratio=0.3)
    with pytest.raises(UnsupportedArchitectureError) as err:
        spec.check_family(gemma())
    message = str(err.value)
    assert "'gemma3' family" in message and "\n" not in message and "post-norm" in message
    with pytest.raises(UnsupportedArchitectureError):
        spec.compress(gemma(), None, CALIB, cfg)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("gemma3")
    out = {}
    for name, (method, options) in CASES.items():
        res = compress(name)
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for m in res.model.modules():
                if isinstance(m, SharedLoRALinear):
                    m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * 0.05)
        manifest = manifest_for(method, res.structure, res.info, res.model, config=options)
        save_compressed(res.model, tiny_tokenizer, manifest, root / name)
        out[name] = (root / name, logits(res.model))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_saved_model_reloads_to_identical_logits(saved, name):
    path, expected = saved[name]
    loaded = load_compressed(path).model
    assert torch.equal(logits(loaded), expected)


@pytest.mark.parametrize("name", list(CASES))
def test_plain_transformers_loads_exactly_or_not_at_all(saved, name):
    from transformers import AutoModelForCausalLM

    path, expected = saved[name]
    cfg = json.loads((path / "config.json").read_text())
    if name in PLAIN:
        assert cfg["model_type"] == "gemma3_text"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        assert type(model).__module__.startswith("transformers.models.gemma3")
        assert torch.equal(logits(model), expected)
        return
    assert cfg["model_type"] == "flexigpt_compressed" and "auto_map" not in cfg
    with pytest.raises((ValueError, KeyError)):
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_gemma_config_scores_tasks_with_bos_and_smollm2_params_stay(monkeypatch):
    """Gemma expects BOS first: its config scores task requests with one; a config that
    never sets ``evaluation.add_bos_token`` keeps the evaluate params it had (no new key, so
    finished runs are not rerun)."""
    from pathlib import Path

    import yaml

    from flexigpt.workflow.dag import RunGrid

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    gemma = RunGrid.from_config(yaml.safe_load((root / "config/gemma3-270m.yaml").read_text()))
    default = RunGrid.from_config(yaml.safe_load((root / "config/config.yaml").read_text()))
    for grid, bos in ((gemma, True), (default, None)):
        run = next(r for r in grid.runs.values() if r.method == "dense")
        assert grid.eval_params(run, "final").get("add_bos_token") is bos
