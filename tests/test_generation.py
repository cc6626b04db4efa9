"""Generation: plain / batched / sampled decoding, the self-speculative FlexiGPT draft
(weight sharing, token-for-token identity with greedy decoding), the merged-weights path, the
CLI and the decode benchmark on tiny models."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import load_benchmark, make_model, manifest_for, perturb_adapters

from flexigpt.cli import main as cli_main
from flexigpt.export.publish import publish_compressed as save_compressed
from flexigpt.methods.flexigpt.extend import ExtendConfig
from flexigpt.methods.flexigpt.extend import compress as extend_compress
from flexigpt.methods.flexigpt.prune import FlexiGPTConfig
from flexigpt.methods.flexigpt.prune import compress as prune_compress
from flexigpt.methods.sharing import SharedLoRALinear
from flexigpt.runtime.generation import (
    Generator,
    build_draft,
    draft_extra_bytes,
    expected_speedup,
    generate,
    skipped_blocks,
)
from flexigpt.runtime.generation.few_rows import few_row_route
from flexigpt.runtime.generation.merged import merge_replacement_linears
from flexigpt.runtime.generation.transformers_engine import generate_batches
from flexigpt.storage.artifacts import LoadedModel
from flexigpt.storage.models import get_adapter

pytestmark = pytest.mark.usefixtures("single_thread")

CALIB = torch.randint(3, 300, (4, 32), generator=torch.Generator().manual_seed(0))
PROMPTS = ["the city of the river was", "music and film", "in the north of the empire the king"]
ROOT = Path(__file__).resolve().parents[1]


def _perturb(model, scale: float = 0.05, seed: int = 0) -> None:
    perturb_adapters(model, scale, seed)


def flexi(layers: int = 6, family: str = "llama") -> tuple[torch.nn.Module, dict]:
    model = make_model(family, layers=layers)
    with torch.no_grad():
        result = prune_compress(model, None, CALIB, FlexiGPTConfig(ratio=0.5, rank=8))
    _perturb(model)
    return model, manifest_for("flexigpt", result.structure, result.info, model=model)


def extended(pattern: str = "block", layers: int = 7) -> tuple[torch.nn.Module, dict]:
    model = make_model(layers=4)
    with torch.no_grad():
        result = extend_compress(model, None, None, ExtendConfig(layers=layers, pattern=pattern,
                                                                 rank=4, gamma_init=0.5))
    _perturb(model, scale=0.2)
    return model, manifest_for("flexigpt_extend", result.structure, model=model)


def gen_for(model, manifest, tokenizer) -> Generator:
    return Generator(LoadedModel(model, tokenizer, manifest))


def _check_speculative(gen: Generator, k: int, ignore_eos: bool = True, n: int = 24) -> dict:
    """Speculative greedy decoding with both engines = plain greedy decoding (both engines),
    token for token; returns the lean engine's stats."""
    plain = gen.generate(PROMPTS, max_new_tokens=n, ignore_eos=ignore_eos)
    lean = gen.generate(PROMPTS, max_new_tokens=n, ignore_eos=ignore_eos, engine="lean")
    assert lean.token_ids == plain.token_ids and lean.stats["engine"] == "lean"
    stats = {}
    for engine in ("lean", "transformers"):
        spec = gen.generate(PROMPTS, max_new_tokens=n, ignore_eos=ignore_eos, speculative=True,
                            draft_length=k, engine=engine)
        assert spec.token_ids == plain.token_ids  # token for token
        assert spec.texts == plain.texts
        s = stats[engine] = spec.stats
        assert s["engine"] == engine and s["draft_forwards"] == s["drafted"]
        assert s["drafted"] <= k * s["rounds"] and s["draft"]["extra_bytes"] == 0
        assert 0 <= s["alpha"] <= 1 and s["full_forwards"] <= plain.stats["full_forwards"]
        if ignore_eos:
            assert s["new_tokens"] == n * len(PROMPTS)
    # transformers verifies the prompt with the first proposals; the lean loop first decodes
    # one token from the prompt, then runs its rounds (the last one may be cut at n / EOS)
    hf, s = stats["transformers"], stats["lean"]
    assert hf["rounds"] == hf["full_forwards"]
    assert hf["accepted"] + hf["rounds"] == hf["new_tokens"]
    assert s["rounds"] + len(PROMPTS) == s["full_forwards"] and s["drafted"] == k * s["rounds"]
    assert s["new_tokens"] <= s["accepted"] + s["rounds"] + len(PROMPTS)
    assert s["new_tokens"] > s["accepted"] + s["rounds"] + len(PROMPTS) - k * len(PROMPTS) - 1
    return s


