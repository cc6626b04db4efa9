"""The typed manifest: manifest.json round-trips unchanged, older manifests are migrated,
newer / broken ones are refused naming the file and the key."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import make_model

from flexigpt.core.fileio import CheckpointError, sha256_file
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.storage.artifacts import load_compressed, read_manifest
from flexigpt.storage.manifest import (
    FORMAT_VERSION,
    Manifest,
    _stable,
    manifest_hash,
    migrate_structure,
)


@pytest.fixture(scope="module")
def compressed(tmp_path_factory, tiny_tokenizer, text_file) -> Path:
    """A real ``flexigpt.compress`` of a tiny Llama (calibration, extras, sharing)."""
    from flexigpt.api.compression import compress

    root = tmp_path_factory.mktemp("manifest")
    make_model().save_pretrained(root / "dense")
    tiny_tokenizer.save_pretrained(root / "dense")
    compress("flexigpt", str(root / "dense"), root / "c", options={"ratio": 0.5, "rank": 4},
             calibration=str(text_file), n_calibration=2, calibration_seq_len=16)
    return root / "c"


def _json(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def test_a_real_manifest_round_trips(compressed):
    d = _json(compressed)
    m = Manifest.from_dict(d)
    assert m.to_dict() == d and read_manifest(compressed) == m
    assert m.format_version == FORMAT_VERSION and m.calibration.n_windows == 2
    assert m.parameters.compressed < m.parameters.dense and m.weights.shared
    assert set(m.extras) == {"compress_seconds", "device"}
    # the hash is today's: sha256 of the on-disk JSON without its volatile keys
    old = hashlib.sha256(json.dumps(_stable(d), sort_keys=True).encode()).hexdigest()
    assert manifest_hash(m) == old
    # to_dict is a copy: changing it does not change the manifest
    m.to_dict()["structure"]["base_map"] = {}
    assert m.to_dict() == d


@pytest.mark.parametrize("version,words", [
    (FORMAT_VERSION + 1, ["newer", "update flexigpt-bench"]), (0, ["unknown format_version"]),
    ("1", ["'format_version' must be an integer"])])
def test_newer_or_unknown_version_is_refused(compressed, tmp_path, version, words):
    d = {**_json(compressed), "format_version": version}
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError) as err:
        read_manifest(tmp_path)
    for word in [str(tmp_path / "manifest.json"), *words]:
        assert word in str(err.value)


@pytest.mark.parametrize("edit,words", [
    (lambda d: d.pop("seed"), ["lacks the required key 'seed'"]),
    (lambda d: d.pop("versions"), ["'versions'"]),
    (lambda d: d.pop("weights"), ["'weights'"]),
    (lambda d: d.pop("format_version"), ["'format_version'"]),
    (lambda d: d["parameters"].pop("dense"), ["'parameters' lacks", "'dense'"]),
    (lambda d: d.update(seed="0"), ["'seed' must be an integer", "str"]),
    (lambda d: d.update(seed=True), ["'seed' must be an integer", "bool"]),
    (lambda d: d.update(history={}), ["'history' must be a list"]),
    (lambda d: d["parameters"].update(dense=1.5), ["'parameters.dense' must be an integer"]),
    (lambda d: d["calibration"].update(extra=1), ["'calibration.extra' is not a known"]),
    (lambda d: d["weights"].update(sha256=None), ["'weights.sha256' must be a string"])])
def test_missing_key_or_wrong_type_is_refused(compressed, tmp_path, edit, words):
    d = _json(compressed)
    edit(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError) as err:
        read_manifest(tmp_path)
    for word in [str(tmp_path / "manifest.json"), *words]:
        assert word in str(err.value)


def test_unsaved_manifest_round_trips_and_extras_stay_extras():
    m = Manifest.new("dense", config={"a": 1}, base_model=None, structure={}, info={},
                     dense_params=4, compressed_params=4, calibration=None, seed=0,
                     dtype="float32", device="cpu")
    assert Manifest.from_dict(m.to_dict()) == m and m.extras == {"device": "cpu"}
    assert m.with_history({"stage": "train", "tokens": 8}).trainings() == [
        {"stage": "train", "tokens": 8}] and m.history == []


def test_older_manifest_is_migrated(compressed):
    d = _json(compressed)
    del d["files"], d["weights"]["shared"]  # saved before file hashes and sharing maps
    m = Manifest.from_dict(d)
    assert m.files == {} and m.weights.shared is None
    slice_d = {**d, "method": "slicegpt", "structure": {"plan": {}}}
    assert Manifest.from_dict(slice_d).structure == {"plan": {}, "head_bias": False}
    assert migrate_structure("slicegpt", {"head_bias": True}) == {"head_bias": True}
    assert migrate_structure("shortgpt", {}) == {}


def test_slicegpt_saved_before_head_bias_loads(tmp_path, tiny_tokenizer, text_file):
    """A SliceGPT model whose manifest.json and config.json predate ``head_bias`` loads, reads
    it as false, and computes what it computed."""
    from conftest import manifest_for

    from baselines.slicegpt.config import SliceGPTConfig
    from baselines.slicegpt.method import compress
    from flexigpt.methods.calibration import token_windows

    model = make_model()
    windows = token_windows(text_file, tiny_tokenizer, 32, 8, seed=0)
    result = compress(model, tiny_tokenizer, windows, SliceGPTConfig(ratio=0.3, round_to=2,
                                                                  tolerance=0.03))
    assert result.structure["head_bias"] is False
    out = tmp_path / "s"
    save_compressed(result.model, tiny_tokenizer,
                    manifest_for("slicegpt", result.structure, result.info, result.model), out)
    config = json.loads((out / "config.json").read_text())
    del config["flexigpt_compression"]["structure"]["head_bias"]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    d = _json(out)
    del d["structure"]["head_bias"]
    d["files"]["config.json"] = sha256_file(out / "config.json")
    (out / "manifest.json").write_text(json.dumps(d, indent=2, sort_keys=True))
    loaded = load_compressed(out)
    assert loaded.manifest.structure["head_bias"] is False
    ids = windows[:2]
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=ids).logits,
                           result.model(input_ids=ids).logits)
