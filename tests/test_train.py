"""The recovery trainer: recipes, LoRA merge, exact resume, divergence, outputs, CLI."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
from conftest import manifest_for

from flexigpt.cli import main
from flexigpt.core.fileio import CheckpointError
from flexigpt.methods.lora import RecoveryLoRALinear, merge_lora
from flexigpt.runtime.training import (
    TrainConfig,
    TrainingDivergedError,
    resolve_plan,
    train_loaded,
    train_model,
)
from flexigpt.runtime.training.checkpoint import checkpoint_dir
from flexigpt.runtime.training.config import TrainPlan
from flexigpt.runtime.training.optim import lr_factor
from flexigpt.runtime.training.outputs import LOG_COLUMNS
from flexigpt.runtime.training.recipes import apply_recipe
from flexigpt.storage.artifacts import load_compressed

ADAPTER_PARAMS = ("lora_A", "lora_B", "gamma")
IDS = torch.tensor([[0, 5, 17, 42, 99, 7, 3, 250]])


pytestmark = pytest.mark.usefixtures("single_thread")


def small(**kw) -> TrainConfig:
    """A few steps of 4 windows × 32 tokens, accumulation 2."""
    base = dict(tokens=32 * 4 * 6, seq_len=32, micro_batch=2, global_batch=4, eval_windows=4,
                checkpoint_every=0, bf16="off", warmup=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture
def flexigpt_dir(tiny_checkpoint, text_file, tmp_path):
    """The tiny Llama pruned by FlexiGPT: 1 of 4 blocks replaced by weight-shared blocks."""
    from flexigpt.api.compression import compress

    out = tmp_path / "flexigpt"
    compress("flexigpt", str(tiny_checkpoint), out, options={"ratio": 0.25, "gamma_init": 0.1},
             calibration=str(text_file), n_calibration=4, calibration_seq_len=32)
    return out


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _losses(rows):
    return [float(r["loss"]) for r in rows if r["loss"] not in ("", None)]


def interrupt_at(k: int):
    """An ``on_step`` hook that simulates a kill right after step ``k`` (and its checkpoint)."""
    def hook(step: int, loss: float) -> None:
        if step == k:
            raise KeyboardInterrupt(f"simulated interruption after step {k}")
    return hook


def read_log(out):
    with open(out / "train_log.csv") as fh:
        return list(csv.DictReader(fh))


def test_flexigpt_recipe_trains_adapters_only(flexigpt_dir, text_file, tmp_path):
    loaded = load_compressed(flexigpt_dir)
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    out = tmp_path / "trained"
    manifest = train_loaded(loaded, out, small(tokens=32 * 4 * 12, lr=1e-2), text_file, text_file)
    entry = manifest.history[-1]
    assert manifest.method == "flexigpt" and entry["recipe"] == "flexigpt"
    assert entry["plan"]["sources"]["recipe"] == "manifest" and entry["steps"] == 12
    adapters = sum(p.numel() for n, p in loaded.model.named_parameters()
                   if _leaf(n) in ADAPTER_PARAMS)
    assert entry["trainable"]["trainable_parameters"] == adapters > 0
    losses = _losses(read_log(out))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    assert entry["final_ppl"] < entry["ppl_before"]
    after = loaded.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(_leaf(k) in ADAPTER_PARAMS for k in changed)  # frozen = bit-equal
    reloaded = load_compressed(out)
    assert torch.equal(reloaded.model(IDS).logits, loaded.model(IDS).logits)
    assert reloaded.manifest.structure == load_compressed(flexigpt_dir).manifest.structure


def test_flexigpt_lora_other_blocks_skips_shared_bases(flexigpt_dir):
    loaded = load_compressed(flexigpt_dir)
    structure = loaded.manifest.structure
    replaced = {int(i) for i in structure["base_map"]}
    bases = set(structure["base_map"].values())
    plan = resolve_plan(TrainConfig(lora_other_blocks=True, lora_rank=2), loaded.manifest)
    report = apply_recipe(loaded.model, plan)
    block = lambda name: int(name.split(".")[2])  # noqa: E731  model.layers.<i>....
    assert report.lora_injected and report.lora_skipped_shared
    assert all(block(n) not in replaced | bases for n in report.lora_injected)
    assert {block(n) for n in report.lora_skipped_shared} == bases
    trainable = {_leaf(n) for n, p in loaded.model.named_parameters() if p.requires_grad}
    assert trainable == set(ADAPTER_PARAMS)


def test_lora_recipe_merges_and_reloads_identically(tiny_checkpoint, text_file, tmp_path):
    loaded = load_compressed(tiny_checkpoint)  # plain HF checkpoint → method "dense"
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    out = tmp_path / "lora"
    manifest = train_loaded(loaded, out, small(recipe="lora", lora_rank=4, lora_alpha=8,
                                               lr=1e-2), text_file, text_file)
    entry = manifest.history[-1]
    assert manifest.method == "dense" and entry["lora_merged"] == 28  # 4 blocks × 7
    assert not any(isinstance(m, RecoveryLoRALinear) for m in loaded.model.modules())
    after = loaded.model.state_dict()
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith("proj.weight") for k in changed)
    reloaded = load_compressed(out)
    assert reloaded.manifest.method == "dense"
    assert torch.equal(reloaded.model(IDS).logits, loaded.model(IDS).logits)
    rows = read_log(out)
    assert tuple(rows[0]) == LOG_COLUMNS
    assert rows[0]["step"] == "0" and rows[0]["loss"] == "" and float(rows[0]["ppl"]) > 1
    assert [r["ppl"] for r in rows[1:-1]] == [""] * (len(rows) - 2) and rows[-1]["ppl"]
    assert (out / "loss_curve.png").stat().st_size > 0
    assert not checkpoint_dir(out).exists()


def test_lora_merge_equals_unmerged_forward():
    torch.manual_seed(0)
    wrapper = RecoveryLoRALinear(torch.nn.Linear(16, 24), rank=4, alpha=8.0)
    torch.nn.init.normal_(wrapper.lora_B)
    holder = torch.nn.Sequential(wrapper)
    x = torch.randn(3, 16)
    y = holder(x)
    assert merge_lora(holder) == 1 and type(holder[0]) is torch.nn.Linear
    torch.testing.assert_close(holder(x), y, rtol=1e-5, atol=1e-5)


def test_resume_is_exact(tiny_checkpoint, text_file, tmp_path):
    cfg = small(recipe="lora", lora_rank=4, lora_dropout=0.1, checkpoint_every=2, bf16="auto",
                lr=5e-3)
    full_losses: dict[int, float] = {}
    train_model(tiny_checkpoint, tmp_path / "a", cfg, text_file, text_file,
                on_step=lambda s, loss: full_losses.__setitem__(s, loss))

    out = tmp_path / "b"
    with pytest.raises(KeyboardInterrupt):
        train_model(tiny_checkpoint, out, cfg, text_file, text_file, on_step=interrupt_at(3))
    assert not out.exists()
    assert json.loads((checkpoint_dir(out) / "state.json").read_text())["step"] == 2
    resumed: dict[int, float] = {}
    manifest = train_model(tiny_checkpoint, out, cfg, text_file, text_file,
                           on_step=lambda s, loss: resumed.__setitem__(s, loss))
    entry = manifest.history[-1]
    assert entry["resumed_from_step"] == 2
    # the tune-split perplexity is taken in the loop's compute dtype, start and end alike
    assert entry["eval_dtype"] == ("bfloat16" if entry["bf16"] else "float32")
    assert resumed == {s: full_losses[s] for s in range(3, 7)}  # bit-equal losses
    rows_a, rows_b = read_log(tmp_path / "a"), read_log(out)
    assert rows_a == rows_b
    a = load_compressed(tmp_path / "a").model.state_dict()
    b = load_compressed(out).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not checkpoint_dir(out).exists()


def test_kept_heap_changes_no_value(flexigpt_dir, text_file, tmp_path, monkeypatch):
    """flexigpt.core.memory.reuse_freed_memory (the loop's default) changes where memory comes
    from, never a loss or a weight: training with it and without is bit-identical."""
    from flexigpt.core import memory

    cfg = small(bf16="auto", eval_windows=2)
    runs = {}
    for reuse in (True, False):
        monkeypatch.setattr(memory, "REUSE", reuse)
        losses: dict[int, float] = {}
        out = tmp_path / f"reuse_{reuse}"
        train_model(flexigpt_dir, out, cfg, text_file, text_file,
                    on_step=lambda s, loss, d=losses: d.__setitem__(s, loss))
        runs[reuse] = losses, load_compressed(out).model.state_dict()
    (la, a), (lb, b) = runs[True], runs[False]
    assert la == lb and len(la) == 6
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_nan_loss_names_step_and_keeps_checkpoint(tiny_checkpoint, text_file, tmp_path):
    cfg = small(recipe="lora", lora_rank=4, global_batch=2, checkpoint_every=1)
    loaded = load_compressed(tiny_checkpoint)
    calls = {"n": 0}

    def poison(module, inputs, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] > 3 else output

    loaded.model.lm_head.register_forward_hook(poison)
    out = tmp_path / "nan"
    with pytest.raises(TrainingDivergedError, match=r"at step 4\b.*step 3"):
        train_loaded(loaded, out, cfg, text_file, None, source={"model": "x"})
    ckpt = checkpoint_dir(out)
    assert json.loads((ckpt / "state.json").read_text())["step"] == 3 and not out.exists()
    saved = torch.load(ckpt / "trainable.pt", weights_only=True)
    assert saved and all(torch.isfinite(t).all() for t in saved.values())
    # the intact checkpoint resumes (without the poison) and finishes
    manifest = train_loaded(load_compressed(tiny_checkpoint), out, cfg, text_file, None,
                            source={"model": "x"})
    assert manifest.history[-1]["resumed_from_step"] == 3
    assert manifest.history[-1]["steps"] == cfg.steps() == 12


def test_checkpoint_from_other_settings_is_refused(tiny_checkpoint, text_file, tmp_path):
    out = tmp_path / "c"
    cfg = small(recipe="full", checkpoint_every=1)
    with pytest.raises(KeyboardInterrupt):
        train_model(tiny_checkpoint, out, cfg, text_file, None,
                    on_step=interrupt_at(1))
    with pytest.raises(CheckpointError, match="different settings"):
        train_model(tiny_checkpoint, out, small(recipe="full", checkpoint_every=1, lr=1e-3),
                    text_file, None)


@pytest.mark.parametrize("bad,field", [
    (dict(tokens=0), "tokens"), (dict(micro_batch=4, global_batch=6), "global_batch"),
    (dict(lr=-1.0), "lr"), (dict(warmup=1.5), "warmup"), (dict(recipe="bogus"), "recipe"),
    (dict(bf16="maybe"), "bf16"), (dict(lora_dropout=1.0), "lora_dropout"),
    (dict(grad_clip=0.0), "grad_clip"), (dict(eval_windows=0), "eval_windows"),
])
def test_config_validation(bad, field):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**bad)


def test_plan_resolution_order():
    manifest = manifest_for(info={"recovery": {"recipe": "lora", "rank": 8, "alpha": 16,
                                               "lr": 1e-4}})
    plan = resolve_plan(TrainConfig(), manifest)
    assert (plan.recipe, plan.lora_rank, plan.lora_alpha, plan.lr) == ("lora", 8, 16.0, 1e-4)
    assert plan.sources["lora_rank"] == "manifest"
    plan = resolve_plan(TrainConfig(lr=1e-3, lora_rank=2), manifest)
    assert (plan.lr, plan.lora_rank, plan.sources["lr"]) == (1e-3, 2, "config")
    plan = resolve_plan(TrainConfig(), manifest_for())
    assert plan.recipe == "none" and plan.sources["recipe"] == "method"
    assert resolve_plan(TrainConfig(recipe="full"), manifest_for()).lr == 1e-4
    with pytest.raises(ValueError, match="lora_other_blocks"):
        resolve_plan(TrainConfig(recipe="lora", lora_other_blocks=True), manifest_for())


def test_recovery_recipe_is_typed_and_reads_old_manifests():
    from flexigpt.storage.registry import RecoveryRecipe

    rec = RecoveryRecipe("lora", lr=1e-4, lora_rank=8, lora_targets=("q_proj",),
                         facts={"rank_source": "config"})
    saved = rec.to_dict()
    assert saved == {"recipe": "lora", "lr": 1e-4, "lora_rank": 8, "lora_targets": ["q_proj"],
                     "rank_source": "config"}
    assert RecoveryRecipe.from_info({"recovery": saved}) == rec
    old = RecoveryRecipe.from_info({"recovery": {"recipe": "lora", "rank": 8, "alpha": 16,
                                                 "targets": ["q_proj"]}})
    assert (old.lora_rank, old.lora_alpha, old.lora_targets) == (8, 16, ("q_proj",))
    assert RecoveryRecipe.from_info({}) is None
    with pytest.raises(ValueError, match="shadow"):
        RecoveryRecipe("lora", lora_rank=4, facts={"lora_rank": 5}).to_dict()


def test_lr_schedule_warmup_then_cosine():
    f = lr_factor(TrainConfig(warmup=2, warmup_min_steps=0, min_lr_ratio=0.1), steps=10)
    values = [f(i) for i in range(10)]
    assert values[:3] == [0.5, 1.0, 1.0]
    assert all(a > b for a, b in zip(values[2:], values[3:]))
    assert math.isclose(values[-1], 0.1)


def test_warmup_has_a_floor_capped_at_half_the_run():
    assert TrainConfig(warmup=0.05).warmup_steps(16) == 3  # round(0.8) = 1 → floor 3
    assert TrainConfig(warmup=0.05).warmup_steps(200) == 10
    assert TrainConfig(warmup=0.05).warmup_steps(4) == 2  # at most half the steps
    assert TrainConfig(warmup=0.05, warmup_min_steps=0).warmup_steps(16) == 1


def test_none_recipe_saves_unchanged(tiny_checkpoint, text_file, tmp_path):
    manifest = train_model(tiny_checkpoint, tmp_path / "n", small(), text_file, text_file)
    entry = manifest.history[-1]
    assert entry["recipe"] == "none" and entry["steps"] == 0 and entry["tokens"] == 0
    assert entry["final_ppl"] == entry["ppl_before"] > 1
    a = load_compressed(tiny_checkpoint).model.state_dict()
    b = load_compressed(tmp_path / "n").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cli_full_recipe(tiny_checkpoint, text_file, tmp_path, capsys):
    out = tmp_path / "cli"
    rc = main(["train", "--model", str(tiny_checkpoint), "--out", str(out), "--tokens", "256",
               "--text", str(text_file), "--validation", str(text_file), "--seq-len", "32",
               "--micro-batch", "2", "--global-batch", "4", "--recipe", "full",
               "--eval-windows", "4", "--bf16", "off"])
    assert rc == 0 and "recipe full" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["history"][-1]
    assert entry["steps"] == 2 and entry["tokens"] == 256 and entry["plan"]["lr"] == 1e-4
    model = load_compressed(out).model
    assert entry["trainable"]["trainable_parameters"] == sum(p.numel() for p in model.parameters())
    assert tuple(read_log(out)[0]) == LOG_COLUMNS


def test_plan_is_serialisable():
    plan = TrainPlan("lora", 1e-3, 1e-3, 4, 8.0, 0.0, ("q_proj",), False, sources={"lr": "config"})
    assert json.loads(json.dumps(plan.to_dict()))["lora_targets"] == ["q_proj"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_cross_entropy_equals_torch(dtype, monkeypatch):
    import flexigpt.runtime.training.losses as losses

    monkeypatch.setattr(losses, "CHUNK_ROWS", 7)  # several chunks, a ragged last one
    torch.manual_seed(0)
    logits = torch.randn(3, 11, 50, dtype=dtype, requires_grad=True)
    ids = torch.randint(0, 50, (3, 11))
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, 50),
                                            ids[:, 1:].reshape(-1))
    (g_ref,) = torch.autograd.grad(ref * 3.0, logits)
    ours = losses.causal_lm_loss(logits, ids)
    (g_ours,) = torch.autograd.grad(ours * 3.0, logits)
    assert float(ours) == pytest.approx(float(ref), rel=1e-6)
    assert g_ours.dtype == dtype and torch.allclose(g_ours.float(), g_ref.float(), atol=1e-6)
    assert torch.count_nonzero(g_ours[:, -1]) == 0  # the last position predicts nothing