# ---- self-speculative decoding: identity with plain greedy decoding --------------------------
@pytest.mark.parametrize("k", [1, 3, 6])
def test_speculative_greedy_identical_pruned(tiny_tokenizer, k):
    model, manifest = flexi()
    s = _check_speculative(gen_for(model, manifest, tiny_tokenizer), k)
    assert s["accepted"] > 0 and s["rejections"] > 0  # both branches of verification ran
    assert s["draft"]["skipped_blocks"] == sorted(int(i) for i in manifest.structure["base_map"])


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_speculative_greedy_identical_other_families(tiny_tokenizer, family):
    model, manifest = flexi(family=family)
    s = _check_speculative(gen_for(model, manifest, tiny_tokenizer), 2, n=16)
    assert s["accepted"] > 0 and s["draft"]["draft_blocks"] == 3


def test_speculative_with_eos_and_skipped_first_block(tiny_tokenizer):
    model, manifest = flexi(layers=8)
    gen = gen_for(model, manifest, tiny_tokenizer)
    _check_speculative(gen, 2, ignore_eos=False, n=16)
    # a draft that also skips block 0 (its cache slot 0 is then a renumbered later block)
    structure = {**manifest.structure, "pruned_blocks": [0, 5], "base_map": {"0": 1, "5": 3}}
    s = _check_speculative(gen_for(model, manifest_for("flexigpt", structure), tiny_tokenizer), 3)
    assert s["draft"]["skipped_blocks"] == [0, 5]


@pytest.mark.parametrize("pattern", ["block", "sequential"])
def test_speculative_greedy_identical_extended(tiny_tokenizer, pattern):
    model, manifest = extended(pattern)
    layout = manifest.structure["layout"]
    s = _check_speculative(gen_for(model, manifest, tiny_tokenizer), 3)
    repeats = [p for p in range(len(layout)) if layout[p] in layout[:p]]
    assert s["draft"]["skipped_blocks"] == repeats and s["draft"]["draft_blocks"] == 4
    assert s["accepted"] > 0


# ---- the draft: shared storage, ShortGPT architecture, full model untouched -------------------
def test_draft_shares_storage_and_is_shortgpt(tiny_tokenizer):
    model, manifest = flexi()
    blocks = get_adapter(model).layers(model)
    idx_before = [b.self_attn.layer_idx for b in blocks]
    logits_before = model(CALIB).logits
    skip = skipped_blocks(manifest.method, manifest.structure, len(blocks))
    draft = build_draft(model, skip)
    full_ptrs = {p.data_ptr() for p in model.parameters()} | {b.data_ptr()
                                                              for b in model.buffers()}
    assert all(p.data_ptr() in full_ptrs for p in draft.parameters())
    assert all(b.data_ptr() in full_ptrs for b in draft.buffers())
    assert draft_extra_bytes(draft, model) == 0
    assert draft.lm_head is model.lm_head and draft.model.embed_tokens is model.model.embed_tokens
    kept = [i for i in range(len(blocks)) if i not in skip]
    assert [w.block for w in draft.model.layers] == [blocks[i] for i in kept]
    assert draft.config.num_hidden_layers == len(kept) == 3
    assert not any(isinstance(m, SharedLoRALinear) for m in draft.modules())
    # reference ShortGPT model: a copy with the replacement blocks removed
    ref = copy.deepcopy(model)
    ad = get_adapter(ref)
    ad.set_layers(ref, [ad.layers(ref)[i] for i in kept])
    with torch.no_grad():
        assert torch.allclose(draft(CALIB).logits, ref(CALIB).logits, atol=1e-6)
        prompt = CALIB[:1, :6]
        out_d = draft.generate(prompt, max_new_tokens=10, do_sample=False, min_new_tokens=10)
        out_r = ref.generate(prompt, max_new_tokens=10, do_sample=False, min_new_tokens=10)
    assert torch.equal(out_d, out_r)  # its own KV cache with renumbered slots
    # the full model is untouched
    assert [b.self_attn.layer_idx for b in blocks] == idx_before
    assert model.config.num_hidden_layers == 6
    assert torch.equal(model(CALIB).logits, logits_before)


