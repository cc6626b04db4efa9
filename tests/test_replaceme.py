"""ReplaceMe (baselines/replaceme) against independent restatements on tiny models: the
least-squares map equals a direct least-squares solve, the folded model's output on the
calibration inputs is the least-squares prediction, the span is the official angular-distance
choice (the saved model as a stock checkpoint: tests/test_checkpoints.py)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import make_model

from baselines.replaceme.config import ReplaceMeConfig
from baselines.replaceme.method import METHOD, span_length
from baselines.replaceme.span import angular_distances, choose_span, last_token_outputs
from baselines.replaceme.transform import (
    cosine_transform,
    lstsq_transform,
    mlp_writer,
    span_activations,
)
from flexigpt.core.params import count_parameters
from flexigpt.storage.models.adapters import get_adapter

pytestmark = pytest.mark.usefixtures("single_thread")

CALIB = torch.randint(3, 300, (6, 24), generator=torch.Generator().manual_seed(0))


def test_lstsq_equals_a_direct_least_squares_solve():
    g = torch.Generator().manual_seed(1)
    batches = [tuple(torch.randn(50, 16, generator=g, dtype=torch.float64) for _ in range(3))
               for _ in range(4)]
    t, fit = lstsq_transform(iter(batches))
    m = torch.cat([b[0] for b in batches])
    r = torch.cat([b[2] - b[1] + b[0] for b in batches])
    direct = torch.linalg.lstsq(m, r).solution
    assert torch.allclose(t, direct, atol=1e-10)
    assert fit["relative_residual"] == pytest.approx(
        float(torch.linalg.matrix_norm(m @ direct - r) / torch.linalg.matrix_norm(r)), rel=1e-8)
    assert fit["residual_identity"] == pytest.approx(
        float(torch.linalg.matrix_norm(m - r) / torch.linalg.matrix_norm(r)), rel=1e-8)
    ridge, _ = lstsq_transform(iter(batches), alpha=5.0)
    expected = torch.linalg.solve(m.T @ m + 5.0 * torch.eye(16, dtype=m.dtype), m.T @ r)
    assert torch.allclose(ridge, expected, atol=1e-10)


def test_span_is_the_lowest_angular_distance_after_block_zero():
    g = torch.Generator().manual_seed(2)
    outputs = torch.randn(8, 5, 12, generator=g)
    outputs[5] = outputs[3] * 2.0  # blocks 4 and 5 change nothing (direction kept)
    d = angular_distances(outputs, 2)
    assert d.shape == (6,) and float(d[3]) == pytest.approx(0.0, abs=1e-6)
    assert choose_span(d, 2) == (4, 6)
    manual = torch.stack([torch.arccos(torch.nn.functional.cosine_similarity(
        outputs[i].double(), outputs[i + 2].double(), dim=-1).clamp(-1, 1)).mean() / math.pi
        for i in range(6)])
    assert torch.allclose(d, manual)
    with pytest.raises(ValueError, match="span"):
        angular_distances(outputs, 8)


def test_last_block_is_scored_after_the_final_norm():
    model = make_model(layers=4)
    outputs = last_token_outputs(model, CALIB, batch_size=4)
    with torch.no_grad():
        hidden = model(CALIB, output_hidden_states=True).hidden_states
    assert torch.allclose(outputs[-1], hidden[-1][:, -1].float(), atol=1e-5)  # normed
    assert torch.allclose(outputs[1], hidden[2][:, -1].float(), atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_folded_block_outputs_the_least_squares_prediction(family):
    model = make_model(family, layers=6)
    dense = copy.deepcopy(model)
    cfg = ReplaceMeConfig(ratio=0.3)
    n, _ = span_length(model, cfg)
    with torch.no_grad():
        result = METHOD.compress(model, None, CALIB, cfg)
    start, end = result.info["removed_blocks"][0], result.info["removed_blocks"][-1] + 1
    assert end - start == n and start >= 1
    acts = list(span_activations(dense, CALIB, start, end, batch_size=4))
    t, _ = lstsq_transform(iter(acts))
    predicted = torch.cat([x - m + m @ t for m, x, _ in acts])
    adapter = get_adapter(result.model)
    before = adapter.layers(result.model)[start - 1]  # the block the map was folded into
    seen = []
    handle = before.register_forward_hook(
        lambda mod, args, out: seen.append((out[0] if isinstance(out, tuple) else out)
                                           .reshape(-1, predicted.shape[1])))
    with torch.no_grad():
        for first in range(0, CALIB.shape[0], 4):
            result.model(CALIB[first:first + 4])
    handle.remove()
    got = torch.cat(seen).double()
    assert torch.allclose(got, predicted, atol=2e-4 * float(predicted.abs().max()))
    assert len(adapter.layers(result.model)) == 6 - n
    assert count_parameters(result.model) == count_parameters(dense) - n * count_parameters(
        get_adapter(dense).layers(dense)[0])
    assert result.info["fit"]["relative_residual"] <= result.info["fit"]["residual_identity"]


def test_cosine_objective_lowers_its_loss_and_repeats():
    model = make_model(layers=6)
    acts = list(span_activations(model, CALIB, 2, 4, batch_size=3))
    t, fit = cosine_transform(iter(acts), epochs=3, lr=1e-3, batch=32, seed=0)
    again, _ = cosine_transform(iter(acts), epochs=3, lr=1e-3, batch=32, seed=0)
    assert torch.equal(t, again) and t.shape == (64, 64)
    assert fit["cosine_loss"] < fit["cosine_loss_identity"]
    assert mlp_writer(get_adapter(model), get_adapter(model).layers(model)[1]).out_features == 64


@pytest.mark.parametrize("bad,match", [({"objective": "adam"}, "objective"),
                                       ({"alpha": -1.0}, "alpha"), ({"ratio": 1.2}, "ratio"),
                                       ({"batch_size": 0}, "batch_size")])
def test_config_rejects_bad_options(bad, match):
    with pytest.raises(ValueError, match=match):
        ReplaceMeConfig(**bad)
