"""OPT (paper Table 3) through the role-based adapter: FlexiGPT pruning and extension,
ShortGPT ± LoRA, save/reload, self-speculative decoding; methods without OPT support refuse
it naming the method and the family."""

from __future__ import annotations

import pytest
import torch

from conftest import perturb_adapters
from flexigpt.artifacts import LoadedModel, load_compressed, save_compressed
from flexigpt.generation import Generator
from flexigpt.methods.extend import ExtendConfig
from flexigpt.methods.extend import compress as extend_compress
from flexigpt.methods.prune import FlexiGPTConfig
from flexigpt.methods.prune import compress as prune_compress
from flexigpt.methods.sharing import OutputNorm, SharedLoRALinear
from flexigpt.models import UnsupportedArchitectureError, get_adapter
from flexigpt.params import count_parameters
from flexigpt.registry import get_method

pytestmark = pytest.mark.usefixtures("single_thread")

CALIB = torch.randint(3, 300, (4, 32), generator=torch.Generator().manual_seed(0))


def make_opt(layers: int = 6, seed: int = 0):
    """A tiny random pre-LN OPT (biases, learned positions, tied head), fp32, eval mode."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(seed)
    cfg = OPTConfig(vocab_size=300, hidden_size=64, num_hidden_layers=layers, ffn_dim=128,
                    num_attention_heads=4, max_position_embeddings=512, word_embed_proj_dim=64,
                    do_layer_norm_before=True, dropout=0.0, attention_dropout=0.0,
                    bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=True)
    return OPTForCausalLM(cfg).eval()


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
    from conftest import make_model

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
    save_compressed(model, tiny_tokenizer, {"method": "flexigpt", "structure": result.structure,
                                            "info": result.info}, tmp_path / "c")
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
    gen = Generator(LoadedModel(model, tiny_tokenizer, {"method": "flexigpt",
                                                        "structure": result.structure}))
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
    save_compressed(model, tiny_tokenizer, {"method": "flexigpt_extend",
                                            "structure": result.structure}, tmp_path / "e")
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


@pytest.mark.parametrize("name", ["slicegpt", "llm_pruner"])
def test_methods_without_opt_refuse_it(name):
    method = get_method(name)
    with pytest.raises(UnsupportedArchitectureError, match=rf"{name}.*'opt' family"):
        method.compress(make_opt(), None, CALIB, method.make_config(ratio=0.3))


def test_flexigpt_recovery_on_opt_trains_the_adapters(tmp_path, tiny_tokenizer, text_file):
    from flexigpt.methods.sharing import adapter_trainable
    from flexigpt.training import TrainConfig, train_model

    model = make_opt()
    with torch.no_grad():
        result = prune_compress(model, None, CALIB, FlexiGPTConfig(ratio=0.3, rank=8))
    save_compressed(model, tiny_tokenizer, {"method": "flexigpt", "structure": result.structure,
                                            "info": result.info}, tmp_path / "c")
    cfg = TrainConfig(tokens=32 * 4 * 3, seq_len=32, micro_batch=2, global_batch=4,
                      eval_windows=2, checkpoint_every=0, bf16="off", warmup=1,
                      recipe="flexigpt", lr=5e-3, gamma_lr=5e-2)
    manifest = train_model(tmp_path / "c", tmp_path / "t", cfg, text_file, text_file)
    entry = manifest["history"][-1]
    assert entry["trainable"]["trainable_parameters"] == adapter_trainable(model)
    trained = load_compressed(tmp_path / "t").model
    before = dict(model.named_parameters())
    for n, p in trained.named_parameters():
        if n.rsplit(".", 1)[-1] not in ("lora_A", "lora_B", "gamma"):
            assert torch.equal(p, before[n]), n  # the base stays frozen
    assert any(not torch.equal(p, before[n]) for n, p in trained.named_parameters()
               if n.endswith("gamma"))