def test_speculative_rejected_for_other_models(tiny_tokenizer):
    gen = gen_for(make_model(), None, tiny_tokenizer)
    with pytest.raises(ValueError, match="FlexiGPT model"):
        gen.generate(PROMPTS[:1], max_new_tokens=2, speculative=True)
    with pytest.raises(ValueError, match="FlexiGPT model"):
        skipped_blocks("shortgpt", {}, 4)


# ---- sampling, batching -----------------------------------------------------------------------
def test_sampling_reproducible(tiny_tokenizer):
    model, manifest = flexi()
    gen = gen_for(model, manifest, tiny_tokenizer)
    opts = {"max_new_tokens": 12, "do_sample": True, "temperature": 1.5, "top_p": 0.95,
            "ignore_eos": True}
    a = gen.generate(PROMPTS, seed=3, **opts)
    b = gen.generate(PROMPTS, seed=3, **opts)
    c = gen.generate(PROMPTS, seed=4, **opts)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    s1 = gen.generate(PROMPTS, seed=3, speculative=True, draft_length=2, **opts)
    s2 = gen.generate(PROMPTS, seed=3, speculative=True, draft_length=2, **opts)
    assert s1.token_ids == s2.token_ids and all(len(t) == 12 for t in s1.token_ids)


def test_batch_of_two_left_padding(tiny_tokenizer):
    model, manifest = flexi()
    gen = gen_for(model, manifest, tiny_tokenizer)
    prompts = PROMPTS[1:]  # different lengths → left padding
    lens = [len(tiny_tokenizer(p)["input_ids"]) for p in prompts]
    assert lens[0] != lens[1]
    single = gen.generate(prompts, max_new_tokens=10, batch_size=1, ignore_eos=True)
    batched = gen.generate(prompts, max_new_tokens=10, batch_size=2, ignore_eos=True)
    assert batched.stats["batches"] == 1 and single.stats["batches"] == 2
    assert batched.token_ids == single.token_ids and len(batched.texts) == 2
    s = batched.stats
    assert s["new_tokens"] == 20 and s["decode_steps"] == 9 and s["tokens_per_s"] > 0
    assert s["prefill_s"] > 0 and s["per_token_ms"] > 0


def test_streamer_clock_times_the_same_steps_as_hooks(tiny_tokenizer):
    model, manifest = flexi()
    gen = gen_for(model, manifest, tiny_tokenizer)
    kwargs = {"max_new_tokens": 7, "do_sample": False, "min_new_tokens": 7,
              "pad_token_id": tiny_tokenizer.pad_token_id}
    runs = {clock: generate_batches(model, None, [gen.encode(PROMPTS[1:])], kwargs, set(),
                                    clock=clock) for clock in ("hooks", "streamer")}
    (ids_h, sums_h), (ids_s, sums_s) = runs["hooks"], runs["streamer"]
    assert ids_h == ids_s and all(len(t) == 7 for t in ids_s)
    for key in ("decode_steps", "full_forwards", "batches"):
        assert sums_h[key] == sums_s[key]
    assert sums_s["decode_steps"] == 6 and 0 < sums_s["prefill_s"] < sums_s["wall_s"]
    with pytest.raises(ValueError, match="clock"):
        generate_batches(model, model, [gen.encode(PROMPTS[:1])], kwargs, set(),
                         clock="streamer")


