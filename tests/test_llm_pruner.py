"""LLM-Pruner block-wise: shapes, exactness of the surgery, importance, ratio, reload, errors."""

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

HD = 8  # head_dim of every test model: hidden 64 / 8 heads


def _calib(n: int = 4, t: int = 24, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (n, t), generator=gen)
    ids[:, 0] = 0
    return ids


def _model(kv: int = 8, family: str = "llama", **kw):
    return make_model(family, layers=6, hidden=64, heads=8, kv_heads=kv, intermediate=256, **kw)


def _run(model, calib=None, **options):
    method = get_method("llm_pruner")
    with torch.no_grad():
        return method.compress(model, None, _calib() if calib is None else calib,
                               method.make_config(**options))


def _match_rows(dense: torch.Tensor, pruned: torch.Tensor, unit: int) -> list[int]:
    """Indices of the ``unit``-row blocks of ``dense`` that ``pruned`` kept, in order."""
    d, p = dense.view(-1, unit, dense.shape[1]), pruned.view(-1, unit, pruned.shape[1])
    return [next(j for j in range(d.shape[0]) if torch.equal(d[j], row)) for row in p]


def _masked_reference(dense_model, pruned_model):
    """The dense model with the removed groups/channels zeroed (found by matching rows)."""
    ref = copy.deepcopy(dense_model)
    ad = get_adapter(ref)
    for dense_b, pruned_b in zip(ad.layers(ref), ad.layers(pruned_model)):
        da, pa = ad.attn(dense_b), ad.attn(pruned_b)
        dm, pm = ad.mlp(dense_b), ad.mlp(pruned_b)
        n_kv = da.k_proj.out_features // HD
        g = da.q_proj.out_features // HD // n_kv
        kept_kv = _match_rows(da.k_proj.weight, pa.k_proj.weight, HD)
        assert _match_rows(da.q_proj.weight, pa.q_proj.weight, g * HD) == kept_kv
        for j in set(range(n_kv)) - set(kept_kv):
            q = slice(j * g * HD, (j + 1) * g * HD)
            kv = slice(j * HD, (j + 1) * HD)
            da.q_proj.weight.data[q] = 0
            da.o_proj.weight.data[:, q] = 0
            da.k_proj.weight.data[kv] = 0
            da.v_proj.weight.data[kv] = 0
            for lin, sl in ((da.q_proj, q), (da.k_proj, kv), (da.v_proj, kv)):
                if lin.bias is not None:
                    lin.bias.data[sl] = 0
        kept = _match_rows(dm.gate_proj.weight, pm.gate_proj.weight, 1)
        assert _match_rows(dm.up_proj.weight, pm.up_proj.weight, 1) == kept
        drop = sorted(set(range(dm.gate_proj.out_features)) - set(kept))
        dm.gate_proj.weight.data[drop] = 0
        dm.up_proj.weight.data[drop] = 0
        dm.down_proj.weight.data[:, drop] = 0
    return ref


@pytest.mark.parametrize("family,kv", [("llama", 8), ("llama", 2), ("qwen2", 2)])
def test_surgery_is_exact(family, kv):
    dense = _model(kv, family)
    pruned = copy.deepcopy(dense)
    res = _run(pruned, ratio=0.35)
    assert res.structure["num_attention_heads"][1] < 8  # something was removed
    ref = _masked_reference(dense, pruned)
    ids = torch.tensor([[0, 4, 77, 123, 9, 250, 31, 8]])
    with torch.no_grad():
        assert torch.allclose(pruned(ids).logits, ref(ids).logits, atol=1e-5)
        assert not torch.allclose(dense(ids).logits, ref(ids).logits, atol=1e-3)


@pytest.mark.parametrize("kv,ratio,heads,kvs,inter", [
    (8, 0.25, 6, 6, 192),  # 64 channels: 64 − int(48) = 16 → 2 heads; FFN int(256·0.75)
    (2, 0.5, 4, 1, 128),   # 16 KV channels: 16 − 8 = 8 → one KV group (4 query heads)
    (2, 0.25, 8, 2, 192),  # 16 − int(12) = 4 < head_dim → no group removed
])
def test_paper_policy_shapes(kv, ratio, heads, kvs, inter):
    model = _model(kv)
    res = _run(model, ratio=ratio, policy="paper")
    assert res.info["layer_range"] == [1, 5]
    assert res.structure["num_attention_heads"] == [8] + [heads] * 4 + [8]
    assert res.structure["num_key_value_heads"] == [kv] + [kvs] * 4 + [kv]
    assert res.structure["intermediate_size"] == [256] + [inter] * 4 + [256]
    ad = get_adapter(model)
    block = ad.layers(model)[2]
    assert ad.attn(block).q_proj.weight.shape == (heads * HD, 64)
    assert ad.attn(block).o_proj.weight.shape == (64, heads * HD)
    assert ad.mlp(block).down_proj.weight.shape == (64, inter)


@pytest.mark.parametrize("kv", [8, 2])
@pytest.mark.parametrize("ratio", [0.3, 0.4])
def test_matched_ratio_within_one_point(kv, ratio):
    model = _model(kv)
    dense = count_parameters(model)
    res = _run(model, ratio=ratio)
    achieved = compression_ratio(count_parameters(model), dense)
    assert abs(achieved - ratio) <= 0.01
    assert achieved == pytest.approx(res.info["expected_ratio"])


