"""flexigpt extend: deepen a model with weight-shared repeated blocks (FlexiGPT §5.2).

Thin wrapper around ``flexigpt.api.compression.compress(method="flexigpt_extend")``; recovery training
is a separate step (``flexigpt train``).
"""

from __future__ import annotations

import argparse

HELP = "extend a model with weight-shared repeated blocks (LoRA + output norm) and save it"


def parse_span(text: str) -> list[int]:
    """``"s:e"`` → ``[s, e]`` (end exclusive)."""
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return [int(start), int(end)]
    except ValueError:
        raise ValueError(f"--span expects START:END (end exclusive), got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    from flexigpt.cli.commands import add_device_argument

    p.add_argument("--model", required=True, help="local checkpoint dir or hub id")
    p.add_argument("--layers", required=True, type=int, help="target depth (blocks)")
    p.add_argument("--pattern", default="block", choices=["block", "sequential"])
    p.add_argument("--span", help="repeated blocks START:END (end exclusive); default: middle")
    p.add_argument("--rank", type=int, help="LoRA rank of the repeats (default hidden/16)")
    p.add_argument("--gamma-init", type=float, default=0.0,
                   help="initial output-norm gamma of the repeats (0: identity at init)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32")
    add_device_argument(p)
    p.add_argument("--force", action="store_true",
                   help="replace --out even if it is not a previous saved model")


def check_flags(args: argparse.Namespace) -> None:
    """Every count-like flag is a positive integer (``ValueError`` naming the flag)."""
    from flexigpt.api.values import check_count

    check_count(args.layers, "--layers")
    check_count(args.seed, "--seed", minimum=0)
    if args.rank is not None:
        check_count(args.rank, "--rank")


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """Bytes of memory the system can give a new process (``MemAvailable``); None where
    the kernel does not say."""
    from pathlib import Path

    try:
        for line in Path(meminfo).read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(model: str, layers: int, rank: int | None, dtype: str,
               available: int | None = None) -> None:
    """``ValueError`` with the estimate when the extended model alone would not fit in the
    memory available (``MemAvailable``), before anything is built: counted on a meta-device
    skeleton of a local checkpoint (a hub id is left to the job), the dense weights plus what
    each added block holds although its linears are shared (its own tensors and the modules
    holding them: :func:`flexigpt.methods.flexigpt.extend.extension_memory`)."""
    from flexigpt.methods.flexigpt.extend import extension_memory
    from flexigpt.storage.models.loading import parse_dtype
    from flexigpt.workflow.model_skeletons import checkpoint_skeleton

    skeleton = checkpoint_skeleton(model)
    available = available_memory() if available is None else available
    if skeleton is None or available is None:
        return
    need = extension_memory(skeleton, layers, rank, parse_dtype(dtype))
    if need.total > available:
        raise ValueError(
            f"--layers {layers} needs ~{need.total / 2**30:.1f} GiB ({need.total:,} bytes) in "
            f"{dtype}: the weights ({need.weights:,} bytes) and {need.added:,} added blocks "
            f"of {need.per_block:,} bytes each (a weight-shared block still holds its own "
            f"LoRA, gamma and norm tensors and modules); {available / 2**30:.1f} GiB "
            f"({available:,} bytes) of memory is available: lower --layers")


def run(args: argparse.Namespace) -> int:
    from flexigpt.api.compression import compress
    from flexigpt.storage.registry import ROLES

    check_flags(args)
    check_fits(args.model, args.layers, args.rank, args.dtype)
    options: dict[str, object] = {"layers": args.layers, "pattern": args.pattern,
                                  "gamma_init": args.gamma_init}
    if args.span is not None:
        options["span"] = parse_span(args.span)
    if args.rank is not None:
        options["rank"] = args.rank
    manifest = compress(ROLES.extension, args.model, args.out, options=options,
                        seed=args.seed, dtype=args.dtype, force=args.force,
                        device=args.device)
    p, info = manifest.parameters, manifest.info
    print(f"flexigpt_extend: {info['original_layers']} -> {info['layers']} blocks, "
          f"{p.compressed:,} / {p.dense:,} parameters "
          f"({100 * (p.compressed / p.dense - 1):+.2f}%) -> {args.out}")
    return 0