def test_weight_reads_count_shared_weights_at_each_use():
    from flexigpt.methods.sharing import adapter_trainable
    from flexigpt.runtime.generation.figures import weight_reads_per_token

    model, _ = flexi()
    dense = make_model(layers=6)
    extra = adapter_trainable(model) * 4  # fp32 adapters and output norms
    assert extra > 0
    assert weight_reads_per_token(model) == weight_reads_per_token(dense) + extra
    emb = dense.get_input_embeddings().weight
    all_params = sum(p.numel() * 4 for p in dense.parameters())  # tied head counted once
    tied = dense.get_output_embeddings().weight is emb
    assert weight_reads_per_token(dense) == (all_params - emb.numel() * 4 + emb.shape[1] * 4
                                             + (emb.numel() * 4 if tied else 0))


def test_decode_compile_kwargs_round_the_static_cache_up():
    from flexigpt.runtime.generation.generator import STATIC_CACHE_STEP, decode_compile_kwargs

    kw = decode_compile_kwargs(40, 128)
    assert kw["cache_implementation"] == "static" and kw["max_cache_len"] == STATIC_CACHE_STEP
    assert decode_compile_kwargs(200, 128)["max_cache_len"] == 2 * STATIC_CACHE_STEP
    assert kw["compile_config"]._compile_all_devices is True


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_decode_same_greedy_tokens(tiny_tokenizer, monkeypatch, backend):
    import flexigpt.runtime.generation.generator as generator

    monkeypatch.setattr(generator, "COMPILE_BACKEND", backend)
    torch._dynamo.reset()
    model, manifest = flexi()
    eager = gen_for(model, manifest, tiny_tokenizer)
    compiled = Generator(LoadedModel(model, tiny_tokenizer, manifest), compile_decode=True)
    for batch_size in (1, 2):
        want = eager.generate(PROMPTS, max_new_tokens=9, ignore_eos=True, batch_size=batch_size)
        got = compiled.generate(PROMPTS, max_new_tokens=9, ignore_eos=True,
                                batch_size=batch_size)
        assert got.token_ids == want.token_ids
        assert got.stats["compiled_decode"] and not want.stats["compiled_decode"]
        assert got.stats["decode_steps"] == want.stats["decode_steps"]
        assert got.stats["per_token_ms"] > 0
    assert model._previous_max_cache_length == generator.STATIC_CACHE_STEP
    torch._dynamo.reset()


def test_compiled_decode_refuses_lean_and_speculative(tiny_tokenizer):
    model, manifest = flexi()
    gen = Generator(LoadedModel(model, tiny_tokenizer, manifest), compile_decode=True)
    for opts in ({"engine": "lean"}, {"speculative": True}):
        with pytest.raises(ValueError, match="compiled decode step"):
            gen.generate(PROMPTS[:1], max_new_tokens=2, **opts)


# ---- merged-weights path -------------------------------------------------------------------------
def test_merged_replacements_unchanged_outputs(tiny_tokenizer):
    model, manifest = flexi()
    gen = gen_for(model, manifest, tiny_tokenizer)
    with torch.no_grad():
        before_logits = model(CALIB).logits
    before = gen.generate(PROMPTS, max_new_tokens=12, ignore_eos=True)
    info = merge_replacement_linears(model)
    assert info["merged"] == 3 * 7 and info["extra_bytes"] > 0
    assert not any(isinstance(m, SharedLoRALinear) for m in model.modules())
    with torch.no_grad():
        assert torch.allclose(model(CALIB).logits, before_logits, atol=1e-5)
    after = gen.generate(PROMPTS, max_new_tokens=12, ignore_eos=True)
    assert after.token_ids == before.token_ids
    spec = gen.generate(PROMPTS, max_new_tokens=12, ignore_eos=True, speculative=True)
    assert spec.token_ids == after.token_ids


def test_few_row_linear_equals_f_linear():
    import torch.nn.functional as F

    from flexigpt.runtime.generation.few_rows import few_row_linear

    w, b = torch.randn(7, 5), torch.randn(7)
    for shape in [(1, 3, 5), (2, 5), (1, 1, 5), (1, 12, 5), (5,)]:
        x = torch.randn(*shape)
        got, got_nb = few_row_linear(x, w, b, max_rows=8), few_row_linear(x, w, max_rows=8)
        assert got.shape == F.linear(x, w, b).shape and got.is_contiguous()
        assert torch.allclose(got, F.linear(x, w, b), atol=1e-6)
        assert torch.allclose(got_nb, F.linear(x, w), atol=1e-6)


