"""How each pipeline stage's time and memory grow with model size: the resource plan.

For random-weight Llama models of several sizes (SmolLM2-135M, SmolLM2-360M and
TinyLlama-1.1B shapes by default), measures on this machine, one stage at a time and in
one process, the wall time, CPU time and peak resident memory (RSS sampled every 20 ms,
minus the RSS before the stage; the script re-executes itself with a fixed glibc mmap
threshold so that freed memory leaves the RSS) of:

- ``block_influence``, ``truncation``, ``distances``, ``surgery_init``: FlexiGPT's stages
  (:func:`flexigpt.methods.flexigpt.prune.compress`, its own ``info["timings"]``; one RSS peak for
  the four);
- ``slicegpt``, ``llm_pruner``: the whole compression at the same ratio of every method
  that declares its FLOP per calibration token (``MethodFacts.calibration_flop``);
- ``train_step``: one optimizer step of the FlexiGPT recovery (recipe ``flexigpt``: LoRA +
  γ of the replacement blocks, the real trainer loop) at ``micro_batch × seq_len`` tokens;
- ``eval_forward``: an inference forward over ``eval_batch × eval_seq_len`` tokens (what
  scoring lm-eval requests costs per token).

It then fits ``t = a·Pᵇ`` per stage over the sizes (P = dense parameters; least squares
in log space) and extrapolates to Llama-2-7B: CPU time at the benchmark's token counts,
scaled linearly to the paper's token counts (``config/paper.yaml``: 500 × 2048 calibration
tokens, 1B training tokens, the full task splits at an assumed ~64 tokens a request), and,
for the matmul-bound stages, an accelerator time from a FLOP count (``k·P`` FLOP a token:
forward 2, LLM-Pruner's forward + backward 6, adapter training 4) at ``--gpu-peak`` ×
``--mfu`` (A100 bf16 312 TFLOP/s × 0.4 by default). FlexiGPT's SVD stages get no FLOP
estimate: their cost is LAPACK/cuSOLVER decompositions, not matmuls. Memory: the RSS rise
is fitted as ``m = c + k·P`` (k: bytes per parameter; the train step's rise also scaled to
the paper's 2 × 2048-token micro-batch), and a job's peak is that plus the bf16 weights.
``--from-json`` redoes the fits and tables from a finished run's figures.

Figures go to ``--out`` (JSON, rewritten after every stage, so a partial run keeps what it
measured) and a Markdown table beside it; ``--plot`` draws time and memory vs size.

Example (from the repository root, nothing else running)::

    .venv/bin/python -m benchmarks.bench_scaling --threads 2 \\
        --out results/reference/scaling/bench_scaling.json --plot
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent

from benchmarks.scaling_report import markdown, plot, write_outputs  # noqa: E402
from flexigpt.core.params import count_parameters  # noqa: E402
from flexigpt.runtime.generation.measure import PeakRSS  # noqa: E402
from flexigpt.storage.registry import METHODS, ROLES  # noqa: E402

log = logging.getLogger("bench_scaling")

# Llama shapes (hidden, intermediate, layers, heads, kv heads, vocab, tied embeddings).
SHAPES: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, True),
    "smollm2-360m": (960, 2560, 32, 15, 5, 49152, True),
    "tinyllama-1.1b": (2048, 5632, 22, 32, 4, 32000, False),
    "llama-2-7b": (4096, 11008, 32, 32, 32, 32000, False),
}
TARGET = "llama-2-7b"

# What config/paper.yaml's jobs process, for the extrapolation (tokens per job).
PAPER = {
    "calibration_tokens": 500 * 2048,   # calibration.n_windows × seq_len
    "train_tokens": 1_000_000_000,      # training.tokens
    "train_seq_len": 2048,
    "train_micro_batch": 2,
    # full splits: documents × choices × ~tokens per request (stated assumption, not measured)
    "eval_tokens": (2376 * 4 + 1172 * 4 + 1838 * 2 + 1267 * 2 + 10042 * 4) * 64,
}

#: the methods whose whole compression is a stage here (their own FLOP per calibration token
#: and dense parameter declared), in table order
BASELINE_STAGES = {key: facts.calibration_flop for key, facts in METHODS.items()
                   if facts.calibration_flop is not None}
STAGES_CALIB = ("block_influence", *BASELINE_STAGES)  # scale with calibration tokens
#: FLOP per token and dense parameter of the matmul-bound stages (forward 2·P; a backward
#: through every block adds 2·P for activation gradients, 2·P more with weight gradients)
FLOP_PER_TOKEN_PARAM = {"block_influence": 2, "eval_forward": 2, **BASELINE_STAGES,
                        "train_step": 4}


def llama_config(shape: str) -> Any:
    from transformers import LlamaConfig

    h, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    return LlamaConfig(hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                       tie_word_embeddings=tied, max_position_embeddings=4096,
                       rms_norm_eps=1e-5)


def random_model(shape: str, seed: int) -> torch.nn.Module:
    """A random-weight fp32 Llama of ``shape`` (std 0.02 init), in eval mode."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(shape)).eval()
    model.config.use_cache = False
    return model


