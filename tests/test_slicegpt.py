"""SliceGPT baseline: invariance, slicing shapes and counts, width solving, reload, errors."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model, manifest_for
from torch import nn

from baselines.slicegpt.accounting import Plan, predict_parameters
from baselines.slicegpt.activations import STORES, open_store
from baselines.slicegpt.config import SliceGPTConfig
from baselines.slicegpt.fusion import fuse_model, is_tied
from baselines.slicegpt.method import METHOD, compress
from baselines.slicegpt.pca import SecondMoment
from baselines.slicegpt.rotate import rotate_and_slice
from flexigpt.core.params import count_parameters
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.methods.calibration import token_windows
from flexigpt.methods.perplexity import perplexity
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.registry import get_method


def _ids(n: int = 8, t: int = 24, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (n, t), generator=g)


def _full_width(model: nn.Module, head: str, ids: torch.Tensor) -> torch.Tensor:
    ad = get_adapter(model)
    d = model.config.hidden_size
    fusion = fuse_model(model, ad, untie=head != "tied")  # as compress does
    rotate_and_slice(model, ad, fusion, Plan.constant(d, len(ad.layers(model)), d, head), ids,
                     SliceGPTConfig(batch_size=3))
    return model(input_ids=ids).logits


FP64, FP32 = (torch.float64, 1e-6), (torch.float32, 1e-4)


@pytest.mark.parametrize("precision,tied,head", [
    (FP64, True, "tied"), (FP64, True, "unsliced"), (FP64, True, "sliced"),
    (FP64, False, "unsliced"), (FP64, False, "sliced"), (FP32, True, "tied"),
    (FP32, False, "unsliced")])
def test_full_width_rotation_is_exact(precision, tied, head):
    dtype, tol = precision
    model = make_model(tied=tied, layers=3).to(dtype)
    ids = _ids()
    dense = model(input_ids=ids).logits
    out = _full_width(model, head, ids)
    # HF's RMSNorm computes in fp32 even for fp64 weights: that bounds the fp64 agreement
    assert (out - dense).abs().max().item() < tol
    assert not any(type(m).__name__.endswith("RMSNorm") for m in model.modules())
    assert is_tied(model, get_adapter(model)) == (head == "tied")


def test_full_width_rotation_fp64_matches_fused_model():
    """Rotation alone (after fusion) is exact to fp64 precision."""
    model = make_model(family="qwen2").double()
    ad = get_adapter(model)
    ids = _ids()
    fusion = fuse_model(model, ad)
    fused = model(input_ids=ids).logits
    d = model.config.hidden_size
    rotate_and_slice(model, ad, fusion, Plan.constant(d, 4, d, "tied"), ids, SliceGPTConfig())
    assert (model(input_ids=ids).logits - fused).abs().max().item() < 1e-10


def test_layernorm_fusion_path_is_exact():
    """A Llama with biased LayerNorms: centring + bias folding keep the function."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", vocab_size=300, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                               attention_bias=True, mlp_bias=True, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg).double().eval()
    ad = get_adapter(model)

    def layer_norm(bias: bool) -> nn.LayerNorm:
        ln = nn.LayerNorm(64, eps=1e-5).double()
        nn.init.normal_(ln.weight, 1.0, 0.2)
        nn.init.normal_(ln.bias, 0.0, 0.2 if bias else 0.0)
        return ln

    for block in ad.layers(model):
        block.input_layernorm, block.post_attention_layernorm = layer_norm(True), layer_norm(True)
    model.model.norm = layer_norm(False)
    ids = _ids()
    dense = model(input_ids=ids).logits
    out = _full_width(model, "unsliced", ids)
    assert (out - dense).abs().max().item() < 1e-8


def _sliced(tied: bool = True, ratio: float = 0.3, **options):
    """Slice a tiny model. ``round_to`` defaults to 1: on this vocabulary-dominated model one
    feature of width is ≈2 % of the parameters with the (official, untied) sliced head, so
    coarser steps cannot meet a ±1 % target."""
    model = make_model(tied=tied)
    dense = count_parameters(model)
    cfg = SliceGPTConfig(ratio=ratio, round_to=options.pop("round_to", 1), batch_size=4, **options)
    result = compress(model, None, _ids(), cfg)
    return result, dense