def test_routed_linears_change_only_that_model_and_restore_it():
    import torch.nn.functional as F

    from flexigpt.runtime.generation.few_rows import routed_linears

    original = F.linear
    model, _ = flexi()
    other = make_model()
    shared = [m for m in model.modules() if isinstance(m, SharedLoRALinear)]
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    x = CALIB[:1, :3]  # 3 rows: the few-row form
    with torch.no_grad():
        before = model(x).logits
    with pytest.raises(RuntimeError), routed_linears([model], route=True):
        assert F.linear is original  # nothing process-wide
        assert all(m.linear_fn is not original for m in shared)
        assert all("forward" in m.__dict__ for m in linears)
        assert not any("forward" in m.__dict__ for m in other.modules())
        with torch.no_grad():
            assert torch.allclose(model(x).logits, before, atol=1e-5)
        raise RuntimeError("boom")
    assert all(m.linear_fn is original for m in shared)  # restored, also after an error
    assert not any("forward" in m.__dict__ for m in model.modules())
    with routed_linears([model], route=False):
        assert not any("forward" in m.__dict__ for m in model.modules())


def test_mm_form_timing_is_cached_per_thread_count_and_cpu_only():
    from flexigpt.runtime.generation import few_rows

    verdict = few_rows.mm_form_is_faster()
    assert isinstance(verdict, bool)
    assert few_rows._MM_FASTER[torch.get_num_threads()] is verdict
    assert few_rows.few_row_route("cpu") is verdict
    assert few_rows.few_row_route("cuda") is False  # never routed on CUDA


def test_lean_engine_suppresses_eos_when_ignored_like_transformers(tiny_tokenizer):
    """With ``ignore_eos`` transformers masks EOS out (``min_new_tokens``); the lean loops
    must too, or they decode another sequence whenever the model's argmax is EOS."""
    model, manifest = flexi()
    gen = gen_for(model, manifest, tiny_tokenizer)
    first = gen.generate(PROMPTS[:1], max_new_tokens=4, ignore_eos=True).token_ids[0][0]
    model.generation_config.eos_token_id = first  # the greedy first token is now "EOS"
    plain = gen.generate(PROMPTS[:1], max_new_tokens=8, ignore_eos=True)
    assert first not in plain.token_ids[0] and len(plain.token_ids[0]) == 8
    lean = gen.generate(PROMPTS[:1], max_new_tokens=8, ignore_eos=True, engine="lean")
    spec = gen.generate(PROMPTS[:1], max_new_tokens=8, ignore_eos=True, speculative=True,
                        draft_length=2, engine="lean")
    assert lean.token_ids == plain.token_ids == spec.token_ids
    assert lean.stats["few_row_route"] is spec.stats["few_row_route"] is few_row_route("cpu")
    stopped = gen.generate(PROMPTS[:1], max_new_tokens=8, engine="lean")
    assert stopped.token_ids[0] == [first]  # not ignored: EOS ends the sequence


def test_combine_sums_chunks_and_recomputes_ratios():
    from flexigpt.runtime.generation.measure import combine

    a = {"wall_s": 2.0, "prefill_s": 0.5, "decode_s": 1.5, "decode_steps": 3, "new_tokens": 4,
         "prompts": 1, "full_forwards": 4, "batch_size": 1, "peak_rss_mb": 10.0,
         "peak_rss_delta_mb": 1.0, "per_token_ms": 500.0}
    b = {**a, "wall_s": 4.0, "decode_s": 3.5, "decode_steps": 5, "new_tokens": 6,
         "peak_rss_mb": 12.0, "peak_rss_delta_mb": 0.5}
    out = combine([a, b])
    assert out["wall_s"] == 6.0 and out["new_tokens"] == 10 and out["peak_rss_mb"] == 12.0
    assert out["per_token_ms"] == pytest.approx(1e3 * 5.0 / 8)  # not the mean of the chunks
    assert out["tokens_per_s"] == pytest.approx(10 / 6) and "alpha" not in out
    spec = combine([{**a, "rounds": 2, "drafted": 4, "accepted": 3, "rejections": 1},
                    {**b, "rounds": 3, "drafted": 6, "accepted": 1, "rejections": 3}])
    assert spec["alpha"] == pytest.approx(4 / 8) and spec["accepted_fraction"] == 0.4