def dense_params(shape: str) -> int:
    """Parameter count of ``shape`` without allocating it (meta device; tied weights once:
    ``parameters()`` yields a shared parameter once, where storage pointers cannot tell)."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in LlamaForCausalLM(llama_config(shape)).parameters())


def measure(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """Run ``fn`` once: its result and wall s, CPU s, peak RSS rise (MiB) over the call."""
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    with PeakRSS(interval=0.02) as rss:
        out = fn()
    return out, {"wall_s": round(time.perf_counter() - w0, 3),
                 "cpu_s": round(time.process_time() - c0, 3),
                 "rss_before_mib": round(rss.start / 2**20, 1),
                 "peak_rise_mib": round((rss.peak - rss.start) / 2**20, 1)}


def flexigpt_stages(model: torch.nn.Module, calib: torch.Tensor, ratio: float, rank: int | None,
                    svd: str = "exact") -> tuple[torch.nn.Module, dict[str, Any], dict]:
    """FlexiGPT compression of a copy with the ``svd`` solver: (model, info, per-stage
    figures)."""
    from flexigpt.methods.flexigpt.prune import FlexiGPTConfig, compress

    work = copy.deepcopy(model)
    cfg = FlexiGPTConfig(ratio=ratio, rank=rank, svd=svd)
    with torch.no_grad():
        result, fig = measure(lambda: compress(work, None, calib, cfg))
    t = result.info["timings"]
    stages = {name: {"wall_s": t[name]} for name in
              ("block_influence", "probe", "probe_truncation", "probe_distances", "truncation",
               "distances", "recheck", "surgery_init")
              if name in t}  # probe (its two parts) / recheck: svd auto's probe / close calls
    stages["flexigpt_total"] = fig
    return result.model, result.info, stages


def baseline_stage(method: str, model: torch.nn.Module, calib: torch.Tensor,
                   ratio: float) -> dict[str, float]:
    """Whole compression of a copy of ``model`` by a registry method."""
    from flexigpt.storage.registry import get_method

    spec = get_method(method)
    cfg = spec.make_config(ratio=ratio)
    work = copy.deepcopy(model)
    with torch.no_grad():
        _, fig = measure(lambda: spec.compress(work, None, calib, cfg))
    return fig


def train_step(model: torch.nn.Module, info: dict[str, Any], seq_len: int, micro_batch: int,
               vocab: int, steps: int = 3) -> dict[str, float]:
    """Seconds of one optimizer step of the FlexiGPT recovery (median of ``steps`` - 1 after
    a warm-up step) and the peak RSS rise over the run."""
    from flexigpt.runtime.training.config import TrainConfig, resolve_plan
    from flexigpt.runtime.training.data import WindowStream
    from flexigpt.runtime.training.loop import run_loop
    from flexigpt.runtime.training.recipes import apply_recipe
    from flexigpt.storage.manifest import Manifest
    from flexigpt.storage.registry import get_method

    cfg = TrainConfig(tokens=steps * micro_batch * seq_len, seq_len=seq_len,
                      micro_batch=micro_batch, global_batch=micro_batch, warmup=0,
                      warmup_min_steps=0, checkpoint_every=0,
                      recipe=get_method(ROLES.subject).recovery,
                      eval_windows=None, device="cpu")
    n = count_parameters(model)
    manifest = Manifest.new(ROLES.subject, config={}, base_model=None, structure={}, info=info,
                            dense_params=n, compressed_params=n, calibration=None, seed=0,
                            dtype="float32")
    plan = resolve_plan(cfg, manifest)
    apply_recipe(model, plan)
    windows = torch.randint(vocab, (max(4 * micro_batch, 8), seq_len),
                            generator=torch.Generator().manual_seed(1))
    stamps: list[float] = []

    def run() -> None:
        start = time.perf_counter()
        stamps.append(start)
        with tempfile.TemporaryDirectory() as tmp:
            run_loop(model, WindowStream(windows, 0), None, cfg, plan, Path(tmp) / "ckpt",
                     "bench", on_step=lambda s, loss: stamps.append(time.perf_counter()))

    _, fig = measure(run)
    per_step = sorted(b - a for a, b in zip(stamps[1:], stamps[2:]))
    fig["wall_s"] = round(per_step[len(per_step) // 2], 3)  # one step, warm
    fig["tokens"] = micro_batch * seq_len
    return fig


def eval_forward(model: torch.nn.Module, batch: int, seq_len: int, vocab: int,
                 repeats: int = 3) -> dict[str, float]:
    """Median seconds of an inference forward over ``batch × seq_len`` random tokens."""
    ids = torch.randint(vocab, (batch, seq_len), generator=torch.Generator().manual_seed(2))
    times: list[float] = []

    def run() -> None:
        with torch.inference_mode():
            model(ids)  # warm-up
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(ids)
                times.append(time.perf_counter() - t0)

    _, fig = measure(run)
    fig["wall_s"] = round(sorted(times)[len(times) // 2], 3)
    fig["tokens"] = batch * seq_len
    return fig


def measure_size(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every stage on one random model of ``shape``."""
    vocab = SHAPES[shape][5]
    model, load = measure(lambda: random_model(shape, args.seed))
    row: dict[str, Any] = {"shape": shape, "params": count_parameters(model),
                           "stages": {"load": load}}
    calib = torch.randint(vocab, (args.n_calibration, args.seq_len),
                          generator=torch.Generator().manual_seed(0))
    log.info("%s: %.1f M parameters", shape, row["params"] / 1e6)
    row["stages"]["eval_forward"] = eval_forward(model, args.eval_batch, args.eval_seq_len, vocab)
    log.info("%s eval_forward %s", shape, row["stages"]["eval_forward"])
    compressed, info, stages = flexigpt_stages(model, calib, args.ratio, None, args.svd)
    row["stages"].update(stages)
    row[ROLES.subject] = {"pruned_blocks": info["pruned_blocks"], "k": info["k"],
                       "base_map": info["base_map"], "svd": args.svd,
                       "rechecked": info.get("svd_rechecked", {}),
                       "flat_fallback": info.get("svd_flat_fallback", False),
                       "trainable": info["recovery"].get("trainable_params")}
    log.info("%s flexigpt %s", shape, stages)
    row["stages"]["train_step"] = train_step(compressed, info, args.train_seq_len,
                                             args.train_micro_batch, vocab)
    log.info("%s train_step %s", shape, row["stages"]["train_step"])
    del compressed
    for method in BASELINE_STAGES:
        row["stages"][method] = baseline_stage(method, model, calib, args.ratio)
        log.info("%s %s %s", shape, method, row["stages"][method])
    return row


