"""FlexiGPT pruning: sharing wrappers, base selection, replacement blocks, accounting, I/O."""

from __future__ import annotations

import copy
import gc
import json
import weakref

import pytest
import torch
from conftest import make_model, manifest_for

from flexigpt.api.compression import compress as api_compress
from flexigpt.core.params import count_parameters
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.methods.flexigpt.base_selection import select_bases
from flexigpt.methods.flexigpt.prune import FlexiGPTConfig, compress
from flexigpt.methods.sharing import FORWARD_MODES, OutputNorm, SharedLoRALinear, set_forward_mode
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.models import UnsupportedArchitectureError, get_adapter

CALIB = torch.randint(3, 300, (4, 32), generator=torch.Generator().manual_seed(0))


pytestmark = pytest.mark.usefixtures("single_thread")


def pruned_model(kv_heads: int = 2, layers: int = 6, **options):
    model = make_model(layers=layers, kv_heads=kv_heads)
    dense = copy.deepcopy(model)
    with torch.no_grad():
        result = compress(model, None, CALIB, FlexiGPTConfig(**{"ratio": 0.5, **options}))
    return dense, result


# ---- wrappers -------------------------------------------------------------------------------
def test_shared_lora_linear_modes_and_output_norm():
    torch.manual_seed(0)
    base = torch.nn.Linear(16, 24)
    layer = SharedLoRALinear(base, torch.randn(3, 16), torch.randn(24, 3))
    assert layer.get_base_layer() is base and layer.weight is base.weight
    expected = base(x := torch.randn(2, 700, 16)) + x @ (layer.lora_B @ layer.lora_A).T
    for mode in FORWARD_MODES:
        assert set_forward_mode(layer, mode) == 1
        assert torch.allclose(layer(x), expected, atol=1e-5), mode
        assert torch.allclose(layer(x[:, :2]), expected[:, :2], atol=1e-5), mode
    with pytest.raises(ValueError, match="lora_B must be"):
        SharedLoRALinear(base, torch.randn(3, 16), torch.randn(16, 3))

    inner = torch.nn.Linear(8, 8)
    norm = OutputNorm(inner, 8, gamma_init=0.5)
    h = inner(y := torch.randn(3, 8))
    manual = (h - h.mean(-1, keepdim=True)) / h.std(-1, unbiased=False, keepdim=True) * 0.5
    assert torch.allclose(norm(y), manual, atol=1e-4)
    assert norm.in_features == 8  # attribute delegation to the wrapped module


def test_output_norm_tuple_passthrough():
    class Pair(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x), "aux"

    wrapped = OutputNorm(Pair(), 8, gamma_init=2.0)
    out, aux = wrapped(torch.randn(2, 8))
    assert aux == "aux" and torch.allclose(out.std(-1, unbiased=False), torch.full((2,), 2.0),
                                           atol=1e-3)


# ---- replacement blocks -----------------------------------------------------------------------
@pytest.mark.parametrize("kv_heads", [4, 2])  # MHA, GQA
def test_sharing_storage_and_isolated_training(kv_heads):
    dense, result = pruned_model(kv_heads)
    model, base_map = result.model, {int(i): j for i, j in result.info["base_map"].items()}
    ad = get_adapter(model)
    blocks = ad.layers(model)
    assert len(blocks) == 6 and len(base_map) == 3
    for i, j in base_map.items():
        for name, lin in ad.block_linears(blocks[i]).items():
            base = ad.block_linears(blocks[j])[name]
            assert isinstance(lin, SharedLoRALinear) and lin.base_layer is base
            assert lin.base_layer.weight.data_ptr() == base.weight.data_ptr()
    first, *others = sorted(base_map)
    for p in model.parameters():
        p.requires_grad_(False)
    trained = [p for n, p in blocks[first].named_parameters() if "lora_" in n or "gamma" in n]
    for p in trained:
        p.requires_grad_(True)
    before = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    opt = torch.optim.AdamW(trained, lr=1e-2)
    for _ in range(3):
        loss = model(input_ids=CALIB[:2], labels=CALIB[:2]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = dict(model.named_parameters(remove_duplicate=False))
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.startswith(f"model.layers.{first}.") for n in changed)
    assert not any("base_layer" in n for n in changed)


@pytest.mark.parametrize("kv_heads,svd_dtype", [(4, "float32"), (2, "float64")])
def test_full_rank_replacement_reproduces_pruned_blocks(kv_heads, svd_dtype):
    dense, result = pruned_model(kv_heads, rank=10_000, output_norm=False, svd_dtype=svd_dtype)
    outputs: dict[str, dict[int, torch.Tensor]] = {"dense": {}, "pruned": {}}
    for key, model in (("dense", dense), ("pruned", result.model)):
        for i, block in enumerate(get_adapter(model).layers(model)):
            block.register_forward_hook(
                lambda m, a, o, i=i, key=key: outputs[key].__setitem__(i, o))
        model(CALIB[:2])
    for i in result.info["pruned_blocks"]:
        assert torch.allclose(outputs["pruned"][i], outputs["dense"][i], atol=1e-4), i
    assert max(v for r in result.info["svd_init_residual"].values() for v in r.values()) < 1e-5