def test_importance_picks_lowest_taylor_groups():
    """Independent check: one backward of HF's own loss over the whole batch."""
    calib = _calib(n=3)
    dense = _model(2)
    ref = copy.deepcopy(dense)
    loss = ref(input_ids=calib, labels=calib).loss
    loss.backward()
    pruned = copy.deepcopy(dense)
    res = _run(pruned, calib=calib, ratio=0.5, policy="paper")
    ad = get_adapter(ref)
    for i in range(1, 5):
        att, mlp = ad.attn(ad.layers(ref)[i]), ad.mlp(ad.layers(ref)[i])
        sal = {n: (m.weight * m.weight.grad).abs() for n, m in
               [("q", att.q_proj), ("k", att.k_proj), ("v", att.v_proj), ("o", att.o_proj),
                ("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj)]}
        heads = (sal["q"].sum(1).view(2, -1).sum(1) + sal["o"].sum(0).view(2, -1).sum(1)
                 + sal["k"].sum(1).view(2, -1).sum(1) + sal["v"].sum(1).view(2, -1).sum(1))
        assert res.info["removed_kv_groups"][str(i)] == [int(heads.argmin())]
        ffn = sal["gate"].sum(1) + sal["up"].sum(1) + sal["down"].sum(0)
        kept = _match_rows(mlp.gate_proj.weight, ad.mlp(ad.layers(pruned)[i]).gate_proj.weight, 1)
        assert kept == sorted(torch.argsort(ffn)[128:].tolist())
    assert all(p.grad is None for p in pruned.parameters())
    assert all(p.requires_grad for p in pruned.parameters())


def test_generate_with_cache_after_pruning():
    model = _model(2)
    _run(model, ratio=0.4)
    prompt = torch.tensor([[0, 17, 42, 99, 7]])
    cached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True)
    plain = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)


def test_save_reload_identical_logits(tmp_path, tiny_tokenizer):
    model = _model(8)
    res = _run(model, ratio=0.3)
    save_compressed(model, tiny_tokenizer, manifest_for("llm_pruner", res.structure),
                    tmp_path / "m")
    loaded = load_compressed(tmp_path / "m")
    assert loaded.manifest.structure["num_attention_heads"] == \
        res.structure["num_attention_heads"]
    ids = torch.tensor([[0, 5, 9, 200, 31]])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, model(ids).logits)


def test_api_compress_roundtrip(tmp_path, tiny_checkpoint, text_file):
    out = tmp_path / "lp"
    manifest = api_compress("llm_pruner", str(tiny_checkpoint), out, options={"ratio": 0.3},
                            calibration=str(text_file), n_calibration=4, calibration_seq_len=32)
    assert abs(manifest.parameters.achieved_ratio - 0.3) <= 0.01
    ad = get_adapter(make_model())
    assert manifest.info["recovery"] == {"recipe": "lora", "lora_rank": 8, "lora_alpha": 16.0,
                                            "lora_dropout": 0.05, "lr": 1e-4,
                                            "lora_targets": list(ad.attn_linears
                                                                 + ad.mlp_linears)}
    from flexigpt.runtime.training.config import (  # the shared trainer reads it
        TrainConfig,
        resolve_plan,
    )

    plan = resolve_plan(TrainConfig(), manifest)
    assert (plan.recipe, plan.lora_rank, plan.lora_alpha, plan.lora_dropout, plan.lr) == \
        ("lora", 8, 16.0, 0.05, 1e-4)
    assert plan.lora_targets == tuple(manifest.info["recovery"]["lora_targets"])
    assert all(plan.sources[k] == "manifest" for k in
               ("recipe", "lr", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets"))
    loaded = load_compressed(out)
    dense = make_model()  # the weights of tiny_checkpoint
    windows = token_windows(text_file, loaded.tokenizer, 32, 4, 0)
    _run(dense, calib=windows, ratio=0.3)
    with torch.no_grad():
        assert torch.allclose(loaded.model(windows).logits, dense(windows).logits, atol=1e-6)


@pytest.mark.parametrize("options,match", [
    ({"ratio": 0.0}, "ratio"), ({"ratio": 1.0}, "ratio"), ({"policy": "x"}, "policy"),
    ({"layer_start": 3, "layer_end": 2}, "layer_end"), ({"batch_size": 0}, "batch_size")])
def test_bad_config(options, match):
    with pytest.raises(ValueError, match=match):
        get_method("llm_pruner").make_config(**options)


def test_bad_inputs():
    with pytest.raises(ValueError, match="every attention head"):
        _run(_model(8), ratio=0.99, policy="paper")
    with pytest.raises(ValueError, match="not reachable"):
        _run(_model(2), ratio=0.9)
    with pytest.raises(ValueError, match="outside the model"):
        _run(_model(8), layer_start=2, layer_end=9)
    method = get_method("llm_pruner")
    with pytest.raises(ValueError, match="calibration"):
        method.compress(_model(8), None, None, method.make_config())
