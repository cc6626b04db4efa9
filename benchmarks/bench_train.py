"""Training throughput of FlexiGPT recovery on SmolLM2-135M, and its fraction of peak.

Measures, in one run on this machine:

1. the dense matmul peak: FLOP/s of a large ``torch.matmul`` (n × n by n × n, 2n³ FLOP) in
   fp32 and bf16;
2. tokens/s of the real trainer loop (:func:`flexigpt.runtime.training.loop.run_loop`) for each
   ``--methods`` entry on SmolLM2-135M compressed at ``--ratio``: ``flexigpt`` (recipe
   ``flexigpt``: LoRA + γ of the replacement blocks, base frozen) and ``shortgpt`` (ShortGPT +
   LoRA: recipe ``lora`` at FlexiGPT's trainable count, Table 1's pair), for each variant
   (bf16 autocast, micro-batch, compile), methods interleaved per variant; the first
   ``--warmup-steps`` steps are excluded from the timing (``--profile``: the operators'
   self CPU time per run, for finding where a step goes);
3. model FLOPs utilisation (MFU) against both peaks.

FLOP model (per training token; M = multiply-accumulates per token of every linear as
used in the forward, shared base weights counted at each use, LoRA paths included, LM head
included, embedding lookup excluded; A = attention-score MACs per token = 2·T·H·d_head per
layer (QKᵀ and AV over the full window, as SDPA computes it on CPU); M_b, A_b = the same
sums over the blocks from the first one holding a trainable parameter to the end, plus the
LM head — autograd propagates no gradient below that block; M_t = MACs of the trainable
matrices (the LoRA paths)):

    forward                  2·(M + A)
    full fine-tuning         6·(M + A)                   (the standard 6·N)
    frozen base + adapters   2·(M + A) + 2·(M_b + A_b) + 2·M_t
                             (forward, activation gradients where they flow, weight
                              gradients of the adapters only)

Usage::

    python -m benchmarks.bench_train --threads 2 --out results/bench/bench_train.json
    python -m benchmarks.bench_train --methods flexigpt shortgpt --variants on:8,on:8:compile
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent

from flexigpt.core import memory  # noqa: E402
from flexigpt.core.fileio import atomic_write_text  # noqa: E402
from flexigpt.core.provenance import cpu_name  # noqa: E402
from flexigpt.methods.calibration import token_windows  # noqa: E402
from flexigpt.methods.lora import is_wrapper  # noqa: E402
from flexigpt.runtime.generation.measure import PeakRSS  # noqa: E402
from flexigpt.runtime.training.config import TrainConfig, resolve_plan  # noqa: E402
from flexigpt.runtime.training.data import WindowStream  # noqa: E402
from flexigpt.runtime.training.loop import run_loop  # noqa: E402
from flexigpt.runtime.training.recipes import apply_recipe  # noqa: E402
from flexigpt.storage.artifacts import load_compressed, read_manifest  # noqa: E402
from flexigpt.storage.registry import ROLES, get_method  # noqa: E402

log = logging.getLogger("bench_train")


def matmul_peak(dtype: torch.dtype, n: int = 2048, seconds: float = 3.0) -> float:
    """Best FLOP/s of ``n×n @ n×n`` in ``dtype`` over repeated calls (2n³ FLOP each)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.matmul(a, b)  # warm-up (kernel selection, AMX tile init)
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tic = time.perf_counter()
        torch.matmul(a, b)
        best = max(best, 2 * n**3 / (time.perf_counter() - tic))
    return best


def _linear_macs(module: torch.nn.Module) -> tuple[int, int]:
    """(linear MACs incl. LoRA paths, LoRA-path MACs) per token of ``module``, each use."""
    linear = lora = 0
    for _, sub in module.named_modules(remove_duplicate=False):
        if type(sub) is torch.nn.Linear:
            linear += sub.in_features * sub.out_features
        if is_wrapper(sub) and hasattr(sub, "lora_A"):
            lora += sub.lora_A.numel() + sub.lora_B.numel()
    return linear + lora, lora


def macs_per_token(model: torch.nn.Module, seq_len: int) -> dict[str, int]:
    """Per-token MACs: all linears (each use), LoRA paths, attention scores, and the part of
    linears/attention that the backward pass runs through (first trainable block → head)."""
    from flexigpt.storage.models.adapters import get_adapter

    adapter = get_adapter(model)
    blocks = list(adapter.layers(model))
    linear, lora = _linear_macs(model)
    cfg: Any = model.config  # its HF config; nn.Module types attributes as Tensor | Module
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_block_attn = 2 * seq_len * cfg.num_attention_heads * head_dim
    first = next((i for i, b in enumerate(blocks)
                  if any(p.requires_grad for p in b.parameters())), len(blocks))
    below = sum(_linear_macs(b)[0] for b in blocks[:first])
    return {"linear": linear, "lora": lora, "attention": per_block_attn * len(blocks),
            "first_trainable_block": first, "backward_linear": linear - below,
            "backward_attention": per_block_attn * (len(blocks) - first)}