def test_expected_speedup():
    assert expected_speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)
    assert expected_speedup(1.0, 3, 0.5) == pytest.approx(4 / 2.5)
    assert expected_speedup(0.5, 2, 0.0) == pytest.approx(1.75)


# ---- CLI and python entry point on saved directories -------------------------------------------
@pytest.fixture
def saved_dirs(tmp_path, tiny_tokenizer):
    model, manifest = flexi()
    save_compressed(model, tiny_tokenizer, manifest, tmp_path / "flexi")
    dense = make_model()
    save_compressed(dense, tiny_tokenizer, manifest_for("dense", model=dense), tmp_path / "dense")
    return tmp_path / "flexi", tmp_path / "dense"


def test_cli_generate_on_saved_model(saved_dirs, tmp_path, capsys):
    flexi_dir, dense_dir = saved_dirs
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("\n".join(PROMPTS[:2]) + "\n\n")
    out = tmp_path / "gen.json"
    rc = cli_main(["generate", "--model", str(flexi_dir), "--prompts-file", str(prompts_file),
                   "--max-new-tokens", "6", "--speculative", "--draft-length", "2",
                   "--ignore-eos", "--json", str(out), PROMPTS[2]])
    captured = capsys.readouterr()
    assert rc == 0 and PROMPTS[2] in captured.out and "tok/s" in captured.err
    record = json.loads(out.read_text())
    assert record["prompts"] == [PROMPTS[2], *PROMPTS[:2]]
    assert record["stats"]["speculative"] and record["stats"]["draft_length"] == 2
    assert all(len(t) == 6 for t in record["token_ids"])
    plain = generate(flexi_dir, record["prompts"], max_new_tokens=6, ignore_eos=True,
                     batch_size=3)
    assert plain.token_ids == record["token_ids"]
    assert cli_main(["generate", "--model", str(dense_dir), "--batch-size", "2",
                     "--sample", "--max-new-tokens", "4", *PROMPTS[:2]]) == 0
    assert cli_main(["generate", "--model", str(dense_dir), "--speculative", "x"]) == 2


def test_bench_decode_quick(saved_dirs, tmp_path):
    bench = load_benchmark("bench_decode")
    flexi_dir, dense_dir = saved_dirs
    prompts_file = tmp_path / "p.txt"
    prompts_file.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "bench.json"
    rc = bench.main([str(dense_dir), str(flexi_dir), "--prompts-file", str(prompts_file),
                     "--quick", "--out", str(out), "--draft-lengths", "1", "2"])
    assert rc == 0
    result = json.loads(out.read_text())
    runs = {r["label"]: r for r in result["models"]}
    assert set(runs) == {"dense", "flexi"}
    assert runs["dense"]["speculative"] is None and runs["flexi"]["speculative"]["identical"]
    for k in ("1", "2"):
        sp = runs["flexi"]["speculative"]["by_k"][k]
        assert sp["identical"] and sp["bound"] > 0 and sp["speedup"] > 0
    for r in runs.values():
        assert r["batch1"]["per_token_ms"] > 0 and r["batch1"]["peak_rss_mb"] > 0
        assert r["batched"]["batch_size"] > 1 and r["prefill_ms"] > 0
    assert "loadavg" in result