def fit_power(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = a·xᵇ`` in log space; returns ``(a, b)``."""
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(max(y, 1e-6)) for _, y in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 1.0
    return math.exp(my - b * mx), b


def fit_linear(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = c + k·x``; returns ``(c, k)``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    k = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - k * mx, k


def paper_tokens(stage: str, args: argparse.Namespace) -> int | None:
    """Tokens paper.yaml's job of ``stage`` processes (None: not token-bound)."""
    if stage in STAGES_CALIB:
        return PAPER["calibration_tokens"]
    return {"train_step": PAPER["train_tokens"], "eval_forward": PAPER["eval_tokens"]}.get(stage)


def extrapolate(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per stage: a power-law time fit over the measured sizes and its value at Llama-2-7B
    (CPU, the benchmark's token count, then paper.yaml's); an accelerator estimate from a
    FLOP count, ``k·P·tokens / (gpu_peak · mfu)`` (matmul-bound stages only); a linear fit of
    the RSS rise in P (bytes per parameter) and, added to the bf16 weights, the job's peak."""
    target = dense_params(TARGET)
    out: dict[str, Any] = {"target": TARGET, "target_params": target, "mfu": args.mfu}
    for stage in [s for s in rows[0]["stages"] if s != "load"]:
        have = [r for r in rows if stage in r["stages"]]
        if len(have) < 2:
            continue
        a, b = fit_power([(r["params"], r["stages"][stage]["wall_s"]) for r in have])
        cpu_bench = a * target ** b
        entry: dict[str, Any] = {"time_fit": {"a": a, "b": round(b, 3)},
                                 "cpu_s_at_bench_tokens": round(cpu_bench, 1)}
        tokens = paper_tokens(stage, args)
        bench_tokens = have[-1]["stages"][stage].get("tokens") or (
            args.n_calibration * args.seq_len if stage in STAGES_CALIB else None)
        if tokens and bench_tokens:
            entry["cpu_s_paper"] = round(cpu_bench * tokens / bench_tokens, 1)
        else:
            entry["cpu_s_paper"] = round(cpu_bench, 1)
        k = FLOP_PER_TOKEN_PARAM.get(stage)
        if k and tokens:
            entry["gpu_s_paper"] = round(k * target * tokens / (args.gpu_peak * args.mfu), 1)
        rises = [(r["params"], r["stages"][stage].get("peak_rise_mib")) for r in have]
        if all(isinstance(m, (int, float)) for _, m in rises):
            c, slope = fit_linear(rises)
            rise_gib = max(0.0, (c + slope * target) / 1024)  # a flat fit can dip below 0
            if stage == "train_step":  # activations grow with the micro-batch's tokens
                assert bench_tokens is not None  # train_step rows record their tokens
                rise_gib *= (PAPER["train_micro_batch"] * PAPER["train_seq_len"]) / bench_tokens
            entry["memory_fit"] = {"c_mib": round(c, 1),
                                   "bytes_per_param": round(slope * 2**20, 2)}
            entry["peak_rise_gib"] = round(rise_gib, 1)
            entry["job_peak_gib_bf16_weights"] = round(rise_gib + 2 * target / 2**30, 1)
        out[stage] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["smollm2-135m", "smollm2-360m",
                                                  "tinyllama-1.1b"], choices=sorted(SHAPES))
    p.add_argument("--ratio", type=float, default=0.3)
    p.add_argument("--n-calibration", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256, help="calibration window length")
    p.add_argument("--train-seq-len", type=int, default=256)
    p.add_argument("--train-micro-batch", type=int, default=2)
    p.add_argument("--eval-batch", type=int, default=2)
    p.add_argument("--eval-seq-len", type=int, default=128)
    p.add_argument("--gpu-peak", type=float, default=312e12,
                   help="accelerator dense matmul FLOP/s for the estimate (A100 bf16)")
    p.add_argument("--mfu", type=float, default=0.4,
                   help="accelerator utilisation assumed for the FLOP-based estimate")
    p.add_argument("--from-json", action="store_true",
                   help="measure nothing: redo the fit and tables of the figures in --out")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--svd", default="exact", choices=("auto", "exact", "randomized"),
                   help="FlexiGPT's top-r SVD solver (flexigpt.methods.truncated_svd; the "
                        "committed figures are 'exact')")
    p.add_argument("--out", default="results/bench/bench_scaling.json")
    p.add_argument("--plot", action="store_true", help="also write <out>.png")
    args = p.parse_args(argv)
    if args.from_json:  # the measured rows of an earlier run, fitted again
        figures: dict[str, Any] = json.loads(Path(args.out).read_text())
        figures["args"].update(gpu_peak=args.gpu_peak, mfu=args.mfu)
        figures["gpu_peak"] = args.gpu_peak
        if len(figures["sizes"]) >= 2:  # as a measuring run: no fit from one size
            figures["extrapolation"] = extrapolate(figures["sizes"], argparse.Namespace(
                **{**figures["args"], "gpu_peak": args.gpu_peak, "mfu": args.mfu}))
        write_outputs(Path(args.out), figures)
        if args.plot:
            plot(figures, Path(args.out).with_suffix(".png"))
        print(markdown(figures))
        return 0
    if argv is None and os.environ.get("MALLOC_MMAP_THRESHOLD_") is None:
        # glibc keeps freed heap memory resident, so a stage after a larger one would show no
        # RSS rise; a fixed mmap threshold returns every allocation over 128 KiB on free
        os.execve(sys.executable, [sys.executable, *sys.argv],
                  {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("flexigpt").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    out = Path(args.out)

    from benchmarks.bench_train import matmul_peak
    from flexigpt.core.provenance import cpu_name

    figures = {
        "cpu": cpu_name(), "threads": args.threads,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "cpu_peak_fp32": matmul_peak(torch.float32), "gpu_peak": args.gpu_peak,
        "args": vars(args), "paper": PAPER, "sizes": []}
    log.info("fp32 matmul peak %.1f GFLOP/s", figures["cpu_peak_fp32"] / 1e9)
    for shape in sorted(args.sizes, key=dense_params):
        figures["sizes"].append(measure_size(shape, args))
        figures["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        if len(figures["sizes"]) >= 2:
            figures["extrapolation"] = extrapolate(figures["sizes"], args)
        write_outputs(out, figures)
        gc.collect()
    if args.plot:
        plot(figures, out.with_suffix(".png"))
    print(markdown(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
