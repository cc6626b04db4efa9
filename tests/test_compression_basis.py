"""The compression basis: a target on the non-embedding parameters is the equal total-basis
target for every method that leaves the embeddings alone, recorded with both achieved
ratios; a method that slices embeddings, or an unknown basis, is refused before any work."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_model

from flexigpt.api.compression import compress
from flexigpt.core.params import count_parameters
from flexigpt.methods.compression_basis import achieved_ratios, embedding_parameters, to_total

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("tied", [True, False])
def test_embedding_parameters_counts_tied_tensors_once(tied):
    model = make_model("llama", tied=tied, vocab=300, hidden=64)
    assert embedding_parameters(model) == 300 * 64 * (1 if tied else 2)
    with torch.device("meta"):
        meta = make_model("llama", tied=tied, vocab=300, hidden=64)
    assert embedding_parameters(meta) == embedding_parameters(model)


def test_opt_position_table_is_an_embedding():
    model = make_model("opt", vocab=300, hidden=64)
    assert embedding_parameters(model) == 300 * 64 + model.model.decoder.embed_positions.weight.numel()


def test_conversion_round_trip():
    dense, emb = 1000, 600
    total = to_total(0.3, "non_embedding", dense, emb)
    assert total == pytest.approx(0.12)
    got = achieved_ratios(dense, round(dense * (1 - total)), emb)
    assert got["non_embedding"] == pytest.approx(0.3) and got["total"] == pytest.approx(0.12)
    assert to_total(0.3, "total", dense, emb) == 0.3
    with pytest.raises(ValueError, match="compression basis must be one of"):
        to_total(0.3, "blocks", dense, emb)


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny Gemma 3 (8 blocks) saved with the test tokenizer."""
    model = make_model("gemma3_text", layers=8, hidden=64, vocab=len(tiny_tokenizer))
    path = tmp_path_factory.mktemp("gemma") / "dense"
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path, count_parameters(model), embedding_parameters(model)


@pytest.mark.parametrize("method", ["shortgpt", "flexigpt"])
def test_non_embedding_target_is_met_on_its_basis_and_recorded(gemma_dir, text_file,
                                                               tmp_path, method):
    path, dense, emb = gemma_dir
    options = {"ratio": 0.3, "policy": "matched"}
    manifest = compress(method, str(path), tmp_path / "out", options=options,
                        calibration=str(text_file), n_calibration=4, calibration_seq_len=32,
                        basis="non_embedding")
    record = manifest.extras["compression_basis"]
    assert record["basis"] == "non_embedding" and record["target"] == 0.3
    assert record["embedding_params"] == emb
    got = record["achieved"]
    assert got["total"] == pytest.approx(manifest.parameters.achieved_ratio)
    assert got["non_embedding"] == pytest.approx(
        (manifest.parameters.achieved_ratio * dense) / (dense - emb))
    # matched: within half a block step of the target on its own basis (8 blocks: 1/16)
    assert abs(got["non_embedding"] - 0.3) <= 1 / 16 + 0.02
    assert manifest.config["ratio"] == pytest.approx(to_total(0.3, "non_embedding", dense, emb))
    saved = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert saved["compression_basis"] == record


def test_total_basis_manifest_has_no_basis_record(gemma_dir, text_file, tmp_path):
    path, _, _ = gemma_dir
    manifest = compress("shortgpt", str(path), tmp_path / "out", options={"ratio": 0.3},
                        calibration=str(text_file), n_calibration=4, calibration_seq_len=32)
    assert "compression_basis" not in manifest.extras


def test_embedding_slicing_method_refuses_non_embedding_basis(gemma_dir, text_file, tmp_path):
    path, _, _ = gemma_dir
    with pytest.raises(ValueError, match="slicegpt removes embedding parameters.*total basis"):
        compress("slicegpt", "/nonexistent/model", tmp_path / "out", options={"ratio": 0.3},
                 calibration=str(text_file), basis="non_embedding")
    with pytest.raises(ValueError, match="compression basis must be one of"):
        compress("shortgpt", str(path), tmp_path / "out2", options={"ratio": 0.3},
                 calibration=str(text_file), basis="blocks")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


def test_dag_passes_the_basis_and_refuses_it_for_slicegpt(monkeypatch):
    """``compression_basis`` reaches every compress job's params (absent for ``total``, so
    finished runs keep their params), and the DAG-build check refuses SliceGPT under it."""
    import copy
    from pathlib import Path

    import yaml

    from flexigpt.workflow.config_check import ConfigError
    from flexigpt.workflow.dag import RunGrid

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    smoke = yaml.safe_load((root / "config/smoke.yaml").read_text())
    total = RunGrid.from_config(copy.deepcopy(smoke))
    cfg = copy.deepcopy(smoke)
    cfg["compression_basis"] = "non_embedding"
    with pytest.raises(ConfigError, match=r"compression_basis: slicegpt removes embedding"):
        RunGrid.from_config(copy.deepcopy(cfg))
    del cfg["methods"]["slicegpt"]
    grid = RunGrid.from_config(cfg)
    runs = [r for r in grid.runs.values() if r.method == "shortgpt"]
    assert runs and all(r.compress_params()["basis"] == "non_embedding" for r in runs)
    assert all("basis" not in r.compress_params() for r in total.runs.values())
