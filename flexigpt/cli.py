"""The ``flexigpt`` command: one subcommand per module under ``flexigpt/commands``.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``; it is imported only when its subcommand runs.

Every user error ends the command with one line on stderr and exit code 2 (``-v`` shows
the traceback). Commands that write an output directory refuse an existing ``--out`` that
is not a previous output of theirs before any work, unless ``--force``
(:func:`flexigpt.artifacts.check_output`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

#: subcommand → module. Add a command by adding a module and a line here.
COMMANDS: dict[str, str] = {
    "fetch": "flexigpt.commands.fetch",
    "compress": "flexigpt.commands.compress",
    "train": "flexigpt.commands.train",
    "extend": "flexigpt.commands.extend",
    "evaluate": "flexigpt.commands.evaluate",
    "tables": "flexigpt.commands.tables",
    "export": "flexigpt.commands.export",
    "generate": "flexigpt.commands.generate",
    "run": "flexigpt.commands.run",
}


#: commands writing a model directory to ``--out`` → the kind of output they write
OUTPUT_KIND: dict[str, str] = {"compress": "model", "extend": "model", "train": "model",
                               "export": "export"}
#: errors that are the user's (bad input, files, environment): one line, exit code 2
USER_ERRORS = (ValueError, RuntimeError, KeyError, OSError, ArithmeticError)


def _one_line(err: BaseException) -> str:
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
    text = " ".join(str(text).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _preflight(args: argparse.Namespace) -> None:
    """Checks that need no heavy work: the output directory, the training window length."""
    from flexigpt.artifacts import check_output

    out = getattr(args, "out", None)
    if args.command in OUTPUT_KIND and out and not getattr(args, "card", False):
        check_output(out, OUTPUT_KIND[args.command], args.force)
    if args.command == "train":
        model_dir = Path(args.model).expanduser()
        if (model_dir / "config.json").is_file():
            from flexigpt.api import check_positions
            from flexigpt.export.checkpoint import family_config

            check_positions(family_config(model_dir), args.seq_len, "--seq-len")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="flexigpt", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, module_name in COMMANDS.items():
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
        else:
            sub.add_parser(name, help=f"(see flexigpt {name} --help)")
    if chosen == "train":  # its flags live in commands/train.py; --force is common to outputs
        train_parser = sub.choices["train"]
        if not any("--force" in a.option_strings for a in train_parser._actions):
            train_parser.add_argument("--force", action="store_true",
                                      help="replace --out even if it is not a saved model")
    if chosen == "run":  # everything after `run` belongs to snakemake, unparsed
        cut = argv.index("run") + 1
        args = parser.parse_args(argv[:cut])
        args.snakemake_args = argv[cut:]
    else:
        args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(COMMANDS[args.command])
    from flexigpt.artifacts import force_outputs

    try:
        with force_outputs(bool(getattr(args, "force", False))):
            _preflight(args)
            return int(module.run(args) or 0)
    except USER_ERRORS as err:
        if args.verbose:
            raise
        print(f"flexigpt {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