@pytest.mark.parametrize("tied,head", [(True, "tied"), (True, "unsliced"), (True, "sliced"),
                                       (False, "unsliced")])
def test_shapes_and_parameter_formula(tied, head):
    V, D, f, L, q_out, kv_out = 300, 64, 128, 4, 64, 32  # make_model defaults (GQA 4/2)
    model = make_model(tied=tied)
    dense = count_parameters(model)
    result = compress(model, None, _ids(), SliceGPTConfig(ratio=0.6, target="slicing_fraction",
                                                          head=head, batch_size=4))
    d = 24  # int(0.4 · 64) = 25 → multiple of 8
    m, ad = result.model, get_adapter(result.model)
    last = D if head == "unsliced" else d
    for i, block in enumerate(ad.layers(m)):
        d_out = last if i == L - 1 else d
        attn, mlp = ad.attn(block), ad.mlp(block)
        assert attn.q_proj.weight.shape == (q_out, d)
        assert attn.k_proj.weight.shape == attn.v_proj.weight.shape == (kv_out, d)  # heads kept
        assert attn.o_proj.weight.shape == (d, q_out)
        assert mlp.gate_proj.weight.shape == mlp.up_proj.weight.shape == (f, d)
        assert mlp.down_proj.weight.shape == (d_out, f)
        assert block.attn_shortcut.weight.shape == (d, d)
        assert block.mlp_shortcut.weight.shape == (d_out, d)
    assert ad.embed(m).weight.shape == (V, d)
    assert ad.lm_head(m).weight.shape == (V, d if head == "tied" else last)
    # docs/baselines.md §2.3, written out independently of accounting.py
    layer = d * (q_out + 2 * kv_out) + q_out * d + d * d + 2 * d * f  # q,k,v, o, attn Q, gate/up
    expected = V * d + L * layer + (L - 1) * (f * d + d * d) + (f * last + d * last)
    expected += d * d if head == "tied" else V * last
    assert count_parameters(m) == expected == result.info["parameters"]
    assert result.info["predicted_parameters"] == expected
    assert result.info["dense_parameters"] == dense
    assert result.info["slicing_fraction"] == pytest.approx(1 - 24 / 64)


@pytest.mark.parametrize("ratio", [0.3, 0.4])
def test_parameter_target_within_one_point(ratio):
    result, dense = _sliced(ratio=ratio)
    achieved = 1 - count_parameters(result.model) / dense
    assert abs(achieved - ratio) <= 0.01
    assert result.info["head"] == "sliced" and result.info["target"] == "parameters"
    assert result.info["width"] < 64
    logits = result.model(input_ids=_ids(2, 10, seed=5)).logits
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("ratio", [0.3, 0.4])
def test_auto_head_on_tied_model_is_the_official_sliced_head(ratio):
    """``auto`` on a tied model: untied head, input sliced to the width; the new V×d′ head
    matrix is counted beside the V×d′ embedding and the ratio still meets the target."""
    V, tol = 300, 0.01
    model = make_model(tied=True)
    ad = get_adapter(model)
    assert is_tied(model, ad)
    dense = count_parameters(model)
    cfg = SliceGPTConfig(ratio=ratio, round_to=1, batch_size=4, tolerance=tol)  # see _sliced
    assert cfg.head == "auto"
    result = compress(model, None, _ids(), cfg)
    info, m = result.info, result.model
    assert (info["head"], info["head_requested"], info["head_official"]) == ("sliced", "auto", True)
    assert info["dense_head_tied"] is True and result.structure["plan"]["head"] == "sliced"
    w = info["width"]
    assert not is_tied(m, ad) and not m.config.tie_word_embeddings
    assert ad.lm_head(m).weight.shape == ad.embed(m).weight.shape == (V, w)
    assert ad.lm_head(m).weight.data_ptr() != ad.embed(m).weight.data_ptr()
    assert info["head_parameters"] == V * w  # the untied head is a new matrix, counted
    after = count_parameters(m)
    assert after == info["parameters"] == info["predicted_parameters"]
    achieved = 1 - after / dense
    assert abs(achieved - ratio) <= tol
    assert info["achieved_ratio"] == pytest.approx(achieved, abs=1e-6)
    # honest accounting: the same plan with the head left shared would be V·w fewer
    plan = Plan(**result.structure["plan"])
    assert info["predicted_parameters"] - predict_parameters(
        make_model(tied=True), ad, Plan(plan.embed, plan.mid, plan.out, "tied"), True) \
        == V * w - w * w  # untied V×w head instead of the variant's w×w projection


