"""Contract tests for the foundation: adapters, loading, registry, artefacts, calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_model, manifest_for

from flexigpt.core.fileio import CheckpointError
from flexigpt.core.params import count_parameters
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.methods.block_influence import block_influence, lowest_blocks
from flexigpt.methods.calibration import CalibrationDataError, token_windows
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.models import (
    ModelLoadError,
    UnsupportedArchitectureError,
    get_adapter,
    load_model,
)
from flexigpt.storage.registry import METHODS, UnknownMethodError, get_method, validate_ratio


@pytest.mark.parametrize("family,kv", [("llama", 4), ("llama", 2), ("mistral", 2), ("qwen2", 2)])
@pytest.mark.parametrize("tied", [True, False])
def test_adapter_contract(family, kv, tied):
    model = make_model(family, kv_heads=kv, tied=tied)
    ad = get_adapter(model)
    blocks = ad.layers(model)
    assert len(blocks) == 4
    for block in blocks:
        lin = ad.block_linears(block)
        assert set(lin) == set(ad.linear_names()) and len(lin) == 7
        assert all(isinstance(m, torch.nn.Linear) for m in lin.values())
    assert ad.embed(model).weight.shape[1] == model.config.hidden_size
    assert (ad.lm_head(model).weight is ad.embed(model).weight) == tied
    ad.set_layers(model, list(blocks)[:2])
    assert model.config.num_hidden_layers == 2
    assert [ad.attn(b).layer_idx for b in ad.layers(model)] == [0, 1]
    out = model.generate(torch.tensor([[0, 5, 6]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 6)


def test_unsupported_architecture():
    from transformers import GPT2Config
    with pytest.raises(UnsupportedArchitectureError, match="gpt2"):
        get_adapter(GPT2Config())


def test_load_model_roundtrip_and_errors(tiny_checkpoint, tmp_path):
    model, tok = load_model(tiny_checkpoint)
    ids = torch.tensor([[0, 10, 20, 30]])
    ref = make_model()(ids).logits
    assert torch.equal(model(ids).logits, ref)
    assert tok.pad_token is not None
    with pytest.raises(ModelLoadError, match="not a checkpoint directory"):
        load_model(tmp_path / "nope")


def _mapped_files() -> set[str]:
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if line.rstrip().endswith(".safetensors")}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc (Linux)")
def test_load_model_unmapped_reads_weights_into_memory(tiny_checkpoint):
    """``mapped=False``: the same weights (tied head still tied), none of them memory-mapped
    from the checkpoint any more, so a replaced weight is freed at once."""
    import gc

    mapped, _ = load_model(tiny_checkpoint)
    owned, _ = load_model(tiny_checkpoint, mapped=False)
    assert mapped.state_dict().keys() == owned.state_dict().keys()
    assert all(torch.equal(v, owned.state_dict()[k]) for k, v in mapped.state_dict().items())
    assert owned.lm_head.weight is owned.model.embed_tokens.weight
    weights = str(tiny_checkpoint / "model.safetensors")
    assert weights in _mapped_files()  # transformers' default maps the file
    del mapped
    gc.collect()
    assert weights not in _mapped_files()  # the owned model holds no page of it
    ids = torch.tensor([[0, 10, 20, 30]])
    assert torch.equal(owned(ids).logits, make_model()(ids).logits)


def test_release_freed_memory_trims_the_c_heap():
    """glibc's malloc_trim is found and called where the C library has it (Linux, glibc)."""
    import platform

    from flexigpt.core.memory import release_freed_memory

    has_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert release_freed_memory() is has_glibc


