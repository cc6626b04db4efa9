"""LinearPatch (baselines/linearpatch): the official span criterion and channel scales, the
Hadamard matrices, the patch as the official forward hook, the block-count rule, checkpoints.
(The generic contracts, family support, fast scorer, remote-code checkpoints, run on it as on
every registered method.)"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_model

from baselines.linearpatch.config import LinearPatchConfig
from baselines.linearpatch.hadamard import hadamard
from baselines.linearpatch.method import METHOD, span_length
from baselines.linearpatch.replay import LinearPatchLayer
from baselines.linearpatch.span import (
    candidate_starts,
    channel_scales,
    choose_span,
    patch_matrix,
    span_similarities,
)
from flexigpt.core.params import count_parameters
from flexigpt.storage.models.adapters import get_adapter

pytestmark = pytest.mark.usefixtures("single_thread")

WINDOWS = torch.randint(3, 300, (5, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("n", [1, 2, 12, 20, 36, 40, 64, 576, 640, 4096])
def test_hadamard_is_orthonormal_with_equal_magnitude_entries(n):
    h = hadamard(n)
    assert torch.allclose(h @ h.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(h.abs(), torch.full((n, n), n ** -0.5, dtype=torch.float64))


@pytest.mark.parametrize("n,message", [(3, "order 3"), (6, "order 6"), (0, "positive order")])
def test_hadamard_refuses_an_order_it_cannot_build(n, message):
    with pytest.raises(ValueError, match=message):
        hadamard(n)


def _inputs(model, windows):
    """``x_i`` (the input of block i) ``[N, T, D]`` for every block, window by window."""
    with torch.no_grad():
        out = [model(w[None], output_hidden_states=True).hidden_states for w in windows]
    return [torch.cat([o[i] for o in out]) for i in range(len(out[0]) - 1)]


def test_span_criterion_is_the_official_one_window_by_window():
    """Per window (the official batch of one) ``torch.cosine_similarity(x_i, x_{i+n})`` with
    its default dim=1 (the sequence axis of [B, T, D]), averaged; starts 1 … L − n − 1."""
    model = make_model(layers=8)
    xs = _inputs(model, WINDOWS)
    found = span_similarities(model, WINDOWS, 3, batch_size=2)
    assert list(found) == [1, 2, 3, 4] == list(candidate_starts(8, 3))
    for i, value in found.items():
        official = sum(float(torch.cosine_similarity(xs[i][k:k + 1].double(),
                                                     xs[i + 3][k:k + 1].double()).mean())
                       for k in range(len(WINDOWS))) / len(WINDOWS)
        assert value == pytest.approx(official, rel=1e-9, abs=1e-12)
    assert span_similarities(model, WINDOWS, 3, batch_size=5) == pytest.approx(found)
    start, end = choose_span(found, 3)
    assert found[start] == max(found.values()) and end == start + 3


def test_candidates_never_remove_the_first_or_last_block():
    assert list(candidate_starts(6, 1)) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="never block 0 nor the last"):
        candidate_starts(6, 5)
    assert choose_span({1: 0.5, 2: 0.5, 3: 0.1}, 2) == (1, 3)  # ties: the lowest start


@pytest.mark.parametrize("rotate", [True, False])
def test_scales_and_patch(rotate):
    model = make_model(layers=6)
    xs = _inputs(model, WINDOWS)
    h = hadamard(64) if rotate else torch.eye(64, dtype=torch.float64)
    expected = sum((xs[4][k].double() @ h).abs().mean(0) / (xs[1][k].double() @ h).abs().mean(0)
                   for k in range(len(WINDOWS))) / len(WINDOWS)
    scales = channel_scales(model, WINDOWS, 1, 4, rotate, batch_size=3)
    assert torch.allclose(scales, expected, rtol=1e-10)
    p = patch_matrix(scales, rotate)
    assert torch.allclose(p, h @ torch.diag(scales) @ h.T, atol=1e-12)
    assert torch.allclose(p, p.T)


@pytest.mark.parametrize("rotate", [True, False])
def test_compressed_model_is_the_official_hook_on_the_pruned_model(rotate):
    """The patch layer at the span's start computes what the official forward hook (the
    output of block start − 1 times P, the span's blocks removed) computes."""
    dense = make_model(layers=8)
    cfg = LinearPatchConfig(ratio=0.3, rotate=rotate, batch_size=2)
    result = METHOD.compress(copy.deepcopy(dense), None, WINDOWS, cfg)
    start, end = result.structure["span"]
    assert 1 <= start < end <= 7 and result.model.config.num_hidden_layers == 8 - (end - start) + 1
    patch = get_adapter(result.model).layers(result.model)[start]
    assert isinstance(patch, LinearPatchLayer)
    p = patch.patch.weight if rotate else torch.diag(patch.scale)

    official = copy.deepcopy(dense)
    adapter = get_adapter(official)
    blocks = list(adapter.layers(official))
    adapter.set_layers(official, [*blocks[:start], *blocks[end:]])

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        patched = hidden @ p
        return (patched, *output[1:]) if isinstance(output, tuple) else patched

    adapter.layers(official)[start - 1].register_forward_hook(hook)
    ids = WINDOWS[:2]
    with torch.no_grad():
        ours, theirs = result.model(ids).logits, official(ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_block_count_charges_the_patch():
    model = make_model(layers=8, hidden=64)
    per_block = count_parameters(get_adapter(model).layers(model)[0])
    for rotate, added in ((True, 64 * 64), (False, 64)):
        cfg = LinearPatchConfig(ratio=0.3, rotate=rotate)
        n, achieved = span_length(model, cfg)
        dense = count_parameters(model)
        assert achieved == pytest.approx(1 - (dense - n * per_block + added) / dense)
        result = METHOD.compress(copy.deepcopy(model), None, WINDOWS, cfg)
        assert count_parameters(result.model) == dense - n * per_block + added


def test_bad_options_and_structures_are_refused():
    with pytest.raises(ValueError, match="rotate"):
        LinearPatchConfig(rotate="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        LinearPatchConfig(batch_size=0)
    config = make_model(layers=6).config
    config.num_hidden_layers = 4
    with pytest.raises(ValueError, match="keep block 0"):
        METHOD.check_structure({"span": [0, 3], "rotate": True, "dense_blocks": 6}, config)
    with pytest.raises(ValueError, match="rotate"):
        METHOD.check_structure({"span": [1, 4], "rotate": 1, "dense_blocks": 6}, config)
    METHOD.check_structure({"span": [1, 4], "rotate": True, "dense_blocks": 6}, config)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_tokenizer, text_file):
    """The tiny Llama compressed by LinearPatch through the API (published: remote code)."""
    from flexigpt.api.compression import compress

    root = tmp_path_factory.mktemp("lp")
    make_model().save_pretrained(root / "dense")
    tiny_tokenizer.save_pretrained(root / "dense")
    compress("linearpatch", str(root / "dense"), root / "linearpatch", options={"ratio": 0.3},
             calibration=str(text_file), n_calibration=4, calibration_seq_len=32)
    return root / "linearpatch"


def _auto(path, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).eval()


def test_saved_model_reloads_and_loads_in_plain_transformers_exactly(saved):
    """Reloads to identical outputs; plain transformers loads it through the assembled
    remote code (its fragment) to the same logits, refuses it without trust_remote_code, and
    decodes with a KV cache as without."""
    from flexigpt.storage.artifacts import load_compressed

    loaded = load_compressed(saved)
    assert loaded.manifest.method == "linearpatch" and loaded.manifest.structure["rotate"]
    ids = WINDOWS[:2, :12]
    with torch.no_grad():
        ref = loaded.model(ids).logits
        assert torch.equal(load_compressed(saved).model(ids).logits, ref)
        remote = _auto(saved, trust_remote_code=True)
        assert torch.equal(remote(ids).logits, ref)
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        _auto(saved, trust_remote_code=False)
    prompt = ids[:1, :5]
    cached = remote.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True)
    plain = remote.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)
