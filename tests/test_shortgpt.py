"""ShortGPT and ShortGPT + LoRA: block choice, removal, k policy, LoRA budget, save/reload."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_model, manifest_for

from flexigpt.api.compression import compress as api_compress
from flexigpt.core.params import compression_ratio, count_parameters
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.methods.calibration import token_windows
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.models import get_adapter
from flexigpt.storage.registry import get_method


def _calib(n: int = 4, t: int = 24, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (n, t), generator=gen)
    ids[:, 0] = 0
    return ids


def _run(name: str, model, **options):
    method = get_method(name)
    with torch.no_grad():
        return method.compress(model, None, _calib(), method.make_config(**options))


@pytest.mark.parametrize("kv", [4, 2])
def test_removes_the_identity_blocks(kv):
    """Blocks whose o_proj/down_proj are zero pass the residual through (BI = 0): removed."""
    model = make_model(layers=5, heads=4, kv_heads=kv)
    ad = get_adapter(model)
    blocks = list(ad.layers(model))
    for i in (1, 3):
        ad.attn(blocks[i]).o_proj.weight.data.zero_()
        ad.mlp(blocks[i]).down_proj.weight.data.zero_()
    expect = [copy.deepcopy(b.state_dict()) for i, b in enumerate(blocks) if i not in (1, 3)]
    res = _run("shortgpt", model, ratio=0.4, policy="paper")  # int(0.4·5) = 2
    assert res.info["k"] == 2 and res.info["removed_blocks"] == [1, 3]
    scores = res.info["block_influence"]
    assert max(abs(scores[1]), abs(scores[3])) < 1e-5 < min(scores[0], scores[2], scores[4])
    kept = ad.layers(model)
    assert model.config.num_hidden_layers == 3 == len(kept)
    assert [ad.attn(b).layer_idx for b in kept] == [0, 1, 2]
    for block, ref in zip(kept, expect):
        assert all(torch.equal(block.state_dict()[k], v) for k, v in ref.items())


def test_generate_with_cache_after_removal():
    model = make_model(layers=6, heads=4, kv_heads=2)
    _run("shortgpt", model, ratio=0.5, policy="paper")
    prompt = torch.tensor([[0, 17, 42, 99, 7]])
    cached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True)
    plain = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False)
    assert cached.shape == (1, 11) and torch.equal(cached, plain)


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.45, 0.6])
def test_matched_k_is_nearest(ratio):
    dense_model = make_model(layers=8, heads=4, kv_heads=2, tied=False)
    dense = count_parameters(dense_model)
    model = copy.deepcopy(dense_model)
    res = _run("shortgpt", model, ratio=ratio)
    chosen = compression_ratio(count_parameters(model), dense)
    assert chosen == pytest.approx(res.info["expected_ratio"])
    achieved = {}
    for k in range(1, 8):  # remove k lowest-BI blocks from a fresh copy, count for real
        other = copy.deepcopy(dense_model)
        ad = get_adapter(other)
        order = sorted(range(8), key=lambda i: res.info["block_influence"][i])[:k]
        ad.set_layers(other, [b for i, b in enumerate(ad.layers(other)) if i not in order])
        achieved[k] = compression_ratio(count_parameters(other), dense)
    best = min(abs(a - ratio) for a in achieved.values())
    assert abs(chosen - ratio) == pytest.approx(best)
    assert achieved[res.info["k"]] == pytest.approx(chosen)


def test_paper_policy_uses_int_ratio_times_layers():
    res = _run("shortgpt", make_model(layers=8), ratio=0.3, policy="paper")
    assert res.info["k"] == 2 and res.info["policy"] == "paper"


def test_lora_budget_matches_flexigpt_and_peft():
    from peft import LoraConfig, get_peft_model

    model = make_model(layers=8, hidden=64, heads=4, kv_heads=2, intermediate=128)
    res = _run("shortgpt_lora", model, ratio=0.3, policy="paper")  # k = 2, r_f = 64 // 16
    rec = res.info["recovery"]
    width = (64 + 64) + (64 + 32) * 2 + (64 + 64) + (64 + 128) * 3  # Σ(in+out), 7 linears
    assert rec["flexigpt_rank"] == 4
    assert rec["flexigpt_trainable_params"] == 2 * (4 * width + 2 * 64)
    per_rank = 6 * width
    r = rec["lora_rank"]
    assert rec["trainable_params"] == r * per_rank and rec["lora_alpha"] == r
    for other in (r - 1, r + 1):
        if other >= 1:
            assert (abs(other * per_rank - rec["flexigpt_trainable_params"])
                    >= abs(r * per_rank - rec["flexigpt_trainable_params"]))
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(
        r=r, lora_alpha=rec["lora_alpha"], target_modules=rec["lora_targets"], lora_dropout=0.0))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert trainable == rec["trainable_params"]


def test_lora_rank_override():
    res = _run("shortgpt_lora", make_model(layers=6), ratio=0.3, lora_rank=7)
    rec = res.info["recovery"]
    assert rec["lora_rank"] == 7 and rec["rank_source"] == "config"


def test_save_reload_roundtrip(tmp_path, tiny_tokenizer):
    model = make_model(layers=6, heads=4, kv_heads=2)
    res = _run("shortgpt", model, ratio=0.3)
    save_compressed(res.model, tiny_tokenizer, manifest_for("shortgpt", res.structure),
                    tmp_path / "m")
    loaded = load_compressed(tmp_path / "m")
    ids = torch.tensor([[0, 5, 9, 200, 31]])
    assert loaded.model.config.num_hidden_layers == 6 - res.info["k"]
    assert torch.equal(loaded.model(ids).logits, model(ids).logits)


def test_api_compress_lora(tmp_path, tiny_checkpoint, text_file):
    out = tmp_path / "sg"
    manifest = api_compress("shortgpt_lora", str(tiny_checkpoint), out,
                            options={"ratio": 0.3}, calibration=str(text_file),
                            n_calibration=4, calibration_seq_len=32)
    assert manifest.info["recovery"]["recipe"] == "lora"
    assert manifest.config["policy"] == "matched"
    loaded = load_compressed(out)
    assert loaded.manifest.method == "shortgpt_lora"
    dense = make_model()
    windows = token_windows(text_file, loaded.tokenizer, 32, 4, 0)
    with torch.no_grad():
        get_method("shortgpt").compress(dense, None, windows,
                                        get_method("shortgpt").make_config(ratio=0.3))
    ids = windows[:2]
    assert torch.allclose(loaded.model(ids).logits, dense(ids).logits, atol=1e-6)


@pytest.mark.parametrize("options,match", [
    ({"ratio": 0.0}, "ratio"), ({"ratio": 1.2}, "ratio"), ({"policy": "half"}, "policy"),
    ({"batch_size": 0}, "batch_size")])
def test_bad_config(options, match):
    with pytest.raises(ValueError, match=match):
        get_method("shortgpt").make_config(**options)


def test_bad_inputs():
    with pytest.raises(ValueError, match="lora_rank"):
        get_method("shortgpt_lora").make_config(lora_rank=0)
    with pytest.raises(ValueError, match="no option"):
        get_method("shortgpt").make_config(lora_rank=4)
    with pytest.raises(ValueError, match="removes int"):
        _run("shortgpt", make_model(layers=4), ratio=0.1, policy="paper")  # k = 0
    with pytest.raises(ValueError, match="calibration"):
        method = get_method("shortgpt")
        method.compress(make_model(), None, None, method.make_config())


@pytest.mark.parametrize("name", ["shortgpt", "flexigpt"])
def test_precomputed_block_influence_is_used(name):
    """``bi_scores`` (the DAG's shared BI) gives the same pruning as computing it; bad → error."""
    from flexigpt.methods.block_influence import block_influence

    model = make_model(layers=5)
    scores = block_influence(model, _calib())
    computed = _run(name, copy.deepcopy(model), ratio=0.4)
    shared = get_method(name).compress(copy.deepcopy(model), None, None,
                                       get_method(name).make_config(ratio=0.4,
                                                                    bi_scores=scores))
    assert shared.info["block_influence"] == computed.info["block_influence"]
    assert shared.structure == computed.structure
    reversed_scores = get_method(name).compress(
        copy.deepcopy(model), None, None,
        get_method(name).make_config(ratio=0.4, bi_scores=[-s for s in scores]))
    assert reversed_scores.structure != computed.structure  # the given scores decide
    with pytest.raises(ValueError, match="bi_scores has 4 entries but the model has 5"):
        get_method(name).compress(copy.deepcopy(model), None, None,
                                  get_method(name).make_config(ratio=0.4, bi_scores=scores[:4]))
    with pytest.raises(ValueError, match="finite"):
        get_method(name).make_config(bi_scores=[0.1, float("nan")])
