"""OPT (paper Table 3) through the role-based adapter: FlexiGPT pruning and extension,
ShortGPT ± LoRA, SliceGPT (LayerNorm-with-bias fusion, learned positions rotated) and
LLM-Pruner (MHA heads, fc1/fc2 channels), save/reload, decoding."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_model, manifest_for, perturb_adapters, perturb_norms
from torch import nn

from flexigpt.core.params import compression_ratio, count_parameters
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.methods.flexigpt.extend import ExtendConfig
from flexigpt.methods.flexigpt.extend import compress as extend_compress
from flexigpt.methods.flexigpt.prune import FlexiGPTConfig
from flexigpt.methods.flexigpt.prune import compress as prune_compress
from flexigpt.methods.sharing import OutputNorm, SharedLoRALinear
from flexigpt.runtime.generation import Generator
from flexigpt.storage.artifacts import LoadedModel, load_compressed
from flexigpt.storage.models import UnsupportedArchitectureError, get_adapter
from flexigpt.storage.registry import get_method

pytestmark = pytest.mark.usefixtures("single_thread")

CALIB = torch.randint(3, 300, (4, 32), generator=torch.Generator().manual_seed(0))


def make_opt(layers: int = 6, seed: int = 0):
    """A tiny random pre-LN OPT (biases, learned positions, tied head), fp32, eval mode."""
    return make_model("opt", layers=layers, heads=4, intermediate=128, seed=seed)


def _perturb(model, scale: float = 0.05) -> None:
    perturb_adapters(model, scale, seed=1)


def test_adapter_roles():
    model = make_opt()
    ad = get_adapter(model)
    assert ad.family == "opt" and len(ad.layers(model)) == 6
    block = ad.layers(model)[0]
    assert list(ad.block_linears(block)) == ["self_attn.q_proj", "self_attn.k_proj",
                                             "self_attn.v_proj", "self_attn.out_proj",
                                             "fc1", "fc2"]
    assert ad.input_norm(block) is block.self_attn_layer_norm
    assert ad.post_attn_norm(block) is block.final_layer_norm
    assert ad.embed(model) is model.model.decoder.embed_tokens
    assert ad.final_norm(model) is model.model.decoder.final_layer_norm
    with pytest.raises(UnsupportedArchitectureError, match="no MLP module"):
        ad.mlp(block)
    assert ad.linear(block, "o") is block.self_attn.out_proj
    assert ad.linear(block, "up") is block.fc1 and ad.linear(block, "down") is block.fc2
    with pytest.raises(UnsupportedArchitectureError, match="no 'gate' linear"):
        ad.linear(block, "gate")
    llama = make_model()
    lblock = get_adapter(llama).layers(llama)[0]
    assert get_adapter(llama).linear(lblock, "gate") is lblock.mlp.gate_proj
    assert get_adapter(llama).writers() == ("self_attn", "mlp") and ad.writers() == (
        "self_attn", "fc2")


def test_flexigpt_prune_shares_weights_and_reloads(tmp_path, tiny_tokenizer):
    model = make_opt()
    dense_params = count_parameters(model)
    with torch.no_grad():
        result = prune_compress(model, None, CALIB, FlexiGPTConfig(ratio=0.3, rank=8))
    ad = get_adapter(model)
    base_map = {int(k): v for k, v in result.structure["base_map"].items()}
    assert base_map and count_parameters(model) < dense_params
    for i, j in base_map.items():
        block, base = ad.layers(model)[i], ad.layers(model)[j]
        assert isinstance(block.self_attn, OutputNorm) and isinstance(block.fc2, OutputNorm)
        for name, lin in ad.block_linears(block).items():
            assert isinstance(lin, SharedLoRALinear), name
            assert lin.base_layer is ad.block_linears(base)[name]  # same module, same storage
            assert lin.bias is ad.block_linears(base)[name].bias is not None  # OPT biases
    _perturb(model)
    with torch.no_grad():
        out = model(CALIB).logits
    assert torch.isfinite(out).all()
    save_compressed(model, tiny_tokenizer, manifest_for("flexigpt", result.structure, result.info),
                    tmp_path / "c")
    loaded = load_compressed(tmp_path / "c")
    assert type(loaded.model).__name__ == "OPTForCausalLM"
    with torch.no_grad():
        assert torch.equal(loaded.model(CALIB).logits, out)
    # γ → 0 closes the replacement blocks: the model is the dense one without them
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("gamma"):
                p.zero_()
        skipped = make_opt()
        keep = [b for i, b in enumerate(get_adapter(skipped).layers(skipped)) if i not in base_map]
        get_adapter(skipped).set_layers(skipped, keep)
        assert torch.allclose(model(CALIB).logits, skipped(CALIB).logits, atol=1e-5)


def test_flexigpt_self_speculative_identical(tiny_tokenizer):
    model = make_opt(layers=6)
    with torch.no_grad():
        result = prune_compress(model, None, CALIB, FlexiGPTConfig(ratio=0.3, rank=8))
    _perturb(model)
    gen = Generator(LoadedModel(model, tiny_tokenizer, manifest_for("flexigpt", result.structure)))
    prompts = ["the city of the river was", "music and film"]
    plain = gen.generate(prompts, max_new_tokens=10, ignore_eos=True)
    spec = gen.generate(prompts, max_new_tokens=10, ignore_eos=True, speculative=True,
                        draft_length=2)
    assert spec.token_ids == plain.token_ids and spec.stats["draft"]["extra_bytes"] == 0


@pytest.mark.parametrize("pattern", ["block", "sequential"])
def test_extension_starts_as_the_base_and_reloads(tmp_path, tiny_tokenizer, pattern):
    base = make_opt(layers=4)
    model = make_opt(layers=4)
    with torch.no_grad():
        result = extend_compress(model, None, None, ExtendConfig(layers=6, pattern=pattern,
                                                                 rank=4, gamma_init=0.0))
        assert model.config.num_hidden_layers == 6
        assert torch.allclose(model(CALIB).logits, base(CALIB).logits, atol=1e-5)
    _perturb(model)
    save_compressed(model, tiny_tokenizer, manifest_for("flexigpt_extend", result.structure),
                    tmp_path / "e")
    with torch.no_grad():
        assert torch.equal(load_compressed(tmp_path / "e").model(CALIB).logits,
                           model(CALIB).logits)


@pytest.mark.parametrize("name", ["shortgpt", "shortgpt_lora"])
def test_shortgpt_removes_blocks_and_decodes_with_cache(name):
    model = make_opt(layers=6)
    method = get_method(name)
    with torch.no_grad():
        result = method.compress(model, None, CALIB, method.make_config(ratio=0.3))
    assert model.config.num_hidden_layers == len(get_adapter(model).layers(model)) < 6
    idx = [b.self_attn.layer_idx for b in get_adapter(model).layers(model)]
    assert idx == list(range(len(idx)))  # KV-cache slots renumbered
    prompt = torch.tensor([[0, 17, 42, 99, 7]])
    cached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True)
    plain = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)
    if name == "shortgpt_lora":
        assert result.info["recovery"]["lora_targets"] == ["q_proj", "k_proj", "v_proj", "out_proj",
                                                     "fc1", "fc2"]


def _opt_fp64(layers: int = 4, tied: bool = True):
    """A tiny OPT in float64 with non-trivial LayerNorm scales and shifts."""
    model = make_model("opt", layers=layers, heads=4, intermediate=128, tied=tied).double()
    perturb_norms(model, seed=3)
    return model


@pytest.mark.parametrize("head,tied", [("unsliced", True), ("sliced", True),
                                       ("unsliced", False), ("sliced", False)])
def test_slicegpt_full_width_on_opt_is_exact(head, tied):
    """Fusion (LayerNorm shifts into biases, centred token *and* position tables, a head
    bias for the final LayerNorm's shift) and a full-width rotation keep OPT's function."""
    from baselines.slicegpt.accounting import Plan
    from baselines.slicegpt.config import SliceGPTConfig
    from baselines.slicegpt.fusion import fuse_model
    from baselines.slicegpt.rotate import rotate_and_slice

    model = _opt_fp64(tied=tied)
    ad = get_adapter(model)
    with torch.no_grad():
        dense = model(input_ids=CALIB).logits
        fusion = fuse_model(model, ad)
        assert fusion.norm == "layernorm" and ad.lm_head(model).bias is not None
        assert (model(input_ids=CALIB).logits - dense).abs().max().item() < 1e-9
        d = model.config.hidden_size
        rotate_and_slice(model, ad, fusion, Plan.constant(d, len(ad.layers(model)), d, head),
                         CALIB, SliceGPTConfig(batch_size=3))
        out = model(input_ids=CALIB).logits
    assert (out - dense).abs().max().item() < 1e-8
    assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())


def test_slicegpt_on_opt_slices_counts_reloads_and_decodes(tmp_path, tiny_tokenizer):
    from baselines.slicegpt.config import SliceGPTConfig
    from baselines.slicegpt.method import compress as slice_compress

    model = make_opt(layers=4)
    perturb_norms(model, seed=3)
    dense_params = count_parameters(model)
    with torch.no_grad():
        dense = model(input_ids=CALIB).logits
        result = slice_compress(model, None, CALIB, SliceGPTConfig(ratio=0.3, round_to=2,
                                                                   tolerance=0.05, batch_size=2))
    ad, width = get_adapter(model), result.info["width"]
    assert width < 64 and result.info["head"] == "sliced" and result.info["head_official"]
    assert ad.embed(model).weight.shape == (300, width)
    assert ad.position_embed(model).weight.shape == (512 + 2, width)
    assert ad.lm_head(model).weight.shape == (300, width) and ad.lm_head(model).bias is not None
    block = ad.layers(model)[0]
    assert block.fc1.weight.shape == (128, width) and block.fc2.weight.shape == (width, 128)
    assert count_parameters(model) == result.info["predicted_parameters"] == \
        result.info["parameters"] < dense_params
    assert abs(result.info["achieved_ratio"] - 0.3) <= 0.05
    with torch.no_grad():
        logits = model(input_ids=CALIB).logits
    assert torch.isfinite(logits).all() and not torch.allclose(logits, dense, atol=1e-3)
    save_compressed(model, tiny_tokenizer, manifest_for("slicegpt", result.structure, result.info),
                    tmp_path / "s")
    loaded = load_compressed(tmp_path / "s").model
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=CALIB).logits, logits)
        gen = loaded.generate(CALIB[:1, :5], max_new_tokens=4, do_sample=False)
        full = loaded(input_ids=gen).logits[0, 4:-1].argmax(-1)
    assert torch.equal(gen[0, 5:], full)  # cached decoding agrees with a full forward
    assert result.info["recovery"]["lora_targets"] == ["q_proj", "k_proj", "v_proj", "out_proj",
                                                       "fc1", "fc2"]


def test_slicegpt_refuses_opt_without_one_pre_norm_stream():
    from baselines.slicegpt.config import SliceGPTConfig
    from baselines.slicegpt.method import compress as slice_compress

    model = make_opt(layers=2)
    model.config.do_layer_norm_before = False  # OPT-350m's post-norm blocks
    with pytest.raises(ValueError, match="post-norm blocks"):
        slice_compress(model, None, CALIB, SliceGPTConfig(ratio=0.3, round_to=2,
                                                          tolerance=0.05))


def _masked_opt(dense, pruned, head_dim: int):
    """``dense`` with the heads / FFN channels that ``pruned`` lacks zeroed (rows matched)."""
    ref = copy.deepcopy(dense)
    ad = get_adapter(ref)
    for d_block, p_block in zip(ad.layers(ref), ad.layers(pruned)):
        dq, pq = ad.linear(d_block, "q"), ad.linear(p_block, "q")
        heads = dq.weight.view(-1, head_dim, dq.in_features)
        kept = [next(j for j in range(heads.shape[0]) if torch.equal(heads[j], row))
                for row in pq.weight.view(-1, head_dim, pq.in_features)]
        for j in set(range(heads.shape[0])) - set(kept):
            ad.linear(d_block, "o").weight.data[:, j * head_dim:(j + 1) * head_dim] = 0
        up, p_up = ad.linear(d_block, "up"), ad.linear(p_block, "up")
        kept = [next(j for j in range(up.out_features) if torch.equal(up.weight[j], row))
                for row in p_up.weight]
        drop = sorted(set(range(up.out_features)) - set(kept))
        ad.linear(d_block, "down").weight.data[:, drop] = 0
    return ref


def test_llm_pruner_on_opt_is_exact_and_reloads(tmp_path, tiny_tokenizer):
    """Heads (MHA: one head per group, q/k/v biases) and fc1/fc2 channels removed: the pruned
    OPT equals the dense one with those heads' out_proj columns and channels' fc2 columns
    zeroed; the parameter count is the plan's, and the model reloads and decodes."""
    dense = make_opt(layers=6)
    perturb_norms(dense, seed=3)
    pruned = copy.deepcopy(dense)
    method = get_method("llm_pruner")
    with torch.no_grad():
        result = method.compress(pruned, None, CALIB, method.make_config(ratio=0.3))
    heads, inter = result.structure["num_attention_heads"], result.structure["intermediate_size"]
    assert min(heads) < 4 and min(inter) < 128
    assert result.structure["num_key_value_heads"] == heads  # MHA
    assert abs(compression_ratio(count_parameters(pruned), count_parameters(dense)) - 0.3) <= 0.01
    ref = _masked_opt(dense, pruned, head_dim=16)
    with torch.no_grad():
        out = pruned(input_ids=CALIB).logits
        assert (out - ref(input_ids=CALIB).logits).abs().max().item() < 1e-4
        assert not torch.allclose(out, dense(input_ids=CALIB).logits, atol=1e-3)
    save_compressed(pruned, tiny_tokenizer, manifest_for("llm_pruner", result.structure),
                    tmp_path / "p")
    loaded = load_compressed(tmp_path / "p").model
    prompt = CALIB[:1, :5]
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=CALIB).logits, out)
        cached = loaded.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=True)
        plain = loaded.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)
    assert result.info["recovery"]["lora_targets"] == ["q_proj", "k_proj", "v_proj", "out_proj",
                                                       "fc1", "fc2"]