#: recovery recipe of each measured method, as Table 1 pairs them: the protocol's subject
#: (FlexiGPT) with its own recipe (LoRA + γ on the replacement blocks), and the one-shot skip
#: method (ShortGPT) with its like-for-like comparator's recipe (ShortGPT + LoRA: mergeable
#: LoRA on every linear at the subject's trainable count); the subject sets that budget
RECIPE = {ROLES.subject: get_method(ROLES.subject).recovery,
          ROLES.skip: get_method(ROLES.comparator).recovery}


def ensure_compressed(method: str, model: str, text: str, ratio: float, out: Path,
                      policy: str = "paper", match_ratio: float | None = None) -> Path:
    """``model`` compressed by ``method`` at ``ratio`` into ``out`` (kept: reused when there).
    ``policy``: the block-count rule (``paper``: int(ratio · L); ``matched``: the count whose
    achieved ratio is nearest the target, ``match_ratio`` for a like-for-like baseline)."""
    if not (out / "manifest.json").is_file():
        from flexigpt.api.compression import compress

        options: dict[str, Any] = {"ratio": ratio, "policy": policy}
        if match_ratio is not None:
            options["match_ratio"] = match_ratio
        log.info("compressing %s with %s at %.2f (%s) -> %s", model, method, ratio, options, out)
        compress(method, model, out, options=options, calibration=text,
                 n_calibration=64, calibration_seq_len=256)
    return out


def achieved_ratio(model_dir: Path) -> float:
    """The achieved compression ratio recorded in a compressed model's manifest."""
    return float(read_manifest(model_dir).parameters.achieved_ratio)


def measure(model_dir: Path, text: str, cfg: TrainConfig, steps: int, warmup: int,
            profile: Path | None = None) -> dict:
    """tokens/s of the trainer loop for ``cfg`` (timed over steps after ``warmup``); with
    ``profile``, the operators' self CPU time over the whole run is written there."""
    loaded = load_compressed(model_dir)
    assert loaded.manifest is not None  # ensure_compressed wrote a harness output
    plan = resolve_plan(cfg, loaded.manifest)
    report = apply_recipe(loaded.model, plan)
    macs = macs_per_token(loaded.model, cfg.seq_len)
    stream = WindowStream(token_windows(text, loaded.tokenizer, cfg.seq_len), cfg.seed)
    stamps: list[float] = []
    with (tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack,
          PeakRSS(interval=0.05) as rss):
        prof = (stack.enter_context(torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True))
            if profile else None)
        run_loop(loaded.model, stream, None, cfg, plan, Path(tmp) / "ckpt", "bench",
                 on_step=lambda s, loss: stamps.append(time.perf_counter()))
    if prof is not None and profile is not None:
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30,
                                          max_name_column_width=60)
        shapes = prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=40,
            max_shapes_column_width=80)
        profile.write_text(f"{table}\n\nBy input shape:\n{shapes}")
    timed = stamps[warmup - 1:] if warmup else stamps
    seconds = timed[-1] - timed[0]
    tokens = (len(timed) - 1) * cfg.global_batch * cfg.seq_len
    return {"tokens_per_second": tokens / seconds, "timed_steps": len(timed) - 1,
            "step_seconds": [round(b - a, 3) for a, b in zip(stamps, stamps[1:])],
            "rss_start_mib": round(rss.start / 2**20), "rss_peak_mib": round(rss.peak / 2**20),
            "trainable_parameters": report.trainable_parameters, "macs": macs}


def train_flops_per_token(macs: dict[str, int]) -> int:
    """The FLOP model of the module docstring (frozen base + adapters)."""
    return (2 * (macs["linear"] + macs["attention"])
            + 2 * (macs["backward_linear"] + macs["backward_attention"]) + 2 * macs["lora"])


