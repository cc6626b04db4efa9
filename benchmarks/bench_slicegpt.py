"""Time, peak memory and quality of the SliceGPT baseline on a real checkpoint.

``memory``: for each calibration size N, slice in a *fresh subprocess* (so ``ru_maxrss`` is
that run's own peak) and record wall time, peak RSS, RSS after loading, and peak RSS over
the model's fp32 weight size.

``quality``: for each parameter-reduction ratio, compress through ``flexigpt.api.compression.compress``,
reload with ``load_compressed`` and measure perplexity (``token_windows`` on the validation
text, first ``--ppl-windows`` windows of ``--ppl-seq-len`` in file order), dense included;
with ``--rft-tokens N`` also train with the shared trainer (``info.recovery``: the paper's
LoRA r32/α10 RFT) on N tokens of the calibration text and re-measure. ``rft``: the same
training for already-compressed ``--model-dirs``.

Examples (repository root)::

    .venv/bin/python -m benchmarks.bench_slicegpt memory --n 128 1024 --seq-len 256
    .venv/bin/python -m benchmarks.bench_slicegpt quality --ratios 0.3 0.4 --rft-tokens 100000
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

from flexigpt.core.params import count_parameters  # noqa: E402
from flexigpt.core.provenance import cpu_name  # noqa: E402
from flexigpt.runtime.generation.measure import PeakRSS  # noqa: E402

log = logging.getLogger("bench_slicegpt")


def _peak_mib() -> float:
    """Lifetime peak RSS of this process (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    """Slice once in this process; report time and memory (called in a subprocess)."""
    from baselines.slicegpt.method import METHOD
    from flexigpt.methods.calibration import token_windows
    from flexigpt.storage.models.loading import load_model

    model, tok = load_model(args.model, mapped=False)  # as flexigpt.api.compression.compress loads it
    weights_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    windows = token_windows(args.calibration, tok, args.seq_len, args.n[0], seed=args.seed)
    gc.collect()
    cfg = METHOD.make_config(ratio=args.ratio, head=args.head, batch_size=args.batch_size,
                             activations=args.activations)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad(), PeakRSS(interval=0.02) as rss:
        result = METHOD.compress(model, tok, windows, cfg)
    before, peak = rss.start / 2**20, rss.peak / 2**20
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    hf_config: Any = model.config  # its HF config; nn.Module types attributes as Tensor | Module
    buffer_mib = windows.numel() * hf_config.hidden_size * 4 / 2**20
    return {"n_calibration": args.n[0], "seq_len": args.seq_len, "threads": args.threads,
            "cpu": cpu_name(), "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "activations": cfg.activations,
            "slice_seconds": round(seconds, 1), "slice_cpu_seconds": round(cpu, 1),
            "rss_before_slicing_mib": round(before, 1),
            "peak_rss_during_slicing_mib": round(peak, 1),
            "slicing_rss_increase_mib": round(peak - before, 1),
            "process_lifetime_peak_rss_mib": round(_peak_mib(), 1),
            "model_fp32_mib": round(weights_mib, 1), "activation_buffer_mib": round(buffer_mib, 1),
            # the official loop holds layer inputs, MLP-norm inputs and outputs at once (§2.6)
            "official_activation_estimate_mib": round(3 * buffer_mib, 1),
            "peak_over_model": round(peak / weights_mib, 2),
            "increase_over_model": round((peak - before) / weights_mib, 2),
            "achieved_ratio": result.info["achieved_ratio"], "width": result.info["width"],
            "head": result.info["head"]}


def memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for n in args.n:
        cmd = [sys.executable, __file__, "one", "--n", str(n), "--seq-len", str(args.seq_len),
               "--model", args.model, "--calibration", args.calibration, "--ratio", str(args.ratio),
               "--head", args.head, "--threads", str(args.threads),
               "--batch-size", str(args.batch_size), "--activations", args.activations]
        log.info("running %s", " ".join(cmd))
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
        if proc.returncode:  # the child's traceback went to our stderr
            rows.append({"n_calibration": n, "error": f"exit status {proc.returncode}"})
        else:
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        log.info("%s", rows[-1])
    return rows


def quality(args: argparse.Namespace) -> list[dict[str, Any]]:
    from baselines.slicegpt.method import METHOD
    from flexigpt.api.compression import compress
    from flexigpt.methods.calibration import token_windows
    from flexigpt.methods.perplexity import perplexity
    from flexigpt.storage.artifacts import load_compressed
    from flexigpt.storage.models.loading import load_model
    from flexigpt.storage.registry import ROLES

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_slicegpt-"))
    dense, tok = load_model(args.model)
    val = token_windows(args.validation, tok, args.ppl_seq_len, args.ppl_windows)
    dense_params = count_parameters(dense)
    rows = [{"model": ROLES.reference, "parameters": dense_params,
             "ppl": round(perplexity(dense, val, batch_size=4), 3)}]
    log.info("%s", rows[-1])
    del dense
    for ratio in args.ratios:
        out = work / f"{METHOD.name}-{ratio}"
        start, cpu = time.perf_counter(), time.process_time()
        manifest = compress(METHOD.name, args.model, out, {"ratio": ratio, "head": args.head},
                            calibration=args.calibration, n_calibration=args.n[0],
                            calibration_seq_len=args.seq_len, seed=args.seed)
        info = manifest.info
        loaded = load_compressed(out)
        row = {"model": f"{METHOD.name} {ratio}", "head": info["head"], "width": info["width"],
               "slicing_fraction": info["slicing_fraction"],
               "parameters": manifest.parameters.compressed,
               "achieved_ratio": round(manifest.parameters.achieved_ratio, 4),
               "slice_seconds": info["slice_seconds"],
               "compress_wall_seconds": round(time.perf_counter() - start, 1),
               "compress_cpu_seconds": round(time.process_time() - cpu, 1),
               "process_peak_rss_mib": info["process_peak_rss_mib"],
               "ppl": round(perplexity(loaded.model, val, batch_size=4), 3)}
        if args.rft_tokens:
            row.update(rft(out, work / f"{METHOD.name}-{ratio}-rft", val, args))
        rows.append(row)
        log.info("%s", row)
    return rows


def rft(model_dir: Path, out: Path, val: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """Recovery fine-tuning by the shared trainer (recipe from the manifest), then perplexity."""
    from flexigpt.methods.perplexity import perplexity
    from flexigpt.runtime.training import TrainConfig, train_model
    from flexigpt.storage.artifacts import load_compressed
    from flexigpt.storage.manifest import Manifest

    tcfg = TrainConfig(tokens=args.rft_tokens, seq_len=args.train_seq_len, micro_batch=4,
                       global_batch=8, checkpoint_every=0, eval_windows=8, seed=args.seed)
    start, cpu = time.perf_counter(), time.process_time()
    manifest = train_model(model_dir, out, tcfg, args.calibration)
    assert isinstance(manifest, Manifest)  # no stop_step: the trained model's manifest
    trained = load_compressed(out)
    return {"rft_tokens": args.rft_tokens, "rft_seconds": round(time.perf_counter() - start, 1),
            "rft_cpu_seconds": round(time.process_time() - cpu, 1),
            "rft_recipe": manifest.history[-1]["plan"],
            "ppl_rft": round(perplexity(trained.model, val, batch_size=4), 3),
            "parameters_rft": count_parameters(trained.model)}


def rft_only(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``rft`` mode: train already-compressed ``--model-dirs`` and measure them."""
    from transformers import AutoTokenizer

    from flexigpt.methods.calibration import token_windows

    tok = AutoTokenizer.from_pretrained(args.model_dirs[0], trust_remote_code=False)
    val = token_windows(args.validation, tok, args.ppl_seq_len, args.ppl_windows)
    rows = []
    for model_dir in map(Path, args.model_dirs):
        out = model_dir.with_name(model_dir.name + "-rft")
        rows.append({"model": str(model_dir), **rft(model_dir, out, val, args)})
        log.info("%s", rows[-1])
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["memory", "quality", "rft", "one"])
    p.add_argument("--model-dirs", nargs="+", default=[], help="rft mode: compressed models")
    p.add_argument("--model", default=str(ROOT / "resources/models/smollm2-135m"))
    p.add_argument("--calibration", default=str(ROOT / "resources/text/wiki/train.txt"))
    p.add_argument("--validation", default=str(ROOT / "resources/text/wiki/validation.txt"))
    p.add_argument("--n", nargs="+", type=int, default=[128], help="calibration windows")
    p.add_argument("--seq-len", type=int, default=256, help="calibration window length")
    p.add_argument("--ratio", type=float, default=0.3, help="memory mode: parameter reduction")
    p.add_argument("--ratios", nargs="+", type=float, default=[0.3, 0.4])
    p.add_argument("--head", default="auto")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--activations", default="disk", choices=["disk", "memory"],
                   help="memory mode: where the calibration activations live while slicing")
    p.add_argument("--ppl-windows", type=int, default=64)
    p.add_argument("--ppl-seq-len", type=int, default=512)
    p.add_argument("--rft-tokens", type=int, default=0)
    p.add_argument("--train-seq-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=int, default=4 * 3600, help="per-subprocess limit (s)")
    p.add_argument("--work-dir")
    p.add_argument("--json", help="also write the rows here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        stream=sys.stderr)
    torch.set_num_threads(args.threads)
    if args.mode == "one":
        print(json.dumps(one_run(args)))
        return 0
    rows = {"memory": memory, "quality": quality, "rft": rft_only}[args.mode](args)
    text = json.dumps(rows, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
