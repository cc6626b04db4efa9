"""FlexiGPT extension: layouts, sharing, identity at init, KV cache, save/load, CLI."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import make_model, manifest_for

from flexigpt.api.compression import compress as api_compress
from flexigpt.cli import main as cli_main
from flexigpt.cli.commands.extend import parse_span
from flexigpt.core.params import count_parameters
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.methods.flexigpt.extend import ExtendConfig, compress, extension_layout
from flexigpt.methods.sharing import OutputNorm, SharedLoRALinear
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.models import get_adapter

IDS = torch.randint(3, 300, (2, 24), generator=torch.Generator().manual_seed(1))


pytestmark = pytest.mark.usefixtures("single_thread")


def extended(kv_heads: int = 2, **options):
    model = make_model(layers=4, kv_heads=kv_heads)
    dense = copy.deepcopy(model)
    with torch.no_grad():
        result = compress(model, None, None, ExtendConfig(**options))
    return dense, result


def test_layouts():
    assert extension_layout(4, 6, "block") == [0, 1, 1, 2, 2, 3]  # default span: middle 2
    assert extension_layout(4, 6, "sequential") == [0, 1, 2, 1, 2, 3]
    assert extension_layout(4, 7, "block", [1, 3]) == [0, 1, 1, 1, 2, 2, 3]
    assert extension_layout(4, 7, "sequential", [1, 3]) == [0, 1, 2, 1, 2, 1, 3]
    assert extension_layout(4, 10, "block") == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    assert extension_layout(4, 10, "sequential") == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert len(extension_layout(22, 36, "block")) == 36
    assert extension_layout(22, 36, "sequential")[:22] == list(range(18)) + list(range(4, 8))
    with pytest.raises(ValueError, match="must exceed"):
        extension_layout(4, 4, "block")
    with pytest.raises(ValueError, match="exceeds"):
        extension_layout(4, 6, "block", [2, 5])


@pytest.mark.parametrize("options", [{"layers": None}, {"layers": 6, "pattern": "zigzag"},
                                     {"layers": 6, "span": [3, 1]}, {"layers": 6, "rank": 0},
                                     {"layers": 6, "gamma_init": float("nan")}])
def test_config_errors(options):
    with pytest.raises(ValueError):
        ExtendConfig(**options)


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("pattern", ["block", "sequential"])
def test_identity_at_init_depth_and_sharing(kv_heads, pattern):
    dense, result = extended(kv_heads, layers=7, pattern=pattern)
    model = result.model
    ad = get_adapter(model)
    blocks = ad.layers(model)
    layout = result.info["layout"]
    assert len(blocks) == 7 == model.config.num_hidden_layers == len(layout)
    assert torch.allclose(model(IDS).logits, dense(IDS).logits, atol=1e-6)
    first = {}
    for pos, src in enumerate(layout):
        assert ad.attn(blocks[pos]).layer_idx == pos
        if src not in first:
            first[src] = blocks[pos]
            assert not isinstance(ad.attn(blocks[pos]), OutputNorm)
            assert all(isinstance(m, torch.nn.Linear) for m in ad.block_linears(blocks[pos]).values())
            continue
        orig, rep = first[src], blocks[pos]
        assert isinstance(ad.attn(rep), OutputNorm) and isinstance(ad.mlp(rep), OutputNorm)
        for name, lin in ad.block_linears(rep).items():
            assert isinstance(lin, SharedLoRALinear)
            assert lin.base_layer is ad.block_linears(orig)[name]
            assert torch.count_nonzero(lin.lora_B) == 0
        own, base = ad.input_norm(rep).weight, ad.input_norm(orig).weight
        assert own.data_ptr() != base.data_ptr() and torch.equal(own, base)
    params = result.info["params"]
    n_rep = len(layout) - 4
    assert count_parameters(model) == params["unique"] == (
        params["dense"] + params["adapters"] + params["output_norms"] + n_rep * 2 * 64)


@pytest.mark.parametrize("pattern", ["block", "sequential"])
def test_generate_with_kv_cache_after_extension(pattern):
    _, result = extended(layers=7, pattern=pattern, gamma_init=0.5)
    model = result.model
    with torch.no_grad():  # make the repeats matter, so a cache-slot mix-up would show
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    prompt = IDS[:1, :6]
    cached = model.generate(prompt, max_new_tokens=8, do_sample=False)
    uncached = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False)
    assert cached.shape == (1, 14) and torch.equal(cached, uncached)


def test_save_load_roundtrip(tmp_path, tiny_tokenizer):
    _, result = extended(layers=6, pattern="sequential", gamma_init=0.3)
    model = result.model
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    save_compressed(model, tiny_tokenizer, manifest_for("flexigpt_extend", result.structure),
                    tmp_path / "e")
    loaded = load_compressed(tmp_path / "e")
    assert loaded.model.config.num_hidden_layers == 6
    assert torch.equal(loaded.model(IDS).logits, model(IDS).logits)


def test_api_and_cli(tiny_checkpoint, tmp_path, capsys):
    dense = make_model()
    out = tmp_path / "ext"
    rc = cli_main(["extend", "--model", str(tiny_checkpoint), "--layers", "6", "--pattern",
                   "block", "--span", "1:3", "--rank", "2", "--out", str(out)])
    assert rc == 0 and "4 -> 6 blocks" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] == "flexigpt_extend"
    assert manifest["config"]["span"] == [1, 3] and manifest["info"]["layout"] == [0, 1, 1, 2, 2, 3]
    assert set(manifest["structure"]["ranks"].values()) == {2}
    loaded = load_compressed(out)
    assert torch.allclose(loaded.model(IDS).logits, dense(IDS).logits, atol=1e-6)
    bad = tmp_path / "bad"
    with pytest.raises(ValueError, match="must exceed"):
        api_compress("flexigpt_extend", str(tiny_checkpoint), bad, options={"layers": 3})
    assert not bad.exists()
    with pytest.raises(ValueError, match="START:END"):
        parse_span("3")
