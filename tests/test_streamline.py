"""LLM-Streamline (baselines/streamline) against independent restatements on tiny models:
the span similarity equals one computed from transformers' own hidden states, the fit
lowers the MSE of the span's replacement, and the parameter count follows the block-count
rule with the module counted (the saved model: tests/test_checkpoints.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_model

from baselines.streamline.config import StreamlineConfig
from baselines.streamline.method import METHOD, span_length
from baselines.streamline.modules import StreamlineFFN
from baselines.streamline.span import choose_span, span_similarities
from baselines.streamline.train import lr_at, span_pairs
from flexigpt.core.params import count_parameters
from flexigpt.storage.models.adapters import get_adapter

pytestmark = pytest.mark.usefixtures("single_thread")

CALIB = torch.randint(3, 300, (6, 24), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_similarity_equals_one_from_transformers_hidden_states(family):
    model = make_model(family, layers=5)
    got = span_similarities(model, CALIB, 2, batch_size=4)
    with torch.no_grad():
        hidden = model(CALIB, output_hidden_states=True).hidden_states  # h_0 … h_L (normed)
    manual = torch.stack([(0.5 + 0.5 * torch.nn.functional.cosine_similarity(
        hidden[j].double(), hidden[j + 2].double(), dim=-1)).mean() for j in range(4)])
    assert torch.allclose(got, manual, atol=1e-6)
    assert choose_span(got, 2) == (int(torch.argmax(manual)), int(torch.argmax(manual)) + 2)


@pytest.mark.parametrize("module", ["block", "ffn"])
def test_compress_fits_the_span_and_counts_the_module(module):
    model = make_model(layers=6)
    dense = copy.deepcopy(model)
    cfg = StreamlineConfig(ratio=0.3, module=module, epochs=3, lr=1e-3, min_lr=1e-4)
    n, expected = span_length(model, cfg)
    with torch.no_grad():
        result = METHOD.compress(model, None, CALIB, cfg)
    start, end = result.info["span"]
    assert end - start == n
    fit = result.info["fit"]
    assert fit["mse_after"] < fit["mse_before"] and fit["steps"] == 3 * 2
    per_block = count_parameters(get_adapter(dense).layers(dense)[0])
    added = per_block if module == "block" else StreamlineFFN.parameter_count(64)
    assert count_parameters(result.model) == count_parameters(dense) - n * per_block + added
    assert len(get_adapter(result.model).layers(result.model)) == 6 - n + 1
    # the model's block at `start` maps the span's input as the fitted module does
    inputs, _, kwargs = span_pairs(dense, CALIB, start, end, batch_size=4)
    replaced = get_adapter(result.model).layers(result.model)[start]
    seen = []
    handle = replaced.register_forward_pre_hook(lambda mod, args, kw: seen.append(
        args[0] if args else kw["hidden_states"]), with_kwargs=True)
    with torch.no_grad():
        logits = result.model(CALIB[:4]).logits
    handle.remove()
    assert torch.allclose(seen[0], inputs[:4], atol=1e-5) and torch.isfinite(logits).all()


def test_schedule_warms_up_then_decays_to_min_lr():
    cfg = StreamlineConfig(lr=2e-4, min_lr=5e-5)
    lrs = [lr_at(s, 200, cfg) for s in range(200)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[1] == pytest.approx(2e-4)  # 2 warm-up steps
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))
    assert lrs[-1] == pytest.approx(5e-5, rel=1e-3)


@pytest.mark.parametrize("bad,match", [({"module": "lstm"}, "module"),
                                       ({"lr": 1e-5, "min_lr": 1e-4}, "min_lr"),
                                       ({"epochs": 0}, "epochs"), ({"ratio": 0.0}, "ratio")])
def test_config_rejects_bad_options(bad, match):
    with pytest.raises(ValueError, match=match):
        StreamlineConfig(**bad)