def test_reuse_freed_memory_nests_and_restores(monkeypatch):
    """The heap is kept for the outermost block only, glibc's defaults come back on leaving
    it (even by an exception), and the switch turns it off."""
    import platform

    from flexigpt.core import memory

    calls: list[tuple] = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append(("mallopt", param, value))
            return 1

        def malloc_trim(self, pad):
            calls.append(("trim", pad))
            return 1

    has_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    with memory.reuse_freed_memory() as active:
        assert active is has_glibc
    monkeypatch.setattr(memory, "_libc", lambda: FakeLibc())
    monkeypatch.setattr(memory, "_kept", None)  # keep_heap_for_reuse not called yet
    with pytest.raises(RuntimeError), memory.reuse_freed_memory() as active:
        assert active
        with memory.reuse_freed_memory():
            pass
        assert calls == [("mallopt", memory._M_MMAP_MAX, 0),
                         ("mallopt", memory._M_TRIM_THRESHOLD, memory._NEVER_TRIM)]
        raise RuntimeError
    assert calls[2:] == [("mallopt", memory._M_MMAP_MAX, memory._DEFAULT_MMAP_MAX),
                         ("mallopt", memory._M_TRIM_THRESHOLD, memory._DEFAULT_TRIM_THRESHOLD),
                         ("trim", 0)]
    assert memory._depth == 0
    assert memory.keep_heap_for_reuse()  # for good: a later block leaves its settings alone
    del calls[:]
    with memory.reuse_freed_memory():
        pass
    assert calls == [("mallopt", memory._M_MMAP_MAX, 0),
                     ("mallopt", memory._M_TRIM_THRESHOLD, memory._NEVER_TRIM),
                     ("mallopt", memory._M_MMAP_MAX, memory._DEFAULT_MMAP_MAX)]
    monkeypatch.setattr(memory, "REUSE", False)
    with memory.reuse_freed_memory() as active:
        assert active is False
    assert len(calls) == 3


def test_load_model_unknown_hub_id(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="cannot resolve model"):
        load_model("no-such-org/no-such-model")


