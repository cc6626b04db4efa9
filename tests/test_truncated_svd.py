"""Top-r SVD solvers (flexigpt.methods.truncated_svd): the exact one is the old thin SVD bit
for bit, the randomized one is accurate on decaying spectra, reports its own residual
exactly and repeats itself; FlexiGPT's choices do not depend on the solver."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import load_benchmark, make_model

from flexigpt.methods.flexigpt.base_selection import truncations
from flexigpt.methods.flexigpt.prune import FlexiGPTConfig, compress
from flexigpt.methods.truncated_svd import AUTO_MIN_SIDE, resolve, thin_svd, top_svd

pytestmark = pytest.mark.usefixtures("single_thread")


def decaying(m: int, n: int, batch: tuple[int, ...] = (), decay: float = 0.9,
             seed: int = 0) -> torch.Tensor:
    """``[*batch, m, n]`` with singular values ``decay**k`` (random singular vectors)."""
    g = torch.Generator().manual_seed(seed)
    k = min(m, n)
    u = torch.linalg.qr(torch.randn(*batch, m, k, generator=g, dtype=torch.float64)).Q
    v = torch.linalg.qr(torch.randn(*batch, n, k, generator=g, dtype=torch.float64)).Q
    s = decay ** torch.arange(k, dtype=torch.float64)
    return (u * s) @ v.mT


def test_exact_is_the_thin_svd_bit_for_bit():
    a = torch.randn(3, 40, 70, generator=torch.Generator().manual_seed(1))
    u, s, vh = thin_svd(a)
    top = top_svd(a, 5, "exact")
    assert torch.equal(top.u, u[..., :5]) and torch.equal(top.s, s[..., :5])
    assert torch.equal(top.vh, vh[..., :5, :])
    assert torch.equal(top.tail, s.double().pow(2)[..., 5:].sum(-1))
    assert torch.equal(top_svd(a, 999, "exact").s, s)  # rank clamped to min(m, n)


@pytest.mark.parametrize("shape", [(300, 200), (200, 300), (2, 256, 128)])
def test_randomized_matches_exact_on_a_decaying_spectrum(shape):
    a = decaying(*shape[-2:], batch=tuple(shape[:-2]))
    exact, approx = top_svd(a, 12, "exact"), top_svd(a, 12, "randomized")
    assert approx.u.shape == exact.u.shape and approx.vh.shape == exact.vh.shape
    # subspace iteration converges as (σ_2r / σ_r)^(2q+1) = 0.9^(12·9) ≈ 1e-5 here
    assert torch.allclose(approx.s, exact.s, rtol=1e-8)
    rebuilt = (approx.u * approx.s[..., None, :]) @ approx.vh
    assert torch.allclose(rebuilt, (exact.u * exact.s[..., None, :]) @ exact.vh, atol=1e-4)
    # tail is the residual of the returned factors, exactly
    assert torch.allclose(approx.tail, (a - rebuilt).pow(2).sum((-2, -1)), rtol=1e-9)
    assert torch.allclose(approx.tail, exact.tail, rtol=1e-6)
    again = top_svd(a, 12, "randomized")
    assert torch.equal(again.u, approx.u) and torch.equal(again.s, approx.s)


def test_randomized_error_on_a_flat_spectrum_is_bounded():
    """Worst case (a Gaussian matrix): the truncation error stays within the stated bound's
    reach, a few per cent of the optimal residual at most."""
    a = torch.randn(512, 384, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    exact, approx = top_svd(a, 24, "exact"), top_svd(a, 24, "randomized")
    excess = float(approx.tail.sqrt() / exact.tail.sqrt() - 1)
    assert 0 <= excess < 0.02, excess


def test_solver_resolution():
    assert resolve("auto", (576, 1536), 36) == "exact"  # SmolLM2-135M stays exact
    assert resolve("auto", (AUTO_MIN_SIDE, 4 * AUTO_MIN_SIDE), 64) == "randomized"
    assert resolve("randomized", (576, 576), 36) == "randomized"
    assert resolve("randomized", (256, 2048), 128) == "exact"  # sketch ≥ half the side
    assert resolve("exact", (4096, 4096), 256) == "exact"
    with pytest.raises(ValueError, match="svd must be one of"):
        resolve("lanczos", (8, 8), 2)
    with pytest.raises(ValueError, match="svd must be one of"):
        FlexiGPTConfig(svd="lanczos")


def test_truncations_exact_unchanged_and_randomized_close():
    w = decaying(96, 64, batch=(5,), decay=0.8).float()
    us, v = truncations(w, 6, torch.float32, solver="exact")
    u, s, vh = thin_svd(w)
    assert torch.equal(us, u[..., :6] * s[..., None, :6]) and torch.equal(v, vh[..., :6, :].mT)
    us_r, v_r = truncations(w, 6, torch.float32, solver="randomized")
    assert torch.allclose(us_r @ v_r.mT, us @ v.mT, atol=1e-5)


def near_copies() -> torch.nn.Module:
    """A 6-block random model whose blocks 1 and 4 are near copies of blocks 0 and 5."""
    from flexigpt.storage.models.adapters import get_adapter

    model = make_model(layers=6, kv_heads=2)
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for copy_, source in ((1, 0), (4, 5)):
            for name, lin in adapter.block_linears(blocks[copy_]).items():
                src = adapter.block_linears(blocks[source])[name].weight
                lin.weight.copy_(src + 1e-3 * torch.randn(src.shape, generator=g))
    return model


def test_flexigpt_choices_and_init_do_not_depend_on_the_solver():
    """Blocks 1 and 4 are near copies of blocks 0 and 5 and have the lowest Block Influence:
    both solvers must choose those bases (random weights have flat spectra, where nothing
    else separates the candidates) and give close SVD-init residuals."""
    model = near_copies()
    calib = torch.randint(3, 300, (4, 32), generator=torch.Generator().manual_seed(0))
    results = {}
    for solver in ("exact", "randomized"):
        cfg = FlexiGPTConfig(ratio=0.34, policy="paper", svd=solver, rank=4,
                             bi_scores=[1.0, 0.1, 1.0, 1.0, 0.1, 1.0])
        with torch.no_grad():
            results[solver] = compress(copy.deepcopy(model), None, calib, cfg)
    exact, approx = results["exact"].info, results["randomized"].info
    assert exact["pruned_blocks"] == approx["pruned_blocks"] == [1, 4]
    assert exact["base_map"] == approx["base_map"] == {"1": 0, "4": 5}
    for block, names in exact["svd_init_residual"].items():
        for name, residual in names.items():
            assert approx["svd_init_residual"][block][name] == pytest.approx(residual, abs=0.02)


@pytest.mark.parametrize("margin", [0.0, 1e6])
def test_close_calls_of_a_randomized_truncation_are_rechecked_exactly(margin, monkeypatch):
    """Random weights: every candidate is about equally far, so a randomized truncation may
    order them differently. With the margin wide enough to recheck every candidate, the
    choice and the distances are exactly the exact solver's; with no margin nothing is
    rechecked (no exact ties between approximate distances)."""
    from flexigpt.methods.flexigpt import base_selection
    from flexigpt.storage.models.adapters import get_adapter

    model = make_model(layers=6, kv_heads=2)
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    ranks = {name: 4 for name in adapter.linear_names()}
    pruned = [1, 3, 4]
    exact = base_selection.select_bases(blocks, adapter, pruned, ranks, solver="exact",
                                        progress=False)
    assert exact.rechecked == {} and "recheck" not in exact.timings
    monkeypatch.setattr(base_selection, "RECHECK_MARGIN", margin)
    approx = base_selection.select_bases(blocks, adapter, pruned, ranks, solver="randomized",
                                         progress=False)
    if margin == 0.0:
        assert approx.rechecked == {}
        return
    assert approx.rechecked == {i: [0, 2, 5] for i in pruned}
    assert approx.base_map == exact.base_map
    for i in pruned:  # the rechecked distances are the exact solver's to fp rounding
        torch.testing.assert_close(approx.distances[i], exact.distances[i], equal_nan=True,
                                   rtol=1e-6, atol=1e-9)


def test_margins_of_decided_choices():
    """bench_truncated_svd's step 4 on near copies (blocks 1 and 4 of 0 and 5): the exact
    margins are wide, the randomized distances (no recheck) choose the same bases, and the
    distances it compares against are those of the exact run, entry for entry."""
    from flexigpt.methods.flexigpt.base_selection import candidate_distances
    from flexigpt.storage.models.adapters import get_adapter

    model = near_copies()
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    cfg = FlexiGPTConfig(ratio=0.34, policy="paper", svd="exact", rank=4,
                         bi_scores=[1.0, 0.1, 1.0, 1.0, 0.1, 1.0])
    with torch.no_grad():
        info = compress(copy.deepcopy(model), None, None, cfg).info
    out = load_benchmark("bench_truncated_svd").margins(model, info, "tiny")
    assert out["pruned_blocks"] == [1, 4]
    assert [(r["exact_base"], r["randomized_base"]) for r in out["rows"]] == [(0, 0), (5, 5)]
    assert out["randomized_argmin_agrees"] == 2
    for r in out["rows"]:
        assert r["margin"] > 1.0 and r["range"] >= r["margin"]  # a near copy is far closer
        assert r["error_max"] < r["margin"]
    assert set(out["spectral_gap"]) == set(adapter.linear_names())
    exact, _ = candidate_distances(blocks, adapter, [1, 4], [0, 2, 3, 5], info["distance_ranks"],
                                   progress=False)
    assert exact.tolist() == [[info["distance_matrix"][i][j] for j in (0, 2, 3, 5)]
                              for i in (1, 4)]


@pytest.mark.parametrize("margin", [0.0, 1e6])
def test_auto_probe_decomposes_exactly_when_every_candidate_is_a_close_call(margin, monkeypatch):
    """``auto`` probes its first randomized matrix kind: with every candidate inside the
    recheck margin (margin 1e6) it decomposes everything exactly (bit for bit the exact
    selection, no recheck); otherwise (margin 0) it keeps the probe's distances and equals the
    randomized solver's selection bit for bit (the probe is the first kind, so the sums run in
    the same order)."""
    from flexigpt.methods import truncated_svd
    from flexigpt.methods.flexigpt import base_selection
    from flexigpt.storage.models.adapters import get_adapter

    model = make_model(layers=6, kv_heads=2)
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    ranks = {name: 4 for name in adapter.linear_names()}
    pruned = [1, 3, 4]
    monkeypatch.setattr(truncated_svd, "AUTO_MIN_SIDE", 8)  # auto truncates tiny matrices too
    monkeypatch.setattr(base_selection, "RECHECK_MARGIN", margin)
    auto = base_selection.select_bases(blocks, adapter, pruned, ranks, solver="auto",
                                       progress=False)
    assert auto.timings["probe"] > 0
    parts = auto.timings["probe_truncation"] + auto.timings["probe_distances"]
    assert parts <= auto.timings["probe"] + 2e-4  # its parts (each rounded to 1e-4 s)
    reference = base_selection.select_bases(blocks, adapter, pruned, ranks, progress=False,
                                            solver="exact" if margin else "randomized")
    assert auto.flat_fallback is bool(margin)
    assert torch.equal(auto.distances.nan_to_num(-1.0), reference.distances.nan_to_num(-1.0))
    assert auto.base_map == reference.base_map and auto.rechecked == reference.rechecked == {}
    if margin:  # nothing approximate left to recheck
        assert "recheck" not in auto.timings