def test_auto_head_on_untied_model_is_unsliced_and_tied_is_labelled():
    result, _ = _sliced(tied=False)
    assert (result.info["head"], result.info["head_official"]) == ("unsliced", True)
    result, _ = _sliced(head="tied")
    assert (result.info["head"], result.info["head_official"]) == ("tied", False)
    assert result.info["head_parameters"] == result.info["width"] ** 2  # d′×d′ projection


def test_unsliced_head_costs_a_full_head_on_tied_models():
    """Untying keeps a V×D head beside the sliced embedding: same width, more parameters."""
    model = make_model()
    ad = get_adapter(model)
    plans = {h: Plan.constant(48, 4, 64, h) for h in ("tied", "sliced", "unsliced")}
    counts = {h: predict_parameters(model, ad, p, tied=True) for h, p in plans.items()}
    assert counts["tied"] < counts["sliced"] < counts["unsliced"]
    assert counts["unsliced"] - counts["sliced"] == 300 * 16 + 128 * 16 + 48 * 16


def test_reload_gives_identical_logits(tmp_path, tiny_tokenizer, text_file):
    for head in ("tied", "unsliced", "sliced"):
        model = make_model()
        windows = token_windows(text_file, tiny_tokenizer, 32, 8, seed=0)
        result = compress(model, tiny_tokenizer, windows,
                          SliceGPTConfig(ratio=0.3, head=head, round_to=2, tolerance=0.03))
        out = tmp_path / head
        save_compressed(result.model, tiny_tokenizer,
                        manifest_for("slicegpt", result.structure, result.info), out)
        loaded = load_compressed(out)
        ids = windows[:2]
        assert torch.equal(loaded.model(input_ids=ids).logits, result.model(input_ids=ids).logits)
        assert count_parameters(loaded.model) == count_parameters(result.model)
        loaded.model.tie_weights()  # lm-eval calls this: must not change a sliced model
        assert torch.equal(loaded.model(input_ids=ids).logits, result.model(input_ids=ids).logits)
        gen = loaded.model.generate(ids[:1, :5], max_new_tokens=4, do_sample=False)
        full = loaded.model(input_ids=gen).logits[0, 4:-1].argmax(-1)
        assert torch.equal(gen[0, 5:], full)  # cached decoding agrees with a full forward


def test_pca_float64_vs_float32(tiny_tokenizer, text_file):
    """fp64 vs fp32 PCA on a model with two "massive activation" features (as in real LLMs).

    A random tiny model's perplexity is ~uniform whatever the slicing, so the comparison is
    the relative logit error to the dense model (perplexity is recorded too). Measured when
    written: fp64 9.2e-6 vs fp32 1.7e-5 (perplexity equal to 4 digits).
    """
    windows = token_windows(text_file, tiny_tokenizer, 32, 8, seed=0)
    held_out = token_windows(text_file, tiny_tokenizer, 32, 8, seed=1)
    err, ppl = {}, {}
    for precision in ("float64", "float32"):
        model = make_model(tied=False)
        with torch.no_grad():
            model.model.embed_tokens.weight[:, :2] *= 1e3
            dense = model(input_ids=held_out).logits
        result = compress(model, tiny_tokenizer, windows,
                          SliceGPTConfig(ratio=0.3, head="sliced", round_to=2, pca_dtype=precision))
        with torch.no_grad():
            out = result.model(input_ids=held_out).logits
        err[precision] = float((out - dense).pow(2).mean() / dense.pow(2).mean())
        ppl[precision] = perplexity(result.model, held_out)
    print(f"slicegpt PCA precision: relative logit error {err}, perplexity {ppl}")
    assert err["float64"] < err["float32"]