def parse_variants(spec: str) -> list[dict[str, Any]]:
    """``BF16:MICRO_BATCH[:compile]`` items, comma-separated."""
    variants = []
    for item in spec.split(","):
        bf16, micro, *rest = item.split(":")
        variants.append({"bf16": bf16, "micro_batch": int(micro), "compile": rest == ["compile"]})
    return variants


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resources/models/smollm2-135m")
    p.add_argument("--text", default="resources/text/wiki/train.txt")
    p.add_argument("--ratio", type=float, default=0.3)
    p.add_argument("--methods", nargs="+", default=[ROLES.subject], choices=sorted(RECIPE),
                   help="recovery recipes measured, interleaved per variant (shortgpt: "
                        "ShortGPT + LoRA at FlexiGPT's trainable count)")
    p.add_argument("--policy", choices=("paper", "matched"), default="paper",
                   help="block count (paper: int(ratio * L), 9 of 30 blocks at 0.3; matched: "
                        "Table 1's and the budget ladder's, FlexiGPT 13 replaced and ShortGPT "
                        "+ LoRA at FlexiGPT's achieved ratio)")
    p.add_argument("--compressed", default="results/bench/smollm2-135m-{method}-{ratio}-{policy}",
                   help="where each compressed model is kept ({method}, {ratio}, {policy} filled in)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--variants", default="on:4,on:8,off:4",
                   help="comma-separated BF16:MICRO_BATCH[:compile], BF16 in auto|on|off")
    p.add_argument("--steps", type=int, default=4, help="steps per variant (incl. warm-up)")
    p.add_argument("--warmup-steps", type=int, default=1)
    p.add_argument("--profile", action="store_true",
                   help="also write <out>.<method>.<variant>.profile.txt: operators by self "
                        "CPU time over each run, overall and by input shape (the profiler "
                        "slows the run, large copies and softmaxes most: ~20x in our runs, "
                        "so read it for op counts and shapes; time parts with timers)")
    p.add_argument("--reuse-memory", choices=("on", "off", "both"), default="on",
                   help="flexigpt.core.memory.reuse_freed_memory in the loop (the trainer's "
                        "default: on); both: each run twice, off then on, interleaved")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", default="results/bench/bench_train.json")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    os.chdir(ROOT)

    peak = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    log.info("matmul peak: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s",
             peak["fp32"] / 1e9, peak["bf16"] / 1e9)
    subject = ROLES.subject
    methods = sorted(args.methods, key=lambda m: m != subject)  # the subject sets the budget
    dirs: dict[str, Path] = {}
    for m in methods:  # FlexiGPT first: under matched, ShortGPT matches its achieved ratio
        match = (achieved_ratio(dirs[subject])
                 if args.policy == "matched" and m != subject and subject in dirs else None)
        dirs[m] = ensure_compressed(m, args.model, args.text, args.ratio, Path(
            args.compressed.format(method=m, ratio=args.ratio, policy=args.policy)),
            args.policy, match)
    budget: int | None = None  # FlexiGPT's trainable count, which ShortGPT + LoRA matches
    results: list[dict] = []
    out = write(args, peak, results)
    reuse = {"on": [True], "off": [False], "both": [False, True]}[args.reuse_memory]
    for v in parse_variants(args.variants):
        for method in methods:
            for flag in reuse:
                memory.REUSE = flag
                row = {**run_variant(args, v, method, dirs[method], budget, peak),
                       "reuse_memory": flag}
                results.append(row)
                if method == subject and "trainable_parameters" in row:
                    budget = row["trainable_parameters"]
                out = write(args, peak, results)  # after every run: partial runs keep results
    print(json.dumps(out, indent=1))
    return 0


def run_variant(args: argparse.Namespace, v: dict[str, Any], method: str, model_dir: Path,
                budget: int | None, peak: dict[str, float]) -> dict[str, Any]:
    """One measured run: the JSON row (an ``error`` row where the variant cannot run)."""
    cfg = TrainConfig(tokens=args.steps * v["micro_batch"] * args.seq_len,
                      seq_len=args.seq_len, micro_batch=v["micro_batch"],
                      global_batch=v["micro_batch"], bf16=v["bf16"], warmup=0,
                      checkpoint_every=0, recipe=RECIPE[method], compile=v["compile"],
                      lora_budget=budget if method != ROLES.subject else None)
    tag = (f"{method}.{v['bf16']}{v['micro_batch']}{'c' if v['compile'] else ''}"
           f"{'' if memory.REUSE else '.noreuse'}")
    profile = Path(f"{args.out}.{tag}.profile.txt") if args.profile else None
    head = {"method": method, "recipe": RECIPE[method], **v}
    try:
        r = measure(model_dir, args.text, cfg, args.steps, args.warmup_steps, profile)
    except Exception as err:  # a variant that cannot run (e.g. compile) is reported
        log.warning("%s failed: %s", tag, err)
        return {**head, "error": f"{type(err).__name__}: {err}"}
    flops_token = train_flops_per_token(r["macs"])
    achieved = flops_token * r["tokens_per_second"]
    row = {**head, **r, "train_flops_per_token": flops_token, "achieved_flops": achieved,
           "mfu_vs_fp32_peak": achieved / peak["fp32"],
           "mfu_vs_bf16_peak": achieved / peak["bf16"]}
    log.info("%s: %.0f tok/s, %.1f GFLOP/s (%.1f%% of fp32 peak, %.1f%% of bf16 peak)",
             tag, r["tokens_per_second"], achieved / 1e9, 100 * row["mfu_vs_fp32_peak"],
             100 * row["mfu_vs_bf16_peak"])
    return row


def write(args: argparse.Namespace, peak: dict, results: list) -> dict:
    out = {"cpu": cpu_name(), "threads": args.threads, "policy": args.policy, "load_average": os.getloadavg(), "seq_len": args.seq_len,
           "peak_flops": peak, "formula": "frozen base + adapters: 2*(M+A) + 2*(M_b+A_b) + 2*M_lora "
           "FLOP/token (M linear MACs/token, A attention MACs/token, _b: from the first "
           "trainable block on)", "variants": results}
    atomic_write_text(args.out, json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