def test_registry():
    assert {"dense", "flexigpt", "shortgpt", "shortgpt_lora", "slicegpt", "llm_pruner",
            "flexigpt_extend"} <= set(METHODS)
    with pytest.raises(UnknownMethodError, match="did you mean 'shortgpt'"):
        get_method("shortgp")
    with pytest.raises(ValueError, match="has no option"):
        get_method("dense").make_config(bogus=1)
    for bad in (0, 1, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            validate_ratio(bad)


def test_registry_owns_the_method_facts():
    """The DAG, the tables and the decoders read their method facts from registry.METHODS."""
    from flexigpt.runtime.generation import SPECULATIVE_METHODS
    from flexigpt.tables.labels import METHOD_LABELS, METHOD_ORDER
    from flexigpt.workflow.dag import BI_METHODS, Run

    assert list(METHODS) == METHOD_ORDER and set(METHOD_LABELS.values()) == {
        f.label for f in METHODS.values()}
    assert BI_METHODS == ("shortgpt", "shortgpt_lora", "flexigpt")
    assert SPECULATIVE_METHODS == ("flexigpt", "flexigpt_extend")
    for name, facts in METHODS.items():
        method = get_method(name)
        assert method.name == name and method.facts is facts
        assert method.needs_calibration == facts.calibration
        assert (method.draft_skip is not None) == facts.speculative, name
        assert method.description, name  # the model card's line
        run = Run(model="m", method=name, variant="default", setting="r0.3")
        assert run.needs_calibration == facts.calibration
        assert run.uses_block_influence == facts.block_influence
    from flexigpt.storage.models.adapters import ADAPTERS
    from flexigpt.storage.registry import ALL_FAMILIES

    assert set(ALL_FAMILIES) == {a.family for a in ADAPTERS.values()}
    for name, f in METHODS.items():  # every known family: handled, or refused with a reason
        assert set(f.families) | {fam for fam, _ in f.family_refusals} == set(ALL_FAMILIES), name
        assert not set(f.families) & {fam for fam, _ in f.family_refusals}, name
    from flexigpt.storage.registry import methods_with

    assert methods_with("timed") == ("dense", "shortgpt", "replaceme", "streamline", "flexigpt",
                                     "flexigpt_extend")


def test_count_parameters_dedups_tied():
    tied, untied = make_model(tied=True), make_model(tied=False)
    assert count_parameters(untied) - count_parameters(tied) == 300 * 64


def test_dense_save_load_identical(tiny_model, tiny_tokenizer, tmp_path):
    manifest = save_compressed(tiny_model, tiny_tokenizer, manifest_for(model=tiny_model),
                               tmp_path / "out")
    loaded = load_compressed(tmp_path / "out")
    ids = torch.tensor([[0, 3, 4, 5]])
    assert torch.equal(loaded.model(ids).logits, tiny_model(ids).logits)
    assert loaded.manifest.to_dict() == json.loads((tmp_path / "out/manifest.json").read_text())
    assert loaded.manifest == manifest and manifest.weights.sha256 is not None
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_corrupt_checkpoint(tiny_model, tmp_path):
    save_compressed(tiny_model, None, manifest_for(), tmp_path / "m")
    weights = tmp_path / "m/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10:] = b"\x00" * 10
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_compressed(tmp_path / "m")
    weights.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_compressed(tmp_path / "m")


def test_failed_save_leaves_nothing(tiny_model, tmp_path):
    with pytest.raises(TypeError, match="Manifest"):  # a plain dict is not a manifest
        save_compressed(tiny_model, None, {"structure": {}}, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_token_windows(text_file, tiny_tokenizer, tmp_path):
    w = token_windows(text_file, tiny_tokenizer, seq_len=32, n_windows=5)
    assert w.shape == (5, 32) and (w[:, 0] == tiny_tokenizer.bos_token_id).all()
    w2 = token_windows(text_file, tiny_tokenizer, seq_len=32, n_windows=5, seed=1)
    assert w2.shape == (5, 32)
    assert torch.equal(w2, token_windows(text_file, tiny_tokenizer, 32, 5, seed=1))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(CalibrationDataError, match="empty"):
        token_windows(empty, tiny_tokenizer, 32, 1)
    short = tmp_path / "short.txt"
    short.write_text("a few words only")
    with pytest.raises(CalibrationDataError, match="too short"):
        token_windows(short, tiny_tokenizer, 32, 4)
    with pytest.raises(CalibrationDataError, match="does not exist"):
        token_windows(tmp_path / "missing.txt", tiny_tokenizer, 32, 4)


def test_block_influence_matches_hidden_states(tiny_model):
    ids = torch.randint(3, 300, (3, 16))
    bi = block_influence(tiny_model, ids, batch_size=2, progress=False)
    hs = tiny_model(ids, output_hidden_states=True).hidden_states
    # hidden_states[i] enters block i; the last entry is after the final norm, so compare
    # every block but the last against output_hidden_states.
    for i in range(len(bi) - 1):
        cos = torch.nn.functional.cosine_similarity(hs[i].float(), hs[i + 1].float(), dim=-1)
        assert bi[i] == pytest.approx(1 - cos.mean().item(), abs=1e-5)
    assert lowest_blocks([0.3, 0.1, 0.2, 0.9], 2) == [1, 2]
    with pytest.raises(ValueError):
        lowest_blocks([0.1, 0.2], 2)


def test_perplexity_matches_hf_loss(tiny_model):
    from flexigpt.methods.perplexity import perplexity
    ids = torch.randint(3, 300, (4, 16))
    ppl = perplexity(tiny_model, ids, batch_size=3)
    loss = tiny_model(ids, labels=ids).loss
    assert ppl == pytest.approx(float(torch.exp(loss)), rel=1e-5)


def test_one_manifest_builder():
    from flexigpt.storage.manifest import KEYS, PROVENANCE_KEYS, Manifest

    m = Manifest.new("dense", config={}, base_model="x", structure={}, info={},
                     dense_params=10, compressed_params=7, calibration=None, seed=3,
                     dtype="float32", compress_seconds=1.5)
    d = m.to_dict()
    assert set(KEYS) <= set(d) and m.history == [] and m.extras == {"compress_seconds": 1.5}
    assert m.parameters.achieved_ratio == pytest.approx(0.3) and d["compress_seconds"] == 1.5
    assert set(PROVENANCE_KEYS) <= set(d)  # provenance is recorded
    assert m.format_version is None and "format_version" not in d  # not saved yet
    with pytest.raises(ValueError, match="required keys"):
        Manifest.new("dense", config={}, base_model=None, structure={}, info={},
                     dense_params=1, compressed_params=1, calibration=None, seed=0,
                     dtype="float32", history=[1])