# ---- decoding cost in the inference rule and Tables 6/7 ---------------------------------------
def test_measure_decode_interleaved_rows(saved_dirs, tiny_tokenizer):
    from flexigpt.runtime.generation.measure import measure_decode

    flexi_dir, dense_dir = saved_dirs
    gens = {"dense": Generator(dense_dir), "flexi": Generator(flexi_dir)}
    seen = []
    rows = measure_decode(gens, PROMPTS, new_tokens=5, batch=2, draft_lengths=[2], repeats=2,
                          on_round=lambda rep, name, b1, s: seen.append((rep, name)))
    assert seen == [(0, "dense"), (0, "flexi"), (1, "dense"), (1, "flexi")]  # interleaved
    dense, flexi_row = rows
    assert dense["relative_decode_time"] == 1.0 and dense["speculative"] is None
    assert flexi_row["speculative"]["identical"] and flexi_row["speculative"]["best_k"] == 2
    assert flexi_row["speculative"]["draft"]["extra_bytes"] == 0
    assert flexi_row["speculative"]["few_row_route"] is few_row_route("cpu")
    assert flexi_row["batched"]["batch_size"] == 2 and flexi_row["prefill_ms"] > 0
    with pytest.raises(ValueError, match="new_tokens"):
        measure_decode(gens, PROMPTS, new_tokens=0, batch=2)
    with pytest.raises(ValueError, match="draft lengths"):
        measure_decode(gens, PROMPTS, new_tokens=2, batch=2, draft_lengths=[0])


def test_inference_cost_with_decode_to_tables(saved_dirs, tmp_path):
    from flexigpt.runtime.evaluation.inference import decode_settings, run_inference_cost
    from flexigpt.tables import timing
    from flexigpt.tables.collect import collect_timings
    from flexigpt.tables.decode import collect_decodes
    from flexigpt.tables.published import load_published
    from flexigpt.tables.render import to_markdown

    flexi_dir, dense_dir = saved_dirs
    text = tmp_path / "held_out.txt"
    text.write_text("The river flows north. It is long.\n\nMusic and film are arts. Yes.\n\n"
                    "In the north the king ruled.\n")
    dirs = {"dense/default/full": dense_dir, "flexigpt/default/r0.5": flexi_dir}
    out_json = tmp_path / "tiny" / "inference.json"
    with pytest.raises(ValueError, match="prompt text"):
        run_inference_cost(dirs, out_json, batch=1, seq_len=8, repeats=1,
                           decode={"prompts": 2})
    with pytest.raises(ValueError, match="unknown key"):
        decode_settings({"prompt": 2})
    with pytest.raises(ValueError, match="new_tokens"):
        decode_settings({"new_tokens": 0})
    assert not out_json.exists()  # refused before any model loaded or file written
    out = run_inference_cost(dirs, out_json, batch=1, seq_len=8, repeats=1, prompt_text=text,
                             decode={"prompts": 3, "new_tokens": 4, "batch": 2})
    dec = out["decode"]
    assert dec["prompts"] == 3 and dec["draft_length"] == 1 and len(dec["rows"]) == 2
    assert [r["method"] for r in dec["rows"]] == ["dense", "flexigpt"]
    assert dec["rows"][1]["ratio"] == 0.5 and dec["rows"][1]["speculative"]["identical"]
    saved = json.loads(out_json.read_text())["decode"]
    assert [r["name"] for r in saved["rows"]] == list(dirs) and saved["new_tokens"] == 4
    decodes = collect_decodes([out_json])
    assert list(decodes["mode"]) == ["plain", "plain", "speculative"]
    table = timing.timing_table(collect_timings([out_json]), load_published(), "tiny", 6,
                                decodes=decodes)
    md = to_markdown(table)
    assert "decoding" in md and "self-speculative (k=1)" in md and "30.11%" in md
    assert "identical to plain" in md and "NOT identical" not in md
    assert set(table.csv["source"]) >= {"ours", "ours-decode", "paper"}
    from flexigpt.tables.verdicts import claim_h

    (claim,) = claim_h(decodes, "tiny")
    assert claim["Paper"] == "+30.11%" and "greedy output identical" in claim["Ours"]
    assert claim["Verdict"].startswith("reported")
    # without decoding measured the table is the forward timing alone
    plain = run_inference_cost(dirs, tmp_path / "t2" / "inference.json", batch=1, seq_len=8,
                               repeats=1)
    assert plain["decode"] is None
    assert collect_decodes([tmp_path / "t2" / "inference.json"]).empty
