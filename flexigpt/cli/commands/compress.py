"""flexigpt compress: run one registered method on a model and save it with a manifest."""

from __future__ import annotations

import argparse

HELP = "compress a model with a registered method and save weights + manifest"
#: method options that have their own flag (given both ways, the command refuses)
FLAG_OPTIONS = {"ratio": "--ratio", "policy": "--policy", "rank": "--rank"}


class _RatioHelp(str):
    """``--ratio``'s help, with each method's default ratio, computed only when shown."""

    def __mod__(self, params: object) -> str:
        import dataclasses

        from flexigpt.storage.registry import METHODS, get_method

        defaults: dict[object, list[str]] = {}
        for name in sorted(METHODS):
            try:
                cls = get_method(name).config_cls
                fields = {f.name: f.default for f in dataclasses.fields(cls)}
            except Exception:  # noqa: BLE001 - help text must not fail
                continue
            if "ratio" in fields:
                defaults.setdefault(fields["ratio"], []).append(name)
        shown = "; ".join(f"{v} ({', '.join(names)})" for v, names in defaults.items())
        return f"{self} (default: the method's own: {shown or 'none'})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from flexigpt.cli.commands import add_device_argument
    from flexigpt.storage.registry import METHODS

    p.add_argument("--method", required=True, choices=sorted(METHODS))
    p.add_argument("--model", required=True, help="local checkpoint dir or hub id")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--ratio", type=float, help=_RatioHelp("compression target in (0, 1)"))
    p.add_argument("--calibration", help="calibration text file (one document per paragraph)")
    p.add_argument("--n-calibration", type=int, default=128, help="calibration windows N")
    p.add_argument("--seq-len", type=int, default=512, help="calibration window length T")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32")
    add_device_argument(p)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="any method option (JSON value), e.g. --option rank=32 "
                        "--option policy='\"matched\"'; repeatable")
    # Frequently used method options, as first-class flags.
    p.add_argument("--policy", help="flexigpt: block-count policy (paper|matched)")
    p.add_argument("--rank", type=int, help="flexigpt: LoRA rank of replacement blocks "
                                            "(default: hidden/16)")
    p.add_argument("--basis", choices=("total", "non_embedding"), default="total",
                   help="what --ratio is a fraction of: all parameters (default) or all but "
                        "the embeddings, LM head and position table")
    p.add_argument("--accept-ratio-miss", action="store_true",
                   help="block-count methods (flexigpt, shortgpt, shortgpt_lora): compress "
                        "even when no block count reaches the ratio within half a block step "
                        "(default: refuse, naming target and achieved)")
    p.add_argument("--force", action="store_true",
                   help="replace --out even if it is not a previous output of compress")


def method_options(args: argparse.Namespace) -> dict[str, object]:
    """The method options of ``--option KEY=VALUE`` and the option flags (``--ratio``,
    ``--policy``, ``--rank``).

    Raises:
        ValueError: an option given twice (two ``--option`` of one key, or a flag and an
            ``--option`` of the same key), naming both; a bad ``--option`` pair.
    """
    from flexigpt.cli.commands import parse_key_values

    given: dict[str, str] = {}
    for pair in args.option:
        key = pair.partition("=")[0]
        if key in given:
            raise ValueError(f"--option {given[key]} and --option {pair} both set option "
                             f"{key!r}; give it once")
        given[key] = pair
    options = parse_key_values(args.option, "--option")
    for key, flag in FLAG_OPTIONS.items():
        value = getattr(args, key)
        if value is None:
            continue
        if key in options:
            raise ValueError(f"{flag} {value} and --option {given[key]} both set option "
                             f"{key!r}; give it once")
        options[key] = value
    return options


def check_flags(args: argparse.Namespace) -> None:
    """Every count-like flag is a positive integer and ``--ratio`` lies in (0, 1)
    (``ValueError`` naming the flag)."""
    from flexigpt.api.values import check_count
    from flexigpt.storage.registry import validate_ratio

    if args.ratio is not None:
        validate_ratio(args.ratio, "--ratio")
    check_count(args.n_calibration, "--n-calibration")
    check_count(args.seq_len, "--seq-len")
    check_count(args.seed, "--seed", minimum=0)
    if args.rank is not None:
        check_count(args.rank, "--rank")


def run(args: argparse.Namespace) -> int:
    from flexigpt.api.compression import compress
    from flexigpt.methods.block_count import RatioOutOfReach

    check_flags(args)
    options = method_options(args)
    try:
        manifest = compress(args.method, args.model, args.out, options=options,
                            calibration=args.calibration, n_calibration=args.n_calibration,
                            calibration_seq_len=args.seq_len, seed=args.seed,
                            dtype=args.dtype, force=args.force, device=args.device,
                            accept_ratio_miss=args.accept_ratio_miss, basis=args.basis)
    except RatioOutOfReach as err:
        raise RatioOutOfReach(f"{err}; --accept-ratio-miss compresses it anyway") from None
    p = manifest.parameters
    target = manifest.config.get("ratio") if isinstance(manifest.config, dict) else None
    aim = f"target ratio {target:g}, " if isinstance(target, (int, float)) else ""
    basis = manifest.extras.get("compression_basis")
    if basis:  # the user's target was on another basis: show both achieved ratios
        got = basis["achieved"]
        aim = (f"target {basis['target']:g} of the {basis['basis']} parameters, achieved "
               f"{got[basis['basis']]:.4f} ({got['total']:.4f} of all), ")
    print(f"{args.method}: {p.compressed:,} / {p.dense:,} parameters "
          f"({aim}achieved ratio {p.achieved_ratio:.4f}) -> {args.out}")
    return 0