def test_pruned_weights_are_dropped():
    model = make_model(layers=6)
    refs = [weakref.ref(lin) for b in get_adapter(model).layers(model)
            for lin in get_adapter(model).block_linears(b).values()]
    with torch.no_grad():
        result = compress(model, None, CALIB, FlexiGPTConfig(ratio=0.5))
    gc.collect()
    alive = [r for r in refs if r() is not None]
    assert len(alive) == 7 * 3  # the 3 unpruned blocks' linears only
    names = list(result.model.state_dict())
    for i in result.info["pruned_blocks"]:
        own = [n for n in names if n.startswith(f"model.layers.{i}.") and n.endswith("proj.weight")
               and "base_layer" not in n]
        assert own == []


# ---- base selection ----------------------------------------------------------------------------
def _trunc(w: torch.Tensor, r: int) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    return u[:, :r] @ torch.diag(s[:r]) @ vh[:r]


@pytest.mark.parametrize("metric", ["lowrank", "full", "frobenius"])
def test_base_selection_matches_eq2(metric):
    model = make_model(layers=6)
    ad = get_adapter(model)
    blocks = ad.layers(model)
    pruned, ranks = [1, 4], {n: 5 for n in ad.linear_names()}
    sel = select_bases(blocks, ad, pruned, ranks, metric, torch.float64, progress=False)
    assert set(sel.base_map) == set(pruned)
    assert all(j not in pruned for j in sel.base_map.values())
    d = sel.distances
    assert torch.isnan(d[[0, 2, 3, 5]]).all() and torch.isnan(d[:, pruned]).all()
    for i, j in [(1, 0), (1, 5), (4, 3)]:
        total = 0.0
        for name in ad.linear_names():
            wi = ad.block_linears(blocks[i])[name].weight.detach().double()
            wj = ad.block_linears(blocks[j])[name].weight.detach().double()
            if metric == "lowrank":  # Eq. 2 with explicit SVDs
                wi_hat, wj_hat = _trunc(wi, 5), _trunc(wj, 5)
                total += float(torch.linalg.norm(wi_hat - (wj_hat + _trunc(wi_hat - wj_hat, 5))))
            elif metric == "full":
                total += float(torch.linalg.norm(wi - (wj + _trunc(wi - wj, 5))))
            else:
                total += float(torch.linalg.norm(wi - wj))
        assert d[i, j].item() == pytest.approx(total, rel=1e-6)
    for i in pruned:
        row = d[i].clone()
        row[torch.isnan(row)] = float("inf")
        assert sel.base_map[i] == int(torch.argmin(row))
    json.dumps(sel.matrix_json())


# ---- parameter accounting ----------------------------------------------------------------------
# make_model(layers=8): hidden 64, intermediate 128, 4 heads / 2 KV heads (head_dim 16), vocab 300,
# tied embeddings. Per block: q 64·64 + k 32·64 + v 32·64 + o 64·64 + 3·128·64 = 36864 linear
# params and 2·64 = 128 norm params. Dense: 300·64 + 64 + 8·(36864 + 128) = 315200.
# Rank hidden/16 = 4: adapters 4·(128 + 96 + 96 + 128 + 192 + 192 + 192) = 4096; γ's 2·64 = 128.
DENSE, LINEAR, NORMS, ADAPTERS, GAMMAS = 315200, 36864, 128, 4096, 128


@pytest.mark.parametrize("policy,prenorm,ratio,k", [
    ("paper", "copy", 0.3, 2),     # int(0.3·8) = 2
    ("matched", "copy", 0.3, 3),   # net 32640/block: 2 → 0.207, 3 → 0.311 nearest to 0.3
    ("matched", "share", 0.3, 3),  # net 32768/block: 2 → 0.208, 3 → 0.312
    ("matched", "copy", 0.4, 4),   # 3 → 0.311, 4 → 0.414
])
def test_parameter_counts_and_policies(policy, prenorm, ratio, k):
    model = make_model(layers=8)
    assert count_parameters(model) == DENSE
    with torch.no_grad():
        result = compress(model, None, CALIB, FlexiGPTConfig(ratio=ratio, policy=policy,
                                                             prenorm=prenorm))
    net = LINEAR - ADAPTERS - GAMMAS + (NORMS if prenorm == "share" else 0)
    assert result.info["k"] == k == len(result.info["pruned_blocks"])
    counted = count_parameters(result.model)
    assert counted == DENSE - k * net == result.info["params"]["unique"]
    assert result.info["params"]["adapters"] == k * ADAPTERS
    naive = sum(p.numel() for _, p in result.model.named_parameters(remove_duplicate=False))
    assert naive > counted  # shared linears appear twice by name, once in the count
    if policy == "matched":  # the shared rule: nearest achieved ratio
        assert all(abs(k * net / DENSE - ratio) <= abs(j * net / DENSE - ratio)
                   for j in range(1, 8))


