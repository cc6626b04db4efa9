"""flexigpt generate: text from any saved model (greedy or sampling, batches, KV cache),
with self-speculative decoding for FlexiGPT models (``--speculative``).

Thin wrapper around :func:`flexigpt.runtime.generation.generate`.
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "generate text with a saved model (optionally self-speculative for FlexiGPT models)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from flexigpt.cli.commands import add_device_argument

    p.add_argument("--model", required=True, help="saved model directory (any method) or "
                                                  "plain HF checkpoint")
    p.add_argument("prompts", nargs="*", help="prompt(s); or use --prompts-file")
    p.add_argument("--prompts-file", help="text file, one prompt per line")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speculative", action="store_true",
                   help="self-speculative decoding: FlexiGPT draft without its shared blocks")
    p.add_argument("--draft-length", type=int, default=None,
                   help="tokens drafted per verification (k)")
    p.add_argument("--engine", choices=("auto", "transformers", "lean"), default="auto",
                   help="decoding loop: transformers' generate, our lean greedy loop (one "
                        "prompt at a time), or auto = lean for greedy speculative decoding")
    p.add_argument("--ignore-eos", action="store_true",
                   help="always generate --max-new-tokens tokens")
    p.add_argument("--merged", action="store_true",
                   help="merged-weights decode path: merge replacement adapters into private "
                        "weights (more memory)")
    p.add_argument("--dtype", default="float32")
    add_device_argument(p)
    p.add_argument("--threads", type=int, help="torch threads")
    p.add_argument("--json", help="write texts and statistics to this JSON file")


def check_flags(args: argparse.Namespace) -> None:
    """Counts are integers at or above their minimum, ``--temperature`` >= 0 and
    ``--top-p`` in (0, 1] (``ValueError`` naming the flag); before the model is loaded."""
    from flexigpt.api.values import check_count

    check_count(args.max_new_tokens, "--max-new-tokens")
    check_count(args.batch_size, "--batch-size")
    check_count(args.seed, "--seed", minimum=0)
    for flag in ("draft_length", "threads"):
        if getattr(args, flag) is not None:
            check_count(getattr(args, flag), f"--{flag.replace('_', '-')}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature!r}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p!r}")


def check_length(config: object, prompt_tokens: int, max_new_tokens: int) -> None:
    """``ValueError`` when the longest prompt plus ``--max-new-tokens`` exceeds the model's
    positions: past them the text is garbage at ever-growing cost (the estimate is named)."""
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and prompt_tokens + max_new_tokens > limit:
        raise ValueError(
            f"--max-new-tokens {max_new_tokens} with a {prompt_tokens}-token prompt needs "
            f"{prompt_tokens + max_new_tokens} positions; the model has {limit} "
            f"(max_position_embeddings): use --max-new-tokens <= {max(limit - prompt_tokens, 0)}")


def run(args: argparse.Namespace) -> int:
    import torch

    from flexigpt.runtime.generation import DEFAULT_DRAFT_LENGTH, Generator, read_prompts

    check_flags(args)
    prompts = list(args.prompts)
    if args.prompts_file:
        prompts += read_prompts(args.prompts_file)
    if not prompts:
        raise ValueError("give prompts as arguments or with --prompts-file")
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = Generator(args.model, dtype=args.dtype, device=args.device)
    longest = max(len(gen.tokenizer(p)["input_ids"]) for p in prompts)
    check_length(gen.model.config, longest, args.max_new_tokens)
    merged = None
    if args.merged:
        from flexigpt.runtime.generation.merged import merge_replacement_linears

        merged = merge_replacement_linears(gen.model)
    out = gen.generate(prompts, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
                       temperature=args.temperature, top_p=args.top_p,
                       batch_size=args.batch_size, seed=args.seed,
                       speculative=args.speculative,
                       draft_length=args.draft_length or DEFAULT_DRAFT_LENGTH,
                       ignore_eos=args.ignore_eos, engine=args.engine)
    for prompt, text in zip(out.prompts, out.texts):
        print(f"{prompt}{text}")
        print("---")
    s = out.stats
    line = (f"{s['new_tokens']} tokens in {s['wall_s']:.2f} s: {s['tokens_per_s']:.1f} tok/s "
            f"(batch {s['batch_size']}, {s['threads']} threads)")
    if args.speculative:
        line += (f"; speculative k={s['draft_length']}: alpha {s['alpha']:.3f}, "
                 f"{s['tokens_per_round']:.2f} tokens/round, {s['draft_forwards']} draft / "
                 f"{s['full_forwards']} full forwards, draft extra memory "
                 f"{s['draft']['extra_bytes']} B ({s['draft']['draft_blocks']}/"
                 f"{s['draft']['full_blocks']} blocks)")
    else:
        line += f"; prefill {1e3 * s['prefill_s']:.1f} ms, {s['per_token_ms']:.2f} ms/token"
    print(line, file=sys.stderr)
    if args.json:
        from flexigpt.core.fileio import atomic_write_text

        record = {"model": str(args.model), "prompts": out.prompts, "texts": out.texts,
                  "token_ids": out.token_ids, "stats": out.stats, "merged": merged}
        atomic_write_text(args.json, json.dumps(record, indent=2, default=str))
    return 0