def test_pad_positions_are_excluded():
    """Tokens under a zero mask (right padding) do not influence the sliced weights."""
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, 15:] = 0
    mask[3, 10:] = 0
    other = ids.clone()
    other[mask == 0] = 7
    cfg = SliceGPTConfig(ratio=0.3, round_to=1, batch_size=4)  # round_to: see _sliced
    a = compress(make_model(), None, ids, cfg, mask=mask).model.state_dict()
    b = compress(make_model(), None, other, cfg, mask=mask).model.state_dict()
    c = compress(make_model(), None, other, cfg).model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    assert not all(torch.allclose(a[k], c[k], atol=1e-5) for k in a)


def test_second_moment_mask_and_basis():
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    acc = SecondMoment(4)
    acc.add(x, mask)
    kept = x[mask.bool()]
    assert torch.allclose(acc.h, kept.T @ kept) and acc.tokens == 8
    q, vals = acc.basis(damping=0.0)
    assert torch.all(vals[:-1] >= vals[1:])
    assert torch.allclose(q.T @ q, torch.eye(4, dtype=torch.float64), atol=1e-12)


def test_random_orientation_and_registry():
    assert get_method("slicegpt") is METHOD
    result, dense = _sliced(orientation="random")
    assert abs(result.info["achieved_ratio"] - 0.3) <= 0.01
    assert result.info["recovery"] == {"recipe": "lora", "lora_rank": 32, "lora_alpha": 10.0,
                                       "lora_dropout": 0.05, "lr": 2e-4,
                                       "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                        "gate_proj", "up_proj", "down_proj"]}
    assert _sliced(recovery="none")[0].info["recovery"] == {"recipe": "none"}
    from flexigpt.runtime.training import (  # the shared trainer reads the recipe
        TrainConfig,
        resolve_plan,
    )

    plan = resolve_plan(TrainConfig(), manifest_for("slicegpt", info=result.info))
    assert (plan.recipe, plan.lora_rank, plan.lora_alpha, plan.lora_dropout, plan.lr) == \
        ("lora", 32, 10.0, 0.05, 2e-4)
    assert plan.lora_targets == tuple(result.info["recovery"]["lora_targets"])
    assert all(plan.sources[k] == "manifest" for k in
               ("recipe", "lr", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets"))
    ad = get_adapter(result.model)  # targets come from the architecture adapter
    assert result.info["recovery"]["lora_targets"] == list(ad.attn_linears + ad.mlp_linears)


@pytest.mark.parametrize("options,match", [
    ({"ratio": 1.5}, "ratio"), ({"head": "big"}, "head"), ({"round_to": 0}, "round_to"),
    ({"pca_dtype": "float16"}, "pca_dtype"), ({"target": "layers"}, "target"),
    ({"tolerance": 0}, "tolerance"), ({"lora_alpha": -1}, "lora_alpha"),
    ({"head": None}, "head"), ({"orientation": "pcaa"}, "orientation"),
    ({"recovery": "full"}, "recovery"), ({"batch_size": 0}, "batch_size"),
    ({"lora_rank": 2.5}, "lora_rank"), ({"seed": "0"}, "seed"), ({"damping": 1.0}, "damping"),
    ({"damping": True}, "damping"), ({"tolerance": True}, "tolerance"),
    ({"lora_lr": float("nan")}, "lora_lr"), ({"lora_alpha": float("inf")}, "lora_alpha"),
    ({"lora_dropout": 1.0}, "lora_dropout"), ({"lora_dropout": False}, "lora_dropout"),
    ({"activations": "gpu"}, "activations")])
def test_config_errors(options, match):
    with pytest.raises(ValueError, match=match):
        SliceGPTConfig(**options)
    with pytest.raises(ValueError, match="no option"):
        METHOD.make_config(ratios=0.3)


def test_input_errors():
    with pytest.raises(ValueError, match="LongTensor"):
        compress(make_model(), None, None, SliceGPTConfig())
    with pytest.raises(ValueError, match="LongTensor"):
        compress(make_model(), None, torch.randn(4, 8), SliceGPTConfig())
    with pytest.raises(ValueError, match="head='tied' needs"):
        compress(make_model(tied=False), None, _ids(), SliceGPTConfig(head="tied"))
    with pytest.raises(ValueError, match="not reachable"):  # an untied full head caps the reduction
        compress(make_model(), None, _ids(), SliceGPTConfig(ratio=0.9, head="unsliced"))
    with pytest.raises(ValueError, match="not reachable"):  # steps of 8 features are too coarse
        compress(make_model(), None, _ids(), SliceGPTConfig(ratio=0.33, tolerance=0.001))
    with pytest.raises(ValueError, match="mask shape"):
        compress(make_model(), None, _ids(), SliceGPTConfig(), mask=torch.ones(2, 2))


@pytest.mark.parametrize("family,tied,head", [("llama", True, "sliced"), ("llama", False, "unsliced"),
                                              ("opt", False, "unsliced")])
def test_activations_on_disk_and_in_memory_give_identical_weights(family, tied, head):
    """The store only moves memory: every sliced weight is bit-identical either way
    (uneven last batch, a padding mask)."""
    ids = _ids(n=7)
    mask = torch.ones_like(ids)
    mask[2, 18:] = 0
    out = {}
    for where in STORES:
        torch.manual_seed(0)
        model = make_model(family=family, tied=tied)
        cfg = SliceGPTConfig(ratio=0.3, round_to=1, batch_size=3, head=head, activations=where)
        out[where] = compress(model, None, ids, cfg, mask=mask).model.state_dict()
    assert out["disk"].keys() == out["memory"].keys()
    assert all(torch.equal(out["disk"][k], out["memory"][k]) for k in out["disk"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_stores_round_trip(tmp_path, dtype):
    shape = (5, 3, 4)
    stores = [open_store("memory", shape, dtype), open_store("disk", shape, dtype, str(tmp_path))]
    values = torch.randn(shape).to(dtype)
    for store in stores:
        store.write(slice(0, 2), values[:2])
        store.write(slice(2, 5), values[2:].double())  # cast to the store's dtype
        batch = store.read(slice(1, 4))
        assert batch.dtype == dtype and torch.equal(batch, values[1:4])
        batch[:, :, :2] = 0  # a batch modified in place and written back
        store.write(slice(1, 4), batch)
        assert torch.equal(store.read(slice(1, 4))[:, :, :2], torch.zeros(3, 3, 2, dtype=dtype))
        assert torch.equal(store.read(slice(4, 5)), values[4:])  # other windows untouched
        store.close()
    with pytest.raises(ValueError, match="expected"):
        stores[1].write(slice(0, 2), values[:3])
    with pytest.raises(ValueError, match="activations must be one of"):
        open_store("cloud", shape, dtype)
    assert not list(tmp_path.iterdir())  # the file was never visible (unlinked)


def test_disk_store_refuses_a_full_disk(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10, 9, 1))
    with pytest.raises(ValueError, match="MiB on disk but .* free; set TMPDIR"):
        open_store("disk", (4, 8, 16), torch.float32, str(tmp_path))


@pytest.mark.parametrize("head,where", [("sliced", "disk"), ("unsliced", "disk"),
                                        ("sliced", "memory")])
def test_deferred_untie_builds_the_same_head(head, where):
    """``defer_untie``: the untied head built at the end from the original embedding equals
    the one copied and folded at fusion, bit for bit, and the model is untied afterwards."""
    ids = _ids()
    out = {}
    for defer in (False, True):
        model = make_model(tied=True)
        ad = get_adapter(model)
        d = model.config.hidden_size
        fusion = fuse_model(model, ad, untie=True, defer_untie=defer)
        assert fusion.head_pending == defer and is_tied(model, ad) == defer
        plan = Plan.constant(24, len(ad.layers(model)), d, head)
        rotate_and_slice(model, ad, fusion, plan, ids,
                         SliceGPTConfig(batch_size=3, activations=where))
        assert not is_tied(model, ad) and model.config.tie_word_embeddings is False
        out[defer] = model.state_dict()
    assert all(torch.equal(out[False][k], out[True][k]) for k in out[False])
