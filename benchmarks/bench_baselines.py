"""Measure the paper's Table 1 baselines that take a ratio policy on a real checkpoint.

By default the methods are those of :func:`policy_baselines` (ShortGPT, ShortGPT + LoRA and
LLM-Pruner today); ``--methods`` names others. For every method × ratio: compress through ``flexigpt.api.compression.compress`` (the path behind
``flexigpt compress``), reload with ``load_compressed``, and record the achieved parameter
ratio (``count_parameters``, embeddings and head included), the pruning time and the
held-out perplexity before recovery (``token_windows`` on the validation text: the first
``--ppl-windows`` windows of ``--ppl-seq-len`` tokens in file order; ``perplexity``). With
``--recover-tokens N`` the methods whose recipe is not ``none`` are also trained by the shared
trainer (``flexigpt.runtime.training.train_model``) on N tokens of the calibration text and re-measured.
Rows are written to ``--json`` as they finish; ``--resume`` keeps the rows already there
(same method, ratio, policy and recovery budget) and measures only the missing ones.

Example (from the repository root)::

    .venv/bin/python -m benchmarks.bench_baselines --threads 2 --recover-tokens 50000 \\
        --json results/bench_baselines.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

from flexigpt.api.compression import compress  # noqa: E402
from flexigpt.core.fileio import atomic_write_text  # noqa: E402
from flexigpt.methods.calibration import token_windows  # noqa: E402
from flexigpt.methods.perplexity import perplexity  # noqa: E402
from flexigpt.storage.artifacts import load_compressed, read_manifest  # noqa: E402
from flexigpt.storage.manifest import Manifest  # noqa: E402
from flexigpt.storage.models.loading import load_model  # noqa: E402
from flexigpt.storage.registry import METHODS, ROLES, get_method, is_paper_baseline  # noqa: E402

log = logging.getLogger("bench_baselines")


def policy_baselines() -> list[str]:
    """The paper's Table 1 baselines (``MethodFacts.paper_variants``) whose options have a
    block-count ``policy``, in table order."""
    return [key for key in METHODS if is_paper_baseline(key, "default")
            and "policy" in {f.name for f in dataclasses.fields(get_method(key).config_cls)}]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(ROOT / "resources/models/smollm2-135m"))
    p.add_argument("--calibration", default=str(ROOT / "resources/text/wiki/train.txt"))
    p.add_argument("--validation", default=str(ROOT / "resources/text/wiki/validation.txt"))
    p.add_argument("--methods", nargs="+", default=None,
                   help="registry keys (default: the paper's baselines with a policy option)")
    p.add_argument("--ratios", nargs="+", type=float, default=[0.3, 0.4])
    p.add_argument("--policy", default="matched", help="policy option of every method")
    p.add_argument("--n-calibration", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=512, help="calibration window length")
    p.add_argument("--ppl-windows", type=int, default=64)
    p.add_argument("--ppl-seq-len", type=int, default=512)
    p.add_argument("--recover-tokens", type=int, default=0,
                   help="also run the shared trainer for this many tokens (0: skip)")
    p.add_argument("--train-seq-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--work-dir", help="where compressed models go (default: a temp dir)")
    p.add_argument("--json", help="write the result rows here (after every row)")
    p.add_argument("--resume", action="store_true", help="keep finished rows of --json")
    return p.parse_args(argv)


def recover(model_dir: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """Shared-trainer recovery of a saved model; returns the trained dir and its history."""
    from flexigpt.runtime.training import TrainConfig, train_model

    out = model_dir.with_name(model_dir.name + "-recovered")
    cfg = TrainConfig(tokens=args.recover_tokens, seq_len=args.train_seq_len, micro_batch=8,
                      global_batch=16, eval_windows=None, checkpoint_every=0, seed=args.seed)
    manifest = train_model(model_dir, out, cfg, text=args.calibration)
    assert isinstance(manifest, Manifest)  # no stop_step: the trained model's manifest
    return out, manifest.history[-1]


def _reusable(out: Path, options: dict[str, Any],
              args: argparse.Namespace) -> Manifest | None:
    """With --resume: the manifest of an earlier identical compression in --work-dir."""
    if not (args.resume and (out / "manifest.json").is_file()):
        return None
    manifest = read_manifest(out)
    calib = manifest.calibration
    same = (all(manifest.config.get(k) == v for k, v in options.items())
            and calib is not None and calib.n_windows == args.n_calibration
            and calib.seq_len == args.seq_len and manifest.seed == args.seed)
    if same:
        log.info("reusing %s", out)
    return manifest if same else None


def run_one(method: str, ratio: float, work: Path, val: torch.Tensor,
            args: argparse.Namespace) -> dict[str, Any]:
    out = work / f"{method}-{ratio}"
    options = {"ratio": ratio, "policy": args.policy}
    wall = time.perf_counter()
    manifest = _reusable(out, options, args)
    if manifest is None:
        manifest = compress(method, args.model, out, options=options,
                            calibration=args.calibration, n_calibration=args.n_calibration,
                            calibration_seq_len=args.seq_len, seed=args.seed)
    wall = time.perf_counter() - wall
    info, params = manifest.info, manifest.parameters
    row: dict[str, Any] = {
        "method": method, "ratio": ratio, "policy": args.policy,
        "achieved_ratio": params.achieved_ratio, "params": params.compressed,
        "dense_params": params.dense, "compress_seconds": manifest.extras["compress_seconds"],
        "wall_seconds_incl_load_save": round(wall, 2),  # ~0 when reused
        "ppl_before_recovery": perplexity(load_compressed(out).model, val, batch_size=4),
    }
    if "removed_blocks" in info:  # a block-removal method
        row["removed_blocks"] = info["removed_blocks"]
    if "head_fraction" in info:  # a width-pruning method's group fractions
        row["structure"] = {k: manifest.structure[k] for k in
                            ("num_attention_heads", "num_key_value_heads", "intermediate_size")}
        row["fractions"] = [info["head_fraction"], info["ffn_fraction"]]
    if "recovery" in info:
        row["recovery_recipe"] = {k: info["recovery"][k] for k in info["recovery"]
                                  if k not in ("targets",)}
    row["recovery_tokens_budget"] = _budget(method, args)
    if row["recovery_tokens_budget"]:
        trained, entry = recover(out, args)
        row["recovery_tokens"] = entry["tokens"]
        row["recovery_seconds"] = entry["train_seconds"]
        row["recovery_lr"] = entry["plan"]["lr"]
        row["ppl_after_recovery"] = perplexity(load_compressed(trained).model, val,
                                               batch_size=4)
    log.info("%s", json.dumps(row))
    return row


def _budget(method: str, args: argparse.Namespace) -> int:
    """Recovery tokens a row of ``method`` gets under ``args`` (0: not trained)."""
    if method == ROLES.reference or get_method(method).recovery == "none":
        return 0
    return args.recover_tokens


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.methods = args.methods or policy_baselines()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    out = Path(args.json) if args.json else None
    rows: list[dict[str, Any]] = []
    if args.resume and out is not None and out.is_file():
        rows = [r for r in json.loads(out.read_text())
                if r.get("recovery_tokens_budget", 0) == _budget(r["method"], args)]
    done = {(r["method"], r["ratio"], r.get("policy")) for r in rows}

    def save() -> None:
        if out is not None:
            atomic_write_text(out, json.dumps(rows, indent=2))

    tokenizer = load_model(args.model)[1]
    val = token_windows(args.validation, tokenizer, args.ppl_seq_len, args.ppl_windows)
    if not any(r["method"] == ROLES.reference for r in rows):
        dense = load_model(args.model)[0]
        rows.insert(0, {"method": ROLES.reference, "ratio": 0.0, "policy": None, "achieved_ratio": 0.0,
                        "ppl_before_recovery": perplexity(dense, val, batch_size=4)})
        log.info("%s", json.dumps(rows[0]))
        del dense
        save()
    with tempfile.TemporaryDirectory(prefix="bench-baselines-") as tmp:
        work = Path(args.work_dir) if args.work_dir else Path(tmp)
        for method in args.methods:
            for ratio in args.ratios:
                if (method, ratio, args.policy) in done:
                    continue
                rows.append(run_one(method, ratio, work, val, args))
                save()
    print("| method | target | achieved | compress s | ppl before | ppl after |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        after = r.get("ppl_after_recovery")
        print(f"| {r['method']} | {r['ratio']:.2f} | {r['achieved_ratio']:.4f} | "
              f"{r.get('compress_seconds', '')} | {r['ppl_before_recovery']:.2f} | "
              f"{'' if after is None else f'{after:.2f}'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