# ---- save / load / manifest --------------------------------------------------------------------
def test_save_load_identical_logits_and_size(tmp_path, tiny_tokenizer):
    dense, result = pruned_model(layers=8, rank=8)
    model = result.model
    with torch.no_grad():  # make every trainable part non-trivial before the round trip
        for n, p in model.named_parameters():
            if "lora_" in n or "gamma" in n:
                p.add_(0.01 * torch.randn_like(p))
    save_compressed(dense, tiny_tokenizer, manifest_for(), tmp_path / "d")
    manifest = save_compressed(model, tiny_tokenizer,
                               manifest_for("flexigpt", result.structure, result.info),
                               tmp_path / "c")
    loaded = load_compressed(tmp_path / "c")
    assert torch.equal(loaded.model(CALIB).logits, model(CALIB).logits)
    assert loaded.manifest.to_dict() == json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert loaded.manifest.structure == manifest.structure
    size_d = (tmp_path / "d" / "model.safetensors").stat().st_size
    size_c = (tmp_path / "c" / "model.safetensors").stat().st_size
    param_ratio = count_parameters(model) / count_parameters(dense)
    assert size_c / size_d == pytest.approx(param_ratio, abs=0.02) and param_ratio < 0.7
    out = loaded.model.generate(CALIB[:1, :5], max_new_tokens=6, do_sample=False)
    ref = loaded.model.generate(CALIB[:1, :5], max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(out, ref) and out.shape == (1, 11)


def test_api_compress_manifest_roundtrip(tiny_checkpoint, text_file, tmp_path):
    out = tmp_path / "flexi"
    manifest = api_compress("flexigpt", str(tiny_checkpoint), out,
                            options={"ratio": 0.5, "policy": "paper", "rank": 4},
                            calibration=str(text_file), n_calibration=4, calibration_seq_len=32)
    assert json.loads((out / "manifest.json").read_text()) == manifest.to_dict()
    info, cfg = manifest.info, manifest.config
    assert cfg == {**FlexiGPTConfig().__dict__, "ratio": 0.5, "rank": 4}
    assert len(info["block_influence"]) == 4 and info["k"] == 2
    assert len(info["distance_matrix"]) == 4 and info["recovery"]["recipe"] == "flexigpt"
    assert info["recovery"]["trainable_params"] == sum(  # the budget baselines are matched to
        p.numel() for n, p in load_compressed(out).model.named_parameters()
        if n.rsplit(".", 1)[-1] in ("lora_A", "lora_B", "gamma"))
    assert manifest.parameters.compressed == info["params"]["unique"]
    loaded = load_compressed(out)
    assert loaded.manifest.structure["pruned_blocks"] == info["pruned_blocks"]
    assert torch.isfinite(loaded.model(CALIB).logits).all()


# ---- bad input -----------------------------------------------------------------------------------
def _assert_clean(parent, out):
    assert not out.exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{out.name}")]


@pytest.mark.parametrize("options,match", [
    ({"ratio": 0.0}, "strictly between 0 and 1"),
    ({"ratio": 1.0}, "strictly between 0 and 1"),
    ({"ratio": -0.2}, "strictly between 0 and 1"),
    ({"ratio": 0.1}, "removes int"),
    ({"ratio": 0.9, "policy": "matched"}, "out of reach"),
    ({"ratio": 0.3, "policy": "greedy"}, "policy must be one of"),
    ({"ratio": 0.3, "rank": 0}, "rank must be"),
    ({"ratio": 0.3, "distance": "cosine"}, "distance must be one of"),
])
def test_bad_options_leave_no_output(tiny_checkpoint, text_file, tmp_path, options, match):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=match):
        api_compress("flexigpt", str(tiny_checkpoint), out, options=options,
                     calibration=str(text_file), n_calibration=4, calibration_seq_len=32)
    _assert_clean(tmp_path, out)


@pytest.mark.parametrize("content,match", [("", "empty"), ("too short.\n", "too short")])
def test_bad_calibration_leaves_no_output(tiny_checkpoint, tmp_path, content, match):
    calib = tmp_path / "calib.txt"
    calib.write_text(content)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=match):
        api_compress("flexigpt", str(tiny_checkpoint), out, options={"ratio": 0.5},
                     calibration=str(calib), n_calibration=4, calibration_seq_len=32)
    _assert_clean(tmp_path, out)


def test_unsupported_architecture_leaves_no_output(tmp_path, text_file, tiny_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    ckpt = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=300)).save_pretrained(ckpt)
    tiny_tokenizer.save_pretrained(ckpt)
    out = tmp_path / "out"
    with pytest.raises(UnsupportedArchitectureError, match="gpt2"):
        api_compress("flexigpt", str(ckpt), out, options={"ratio": 0.5},
                     calibration=str(text_file), n_calibration=4, calibration_seq_len=32)
    _assert_clean(tmp_path, out)