def test_flexigpt_recovery_on_opt_trains_the_adapters(tmp_path, tiny_tokenizer, text_file):
    from flexigpt.methods.sharing import adapter_trainable
    from flexigpt.runtime.training import TrainConfig, train_model

    model = make_opt()
    with torch.no_grad():
        result = prune_compress(model, None, CALIB, FlexiGPTConfig(ratio=0.3, rank=8))
    save_compressed(model, tiny_tokenizer, manifest_for("flexigpt", result.structure, result.info),
                    tmp_path / "c")
    cfg = TrainConfig(tokens=32 * 4 * 3, seq_len=32, micro_batch=2, global_batch=4,
                      eval_windows=2, checkpoint_every=0, bf16="off", warmup=1,
                      recipe="flexigpt", lr=5e-3, gamma_lr=5e-2)
    manifest = train_model(tmp_path / "c", tmp_path / "t", cfg, text_file, text_file)
    entry = manifest.history[-1]
    assert entry["trainable"]["trainable_parameters"] == adapter_trainable(model)
    trained = load_compressed(tmp_path / "t").model
    before = dict(model.named_parameters())
    for n, p in trained.named_parameters():
        if n.rsplit(".", 1)[-1] not in ("lora_A", "lora_B", "gamma"):
            assert torch.equal(p, before[n]), n  # the base stays frozen
    assert any(not torch.equal(p, before[n]) for n, p in trained.named_parameters()
               if n.endswith("gamma"))
